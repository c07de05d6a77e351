"""The whole GPU check as one bounded command: what one call on a lent GPU machine runs (docs/performance.md).

    python benchmarks/gpu_check.py --out OUT --data-root .gpu/cifar10 [--budget-s 540]
    python benchmarks/gpu_check.py --tiny --out OUT --data-root .gpu/cifar10    # the rehearsal, on the CPU

A lent GPU machine runs one command of at most 10 minutes, returns at most 8 files from its output folder, and
has torch and torchvision but no Ray, Optuna or MLflow. So three steps run in order, each within its share of
``--budget-s``, each result put into OUT the moment it exists (8 files; a command cut short still reports):

1. ``tests.txt``: pytest over the losses, data, training, evaluation, frameworks and models, ``tests/test_cuda.py``
   first (what only a GPU can check), stopped after ``--tests-s``;
2. ``gpu.json`` and ``gpu.md``: ``benchmarks/gpu.py`` with ``--gpu-s`` (autocast against fp32, the device's
   peak rates, the trainer against a bare loop at batch 512 and 32, processes sharing the device);
3. ``runs.jsonl``, ``answer.md``, ``curves.png`` and ``runs_logs.txt``: ``benchmarks/gpu_runs.py`` with what is
   left (DCL vs InfoNCE, ResNet-18, full CIFAR-10, batch 32, ``--seeds`` each, kNN every epoch): every run's
   metrics merged as they are written, the per-epoch table with the paired verdict, kNN against the epoch per
   run, and each run's last log lines.

``check.log`` says when each step started and ended and why it stopped. ``--tiny`` runs the same steps at toy
sizes (``gpu.py --tiny``, the runs shrunk by ``--set``), so the command is rehearsed on a CPU before a GPU's
minutes are spent on it (``tests/test_benchmark_gpu.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import MAX_METRICS_BYTES  # noqa: E402 - the repository root is on the path from here
from dcl_core import metric_names as M  # noqa: E402
from dcl_core.files import open_append, open_fd, read_bounded, write_text, write_with  # noqa: E402

# What only a GPU checks comes first, so a step cut short has run it.
TESTS = ("tests/test_cuda.py", "tests/losses", "tests/data", "tests/training", "tests/eval", "tests/frameworks",
         "tests/models")
TINY_RUN = ("model.width=0.125", "model.proj_hidden_dim=32", "model.proj_dim=16", "data.train_per_class=20",
            "data.test_per_class=10", "threads=1")
STOP_S = 45.0  # kept back from the runs' budget: stopping them (SIGTERM, their last writes) and the summary
LOG_TAIL = 40  # lines of each run's log in runs_logs.txt


class Check:
    """The output folder, ``check.log`` and the deadline every step is fitted into."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out, self.end, self.t0 = out, time.monotonic() + budget_s, time.monotonic()
        out.mkdir(parents=True, exist_ok=True)

    @property
    def left(self) -> float:
        """Seconds left of the budget."""
        return self.end - time.monotonic()

    def log(self, text: str) -> None:
        """A line in ``check.log`` and on the console, stamped with the seconds since the start."""
        line = f"[{time.monotonic() - self.t0:6.1f} s] {text}"
        print(line, flush=True)
        with open_append(self.out / "check.log") as f:
            f.write(line + "\n")

    def step(self, name: str, cmd: list[str], limit_s: float, output: Path,
             every: Callable[[], None] | None = None, env: dict[str, str] | None = None) -> int | None:
        """Run ``cmd`` (its output to ``output``) for at most ``limit_s`` seconds, calling ``every`` each 10 s;
        past the limit its whole process group is stopped. Its exit code, None when stopped."""
        limit_s = min(limit_s, self.left)
        self.log(f"{name}: started, at most {limit_s:.0f} s: {' '.join(cmd[1:])}")
        fd = open_fd(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        with os.fdopen(fd, "w") as sink:
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=None if env is None else os.environ | env)
            end, code = time.monotonic() + limit_s, None
            while (code := proc.poll()) is None and time.monotonic() < end:
                time.sleep(min(10.0, max(end - time.monotonic(), 0.1)))
                if every:
                    every()
            if code is None:
                _stop(proc)
        self.log(f"{name}: " + (f"exit {code}" if code is not None else f"stopped after {limit_s:.0f} s"))
        return code


def _test_env(data_root: str | None) -> dict[str, str]:
    """The tests' environment: their helpers and the repository importable (pytest runs without the suite's
    conftest, which needs Ray), and the data where the check was told it is (``tests/test_cuda.py`` trains on it)."""
    path = [str(REPO / "tests"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(path)} | ({"DCL_DATA_ROOT": str(Path(data_root).resolve())} if data_root
                                                     else {})


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group (pytest's workers, the runs), SIGKILL 20 s later."""
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def merge_runs(runs: Path, out: Path) -> None:
    """Every run's ``metrics.jsonl`` in ``runs`` as one ``out`` file: a line an epoch, with the run's name."""
    lines = []
    for folder in sorted(runs.glob("*_s*")):
        metrics = folder / "metrics.jsonl"
        if folder.is_dir() and not folder.is_symlink() and metrics.is_file():
            for line in read_bounded(metrics, MAX_METRICS_BYTES).decode(errors="replace").splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if isinstance(record, dict):
                    lines.append(json.dumps({"run": folder.name} | record))
    write_text(out, "".join(x + "\n" for x in lines))


def plot_curves(merged: Path, out: Path) -> None:
    """The kNN top-1 against the epoch of each run in ``merged`` (``runs.jsonl``): DCL solid, InfoNCE dashed, a
    colour a seed; the curves docs/results.md shows beside the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    curves: dict[str, list[tuple[int, float]]] = {}
    for line in read_bounded(merged, 64 * MAX_METRICS_BYTES).decode(errors="replace").splitlines():
        record = json.loads(line)
        if isinstance(record.get(M.KNN_TOP1), int | float) and isinstance(record.get(M.EPOCH), int):
            curves.setdefault(str(record["run"]), []).append((record[M.EPOCH], float(record[M.KNN_TOP1])))
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in sorted(curves.items()):
        loss, _, seed = name.partition("_s")
        ax.plot(*zip(*sorted(points), strict=True), "-" if loss == "dcl" else "--", marker=".",
                color=f"C{int(seed) if seed.isdigit() else 0}", label=name)
    ax.set(xlabel="epoch", ylabel="kNN top-1 (%)", title="DCL (solid) vs InfoNCE (dashed), one colour a seed")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.legend(fontsize="small")
    fig.tight_layout()
    write_with(out, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


def log_tails(runs: Path, out: Path) -> None:
    """The last :data:`LOG_TAIL` lines of each run's log, then of ``gpu_runs.py``'s own, one after the other."""
    parts = []
    for log in [*sorted(runs.glob("*_s*.log")), runs / "driver.log"]:
        if log.is_file() and not log.is_symlink():
            text = read_bounded(log, 64 * 2**20).decode(errors="replace").splitlines()[-LOG_TAIL:]
            parts.append(f"==> {log.name} <==\n" + "\n".join(text))
    write_text(out, "\n\n".join(parts) + "\n")


def main(argv: list[str] | None = None) -> int:
    """The three steps within the budget; exit 1 if a step failed or was stopped."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the folder every result goes to (8 files)")
    p.add_argument("--data-root", default=None, help="CIFAR-10: a pack (python -m dcl_core.pack) or an ImageFolder")
    p.add_argument("--budget-s", type=float, default=540.0, help="the whole check's seconds")
    p.add_argument("--tests-s", type=float, default=75.0, help="the tests' share")
    p.add_argument("--gpu-s", type=float, default=200.0, help="benchmarks/gpu.py's share")
    p.add_argument("--epochs", type=int, default=10, help="the runs' schedule (stopped at the budget)")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--tests", nargs="+", default=list(TESTS), help="what pytest runs")
    p.add_argument("--tiny", action="store_true", help="toy sizes: the rehearsal on a CPU")
    args = p.parse_args(argv)
    check = Check(args.out, args.budget_s)
    data = ["--data-root", str(Path(args.data_root).resolve())] if args.data_root else []
    check.log(f"GPU check, budget {args.budget_s:g} s; python {sys.version.split()[0]}")
    codes: dict[str, int | None] = {}

    workers = str(min(8, os.cpu_count() or 1))
    codes["tests"] = check.step("tests", [sys.executable, "-m", "pytest", "--noconftest", "-q", "-p",
                                          "no:cacheprovider", "-m", "not slow", "-n", workers, *args.tests],
                                args.tests_s, args.out / "tests.txt",
                                env=_test_env(args.data_root))
    codes["gpu.py"] = check.step("gpu.py", [sys.executable, "benchmarks/gpu.py", "--out", str(args.out),
                                            "--budget-s", str(args.gpu_s), *data, *(["--tiny"] * args.tiny)],
                                 args.gpu_s + 60, args.out / "check.log")

    with tempfile.TemporaryDirectory(prefix="gpu_check_runs_") as tmp:
        runs = Path(tmp)
        sets = [x for kv in TINY_RUN for x in ("--set", kv)] if args.tiny else []
        budget = max(check.left - STOP_S, 0.0)
        codes["runs"] = check.step(
            "runs", [sys.executable, "benchmarks/gpu_runs.py", "--out", str(runs), *data, "--batch", "32",
                     "--seeds", str(args.seeds), "--epochs", str(args.epochs), "--budget-s", f"{budget:.0f}", *sets],
            check.left, runs / "driver.log", every=lambda: merge_runs(runs, args.out / "runs.jsonl"))
        merge_runs(runs, args.out / "runs.jsonl")
        try:
            plot_curves(args.out / "runs.jsonl", args.out / "curves.png")
        except Exception as exc:  # the numbers are in runs.jsonl: a figure that fails is a line, not a lost check
            check.log(f"curves.png: not drawn ({type(exc).__name__}: {exc})")
        log_tails(runs, args.out / "runs_logs.txt")
        if not (runs / "answer.md").is_file():  # stopped before its summary: make it from what the runs wrote
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run([sys.executable, "benchmarks/gpu_runs.py", "--summarize", str(runs)], cwd=REPO,
                               capture_output=True, timeout=60)
        if (runs / "answer.md").is_file():
            write_text(args.out / "answer.md", read_bounded(runs / "answer.md", 2**20).decode())
    failed = [name for name, code in codes.items() if code != 0]
    check.log("done" + (f"; not passed: {', '.join(failed)}" if failed else ", every step exit 0"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
