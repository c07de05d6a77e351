"""The papers' published numbers, typed in one place: what every study is compared against.

Layout (pure Python, no torch, no Ray):

- :class:`PaperSeries`: one row of a paper's table (one curve), ``values`` = ``{x: y}`` read-only, where x is
  the study's x (τ, batch size, queue size, epochs, σ, K) and y an accuracy in % or an MI bound in nats.
  ``source`` names the table, the row and the column block it was typed from.
- :class:`PaperClaim`: what one study compares against: the paper's series keyed by *our* series names (a
  series of ours with no counterpart in the paper is simply absent), the paper's value of the study's
  headline statistic (``None`` when the paper prints no number for it) and how that value is derived.
- :data:`PAPER`: ``{study name: PaperClaim}``, read with :func:`paper_claim`. A verdict's paper value is
  computed from these series by the question's own statistic over the x values both grids share
  (:meth:`dcl_core.study.analysis.answer.Question.paper`), never typed by hand; ``headline`` is the figure the paper
  itself reports, printed beside it when the two differ.

Every number is typed from the papers' text (DCL = Yeh et al., "Decoupled Contrastive Learning", ECCV 2022,
with its appendix; EqCo = Zhu et al., "EqCo: Equivalent Rules for Self-supervised Contrastive Learning", 2020);
a number the text does not print (e.g. one only drawn in a figure) is left out and the omission is said in the
claim's ``note``.

DCL Table 18's ``Std`` column (temperature sweep): with the sample standard deviation (``ddof = 1``,
:data:`TABLE18_STD_DDOF`) the DCL row's 11 values give 0.982 (reported 0.98; ``ddof = 0`` gives 0.937), but the
SimCLR row's 11 values give 1.869 (``ddof = 0``: 1.782), not the reported 1.44. Both reported values are
reproduced (1.446 and 0.987, to within 0.01; truncated to two decimals exactly) by ``ddof = 1`` over the ten
τ ∈ {0.1, …, 1.0}, i.e. without the τ = 0.07 column (:data:`TABLE18_STD_TAUS`); no other single-column
exclusion and no ``ddof = 0`` variant of it reproduces both rows. The headline keeps the paper's reported
1.44 − 0.98 = 0.46; a study's verdict compares with the same statistic over its own τ (+1.38 over 0.07, 0.2,
0.5, 1.0; ≈ 0.89 over all 11 τ).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dcl_core.study.analysis import measures

X = float | int  # a table's x: τ, batch size, queue size, epochs, σ, K


@dataclass(frozen=True)
class PaperSeries:
    """One row/curve of a paper's table: y values (accuracy %, or nats) by x (τ, batch size, queue size, epochs, σ, K).

    ``values`` may be given as a mapping or as ``(x, y)`` pairs; it is stored as a read-only mapping in x order.
    """

    source: str  # e.g. "DCL Table 18, SimCLR row, CIFAR-10 kNN top-1"
    metric: str  # e.g. "kNN top-1 (%)" / "linear top-1 (%)" / "MI bound (nats)"
    values: Mapping[X, float]

    def __post_init__(self) -> None:
        pairs = self.values.items() if isinstance(self.values, Mapping) else self.values
        object.__setattr__(self, "values", MappingProxyType(dict(sorted((x, float(y)) for x, y in pairs))))


@dataclass(frozen=True)
class PaperClaim:
    """What a study compares against: the paper's series keyed by OUR series name, and the paper's value of the
    study's headline statistic."""

    source: str  # the table(s)
    series: Mapping[str, PaperSeries]  # keys are our series names
    headline: float | None  # the paper's value of the headline statistic (None: the paper gives no number)
    headline_source: str  # how it is derived, e.g. "1.44 − 0.98, Table 18 Std column"
    note: str = ""  # e.g. "ImageNet-100, linear top-1: compare the shape, not the level"
    comparable: bool = True  # False: the series give no like-for-like value of the question (e.g. one shared run)
    compares: str = ""  # what the paper's number compares when that is not what the name says
    decimals: int = 1  # the decimals its tables print: each cell is the paper's number to ±half a unit of the last

    @property
    def rounding(self) -> float:
        """How far a printed cell may lie from the number the paper measured: half a unit of its last decimal."""
        return 0.5 * 10.0**-self.decimals

    def __post_init__(self) -> None:
        object.__setattr__(self, "series", MappingProxyType(dict(self.series)))


def _series(source: str, metric: str, xs: Iterable[X], ys: Iterable[float]) -> PaperSeries:
    return PaperSeries(source, metric, dict(zip(xs, ys, strict=True)))


def _clean(v: float) -> float:
    """Drop binary noise from a difference of one-decimal numbers (4.799999999999997 → 4.8)."""
    return round(v, 9)


def _values(s: PaperSeries | Mapping[X, float]) -> Mapping[X, float]:
    return s.values if isinstance(s, PaperSeries) else s


def gap(better: PaperSeries | Mapping[X, float], base: PaperSeries | Mapping[X, float]) -> dict[X, float]:
    """``better − base`` at every x both have."""
    b, a = _values(better), _values(base)
    return {x: _clean(b[x] - a[x]) for x in sorted(set(b) & set(a))}


def _pair(better: PaperSeries | Mapping[X, float], base: PaperSeries | Mapping[X, float]
          ) -> dict[str, Mapping[X, float]]:
    """Two series as the cell means :mod:`dcl_core.study.analysis.measures` computes statistics of: the paper's
    headline is the same function of its numbers as ours is of our cells."""
    return {"better": _values(better), "base": _values(base)}


def gap_at_smallest(better: PaperSeries | Mapping[X, float], base: PaperSeries | Mapping[X, float]) -> float:
    """``better − base`` at the smallest x both have (NaN if none)."""
    return _clean(measures.gap_at_smallest(_pair(better, base), "better", "base"))


def gap_slope(better: PaperSeries | Mapping[X, float], base: PaperSeries | Mapping[X, float]) -> float:
    """Least-squares slope of ``better − base`` against log2 x over the x both have (per doubling of x)."""
    return _clean(measures.gap_slope(_pair(better, base), "better", "base"))


def std_across(s: PaperSeries | Mapping[X, float], ddof: int = 1, xs: Iterable[X] | None = None) -> float:
    """Standard deviation of a series' values across x (``ddof`` 1 = sample, 0 = population), over ``xs`` if given."""
    v = _values(s)
    return measures.std_across({x: v[x] for x in (v if xs is None else xs)}, ddof=ddof)


def best_gap(better: PaperSeries | Mapping[X, float], base: PaperSeries | Mapping[X, float]) -> float:
    """The best value of ``better`` minus the best of ``base`` (tuned against tuned)."""
    return _clean(measures.best_gap(_pair(better, base), "better", "base"))


# ---------------------------------------------------------------------------------------------------------------
# DCL Table 18 (appendix A.9): kNN top-1 on CIFAR-10 vs τ, batch 512, 500 epochs.
TABLE18_TAUS: tuple[float, ...] = (0.07, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
TABLE18_REPORTED_STD: Mapping[str, float] = MappingProxyType({"infonce": 1.44, "dcl": 0.98})  # the "Std" column
TABLE18_STD_DDOF = 1  # the reported Std is a sample std (see the module docstring)
TABLE18_STD_TAUS: tuple[float, ...] = TABLE18_TAUS[1:]  # the τ the reported Std reproduces over (0.07 excluded)

_T18 = "DCL Table 18 (A.9), CIFAR-10 kNN top-1, batch 512, 500 epochs"
_TEMPERATURE = {
    "infonce": _series(f"{_T18}, row 'SimCLR'", "kNN top-1 (%)", TABLE18_TAUS,
                       (83.6, 87.5, 89.5, 89.2, 88.7, 89.1, 88.5, 87.6, 86.8, 85.9, 85.3)),
    "dcl": _series(f"{_T18}, row 'SimCLR w/ DCL'", "kNN top-1 (%)", TABLE18_TAUS,
                   (88.3, 89.4, 90.8, 89.9, 89.6, 90.3, 89.6, 89.0, 88.5, 88.0, 87.7)),
}

# DCL Table 1, "CIFAR-10 (kNN / Linear)" block: the kNN number (before the slash), ResNet-18, 200 epochs, τ 0.07.
BATCH_SIZES: tuple[int, ...] = (32, 64, 128, 256, 512)
_T1 = "DCL Table 1, CIFAR-10 (kNN / Linear) block, kNN (first) number"
_BATCH = {
    "infonce": _series(f"{_T1}, row 'Baseline (ResNet-18)'", "kNN top-1 (%)", BATCH_SIZES,
                       (78.9, 80.4, 81.1, 81.4, 81.3)),
    "dcl": _series(f"{_T1}, row 'w/ DCL (ResNet-18)'", "kNN top-1 (%)", BATCH_SIZES, (83.7, 84.4, 84.4, 84.2, 83.5)),
}

# DCL Table 5, "ImageNet-100 (Linear)" columns (queue 32 … 8192), MoCo-v2, ResNet-50.
QUEUE_SIZES: tuple[int, ...] = (32, 64, 128, 256, 8192)
_T5 = "DCL Table 5, ImageNet-100 (Linear) columns"
_QUEUE = {
    "infonce": _series(f"{_T5}, row 'MoCo-v2 Baseline (ResNet-50)'", "linear top-1 (%)", QUEUE_SIZES,
                       (73.7, 76.4, 78.7, 78.7, 79.8)),
    "dcl": _series(f"{_T5}, row 'MoCo-v2 w/DCL (ResNet-50)'", "linear top-1 (%)", QUEUE_SIZES,
                   (76.2, 78.3, 79.6, 79.6, 80.5)),
}

# DCL Table 6: ImageNet-1K linear top-1, batch 256 (MoCo-v2 queue 65536); rows "100 Epoch", "200 Epoch".
EPOCHS: tuple[int, ...] = (100, 200)
_T6 = "DCL Table 6, ImageNet-1K linear top-1, rows '100 Epoch'/'200 Epoch'"
_FEW_EPOCHS = {
    "infonce": _series(f"{_T6}, column 'SimCLR'", "linear top-1 (%)", EPOCHS, (57.5, 61.8)),
    "dcl": _series(f"{_T6}, column 'SimCLR w/ DCL'", "linear top-1 (%)", EPOCHS, (64.6, 65.9)),
    "moco+infonce": _series(f"{_T6}, column 'MoCo-v2'", "linear top-1 (%)", EPOCHS, (63.6, 67.5)),
    "moco+dcl": _series(f"{_T6}, column 'MoCo-v2 w/ DCL'", "linear top-1 (%)", EPOCHS, (64.4, 67.7)),
}

# DCL Table 2, column "CIFAR10 (kNN)": DCLW (σ = 0.5, Sec. 4.2) and DCL (σ → ∞, Eq. 7; our σ = 1000).
DCLW_SIGMA = 0.5
DCL_SIGMA = 1000.0
_DCLW = {
    "dclw": _series("DCL Table 2, column 'CIFAR10 (kNN)', rows 'DCLW' (σ = 0.5) and 'DCL' (σ → ∞)",
                    "kNN top-1 (%)", (DCLW_SIGMA, DCL_SIGMA), (84.8, 84.2)),
}

# DCL Table 3 (tuned τ, lr; ImageNet-1K, batch 256, 200 epochs), keyed by τ; SimCLR from Table 2.
_TAU_LR = {
    "infonce": _series("DCL Table 2, row 'SimCLR', column 'ImageNet-1K (linear)' (τ = 0.1, Sec. 4.1)",
                       "linear top-1 (%)", (0.1,), (61.8,)),
    "dcl": _series("DCL Table 3, rows 'DCL' (τ = 0.1, Sec. 4.1) and '+ optimal (τ, lr) = (0.2, 0.07)'",
                   "linear top-1 (%)", (0.1, 0.2), (65.9, 67.8)),
}

# EqCo Sec. 2.3 text (Fig. 3(b)) and Table 2: ImageNet linear top-1, ResNet-50, N = 256 queries, 200 epochs.
_EQCO_NEG = {
    "simclr+eqco(α=256)": _series("EqCo Sec. 2.3 text on Fig. 3(b): SimCLR, K = 256, α = 256 ('from 62.0%')",
                                  "linear top-1 (%)", (256,), (62.0,)),
    "simclr+eqco(α=K)": _series("EqCo Sec. 2.3 text on Fig. 3(b): SimCLR, K = 256 = α ('from 62.0%')",
                                "linear top-1 (%)", (256,), (62.0,)),
    "simo+eqco(α=256)": _series("EqCo Table 2, rows 'SiMo (K=16, α=256)' and 'SiMo (K=256, α=256)', 200 epochs",
                                "linear top-1 (%)", (16, 256), (68.1, 68.0)),
    "simo+eqco(α=K)": _series("EqCo Table 2, row 'SiMo (K=256, α=256)' (α = K), 200 epochs",
                              "linear top-1 (%)", (256,), (68.0,)),
}

# EqCo Table 5: MI bound (nats) by method and true MI, columns K = 64, 128, 256, 512 (α = 512 for EqCo).
PAPER_KS: tuple[int, ...] = (64, 128, 256, 512)
PAPER_TABLE5: Mapping[str, Mapping[int, tuple[float, ...]]] = MappingProxyType({
    "infonce": MappingProxyType({2: (1.7, 1.8, 1.9, 1.9), 4: (2.9, 3.2, 3.4, 3.6), 6: (3.6, 4.1, 4.5, 4.9),
                                 8: (3.9, 4.6, 5.1, 5.6), 10: (4.1, 4.7, 5.4, 6.0)}),
    "eqco": MappingProxyType({2: (1.9, 1.9, 1.9, 1.9), 4: (3.8, 3.7, 3.6, 3.6), 6: (5.1, 5.0, 4.9, 4.9),
                              8: (5.8, 5.7, 5.7, 5.6), 10: (6.1, 6.0, 6.0, 6.0)}),
})
_T5_ROW = {"infonce": "I_NCE", "eqco": "I_EqCo"}
_MI_TOY = {
    f"{method}/MI={mi}": _series(f"EqCo Table 5, block 'Mutual Information = {mi}.0', row '{_T5_ROW[method]}'",
                                 "MI bound (nats)", PAPER_KS, row)
    for method, by_mi in PAPER_TABLE5.items() for mi, row in by_mi.items()
}


def _small_x_claim(source: str, series: Mapping[str, PaperSeries], headline_source: str, note: str) -> PaperClaim:
    """A claim whose headline is DCL's gain over InfoNCE at the smallest x (batch, queue, epochs)."""
    return PaperClaim(source=source, series=series, headline=gap_at_smallest(series["dcl"], series["infonce"]),
                      headline_source=headline_source, note=note)


# ---------------------------------------------------------------------------------------------------------------
PAPER: Mapping[str, PaperClaim] = MappingProxyType({
    "temperature_sweep": PaperClaim(
        source="DCL Table 18 (appendix A.9)",
        series=_TEMPERATURE,
        headline=_clean(TABLE18_REPORTED_STD["infonce"] - TABLE18_REPORTED_STD["dcl"]),
        headline_source="Table 18's Std column (1.44 − 0.98), which reproduces over τ 0.1-1.0 only",
        note="CIFAR-10 kNN top-1, batch 512, 500 epochs (backbone not stated in A.9; the τ = 0.5 cells equal "
             "Table 4's ResNet-50 batch-512 cells, 89.1/90.3). The reported Std reproduces as a sample std "
             "(ddof 1) over τ = 0.1..1.0 only; over all 11 τ the SimCLR row's std is 1.87, not 1.44",
    ),
    "batch_size_sweep": _small_x_claim(
        "DCL Table 1 (CIFAR-10 block)",
        _BATCH,
        headline_source="83.7 − 78.9 at batch 32, Table 1 CIFAR-10 kNN (Sec. 4.2 text: 'outperforms its "
                        "baseline by 4.8%')",
        note="CIFAR-10 kNN top-1, ResNet-18, 200 epochs, τ 0.07. The linear numbers and the ImageNet-1K, "
             "ImageNet-100, CIFAR-100 and STL-10 blocks of Table 1 are not encoded",
    ),
    "queue_size_sweep": _small_x_claim(
        "DCL Table 5 (ImageNet-100 columns)",
        _QUEUE,
        headline_source="76.2 − 73.7 at queue 32, Table 5 ImageNet-100 (Linear)",
        note="ImageNet-100, linear top-1, MoCo-v2, ResNet-50: compare the shape, not the level. Queues 128 and "
             "256 print identical values (78.7 / 79.6) in the text. Not encoded: Table 5's ImageNet-1K (Linear) "
             "columns, queue 64/256/65536: MoCo-v2 63.9/67.1/67.5, w/DCL 65.8/67.6/67.7 (another dataset on "
             "the same x)",
    ),
    "few_epochs": _small_x_claim(
        "DCL Table 6",
        _FEW_EPOCHS,
        headline_source="64.6 − 57.5 at 100 epochs, Table 6 SimCLR w/ DCL minus SimCLR",
        note="ImageNet-1K, linear top-1, ResNet-50, batch 256 (MoCo-v2 queue 65536): compare the shape, not the "
             "level. Fig. 4's CIFAR-10/STL-10 convergence curves give no numbers in the text",
    ),
    "dclw_sigma_sweep": PaperClaim(
        source="DCL Table 2 (CIFAR10 (kNN) column), Eq. 7",
        series=_DCLW,
        headline=_clean(_DCLW["dclw"].values[DCLW_SIGMA] - _DCLW["dclw"].values[DCL_SIGMA]),
        headline_source="84.8 − 84.2: Table 2 CIFAR10 (kNN), DCLW (σ = 0.5) minus DCL",
        note="The paper gives only DCL and DCLW at σ = 0.5 (Sec. 4.2), no σ sweep: σ = 1000 stands for DCL "
             "(lim σ→∞ L_DCW = L_DC). CIFAR-10 kNN top-1, ResNet-18, batch 256, 200 epochs. Not encoded: "
             "Table 2's CIFAR100 (kNN) 54.9/55.2, ImageNet-100 (linear) 83.1/84.2, ImageNet-1K (linear) "
             "65.9/66.9 (DCL/DCLW); A.8's exponential weighting (δ = 3, σ = 0.5: 85.4 kNN) is another "
             "weighting function",
    ),
    "eqco_negatives_sweep": PaperClaim(
        source="EqCo Sec. 2.3 (Fig. 3(b) text) and Table 2",
        series=_EQCO_NEG,
        headline=None,
        headline_source="No number: the α = K curves at small K are only drawn (Figs. 3-4), not printed; the "
                        "only K with both series, 256, is α = K = 256 (the same run, gap 0 by construction)",
        comparable=False,
        note="ImageNet linear top-1, ResNet-50, 200 epochs: compare the shape, not the level. At K = 256, "
             "α = 256 is also α = K. The claim's range: SimCLR/MoCo-type frameworks keep their accuracy with EqCo "
             "for K ≥ 16 (Sec. 1; Sec. 5 concedes MoCo v2 degrades for K ≤ 16), SiMo down to very small K (Sec. 3, "
             "Fig. 4; Sec. 5). Not encoded: SimCLR α = 4096, K = 256 (65.3%); Table 3 (SiMo vs α at "
             "K = 256: 68.0/68.1/68.1/68.4/68.5 for α = 256/1024/4096/16384/65536); Tables 1 and 4 and Fig. 3(a) "
             "(MoCo/MoCo v2, no series of ours)",
    ),
    "tau_lr_search": PaperClaim(
        source="DCL Table 3 (DCL) and Table 2 (SimCLR)",
        series=_TAU_LR,
        headline=best_gap(_TAU_LR["dcl"], _TAU_LR["infonce"]),
        headline_source="67.8 − 61.8: Table 3 tuned DCL minus Table 2 SimCLR (Table 9 prints it: '67.8 (+6.0)')",
        compares="tuned DCL (Table 3) against untuned SimCLR (Table 2, τ 0.1): only DCL was tuned",
        note="ImageNet-1K, linear top-1, ResNet-50, batch 256, 200 epochs, keyed by τ. Only DCL was tuned: "
             "SimCLR is its default τ = 0.1 run, so the paper's gap is tuned DCL vs untuned SimCLR. The lr of "
             "the τ = 0.1 runs is not stated; tuned DCL used lr 0.07. Table 3's '+ asymmetric augmentation' "
             "row (68.2) is not a (τ, lr) result and is not encoded",
    ),
    "lr_in_regime": PaperClaim(
        source="DCL Eq. 4 and Sec. 4 (no table at batch 16, τ 0.07)",
        series={},
        headline=None,
        headline_source="No number: the paper runs neither loss at batch 16 and τ 0.07, nor tunes SimCLR's lr; "
                        "its claim read here is the sign (DCL ahead where q_B ≪ 1, Eq. 4, Fig. 1)",
        comparable=False,
    ),
    "eqco_mi_toy": PaperClaim(
        source="EqCo Table 5",
        series=_MI_TOY,
        headline=None,
        headline_source="No single headline: the claim is that I_EqCo stays flat in K while I_NCE grows with K",
        note="Toy Gaussians, d = 20, α = 512 for EqCo; MI bound in nats, one decimal",
    ),
})

def paper_claim(study: str) -> PaperClaim | None:
    """The paper's numbers a study compares against (``None`` for a study with no counterpart)."""
    return PAPER.get(study)
