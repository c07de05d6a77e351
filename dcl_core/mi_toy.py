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

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dcl_core import metrics as M
from dcl_core.losses import EqCoLoss, InfoNCELoss, PairSimilarities
from dcl_core.study.paper import PAPER_KS, PAPER_TABLE5  # EqCo Table 5, typed once (re-exported here)


@dataclass(frozen=True)
class ToyConfig:
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


def _cell_means(rows: list[dict]) -> dict[tuple[str, float, int], float]:
    """``{(method, true MI, K): mean estimate over the cell's critics (seeds)}``."""
    cells: dict[tuple[str, float, int], list[float]] = {}
    for r in rows:
        cells.setdefault((r["method"], r["true_mi"], r["k"]), []).append(r["mi_estimate"])
    return {key: sum(v) / len(v) for key, v in cells.items()}


def format_table5(rows: list[dict], ks: tuple[int, ...]) -> str:
    """Our estimates (the mean over a cell's critics when it has several) beside EqCo Table 5's, one block per
    true MI."""
    est = _cell_means(rows)
    mis = sorted({r["true_mi"] for r in rows})
    lines = ["K".ljust(22) + "".join(f"{k:>14}" for k in ks), " " * 22 + "".join(f"{'ours (paper)':>14}" for _ in ks)]
    for mi in mis:
        lines.append(f"Mutual Information = {mi:g}")
        for method, label in (("infonce", "I_NCE"), ("eqco", "I_EqCo")):
            cells = []
            for k in ks:
                paper = PAPER_TABLE5[method].get(int(mi))
                ref = f"({paper[PAPER_KS.index(k)]:.1f})" if paper and k in PAPER_KS else "(-)"
                cells.append(f"{est.get((method, mi, k), math.nan):.2f} {ref}".rjust(14))
            lines.append(f"  {label:<20}" + "".join(cells))
    return "\n".join(lines)


def plot_table5(rows: list[dict], path):
    """Estimated MI vs K for each true MI, InfoNCE dashed, EqCo solid."""
    from dcl_core.study.report import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(6, 4), dpi=120)
    for i, mi in enumerate(sorted({r["true_mi"] for r in rows})):
        ax.axhline(mi, color=f"C{i}", lw=0.6, alpha=0.4)  # the true MI
        for method, style in (("infonce", "--"), ("eqco", "-")):  # one colour per true MI
            pts = sorted((k, v) for (m, t, k), v in _cell_means(rows).items() if t == mi and m == method)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=f"C{i}", marker="o",
                    label=f"{'InfoNCE' if method == 'infonce' else 'EqCo'}, MI={mi:g}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("K (pairs per batch)")
    ax.set_ylabel("estimated MI (nats)")
    ax.set_title("EqCo Table 5: MI bound vs K (thin lines: true MI)")
    ax.legend(fontsize=6, ncol=2, loc="upper left")
    return save_figure(fig, Path(path))


def toy_verdict(rows: list[dict]) -> Any:
    """EqCo's claim at the largest true MI run: InfoNCE's bound grows with K, EqCo's does not, i.e. the slope of
    (I_NCE − I_EqCo) vs log2 K is positive. Each seed trains its own critics (one per K and method; both methods
    of a seed and K see the same batches), so the interval, a t-interval over seeds of each seed's slope, covers
    the variance of training a critic, not only that of the evaluation batches; one seed: no interval. The paper's
    value is the same slope of Table 5's row at that MI."""
    from dcl_core.study import stats
    from dcl_core.study.answer import Question, Verdict
    from dcl_core.study.paper import paper_claim

    mi = max(r["true_mi"] for r in rows)
    series = {m: f"{m}/MI={mi:g}" for m in ("infonce", "eqco")}
    data: stats.Data = {name: {} for name in series.values()}
    for r in rows:
        if r["true_mi"] == mi and r.get("mi_estimate") is not None:
            data[series[r["method"]]].setdefault(r["k"], {})[int(r.get("seed") or 0)] = r["mi_estimate"]
    q = Question(f"InfoNCE's MI bound grows with K, EqCo's does not (true MI {mi:g})", "gap_slope",
                 series["infonce"], series["eqco"], label="slope of I_NCE − I_EqCo per doubling of K (nats)")
    est = q.estimate(data)
    ks = sorted({k for by_k in data.values() for k in by_k})
    return Verdict(q, est, stats.verdict(est, q.paper_sign), q.paper(paper_claim("eqco_mi_toy"), ks, "K"),
                   stats.seeds_needed(est, est.n))


def toy_answer(rows: list[dict], ks: tuple[int, ...]) -> tuple[str, dict[str, float], dict[str, str]]:
    """What the toy study prints, writes to ``table.txt`` and logs on its summary run: (the table beside EqCo
    Table 5 with the verdict last, the summary metrics, the verdict tags). A pure function of the rows, so
    ``python -m dcl_core.study.answer`` recomputes it from ``mi_toy.parquet``."""
    from dcl_core.study.answer_output import verdict_metrics, verdict_tags

    found = toy_verdict(rows)
    mi = max(r["true_mi"] for r in rows)
    seeds = len({r.get("seed") or 0 for r in rows if r["true_mi"] == mi})
    head = (f"Verdict (t-interval over {seeds} critic(s) per cell at true MI {mi:g}, trained from different seeds: "
            "each seed's slope, its bound averaged over its evaluation batches; decided by its 95% CI alone)")
    table = "\n\n".join([format_table5(rows, ks), f"{head}\n{found.line()}"])
    metrics = {f"{m}/mi{t:g}/K{k}": v for (m, t, k), v in _cell_means(rows).items()}
    return table, metrics | verdict_metrics(0, found), verdict_tags([found])
