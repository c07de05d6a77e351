"""The README and docs/ say only what the code accepts: every `python studies/…`, `python benchmarks/…` and
`python -m dcl_core…` command they show names a script or module that exists and passes it only long flags its
`--help` lists; every relative link points to a file (and, for `page.md#anchor`, a heading) that exists; the
README stays a front door (at most 250 lines).

Help texts are cheap: a study script's `--help` imports no torch. Each distinct script or module (with its
subcommand, for `python -m dcl_core.study answer …`) is asked once per test session."""

import functools
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pyrun
import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 250

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)
INLINE = re.compile(r"(`+)(.+?)\1", re.S)
# A command starts at `python` followed by a study script, a benchmark script or `-m dcl_core…`; it may follow
# other words (`time python …`, `ray job submit … -- python …`), whose own flags are not its flags.
COMMAND = re.compile(r"(?<![\w/.-])python3? +(?:(?P<script>(?:studies|benchmarks)/[\w/.-]+\.py)"
                     r"|-m +(?P<module>dcl_core(?:\.\w+)*))(?P<rest>[^\n]*)")
# Where a shell command ends: a pipe, a list, a redirection, a comment, a background `&`.
END = re.compile(r"\s(?:\||&&|;|#|&|>|2>|<)|[;|]$")
LONG_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w.-]*")
# Modules and scripts that take a subcommand as their first argument: `python -m dcl_core.study answer OUTPUT_DIR`.
SUBCOMMAND_TARGETS = {"dcl_core.study", "dcl_core.losses", "benchmarks/behaviour.py"}


@dataclass(frozen=True)
class Command:
    page: str  # e.g. "docs/statistics.md"
    text: str  # the command as shown, one line
    target: str  # "studies/x.py", "benchmarks/x.py" or a module name
    subcommand: str | None
    flags: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}: {self.text}"


def _code_lines(markdown: str) -> list[str]:
    """The lines of code a page shows: each fenced block's lines (a backslash-continued shell line joined into
    one), then each inline code span outside the fences as one line (prose may wrap it)."""
    lines = []
    for m in FENCE.finditer(markdown):
        lines += re.sub(r"\\\n\s*", " ", m.group(2)).splitlines()
    prose = FENCE.sub("", markdown)
    return lines + [" ".join(m.group(2).split()) for m in INLINE.finditer(prose)]


def extract_commands(markdown: str, page: str = "<text>") -> list[Command]:
    """The runnable project commands in a page's code blocks and inline code."""
    commands = []
    for line in _code_lines(markdown):
        for m in COMMAND.finditer(line):
            rest = m.group("rest")
            end = END.search(rest)
            rest = rest[:end.start()] if end else rest
            target = m.group("script") or m.group("module")
            words = rest.split()
            sub = None
            if target in SUBCOMMAND_TARGETS and words and re.fullmatch(r"[a-z][\w-]*", words[0]):
                sub = words[0]
            text = " ".join(line[m.start():m.start("rest")].split() + words)
            commands.append(Command(page, text, target, sub, tuple(LONG_FLAG.findall(rest))))
    return commands


def all_commands() -> list[Command]:
    return [c for path in PAGES for c in extract_commands(path.read_text(), str(path.relative_to(REPO)))]


def target_exists(target: str) -> bool:
    """A script is a file of the repository; a module runs with -m: a `.py` file, or a package with `__main__`."""
    if target.endswith(".py"):
        return (REPO / target).is_file()
    path = REPO.joinpath(*target.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


@functools.cache
def _checkout_is_installed() -> bool:
    """Whether ``import dcl_core`` finds this checkout (an editable install, as CI's) rather than another copy."""
    spec = importlib.util.find_spec("dcl_core")
    return spec is not None and spec.origin is not None and Path(spec.origin).resolve().is_relative_to(REPO)


@functools.cache
def help_text(target: str, subcommand: str | None) -> tuple[int, str]:
    """`--help` of a script or module (and subcommand), run from the repository's root on this checkout."""
    argv = [sys.executable, target] if target.endswith(".py") else [sys.executable, "-m", target]
    argv += [subcommand, "--help"] if subcommand else ["--help"]
    env = dict(os.environ)
    if not _checkout_is_installed():  # PYTHONPATH is read at start: a new interpreter then, not a fork (pyrun)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = pyrun.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    # argparse wraps long help lines at a hyphen ("--max-\n      seeds"): rejoin them.
    return proc.returncode, re.sub(r"-\n\s+", "-", proc.stdout + proc.stderr)


def problems(command: Command) -> list[str]:
    """Why a command as shown would not run: a missing script or module, a failing --help, an unknown flag."""
    if not target_exists(command.target):
        return [f"{command.target} does not exist (or cannot run with -m)"]
    rc, text = help_text(command.target, command.subcommand)
    shown = command.target + (f" {command.subcommand}" if command.subcommand else "")
    if rc != 0:
        return [f"`{shown} --help` exited {rc}: {text.strip().splitlines()[-1] if text.strip() else ''}"]
    accepted = set(LONG_FLAG.findall(text))
    return [f"{flag} is not an option of {shown}" for flag in command.flags if flag not in accepted]


COMMANDS = all_commands()


def test_the_pages_show_commands():
    """An extractor that finds nothing would make the test below pass vacuously."""
    assert len(COMMANDS) >= 20
    assert {c.target for c in COMMANDS} >= {"studies/temperature_sweep.py", "dcl_core.train"}


@pytest.mark.slow  # the documented commands in subprocesses (the fork server's start: ~20 s a worker)
@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_command_runs_as_shown(command):
    assert problems(command) == []


def test_a_planted_bad_command_is_caught():
    """A command with a flag its script does not take, in a fence and inline, is found and reported."""
    page = ("Run\n\n```bash\npython studies/temperature_sweep.py --smoke \\\n    --no-such-flag 3  # comment --x\n```\n"
            "or `python studies/temperature_sweep.py --seeds 2`, or `python studies/no_such_study.py`.\n")
    found = extract_commands(page)
    assert [(c.target, c.flags) for c in found] == [
        ("studies/temperature_sweep.py", ("--smoke", "--no-such-flag")),
        ("studies/temperature_sweep.py", ("--seeds",)),
        ("studies/no_such_study.py", ()),
    ]
    assert problems(found[0]) == ["--no-such-flag is not an option of studies/temperature_sweep.py"]
    assert problems(found[1]) == []
    assert problems(found[2]) == ["studies/no_such_study.py does not exist (or cannot run with -m)"]


def test_subcommands_are_read_as_such():
    found = extract_commands("`python -m dcl_core.study answer OUTPUT_DIR --quiet`, `python -m dcl_core.train -h`, "
                             "`python benchmarks/behaviour.py record OUT --repo DIR`")
    assert [(c.target, c.subcommand, c.flags) for c in found] == [
        ("dcl_core.study", "answer", ("--quiet",)), ("dcl_core.train", None, ()),
        ("benchmarks/behaviour.py", "record", ("--repo",))]


def test_readme_is_a_front_door():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {README_MAX_LINES})"


# Links ------------------------------------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, everything but letters, digits, `_`, `-` and
    spaces removed, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"(\*\*|__|\*|~~)", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor, with GitHub's -1, -2 … suffixes for repeated ones (fenced code is no heading)."""
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(FENCE.sub("", markdown)):
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    prose = INLINE.sub("", FENCE.sub("", path.read_text()))
    return [t for t in LINK.findall(prose) if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


LINKS = [(path, target) for path in PAGES for target in relative_links(path)]


def link_problem(page: Path, target: str) -> str | None:
    file_part, _, anchor = target.partition("#")
    dest = (page.parent / file_part).resolve() if file_part else page
    if not dest.exists():
        return f"{file_part} does not exist"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
        return f"no heading #{anchor} in {dest.relative_to(REPO)}"
    return None


def test_the_pages_have_links():
    assert len(LINKS) >= 20


@pytest.mark.parametrize(("page", "target"), LINKS, ids=[f"{p.relative_to(REPO)}:{t}" for p, t in LINKS])
def test_relative_link_resolves(page, target):
    assert link_problem(page, target) is None, link_problem(page, target)


def test_slugs_follow_github():
    assert github_slug("Into the NPC regime: `--preset cpu_long`") == "into-the-npc-regime---preset-cpu_long"
    assert github_slug("Answers: verdicts, the paper beside us") == "answers-verdicts-the-paper-beside-us"
    assert github_slug("τ/lr search (Table 3)") == "τlr-search-table-3"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}
    assert link_problem(README, "docs/no-such-page.md") == "docs/no-such-page.md does not exist"


# A verdict line as a study prints it: "<claim>: <words> — <statistic> <estimate>, <95% CI [...] or no interval> ..."
VERDICT_LINE = re.compile(r"^\s*(?P<claim>[^:`|]{5,}?): (?P<words>not resolved|rules out|supports|contradicts)"
                          r"[^—]* — (?P<body>.*)$")
ESTIMATE = re.compile(r"([+-]\d+\.\d+), (95% CI \[[^\]]+\]|no interval)")


def verdict_copies(pages: list[Path]) -> dict[tuple[str, str, str], list[str]]:
    """Each verdict (its claim, estimate and interval) with every place README.md and docs/ print it."""
    found: dict[tuple[str, str, str], list[str]] = {}
    for page in pages:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if (m := VERDICT_LINE.match(line)) and (e := ESTIMATE.search(m["body"])):
                found.setdefault((m["claim"].strip(), e[1], e[2]), []).append(f"{page.name}:{number}")
    return found


def test_every_verdict_stands_in_one_place(tmp_path):
    """One truth per figure: a verdict printed twice drifts (one copy in today's words, another in an older
    version's); the other pages link to the one place."""
    twice = {k: v for k, v in verdict_copies(PAGES).items() if len(v) > 1}
    assert not twice, f"verdicts printed in more than one place: {twice}"
    planted = tmp_path / "planted.md"  # the check finds a second copy, even in other words
    planted.write_text("DCL flatter across τ than InfoNCE: not resolved — Δstd +0.21, 95% CI [-0.45, +0.87] "
                       "(paper: …)\n"
                       "```\nDCL flatter across τ than InfoNCE: rules out the paper's size — no effect as large as the "
                       "paper's +1.38 at this scale: Δstd +0.21, 95% CI [-0.45, +0.87] (paper: …)\n```\n")
    assert list(verdict_copies([planted]).values()) == [["planted.md:1", "planted.md:3"]]
