"""Same behaviour, shown with numbers: what a behaviour-preserving change is checked by, before and after, on one
machine. Not a speed benchmark.

``record OUT`` runs a fixed list of commands from this checkout (every study script's and ``dcl_core.study``
subcommand's ``--help``, every study's smoke ``--dry-run``, a smoke study, its re-analysis, a resume adding a seed,
an ``--until-resolved`` study, refusals of bad input and of a moved or damaged folder) and keeps each command's
output and exit status in ``OUT/NN.txt``, with the studies' summaries (``table.txt``, plots, ``results.csv``).
``compare BEFORE AFTER`` says which outputs differ once what legitimately varies between two runs is masked
(clock times, durations, the CPU rate a dry run measures, MLflow run ids, Tune's trial-id suffix, the order in
which trials finish), then whether the summaries' tables and plots are byte-identical and the results rows equal
but for their trial ids and speed. Exit 1 when anything differs.

    git worktree add /tmp/before <commit>   # or a fresh clone at the commit before the change
    python benchmarks/behaviour.py record /tmp/b --repo /tmp/before
    python benchmarks/behaviour.py record /tmp/a
    python benchmarks/behaviour.py compare /tmp/b /tmp/a

Both records must come from one machine with the same thread count (CPU runs are deterministic given the seed,
thread count and CPU kind). A record takes ~12 minutes on 2 cores; it writes only under OUT.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import filecmp
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUDY = "studies/temperature_sweep.py"
T = ["python", STUDY, "--smoke"]
SUBCOMMANDS = ("answer", "calibrate", "export", "sync")
# (what a command's output keeps between two runs, masked): (pattern, replacement)
MASKS = [
    (r"\b\d\d:\d\d:\d\d\b", "HH:MM:SS"),  # a log line's clock time
    (r"\b[0-9a-f]{32}\b", "RUN_ID"),  # an MLflow run id
    (r"_[0-9a-f]{5}_(\d{5})\b", r"_TUNE_\1"),  # Tune's experiment suffix in a trial's name
    (r"\d[\d,.]*( ?)(s|ms|min|GFLOP/s|img/s|images/s)\b", r"N\1\2"),  # durations and rates
    (r"\d+ step\(s\) of", "N step(s) of"),  # how many steps a rate's measurement took
    (r"\(~[\d,.]+ days\)", "(~N days)"),
]
VOLATILE_LINES = re.compile(r"matplotlib\.font_manager|auth_token")  # one-off notices of the machine's state
VOLATILE_COLUMNS = {"trial_id", "images_per_s", "time_total_s", "epoch_seconds"}
DAMAGE = ("import json, pathlib; p = pathlib.Path({!r}); d = json.loads(p.read_text()); "
          "d['command']['seeds'] = 'zz'; p.write_text(json.dumps(d))")
PLANT_LINK = ("import pathlib, tempfile; p = pathlib.Path({!r}); p.mkdir(parents=True); "
              "(p / 'temperature_sweep').symlink_to(tempfile.gettempdir())")


def commands(s: str, repo: Path) -> list[list[str]]:
    """The commands a record runs from ``repo``, in order; ``s``: the scratch folder their studies write in. A
    ``copy`` keeps a folder (under the record when relative); ``python -c`` lines damage a copy on purpose."""
    studies = sorted(str(p.relative_to(repo)) for p in (repo / "studies").glob("*.py"))
    out = [["python", p, "--help"] for p in studies]
    out += [["python", "-m", "dcl_core.study", "--help"]]
    out += [["python", "-m", "dcl_core.study", c, "--help"] for c in SUBCOMMANDS]
    out += [["python", p, "--smoke", "--dry-run", "--output-dir", f"{s}/dry"] for p in studies]
    out += [
        ["python", STUDY, "--dry-run", "--output-dir", f"{s}/dry"],
        [*T, "--dry-run", "--until-resolved", "--max-seeds", "8", "--output-dir", f"{s}/dry"],
        [*T, "--dry-run", "--download", "--data-root", f"{s}/dl", "--output-dir", f"{s}/dry"],
        [*T, "--dry-run", "--asha", "--search", "optuna", "--output-dir", f"{s}/dry"],
        [*T, "--output-dir", f"{s}/o1"], ["copy", f"{s}/o1/summary", "o1_summary"],
        [*T, "--dry-run", "--output-dir", f"{s}/o1"],
        [*T, "--dry-run", "--resume", "--seeds", "2", "--output-dir", f"{s}/o1"],
        [*T, "--reanalyze", "--output-dir", f"{s}/o1"], ["copy", f"{s}/o1/summary", "o1_summary_re"],
        ["python", "studies/batch_size_sweep.py", "--smoke", "--reanalyze", "--output-dir", f"{s}/o1",
         "--name", "temperature_sweep"],
        ["copy", f"{s}/o1", f"{s}/moved"],
        [*T, "--resume", "--seeds", "2", "--output-dir", f"{s}/moved"],
        [*T, "--reanalyze", "--output-dir", f"{s}/moved"],
        ["copy", f"{s}/o1", f"{s}/damaged"],
        ["python", "-c", DAMAGE.format(f"{s}/damaged/summary/temperature_sweep/study_options.json")],
        [*T, "--resume", "--output-dir", f"{s}/damaged"],
        [*T, "--resume", "--output-dir", f"{s}/damaged", "--workers", "64"],
        [*T, "--resume", "--seeds", "2", "--output-dir", f"{s}/o1"], ["copy", f"{s}/o1/summary", "o1_resumed"],
        [*T, "--until-resolved", "--max-seeds", "3", "--output-dir", f"{s}/o2"], ["copy", f"{s}/o2/summary", "o2"],
        [*T, "--output-dir", f"{s}/o1"],  # exists: refused
        [*T, "--output-dir", f"{s}/o1", "--overwrite", "--resume"],
        [*T, "--reanalyze", "--resume"],
        [*T, "--resume", "--output-dir", f"{s}/none"],
        [*T, "--reanalyze", "--output-dir", f"{s}/none"],
        [*T, "--download", "--address", "ray://127.0.0.1:1", "--output-dir", f"{s}/x"],
        [*T, "--storage", "foo://x", "--output-dir", f"{s}/x"],
        [*T, "--output-dir", f"{s}/a_file"],
        [*T, "--dry-run", "--output-dir", f"{s}/a_file"],
        ["python", "-c", PLANT_LINK.format(f"{s}/linked/summary")],
        [*T, "--output-dir", f"{s}/linked"],
        [*T, "--workers", "64", "--output-dir", f"{s}/x"],
        [*T, "--num-cpus", "1", "--workers", "2", "--output-dir", f"{s}/x"],
        [*T, "--set", "optim.epochs=0", "--output-dir", f"{s}/x"],
        [*T, "--set", "loss.tau=0.2", "--output-dir", f"{s}/x"],
        [*T, "--until-resolved", "--output-dir", f"{s}/x"],
        [*T, "--max-seeds", "3", "--output-dir", f"{s}/x"],
        [*T, "--seeds", "0", "--output-dir", f"{s}/x"],
        [*T, "--losses", "nope", "--output-dir", f"{s}/x"],
        [*T, "--data-root", f"{s}/nodata", "--output-dir", f"{s}/x"],
        [*T, "--compare", "dcl,nope", "--output-dir", f"{s}/x"],
        [*T, "--statistic", "gap_at", "--output-dir", f"{s}/x"],
        [*T, "--effect-of-interest", "zz=1", "--output-dir", f"{s}/x"],
        [*T, "--name", "", "--output-dir", f"{s}/x"],
        [*T, "--tracking-uri", "", "--output-dir", f"{s}/x"],
        [*T, "--address", "foo", "--output-dir", f"{s}/x"],
        [*T, "--search", "optuna", "--num-samples", "0", "--output-dir", f"{s}/x"],
    ]
    return out


def record(out: Path, repo: Path) -> None:
    """Run :func:`commands` from ``repo``; each output in ``out/NN.txt``, summaries copied under ``out``."""
    if out.exists():
        raise SystemExit(f"error: {out} exists: record into a new folder")
    scratch = out / "scratch"
    scratch.mkdir(parents=True)
    (scratch / "a_file").write_text("not a folder")  # an --output-dir that is a file
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
           **_same_data()}
    found = subprocess.run([sys.executable, "-c", "import dcl_core; print(dcl_core.__file__)"], cwd=repo, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not Path(found).resolve().is_relative_to(repo):
        raise SystemExit(f"error: dcl_core is imported from {found}, not from {repo}")
    n = 0
    for cmd in commands(str(scratch), repo):
        if cmd[0] == "copy":
            target = Path(cmd[2]) if Path(cmd[2]).is_absolute() else out / cmd[2]
            if Path(cmd[1]).exists():
                shutil.copytree(cmd[1], target, symlinks=True)
            continue
        n += 1
        proc = subprocess.run([sys.executable, *cmd[1:]], cwd=repo, env=env, capture_output=True, text=True,
                              timeout=900)
        text = f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}exit {proc.returncode}\n"
        (out / f"{n:02d}.txt").write_text(text.replace(str(scratch), "S").replace(str(repo), "REPO"))
        print(f"{n:02d} exit {proc.returncode}: {' '.join(cmd)[:100]}", flush=True)
    shutil.rmtree(scratch)


def _same_data() -> dict[str, str]:
    """``DCL_DATA_ROOT`` for the recorded commands: the CIFAR-10 this checkout reads, unless the variable is set.
    The embedded copy is found beside the checkout, so a ``--repo`` elsewhere (``git worktree add /tmp/before``)
    found none, and its record compared "CIFAR-10 not found" with the other's studies."""
    if os.environ.get("DCL_DATA_ROOT"):
        return {}
    found = subprocess.run([sys.executable, "-c", "from dcl_core.data import resolve_data_root as r; "
                            "print(r('cifar10', None))"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                           capture_output=True, text=True)
    return {"DCL_DATA_ROOT": found.stdout.strip()} if found.returncode == 0 and found.stdout.strip() else {}


def masked(text: str) -> list[str]:
    """A command's output as two runs of the same code print it: volatile values masked, finished trials sorted."""
    lines = []
    for line in text.splitlines():
        if VOLATILE_LINES.search(line):
            continue
        for pattern, repl in MASKS:
            line = re.sub(pattern, repl, line)
        lines.append(line)
    trials = sorted(re.sub(r"^\[\d+/(\d+)\]", r"[k/\1]", x) for x in lines if re.match(r"\[\d+/\d+\] ", x))
    rest = [x for x in lines if not re.match(r"\[\d+/\d+\] ", x) and "trials done" not in x]
    return rest + trials


def _rows(path: Path) -> list[tuple[tuple[str, str], ...]]:
    with path.open(newline="") as f:
        return sorted(tuple(sorted((k, v) for k, v in row.items() if k not in VOLATILE_COLUMNS))
                      for row in csv.DictReader(f))


def compare(before: Path, after: Path) -> int:
    """Print what differs between two records; 1 when anything does."""
    differ = 0
    names = sorted({p.name for p in before.glob("*.txt")} | {p.name for p in after.glob("*.txt")})
    for name in names:
        a, b = before / name, after / name
        old = masked(a.read_text()) if a.exists() else ["(missing)"]
        new = masked(b.read_text()) if b.exists() else ["(missing)"]
        if old != new:
            differ += 1
            print(f"--- {name}: {(old or new)[0]}")
            print("\n".join(list(difflib.unified_diff(old, new, lineterm="", n=0))[2:40]))
    summaries = sorted(p.relative_to(before) for p in before.rglob("*")
                       if p.is_file() and (p.suffix in (".csv", ".png") or p.name == "table.txt"))
    for rel in summaries:
        a, b = before / rel, after / rel
        if not b.exists():
            differ += 1
            print(f"--- {rel}: missing after")
        elif rel.suffix == ".csv":
            if _rows(a) != _rows(b):
                differ += 1
                print(f"--- {rel}: rows differ (trial ids, speed and order aside)")
        elif rel.suffix != ".csv" and not filecmp.cmp(a, b, shallow=False):
            differ += 1
            print(f"--- {rel}: not byte-identical")
    print(f"{len(names)} command outputs and {len(summaries)} summary files compared: "
          f"{'no difference' if not differ else f'{differ} differ'}")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    """The command line: ``record OUT [--repo DIR]`` or ``compare BEFORE AFTER``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("record", help="run the commands, keep their outputs in OUT")
    r.add_argument("out", type=Path)
    r.add_argument("--repo", type=Path, default=REPO, help="the checkout to run (default: this one)")
    c = sub.add_parser("compare", help="what differs between two records")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "record":
        record(args.out.resolve(), args.repo.resolve())
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
