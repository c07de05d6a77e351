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
t-interval over seeds; :func:`dcl_core.study.analysis.stats.verdict` against Table 1's gap at this batch, its
200-epoch value, labelled with the epochs run here). Table 1 trains at τ 0.07; ``--tau`` defaults to 0.1.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dcl_core import metric_names as M  # noqa: E402 - the repository root is on the path from here
from dcl_core.study.analysis import paper  # noqa: E402
from dcl_core.study.analysis.stats import format_estimate, paired_difference, verdict  # noqa: E402

LOSSES = ("infonce", "dcl")


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
            log = (out / f"{loss}_s{seed}.log").open("w")
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


def _what_ran(out: Path) -> str:
    """The network and data the runs' own ``config.json`` name (``ResNet-18, CIFAR-10, 5,000 images per class``),
    so a run shrunk with ``--set`` is not called the paper's scale."""
    configs = [json.loads(p.read_text()) for p in sorted(out.glob("*_s*/config.json"))]
    if not configs:
        return "runs without config.json"
    c = configs[0]
    per_class = c.get("data.train_per_class")
    images = "all training images" if not per_class else f"{per_class:,} images per class"
    data = f"{c.get('data.dataset')}, {images}"
    width = "" if c.get("model.width") in (1, 1.0, None) else f" x{c['model.width']:g}"
    return f"{c.get('model.arch')}{width}, {data}"


def summarize(out: Path, batch: int) -> str:
    """The per-epoch table and the paired verdict from the runs' metrics.jsonl files."""
    history: dict[tuple[str, int], list[dict[str, float]]] = {}
    for path in sorted(out.glob("*_s*/metrics.jsonl")):
        loss, seed = path.parent.name.rsplit("_s", 1)
        history[(loss, int(seed))] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not history:
        return f"no runs in {out}"
    common = min(len(h) for h in history.values())
    if common == 0:
        return "no run finished an epoch"
    lines = [f"DCL vs InfoNCE, {_what_ran(out)}, batch {batch}: {len(history)} runs, compared at epoch "
             f"{common} (the last every run finished)", "", "| epoch | " + " | ".join(
                 f"{loss} s{seed} kNN" for loss, seed in sorted(history)) + " |",
             "|---|" + "---|" * len(history)]
    for e in range(common):
        cells = [f"{history[k][e].get(M.KNN_TOP1, math.nan):.2f}" for k in sorted(history)]
        lines.append(f"| {e + 1} | " + " | ".join(cells) + " |")
    at = {k: h[common - 1] for k, h in history.items()}
    knn = {loss: {s: at[(lo, s)][M.KNN_TOP1] for lo, s in at if lo == loss} for loss in LOSSES}
    q = {loss: [at[(lo, s)].get("train/q_mean", math.nan) for lo, s in at if lo == loss] for loss in LOSSES}
    est = paired_difference(knn["dcl"], knn["infonce"])
    table1 = paper.paper_claim("batch_size_sweep")  # DCL Table 1, CIFAR-10 kNN, 200 epochs
    delta = None
    if table1 is not None and batch in table1.series["dcl"].values:
        delta = table1.series["dcl"].values[batch] - table1.series["infonce"].values[batch]
    said = verdict(est, paper_sign=+1, delta=delta)
    lines += ["", "mean q_B at that epoch: " + ", ".join(
        f"{loss} {sum(v) / len(v):.3f}" for loss, v in q.items() if v),
              f"DCL − InfoNCE kNN top-1 at epoch {common}: {format_estimate(est, digits=2)} over "
              f"{est.n} seed(s): {said}" + (f" (Table 1, 200 epochs: {delta:+.1f})" if delta is not None else "")]
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
    if args.summarize is None:
        out.mkdir(parents=True, exist_ok=True)
        run_all(out, args.data_root, args.batch, args.tau, args.seeds, args.epochs, args.budget_s,
                [x for kv in args.set for x in ("--set", kv)])
    text = summarize(out, args.batch)
    (out / "answer.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
