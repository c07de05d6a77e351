"""Does EqCo make the InfoNCE mutual-information bound independent of the number of negatives? (EqCo Table 5)

EqCo's toy: X ~ N(0, I_20), Y = ρX + √(1−ρ²)ε with true MI −(d/2)·log(1−ρ²) ∈ {2, 4, 6, 8, 10}; two MLPs (one
hidden layer of 256, ReLU) trained with Adam (lr 5e-4, 5000 steps) on batches of K ∈ {64, 128, 256, 512} pairs,
with InfoNCE or EqCo (α = 512); the bound is averaged over 1000 fresh batches. InfoNCE's estimate is capped at
log K and grows with K; EqCo's stays put. Prints our table beside the paper's and logs it (CSV, Parquet, plot)
to MLflow as the study's summary run. The verdict (slope of I_NCE − I_EqCo per doubling of K at the largest true
MI) trains 3 critics per cell there, from different seeds, and takes a t-interval over their slopes: the variance
of training a critic is in it, not only that of the evaluation batches.

    python studies/eqco_mi_toy.py            # the paper's full scale on CPU: 56 runs x 5000 steps, 8.1 min on 2 cores
    python studies/eqco_mi_toy.py --preset paper  # the paper's protocol exactly: one critic per cell (40 runs)
    python studies/eqco_mi_toy.py --smoke    # seconds, for tests
    python studies/eqco_mi_toy.py --dry-run  # the runs and their estimated time (times a few steps), no Ray
"""

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dcl_core import cli
from dcl_core.mi_toy import PAPER_KS, ToyConfig, run_toy

# seeds: critics trained per cell at the largest true MI, where the verdict is asked (each seed's slope is one
# draw of training a critic); the other MIs reproduce Table 5 with one critic each.
# The paper's toy is CPU-sized: ``cpu`` (the default) is its full protocol plus the extra critics the verdict's
# interval needs; ``paper`` is the protocol exactly (one critic per cell).
PRESETS = {
    "smoke": dict(mis=(2, 6), ks=(64, 128), steps=60, repeats=10, seeds=2),
    "cpu": dict(mis=(2, 4, 6, 8, 10), ks=PAPER_KS, steps=5000, repeats=1000, seeds=3),
    "paper": dict(mis=(2, 4, 6, 8, 10), ks=PAPER_KS, steps=5000, repeats=1000, seeds=1),
}


def _run_one(cfg: ToyConfig) -> dict:
    import torch

    torch.set_num_threads(1)
    return {"true_mi": cfg.true_mi, "k": cfg.k, "method": cfg.method, "seed": cfg.seed, **run_toy(cfg)}


def dry_run(configs: list[ToyConfig], slots: int) -> str:
    """The runs and an estimate of the study's wall time from a few timed steps per K on this machine."""
    import torch

    torch.set_num_threads(1)
    top = max(c.true_mi for c in configs)
    seeds = len({c.seed for c in configs if c.true_mi == top})
    lines = [f"dry run of study eqco_mi_toy: {len(configs)} runs (true MI x K x method; {seeds} seeds at true MI "
             f"{top:g}, where the verdict is asked), nothing was started",
             f"  {configs[0].steps} training steps + {configs[0].eval_repeats} evaluation batches each"]
    seconds = 0.0
    for k in sorted({c.k for c in configs}):
        probe = dataclasses.replace(next(c for c in configs if c.k == k), steps=20, eval_repeats=20)
        run_toy(probe)  # warm-up
        t0 = time.perf_counter()
        run_toy(probe)
        per_step = (time.perf_counter() - t0) / 20  # a training step plus (less) an evaluation batch: upper bound
        runs = [c for c in configs if c.k == k]
        seconds += sum(per_step * (c.steps + c.eval_repeats) for c in runs)
        lines.append(f"  K={k}: {len(runs)} runs, ~{per_step * 1e3:.1f} ms per step measured now (1 thread)")
    lines.append(f"cost estimate (timed steps x step counts, {slots} runs at a time, the machine's current load "
                 "included; evaluation batches counted as training steps, Ray start-up not): at most "
                 f"~{seconds / slots / 60:.1f} min wall-clock")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=tuple(PRESETS), default="cpu",
                   help="cpu (default: the paper's scale, 3 critics per cell at MI 10), paper (1 critic per cell) "
                        "or smoke")
    p.add_argument("--smoke", dest="preset", action="store_const", const="smoke")
    p.add_argument("--alpha", type=float, default=512.0, help="EqCo alpha (paper: 512)")
    cli.add_store_options(p, "study folder shared with the other studies: MLflow store, summary/eqco_mi_toy/")
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--dry-run", action="store_true", help="print the runs and an estimated time, then exit")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the answer (table and verdict)")
    args = p.parse_args(argv)
    cli.setup_logging(quiet=args.quiet)
    if not args.alpha > 0:
        return cli.error(f"--alpha must be > 0, got {args.alpha}")
    pr = PRESETS[args.preset]
    configs = [ToyConfig(true_mi=mi, k=k, method=m, alpha=args.alpha, steps=pr["steps"], eval_repeats=pr["repeats"],
                         seed=seed)
               for mi in pr["mis"] for seed in range(pr["seeds"] if mi == max(pr["mis"]) else 1)
               for k in pr["ks"] for m in ("infonce", "eqco")]
    if args.dry_run:
        import os

        print(dry_run(configs, args.num_cpus or os.cpu_count() or 1))
        return 0
    import ray

    from dcl_core.config import ConfigError
    from dcl_core.mi_toy import plot_table5, toy_answer
    from dcl_core.study import init_ray, summary_dir
    from dcl_core.study.report import write_rows
    from dcl_core.study.storage import atomic_write_text, default_tracking_uri
    from dcl_core.study.tracking import StudyTracker, git_commit, preflight

    root = Path(args.output_dir).expanduser().resolve()
    out = summary_dir(root, "eqco_mi_toy")
    uri = args.tracking_uri or default_tracking_uri(root)
    try:
        preflight(uri)
    except ConfigError as err:
        return cli.error(err)
    init_ray(None, args.num_cpus)
    task = ray.remote(num_cpus=1)(_run_one)
    pending = {task.remote(c): c for c in configs}
    rows = []
    while pending:  # progress as each run finishes
        (ref,), _ = ray.wait(list(pending), num_returns=1)
        cfg, row = pending.pop(ref), ray.get(ref)
        rows.append(row)
        logging.info("[%d/%d] %s, true MI %g, K %d: estimate %.2f", len(rows), len(configs), cfg.method,
                     cfg.true_mi, cfg.k, row["mi_estimate"])
    ray.shutdown()
    rows.sort(key=lambda r: (r["true_mi"], r["seed"], r["k"], r["method"]))
    for r in rows:
        r.pop("bounds")
    table, metrics, tags = toy_answer(rows, pr["ks"])
    files = [*write_rows(rows, out, "mi_toy"), plot_table5(rows, out / "mi_toy.png")]
    atomic_write_text(out / "table.txt", table + "\n")
    tracker = StudyTracker(uri, "eqco_mi_toy", artifact_root=root / "mlartifacts",
                           tags={"study": "eqco_mi_toy", "git_commit": git_commit()}, journal_dir=out).open()
    tracker.log_summary(metrics, [*files, out / "table.txt"],
                        params={"alpha": args.alpha, "steps": pr["steps"], "repeats": pr["repeats"],
                                "seeds": pr["seeds"]}, tags=tags)
    if not args.quiet:
        print(f"plot: {files[-1]}\nMLflow: experiment 'eqco_mi_toy' at {uri}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
