"""EqCo's toy mutual-information experiment (EqCo Sec. 3, Table 5), at the paper's full scale.

X ~ N(0, I_d), Y = ρX + √(1−ρ²)ε with d = 20, so I(X; Y) = −(d/2)·log(1−ρ²). Two MLPs g, h (one hidden layer
of 256, ReLU) embed X and Y; the critic is the inner product f(x, y) = g(x)ᵀh(y). Each step samples K pairs,
so every query x_i has its own y_i as positive and the other K−1 as negatives. After 5000 Adam steps
(lr 5e-4) the bound is averaged over 1000 fresh batches:

- InfoNCE: I_NCE = log K − L_NCE (at most log K),
- EqCo with α: I_EqCo = log(1 + α) − L_EqCo, the negatives' sum scaled by α/(K−1) (EqCo Eq. 12, τ = 1).

Both bounds come from the library's own losses (``from_similarities`` with τ = 1 on raw critic scores), so the
toy exercises exactly the code the image studies use.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dcl_core import metric_names as M
from dcl_core.losses import EqCoLoss, InfoNCELoss, PairSimilarities
from dcl_core.study.analysis.mi_toy_answer import TABLE_STEM, TOY, table5_figure, toy_answer
from dcl_core.study.execution import ray_env
from dcl_core.study.plan.storage import atomic_write_text, summary_dir
from dcl_core.study.plan.writers import save_figure, write_rows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToyConfig:
    """One run of EqCo's mutual-information toy: true MI, batch, estimator, critic sizes and optimization."""

    true_mi: float = 2.0
    k: int = 64  # pairs per batch: K−1 negatives per query
    method: str = "infonce"  # or "eqco"
    alpha: float = 512.0
    dim: int = 20
    hidden: int = 256
    embed: int = 32  # critic embedding size (EqCo follows Poole et al.'s separable critic)
    steps: int = 5000
    lr: float = 5e-4
    eval_repeats: int = 1000
    seed: int = 0


def rho_for(mi: float, dim: int) -> float:
    """Correlation giving I(X; Y) = mi for d-dimensional Gaussians: ρ = √(1 − exp(−2·mi/d))."""
    return math.sqrt(1.0 - math.exp(-2.0 * mi / dim))


def sample_pairs(k: int, dim: int, rho: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``k`` Gaussian pairs (x, y) in ``dim`` dimensions with per-coordinate correlation ``rho``."""
    x = torch.randn(k, dim, generator=generator)  # (K, d)
    eps = torch.randn(k, dim, generator=generator)  # (K, d)
    return x, rho * x + math.sqrt(1.0 - rho**2) * eps


def _mlp(dim: int, hidden: int, out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, out))


def critic_similarities(gx: Tensor, hy: Tensor) -> PairSimilarities:
    """Queries x_i against keys y_j: the positive is y_i, the K−1 other y_j are negatives."""
    k = gx.shape[0]
    scores = gx @ hy.T  # (K, K) critic values f(x_i, y_j)
    off = ~torch.eye(k, dtype=torch.bool, device=gx.device)  # (K, K)
    return PairSimilarities(pos=scores.diagonal(), neg=scores[off].view(k, k - 1), pos_batch=scores.diagonal())


def run_toy(cfg: ToyConfig) -> dict[str, Any]:
    """Train the critic and return the averaged MI bound, the final training loss, and the bound of each
    evaluation batch (``bounds``; InfoNCE's and EqCo's runs of one K and seed see the same batches)."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    g, h = _mlp(cfg.dim, cfg.hidden, cfg.embed), _mlp(cfg.dim, cfg.hidden, cfg.embed)
    loss_fn = InfoNCELoss(temperature=1.0) if cfg.method == "infonce" else EqCoLoss(temperature=1.0, alpha=cfg.alpha)
    opt = torch.optim.Adam([*g.parameters(), *h.parameters()], lr=cfg.lr)
    rho = rho_for(cfg.true_mi, cfg.dim)
    for _ in range(cfg.steps):
        x, y = sample_pairs(cfg.k, cfg.dim, rho, gen)
        out = loss_fn.from_similarities(critic_similarities(g(x), h(y)))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
    bounds = []
    with torch.no_grad():
        for _ in range(cfg.eval_repeats):
            x, y = sample_pairs(cfg.k, cfg.dim, rho, gen)
            diagnostics = loss_fn.from_similarities(critic_similarities(g(x), h(y))).diagnostics
            bounds.append(float(diagnostics[M.Diagnostic.MI_BOUND]))
    return {"mi_estimate": sum(bounds) / len(bounds), "final_loss": float(out.loss.detach()), "bounds": bounds}


def toy_configs(mis: tuple[float, ...], ks: tuple[int, ...], steps: int, repeats: int, seeds: int,
                alpha: float) -> list[ToyConfig]:
    """The toy study's runs: every true MI x K x method, with ``seeds`` critics per cell at the largest true MI
    (where the verdict is asked) and one elsewhere."""
    return [ToyConfig(true_mi=mi, k=k, method=m, alpha=alpha, steps=steps, eval_repeats=repeats, seed=seed)
            for mi in mis for seed in range(seeds if mi == max(mis) else 1)
            for k in ks for m in ("infonce", "eqco")]


def _run_one(cfg: ToyConfig) -> dict[str, Any]:
    torch.set_num_threads(1)
    return {"true_mi": cfg.true_mi, "k": cfg.k, "method": cfg.method, "seed": cfg.seed, **run_toy(cfg)}


def dry_run(configs: list[ToyConfig], slots: int) -> str:
    """The runs and an estimate of the study's wall time from a few timed steps per K on this machine."""
    torch.set_num_threads(1)
    top = max(c.true_mi for c in configs)
    seeds = len({c.seed for c in configs if c.true_mi == top})
    lines = [f"dry run of study eqco_mi_toy: {len(configs)} runs (true MI x K x method; {seeds} seeds at true MI "
             f"{top:g}, where the verdict is asked), nothing was started",
             f"  {configs[0].steps} training steps + {configs[0].eval_repeats} evaluation batches each"]
    seconds = 0.0
    for k in sorted({c.k for c in configs}):
        probe = replace(next(c for c in configs if c.k == k), steps=20, eval_repeats=20)
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


def run_toy_study(configs: list[ToyConfig], output_dir: Path, tracking_uri: str, num_cpus: int | None,
                  params: dict[str, Any], ks: tuple[int, ...], quiet: bool = False) -> tuple[str, Path]:
    """Every run of ``configs`` as a Ray task, then the answer: the rows (CSV, Parquet), the plot and ``table.txt``
    in ``summary/eqco_mi_toy/``, logged with ``params`` on the study's MLflow summary run. Returns (the table with
    its verdict, the plot's path). Ray is set up as a study's is (token mode asked for, Ray's own lines off the
    console); ``quiet`` (``-q``): neither Ray's start-up messages nor the MLflow store's set-up lines."""
    if os.environ.get("RAY_ADDRESS"):  # Ray's token mode is read when Ray is first imported: set before
        ray_env.request_token_auth_to_attach()
    else:
        ray_env.request_token_auth()
    import ray  # seconds to import: not for --help or --dry-run

    from dcl_core.study.execution.trial_failures import quiet_ray_lines, shutdown_quietly  # Ray, as above
    from dcl_core.study.execution.tuning import init_ray  # Ray, as above
    from dcl_core.study.tracking import StudyTracker, git_commit  # MLflow: as Ray

    out = summary_dir(output_dir, TOY)
    with quiet_ray_lines():
        init_ray(None, num_cpus, quiet=quiet)
        task = ray.remote(num_cpus=1)(_run_one)
        pending = {task.remote(c): c for c in configs}
        rows = []
        while pending:  # progress as each run finishes
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            cfg, row = pending.pop(ref), ray.get(ref)
            rows.append(row)
            log.info("[%d/%d] %s, true MI %g, K %d: estimate %.2f", len(rows), len(configs), cfg.method,
                     cfg.true_mi, cfg.k, row["mi_estimate"])
        shutdown_quietly()
    if quiet:
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its store's set-up messages
    rows.sort(key=lambda r: (r["true_mi"], r["seed"], r["k"], r["method"]))
    for r in rows:
        r.pop("bounds")
    table, metrics, tags = toy_answer(rows, ks)
    files = [*write_rows(rows, out, TABLE_STEM), save_figure(table5_figure(rows), out / "mi_toy.png")]
    atomic_write_text(out / "table.txt", table + "\n")
    tracker = StudyTracker(tracking_uri, TOY, artifact_root=output_dir / "mlartifacts",
                           tags={"study": TOY, "git_commit": git_commit()}, journal_dir=out).open()
    tracker.log_summary(metrics, [*files, out / "table.txt"], params=params, tags=tags)
    return table, files[-1]
