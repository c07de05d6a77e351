"""DCL vs InfoNCE at the paper's scale on one GPU, without Ray: Table 1's smallest batch, paired by seed.

    python benchmarks/gpu_runs.py --out OUT --data-root DIR [--batch 32] [--tau 0.1] [--seeds 2] [--epochs 20]
                                  [--budget-s 420]
    python benchmarks/gpu_runs.py --summarize OUT      # the table and verdict again, from what OUT holds

For a bare GPU machine (torch, torchvision, scipy; no Ray, Optuna or MLflow, so no study script): every
(loss, seed) run is a ``python -m dcl_core.train --preset paper`` process (ResNet-18, full CIFAR-10), all started
at once on the one GPU, with the same schedule (``--epochs``, cosine) and the kNN monitor (k=200, t=0.1) after
every epoch; each writes ``OUT/<loss>_s<seed>/metrics.jsonl`` as it goes. Once ``--budget-s`` is spent the runs
still going are stopped (SIGTERM), so the comparison is made at the last epoch every run finished: kNN top-1 per
epoch and loss, mean q_B (the NPC regime), and the platform's paired verdict on DCL − InfoNCE (by seed, a
t-interval over seeds; :func:`dcl_core.study.analysis.verdicts.verdict` against Table 1's gap at this batch, its
200-epoch value to within its two one-decimal cells' rounding, labelled with the epochs run here). Table 1 trains
at τ 0.07; ``--tau`` defaults to 0.1.

What ``--summarize`` reads is bounded (:data:`MAX_RUNS` run folders, :data:`benchmarks.common.MAX_METRICS_BYTES`
and :data:`MAX_CONFIG_BYTES` a file, regular files only: :func:`dcl_core.files.read_bounded`); what it writes never goes
through a link planted in OUT (:func:`dcl_core.files.write_text`). A folder, file or value that is not what the runs
write is one line, ``error: ...``, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import MAX_METRICS_BYTES  # noqa: E402 - the repository root is on the path from here
from dcl_core import metric_names as M  # noqa: E402
from dcl_core.cli_common import run_command  # noqa: E402
from dcl_core.config import ConfigError  # noqa: E402
from dcl_core.files import open_fd, read_bounded, write_text  # noqa: E402
from dcl_core.study.analysis import paper  # noqa: E402
from dcl_core.study.analysis.answer_output import format_estimate  # noqa: E402
from dcl_core.study.analysis.intervals import paired_difference  # noqa: E402
from dcl_core.study.analysis.verdicts import verdict  # noqa: E402

LOSSES = ("infonce", "dcl")
TABLE1_EPOCHS = 200  # DCL Table 1's CIFAR-10 kNN accuracies are after 200 epochs
RUN = re.compile(r"([a-z]{1,20})_s(\d{1,6})")  # a run's folder in OUT: <loss>_s<seed>
# What --summarize reads, at most (and MAX_METRICS_BYTES of each run's metrics.jsonl, benchmarks/common.py): this
# script starts 2 x --seeds runs; a run's config.json is ~1.2 KB. Larger (or a link, a FIFO, a device): refused unread.
MAX_RUNS = 64
MAX_CONFIG_BYTES = 2**20
NAME = re.compile(r"[\w.+\-]{1,40}")  # an architecture's or a dataset's name as a config says it


def run_all(out: Path, data_root: str | None, batch: int, tau: float, seeds: int, epochs: int, budget_s: float,
            extra: list[str]) -> None:
    """Start every (loss, seed) run at once; stop those still going after ``budget_s`` seconds."""
    procs = []
    for loss in LOSSES:
        for seed in range(seeds):
            cmd = [sys.executable, "-m", "dcl_core.train", "--preset", "paper", "--overwrite",
                   "--set", f"loss.name={loss}", "--set", f"loss.temperature={tau}",
                   "--set", f"optim.batch_size={batch}", "--set", f"optim.epochs={epochs}", "--set", f"seed={seed}",
                   "--set", "eval.knn_every=1", "--set", f"output_dir={out / f'{loss}_s{seed}'}", *extra]
            if data_root:
                cmd += ["--set", f"data.root={data_root}"]
            log = os.fdopen(open_fd(out / f"{loss}_s{seed}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w")
            procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
    end = time.monotonic() + budget_s
    while any(p.poll() is None for p in procs) and time.monotonic() < end:
        time.sleep(2)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()


def _records(path: Path) -> list[dict[str, Any]]:
    """A run's ``metrics.jsonl``, one object an epoch, read bounded; ConfigError naming a line that is not one."""
    records = []
    for n, line in enumerate(read_bounded(path, MAX_METRICS_BYTES).decode(errors="replace").splitlines(), 1):
        if line.strip():
            try:
                record = json.loads(line)
            except ValueError as err:
                raise ConfigError(f"{path}, line {n} is not JSON ({str(err)[:60]}): not a run's metrics") from None
            if not isinstance(record, dict):
                raise ConfigError(f"{path}, line {n} is not a JSON object: not a run's metrics")
            records.append(record)
    return records


def _config(path: Path) -> dict[str, Any]:
    """A run's ``config.json``, read bounded; ConfigError when it is not a JSON object."""
    try:
        config = json.loads(read_bounded(path, MAX_CONFIG_BYTES))
    except ValueError as err:
        raise ConfigError(f"{path} is not JSON ({str(err)[:60]}): not a run's config") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a JSON object: not a run's config")
    return config


def _number(record: dict[str, Any], key: str, where: str, at_most: float = math.inf) -> float | None:
    """``record[key]``, a finite number in [0, ``at_most``], or None when missing; ConfigError for anything else."""
    value = record.get(key)
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and 0 <= value <= at_most):
        raise ConfigError(f"{where}: {key} is {str(value)[:40]!r}, not a number in [0, {at_most:g}]")
    return float(value)


def _what_ran(runs: dict[tuple[str, int], Path]) -> str:
    """The network and data the runs' own ``config.json`` name (``ResNet-18, CIFAR-10, 5,000 images per class``),
    so a run shrunk with ``--set`` is not called the paper's scale."""
    configs = [runs[k] / "config.json" for k in sorted(runs) if os.path.lexists(runs[k] / "config.json")]
    if not configs:
        return "runs without config.json"
    c, where = _config(configs[0]), str(configs[0])
    names = {k: c.get(k) for k in ("model.arch", "data.dataset")}
    for key, value in names.items():
        if not isinstance(value, str) or not NAME.fullmatch(value):
            raise ConfigError(f"{where}: {key} is {str(value)[:40]!r}, not a name")
    per_class = c.get("data.train_per_class")
    if per_class is not None and (isinstance(per_class, bool) or not isinstance(per_class, int) or per_class < 0):
        raise ConfigError(f"{where}: data.train_per_class is {str(per_class)[:40]!r}, not a count")
    width = _number(c, "model.width", where, at_most=1e6)
    images = "all training images" if not per_class else f"{per_class:,} images per class"
    data = f"{names['data.dataset']}, {images}"
    return f"{names['model.arch']}{'' if width in (1.0, None) else f' x{width:g}'}, {data}"


def _runs(out: Path) -> dict[tuple[str, int], Path]:
    """The run folders in ``out`` (``<loss>_s<seed>``, not links), by (loss, seed); ConfigError when ``out`` is not
    a folder or holds more than :data:`MAX_RUNS`."""
    if not out.exists():
        raise ConfigError(f"{out} does not exist: name the folder of the runs (--out of an earlier run)")
    if not out.is_dir():
        raise ConfigError(f"{out} is not a folder: name the folder of the runs (--out of an earlier run)")
    runs = {}
    for folder in sorted(out.iterdir()):
        named = RUN.fullmatch(folder.name)
        if named and folder.is_dir() and not folder.is_symlink() and os.path.lexists(folder / "metrics.jsonl"):
            runs[(named[1], int(named[2]))] = folder
            if len(runs) > MAX_RUNS:
                raise ConfigError(f"{out} holds more than {MAX_RUNS} runs, more than this script starts: not read")
    return runs


def summarize(out: Path, batch: int) -> str:
    """The per-epoch table and the paired verdict from the runs' metrics.jsonl files."""
    runs = _runs(out)
    history = {k: _records(folder / "metrics.jsonl") for k, folder in runs.items()}
    if not history:
        return f"no runs in {out}"
    common = min(len(h) for h in history.values())
    if common == 0:
        return "no run finished an epoch"
    knn = {k: [_number(r, M.KNN_TOP1, f"{runs[k] / 'metrics.jsonl'}, epoch {e + 1}", at_most=100.0)
               for e, r in enumerate(h[:common])] for k, h in history.items()}
    q_mean = {k: _number(h[common - 1], M.Q_MEAN, f"{runs[k] / 'metrics.jsonl'}, epoch {common}", at_most=1.0)
              for k, h in history.items()}
    for k, values in knn.items():
        if values[-1] is None:
            raise ConfigError(f"{runs[k] / 'metrics.jsonl'}: no {M.KNN_TOP1} at epoch {common}, the one the runs "
                              "are compared at (run with --set eval.knn_every=1)")
    lines = [f"DCL vs InfoNCE, {_what_ran(runs)}, batch {batch}: {len(history)} runs, compared at epoch "
             f"{common} (the last every run finished)", "", "| epoch | " + " | ".join(
                 f"{loss} s{seed} kNN" for loss, seed in sorted(history)) + " |",
             "|---|" + "---|" * len(history)]
    for e in range(common):
        cells = ["-" if knn[k][e] is None else f"{knn[k][e]:.2f}" for k in sorted(history)]
        lines.append(f"| {e + 1} | " + " | ".join(cells) + " |")
    at = {k: float(values[-1] or 0.0) for k, values in knn.items()}
    by_loss = {loss: {s: at[(lo, s)] for lo, s in at if lo == loss} for loss in LOSSES}
    q = {loss: [math.nan if v is None else v for k, v in q_mean.items() if k[0] == loss] for loss in LOSSES}
    est = paired_difference(by_loss["dcl"], by_loss["infonce"])
    table1 = paper.paper_claim("batch_size_sweep")  # DCL Table 1, CIFAR-10 kNN, 200 epochs
    delta = None
    if table1 is not None and batch in table1.series["dcl"].values:
        delta = round(table1.series["dcl"].values[batch] - table1.series["infonce"].values[batch], 9)
    paper_gap = ""
    if delta is not None:
        unweighed = f"; a gap at epoch {common} is not weighed against it" if common < TABLE1_EPOCHS else ""
        paper_gap = f" (Table 1, {TABLE1_EPOCHS} epochs: {delta:+.1f}{unweighed})"
    if common < TABLE1_EPOCHS:  # a gap after fewer epochs is another quantity: only its sign is weighed
        delta = None
    spread = 2 * table1.rounding if table1 is not None else 0.0  # a gap of two cells, each printed to ±rounding
    said = str(verdict(est, paper_sign=+1, delta=delta, spread=spread))
    if delta is not None and said != verdict(est, paper_sign=+1, delta=delta):
        said += f" (its table's rounding allows {delta - spread:+.2f} to {delta + spread:+.2f})"
    lines += ["", "mean q_B at that epoch: " + ", ".join(
        f"{loss} {sum(v) / len(v):.3f}" for loss, v in q.items() if v),
              f"DCL − InfoNCE kNN top-1 at epoch {common}: {format_estimate(est, digits=2)} over "
              f"{est.n} seed(s): {said}{paper_gap}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the pairs (or only summarize), print and write ``OUT/answer.md``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="folder of the runs (required unless --summarize)")
    p.add_argument("--summarize", type=Path, default=None, help="only summarize the runs in this folder")
    p.add_argument("--data-root", default=None, help="CIFAR-10: an ImageFolder or a pack (python -m dcl_core.pack)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--tau", type=float, default=0.1)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=20, help="the schedule's length (the same for every run)")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop the runs still going after this long")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more config overrides")
    args = p.parse_args(argv)
    out = args.summarize or args.out
    if out is None:
        p.error("--out is required")

    def body() -> int:
        if args.summarize is None:
            if out.exists() and not out.is_dir():
                raise ConfigError(f"{out} is not a folder: --out names the folder the runs go in")
            out.mkdir(parents=True, exist_ok=True)
            run_all(out, args.data_root, args.batch, args.tau, args.seeds, args.epochs, args.budget_s,
                    [x for kv in args.set for x in ("--set", kv)])
        text = summarize(out, args.batch)
        write_text(out / "answer.md", text + "\n")  # a link planted there is replaced, never written through
        print(text)
        return 0

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
