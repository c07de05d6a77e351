"""The results table's columns, declared once: each column's name, type, and where its value comes from (a
config key, a metric of the trial's last report, or computed by :mod:`dcl_core.study.execution.results`).

Everything else is derived from this table: the Parquet/CSV schema, which column a swept config key is shown
in, the short prefixes of trial names, and the names the study code indexes rows with (``row[KNN_TOP1]``, never a
bare ``"knn_top1"``). A new swept hyperparameter is one line here.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from dcl_core import metric_names as M
from dcl_core.config import CONFIG_KEYS

Row = dict[str, Any]  # one trial's results row: column name -> value


class Status(StrEnum):
    """A trial's outcome, the ``status`` column."""

    OK = "ok"
    DIVERGED = "diverged"  # its loss became NaN/inf: it stopped
    ERROR = "error"  # it failed (the same way twice, or for good)


class Column(str):
    """One column of the results table. The column *is* its name (a ``str``), so a row is indexed by the constant:
    ``row[KNN_TOP1]``; rows read back from Parquet, keyed by plain strings, are indexed the same way.

    Attributes:
        type: ``float`` columns are stored as float64; others as their values are.
        key: the config key whose value the column shows.
        metric: the metric (last report of the trial) whose value the column shows.
        x_keys: config keys a study may sweep that are shown in this column (default: ``key``).
        short: the prefix of this column's value in trial names (``t0.1``); ``None``: the key's last part.
        label: the column's name in a cell's label (``τ`` in ``dcl τ=0.1``); ``""``: its value alone (a loss, a
            framework); ``None``: the column's name.
    """

    type: type
    key: str | None
    metric: str | None
    x_keys: tuple[str, ...]
    short: str | None
    label: str | None

    def __new__(cls, name: str, type: builtins.type = str, key: str | None = None, metric: str | None = None,
                x_keys: tuple[str, ...] = (), short: str | None = None, label: str | None = None) -> Column:
        """A column named ``name`` holding values of ``type``, read from config ``key`` or result ``metric``."""
        column = super().__new__(cls, name)
        column.type, column.key, column.metric, column.x_keys, column.short = type, key, metric, x_keys, short
        column.label = label
        return column

    def __getnewargs__(self) -> tuple[str]:  # pickled (a Ray object, a spec) as its name, then its attributes
        return (str(self),)

    @property
    def name(self) -> str:
        """The column's name (the string it is)."""
        return str(self)

    @property
    def swept_by(self) -> tuple[str, ...]:
        """The config keys that vary this column: ``x_keys``, else its own key, else none."""
        return self.x_keys or ((self.key,) if self.key else ())


TRIAL_ID = Column("trial_id", str, metric="trial_id")
STATUS = Column("status", str)  # a Status
SERIES = Column("series", str)  # the table line: the spec's series columns joined by "+"
LOSS = Column("loss", str, key="loss.name", short="", label="")
FRAMEWORK = Column("framework", str, key="framework.name", short="", label="")
METHOD = Column("method", str, label="")  # the loss as a label; EqCo with its α: eqco(α=K)
TEMPERATURE = Column("temperature", float, key="loss.temperature", short="t", label="τ")
BATCH_SIZE = Column("batch_size", int, key="optim.batch_size", short="b", label="batch")
BASE_LR = Column("base_lr", float, key="optim.base_lr", short="lr", label="lr")
SIGMA = Column("sigma", float, key="loss.sigma", short="sig", label="σ")
ALPHA = Column("alpha", float, key="loss.alpha", short="a", label="α")
ALPHA_USED = Column("alpha_used", float, metric=M.EQCO_ALPHA)
NUM_NEGATIVES = Column("num_negatives", int, metric=M.NUM_NEGATIVES,
                       x_keys=("loss.num_negatives", "framework.num_negatives"), short="K", label="K")
QUEUE_SIZE = Column("queue_size", int, key="framework.queue_size", short="Q", label="queue")
SEED = Column("seed", int, key="seed", short="s")
EPOCH_BUDGET = Column("epoch_budget", int, key="optim.epochs", short="ep", label="epochs")
# The generic sweep's (studies/sweep.py) value of a swept config key no other column shows, e.g. optim.weight_decay
SWEPT = Column("swept", float, label="value")
EPOCHS = Column("epochs", int, metric=M.EPOCH)
KNN_TOP1 = Column("knn_top1", float, metric=M.KNN_TOP1)
BEST_KNN_TOP1 = Column("best_knn_top1", float)  # the best kNN accuracy over the trial's reports
TRAIN_LOSS = Column("train_loss", float, metric=M.TRAIN_LOSS)
Q_MEAN = Column("q_mean", float, metric=M.Q_MEAN)
Q_CV = Column("q_cv", float, metric=M.Q_CV)
MI_BOUND = Column("mi_bound", float, metric=M.MI_BOUND)
GRAD_NORM_MEAN = Column("grad_norm_mean", float, metric=M.GRAD_NORM_MEAN)
GRAD_NORM_CV = Column("grad_norm_cv", float, metric=M.GRAD_NORM_CV)
IMAGES_PER_S = Column("images_per_s", float, metric=M.IMAGES_PER_S)
ERROR = Column("error", str)  # the first line of a failed trial's error

COLUMNS: tuple[Column, ...] = (
    TRIAL_ID, STATUS, SERIES, LOSS, FRAMEWORK, METHOD, TEMPERATURE, BATCH_SIZE, BASE_LR, SIGMA, ALPHA, ALPHA_USED,
    NUM_NEGATIVES, QUEUE_SIZE, SEED, EPOCH_BUDGET, SWEPT, EPOCHS, KNN_TOP1, BEST_KNN_TOP1, TRAIN_LOSS, Q_MEAN, Q_CV,
    MI_BOUND, GRAD_NORM_MEAN, GRAD_NORM_CV, IMAGES_PER_S, ERROR,
)
# What makes two trials the same cell of a study, apart from the loss and the seed.
CELL_COLUMNS: tuple[Column, ...] = (FRAMEWORK, TEMPERATURE, BATCH_SIZE, BASE_LR, SIGMA, ALPHA, NUM_NEGATIVES,
                                    QUEUE_SIZE, EPOCH_BUDGET, SWEPT)

COLUMN_NAMES: tuple[str, ...] = tuple(str(c) for c in COLUMNS)
FLOAT_COLUMNS: tuple[str, ...] = tuple(c.name for c in COLUMNS if c.type is float)
# config key -> the column that shows it when a study sweeps it (loss.temperature -> temperature)
X_COLUMN: dict[str, str] = {k: c.name for c in COLUMNS for k in c.swept_by}


def x_column(key: str) -> str:
    """The results column of a swept quantity: a config key's column, :data:`SWEPT` for a config key no column
    shows, or the name itself if it is a column."""
    if key in X_COLUMN or key in COLUMN_NAMES:
        return X_COLUMN.get(key, key)
    return SWEPT.name if key in CONFIG_KEYS else key


def fmt_x(x: Any) -> str:
    """An x value as tables, labels and metric names show it (``0.1``, ``32``, ``dcl``)."""
    return f"{x:g}" if isinstance(x, float) else str(x)


def cell_label(values: Mapping[str, Any]) -> str:
    """A cell in a few characters, from its columns' values in the order given (the swept one first): the
    loss/framework values first, then ``τ=0.1``, ``batch=16`` (:attr:`Column.label`); ``dcl τ=0.1``. MLflow's
    runs table and charts name a group by it, the gap-vs-q_B figure a point."""
    columns = {c.name: c for c in COLUMNS}
    named, valued = [], []
    for name, value in values.items():
        text = fmt_x(value)
        label = columns[name].label if name in columns else None
        if label == "":
            named.append(text)
        else:
            valued.append(f"{name if label is None else label}={text}")
    return " ".join(named + valued)


def short_name(key: str) -> str:
    """The prefix of a config key's value in trial names: the column's ``short``, else the key's last part."""
    for c in COLUMNS:
        if key in c.swept_by and c.short is not None:
            return c.short
    return key.rsplit(".", 1)[-1]
