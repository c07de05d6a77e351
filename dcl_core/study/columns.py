"""The results table's columns, declared once: each column's name, type, and where its value comes from (a
config key, a metric of the trial's last report, or computed by :mod:`dcl_core.study.results`).

Everything else is derived from this table: the Parquet/CSV schema, which column a swept config key is shown
in, and the short prefixes of trial names. A new swept hyperparameter is one line here.
"""

from __future__ import annotations

from dataclasses import dataclass

from dcl_core import metrics as M


@dataclass(frozen=True)
class Column:
    """One column of the results table.

    Attributes:
        name: the column's name (Parquet/CSV header, row key).
        type: ``float`` columns are stored as float64; others as their values are.
        key: the config key whose value the column shows.
        metric: the metric (last report of the trial) whose value the column shows.
        x_keys: config keys a study may sweep that are shown in this column (default: ``key``).
        short: the prefix of this column's value in trial names (``t0.1``); ``None``: the key's last part.
    """

    name: str
    type: type = str
    key: str | None = None
    metric: str | None = None
    x_keys: tuple[str, ...] = ()
    short: str | None = None

    @property
    def swept_by(self) -> tuple[str, ...]:
        return self.x_keys or ((self.key,) if self.key else ())


COLUMNS: tuple[Column, ...] = (
    Column("trial_id", str, metric="trial_id"),
    Column("status", str),  # ok / diverged / error
    Column("series", str),  # the table line: the spec's series columns joined by "+"
    Column("loss", str, key="loss.name", short=""),
    Column("framework", str, key="framework.name", short=""),
    Column("method", str),  # the loss as a label; EqCo with its α: eqco(α=K)
    Column("temperature", float, key="loss.temperature", short="t"),
    Column("batch_size", int, key="optim.batch_size", short="b"),
    Column("base_lr", float, key="optim.base_lr", short="lr"),
    Column("sigma", float, key="loss.sigma", short="sig"),
    Column("alpha", float, key="loss.alpha", short="a"),
    Column("alpha_used", float, metric=M.EQCO_ALPHA),
    Column("num_negatives", int, metric=M.NUM_NEGATIVES, x_keys=("loss.num_negatives", "framework.num_negatives"),
           short="K"),
    Column("queue_size", int, key="framework.queue_size", short="Q"),
    Column("seed", int, key="seed", short="s"),
    Column("epoch_budget", int, key="optim.epochs", short="ep"),
    Column("epochs", int, metric=M.EPOCH),
    Column("knn_top1", float, metric=M.KNN_TOP1),
    Column("best_knn_top1", float),  # the best kNN accuracy over the trial's reports
    Column("train_loss", float, metric=M.TRAIN_LOSS),
    Column("q_mean", float, metric=M.Q_MEAN),
    Column("q_cv", float, metric=M.Q_CV),
    Column("mi_bound", float, metric=M.MI_BOUND),
    Column("grad_norm_mean", float, metric=M.GRAD_NORM_MEAN),
    Column("grad_norm_cv", float, metric=M.GRAD_NORM_CV),
    Column("images_per_s", float, metric=M.IMAGES_PER_S),
    Column("error", str),  # the first line of a failed trial's error
)

COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)
FLOAT_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.type is float)
# config key -> the column that shows it when a study sweeps it (loss.temperature -> temperature)
X_COLUMN: dict[str, str] = {k: c.name for c in COLUMNS for k in c.swept_by}


def x_column(key: str) -> str:
    """The results column of a swept quantity: a config key's column, or the name itself if it is a column."""
    return X_COLUMN.get(key, key)


def short_name(key: str) -> str:
    """The prefix of a config key's value in trial names: the column's ``short``, else the key's last part."""
    for c in COLUMNS:
        if key in c.swept_by and c.short is not None:
            return c.short
    return key.rsplit(".", 1)[-1]
