"""CI's per-change selection: the slow tests a change can break, chosen from the change alone.

``--changed-since REV`` keeps every test that is not slow, every slow test marked ``core`` (the README's quick start
study, the MLflow view in the browser), every slow test recorded at most ``CHEAP_S`` seconds
(``.ci/test_durations.json``, as ``--record-durations`` writes it), and every other slow test whose module depends
on a file that differs between commit REV and the work tree. ``.ci/run`` passes the commit ``.ci/full_passed``
names: the newest commit whose whole suite passed, which ``.ci/run --full`` writes. So which tests run is a
function of the commit alone (its tree, its history and the files in it), never of the date, and every slow test a
change can reach runs until the next full pass moves the base (docs/testing.md#ci).

What a test module depends on (:func:`dependencies`), read statically and on the side of running too much:

- its own file, the ``conftest.py`` files above it, and every repository file they import, transitively: an import
  resolves as pytest's ``prepend`` import mode and the package layout resolve it (the importing file's folder, the
  folders above it up to ``tests/``, the repository root), a package's import brings its ``__init__.py`` and those
  of the packages above it, and a package whose ``__init__.py`` imports lazily (``import_module``) brings every
  module under it;
- every repository file or folder a string in one of those files names, as a path (``"studies/temperature_sweep.py"``,
  ``"docs"``), a file name found once in the repository (``"temperature_sweep.py"``) or a module (``"dcl_core.study"``,
  as in ``python -m dcl_core.study``: with its ``__main__.py``); and then what those import. A test that runs a study
  in a subprocess depends on the study script and everything it imports.

A changed file that no test module depends on, and that is not one of ``INERT`` (prose, CI's own files, this
plugin), selects every slow test: nothing says which tests it can break (``pyproject.toml``'s pins and pytest
settings, a new kind of file). A file that was deleted counts under the path it had.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import json
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import pytest

CHEAP_S = 15.0  # a slow test recorded at most this long runs on every change: it starts a process or two
# Files whose change reaches no test by itself: prose the fast tier's doc tests read (they always run), CI's script,
# its durations and its base. `.ci/run` installs and lints, which every run does whatever the change.
INERT = ("*.md", "docs/*", ".ci/*", ".gitignore", "LICENSE", "tests/ci_select.py")
# This plugin chooses tests and checks none: no test depends on it (its strings are patterns, not paths it reads), and
# its own tests (tests/test_ci_select.py, fast) run on every change.
SELF = "tests/ci_select.py"
_GROUP_SUFFIX = re.compile(r"@[\w-]+$")  # what --dist loadgroup appends to a grouped test's id
_MODULE = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ci selection")
    group.addoption("--changed-since", metavar="REV", help="keep the fast tier, the slow tests marked core, the slow "
                    f"tests recorded at {CHEAP_S:g} s or less, and the slow tests whose module depends on a file that "
                    "differs between commit REV and the work tree (tests/ci_select.py)")
    group.addoption("--durations-file", metavar="FILE", default=".ci/test_durations.json",
                    help="test durations for --changed-since's quick slow tests, as --record-durations writes them")
    group.addoption("--record-durations", metavar="FILE", help="write each slow test's duration (setup, call "
                    "and teardown, seconds) to FILE as JSON, for --durations-file")


def _base_id(nodeid: str) -> str:
    return _GROUP_SUFFIX.sub("", nodeid)


class Repository:
    """The repository's files (tracked, untracked but not ignored, and any extra paths such as deleted ones), and
    what each Python file among them imports and names."""

    def __init__(self, root: Path, files: Iterable[str]) -> None:
        self.root = root
        self.files = frozenset(files)
        self.folders = frozenset(str(p) for f in self.files for p in PurePosixPath(f).parents if str(p) != ".")
        names: dict[str, list[str]] = {}
        for f in self.files:
            names.setdefault(PurePosixPath(f).name, []).append(f)
        self.unique_names = {n: fs[0] for n, fs in names.items() if len(fs) == 1}

    def under(self, folder: str) -> set[str]:
        return {f for f in self.files if f.startswith(folder + "/")}

    def module_file(self, dotted: str, near: Iterable[str]) -> set[str]:
        """The files ``import dotted`` can load, looked for in the folders ``near`` (as sys.path entries), with the
        ``__init__.py`` of each package on the way."""
        found: set[str] = set()
        parts = dotted.split(".")
        for base in near:
            prefix = f"{base}/" if base else ""
            inits = [f"{prefix}{'/'.join(parts[:i])}/__init__.py" for i in range(1, len(parts) + 1)]
            for candidate in (f"{prefix}{'/'.join(parts)}.py", inits[-1]):
                if candidate in self.files:
                    found.add(candidate)
                    found.update(i for i in inits[:-1] if i in self.files)
        return found

    @functools.cache  # noqa: B019 - one Repository a session, kept for its whole life
    def parsed(self, path: str) -> tuple[frozenset[str], frozenset[str]]:
        """The modules ``path`` imports (absolute names; a relative import resolved against its package) and the
        strings it holds."""
        file = self.root / path
        try:
            tree = ast.parse(file.read_bytes(), filename=path)
        except (OSError, SyntaxError, ValueError):
            return frozenset(), frozenset()
        package = PurePosixPath(path).parent.parts
        imports: set[str] = set()
        strings: set[str] = set()
        joined: set[int] = set()  # the strings of a path joined with `/` (REPO / "docs" / "x.md"): read as one path
        for node in ast.walk(tree):  # breadth first: a chain's outermost `/` comes before its parts
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and id(node) not in joined:
                parts = _path_parts(node)
                joined.update(id(p) for p in parts)
                joined.update(id(n) for n in ast.walk(node) if isinstance(n, ast.BinOp))
                if parts:
                    strings.add("/".join(str(p.value) for p in parts))
                continue
            if isinstance(node, ast.Import):
                imports.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package[: len(package) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                if base:
                    imports.add(base)
                    imports.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytest_plugins"
                                                      for t in node.targets):
                imports.update(c.value for c in ast.walk(node.value)
                               if isinstance(c, ast.Constant) and isinstance(c.value, str))
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200
                    and id(node) not in joined):
                strings.add(node.value)
        return frozenset(imports), frozenset(strings)

    def named_by(self, text: str) -> set[str]:
        """The repository files a string names: a path (file or folder, relative to the root), a file name found
        once in the repository, or a dotted module of the repository (a package with its ``__main__.py``)."""
        found: set[str] = set()
        for piece in {text.strip().strip("/"), text.strip().removeprefix("./").strip("/")}:
            if not piece:
                continue
            if piece in self.files:
                found.add(piece)
            elif piece in self.folders:
                found.update(self.under(piece))
            elif piece in self.unique_names:
                found.add(self.unique_names[piece])
            elif _MODULE.fullmatch(piece):
                modules = self.module_file(piece, [""])
                found.update(modules)
                found.update(m.replace("__init__.py", "__main__.py") for m in modules
                             if m.replace("__init__.py", "__main__.py") in self.files)
        return found

    def search_path(self, path: str) -> list[str]:
        """Where an import in ``path`` looks: its folder, the folders above it up to ``tests/`` (pytest's prepend
        mode puts each test folder on sys.path, conftest.py the tests folder), and the root."""
        folders = [str(p) for p in PurePosixPath(path).parents if str(p) != "."]
        return [*folders[:1], *[f for f in folders[1:] if f == "tests" or f.startswith("tests/")], ""]

    def dependencies(self, start: str) -> frozenset[str]:
        """Every repository file ``start`` depends on (see the module's docstring)."""
        seen: set[str] = set()
        todo = [start, *self.conftests(start)]
        while todo:
            path = todo.pop()
            if path in seen or path == SELF:
                continue
            seen.add(path)
            if not path.endswith(".py"):
                continue
            imports, strings = self.parsed(path)
            near = self.search_path(path)
            for name in imports:
                todo.extend(self.module_file(name, near))
            for text in strings:
                todo.extend(self.named_by(text))
            if path.endswith("__init__.py") and "import_module" in self.source(path):
                todo.extend(f for f in self.under(str(PurePosixPath(path).parent)) if f.endswith(".py"))
        return frozenset(seen)

    def conftests(self, path: str) -> list[str]:
        return [f"{p}/conftest.py" for p in PurePosixPath(path).parents if f"{p}/conftest.py" in self.files]

    def source(self, path: str) -> str:
        try:
            return (self.root / path).read_text(errors="replace")
        except OSError:
            return ""


def _path_parts(node: ast.expr) -> list[ast.Constant]:
    """The string constants of a chain ``a / "b" / "c"`` after its last part that is not one (its head, such as the
    repository's root, or a name): the path they spell from there."""
    chain: list[ast.expr] = []
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        chain.append(node.right)
        node = node.left
    chain.append(node)
    parts: list[ast.Constant] = []
    for part in chain:  # from the right: the tail of constants
        if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
            break
        parts.append(part)
    return parts[::-1]


def _git(root: Path, *args: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line]


def changed_files(root: Path, since: str) -> list[str]:
    """The files that differ between commit ``since`` and the work tree (added, changed, deleted, either side of a
    rename), and the untracked files git does not ignore."""
    try:
        _git(root, "rev-parse", "--verify", "--quiet", f"{since}^{{commit}}")
    except subprocess.CalledProcessError:
        raise pytest.UsageError(f"--changed-since {since}: no such commit in this clone (a shallow clone, or a "
                                "commit from another history): run the whole suite") from None
    return sorted({*_git(root, "diff", "--no-renames", "--name-only", since, "--"),
                   *_git(root, "ls-files", "--others", "--exclude-standard")})


def inert(path: str) -> bool:
    return any(fnmatch.fnmatch(path, pattern) for pattern in INERT)


def select(root: Path, modules: Iterable[str], changed: Iterable[str]) -> tuple[set[str], list[str]]:
    """The test modules (paths relative to ``root``) a change reaches, and the changed files that reach every module
    (no module depends on them and they are not inert)."""
    changed = set(changed)
    repo = Repository(root, {*_git(root, "ls-files"), *_git(root, "ls-files", "--others", "--exclude-standard"),
                             *changed})
    modules = sorted(set(modules))
    deps = {m: repo.dependencies(m) for m in modules}
    reached_by_none = sorted(f for f in changed if not inert(f) and not any(f in d for d in deps.values()))
    if reached_by_none:
        return set(modules), reached_by_none
    return {m for m in modules if deps[m] & changed}, []


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    since = config.getoption("changed_since")
    if not since:
        return
    root = Path(config.rootpath)
    path = Path(config.getoption("durations_file"))
    recorded = {_base_id(k): float(v) for k, v in json.loads(path.read_text()).items()} if path.is_file() else {}
    candidates = [i for i in items if i.get_closest_marker("slow") and not i.get_closest_marker("core")
                  and recorded.get(_base_id(i.nodeid), CHEAP_S + 1) > CHEAP_S]
    # every test module collected, fast ones too: a changed file only a fast test depends on reaches no slow test
    modules = {Path(str(i.path)).resolve().relative_to(root.resolve()).as_posix() for i in items}
    changed = changed_files(root, since)
    reached, everything = select(root, modules, changed)
    dropped = [i for i in candidates
               if Path(str(i.path)).resolve().relative_to(root.resolve()).as_posix() not in reached]
    config.stash[_SUMMARY] = (since, len(changed), everything, len(candidates) - len(dropped), len(candidates))
    if dropped:
        gone = {id(i) for i in dropped}
        items[:] = [i for i in items if id(i) not in gone]
        config.hook.pytest_deselected(items=dropped)


_SUMMARY = pytest.StashKey[tuple[str, int, list[str], int, int]]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if _SUMMARY not in config.stash:
        return
    since, changed, everything, kept, total = config.stash[_SUMMARY]
    why = (f"; every slow test, as {', '.join(everything[:3])}{' ...' if len(everything) > 3 else ''} reaches no "
           "test module" if everything else "")
    terminalreporter.write_line(f"ci selection: {changed} file(s) changed since {since[:12]}; {kept} of {total} "
                                f"slow tests over {CHEAP_S:g} s kept{why}")


class _Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "slow" not in report.keywords:
            return
        key = _base_id(report.nodeid)
        self.seconds[key] = self.seconds.get(key, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        self.path.write_text(json.dumps({k: round(v, 2) for k, v in sorted(self.seconds.items())}, indent=0) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    target = config.getoption("record_durations")
    if target and not hasattr(config, "workerinput"):  # the xdist controller (or a run without xdist) sees every report
        config.pluginmanager.register(_Recorder(Path(target)), "ci_select_recorder")
