"""Names of what the trainer reports every epoch: the keys of ``metrics.jsonl``, of Ray Tune's results and
of the MLflow metrics. Declared once here; the trainer writes them, the study and its reports read them.

A loss names its own diagnostics (``LossOutput.diagnostics``) with the :class:`Diagnostic` keys below, and the
trainer reports each step-averaged as :func:`train_metric` of its key (``q_mean`` -> ``train/q_mean``).
"""


class Diagnostic:
    """Keys of a loss's diagnostics (``LossOutput.diagnostics``), detached scalars computed with the loss."""

    LOSS = "loss"  # the loss itself, reported beside its diagnostics
    Q_MEAN = "q_mean"  # NPC multiplier q_B (DCL Eq. 4), mean over anchors
    Q_STD = "q_std"
    Q_CV = "q_cv"
    MI_BOUND = "mi_bound"  # EqCo's empirical MI lower bound, log(1 + K or α) - loss
    POS_SIM = "pos_sim"  # mean cosine similarity of the positive pairs
    NEG_SIM = "neg_sim"  # mean cosine similarity of the negatives
    WEIGHT_MEAN = "weight_mean"  # DCLW-exp's positive weight
    WEIGHT_STD = "weight_std"  # DCLW's positive weight
    ALIGN = "align"  # Wang & Isola's alignment
    UNIFORM = "uniform"  # and uniformity


def train_metric(diagnostic: str) -> str:
    """The reported name of a loss diagnostic (or of the loss itself, ``loss``): ``train/<key>``."""
    return f"train/{diagnostic}"


KNN_TOP1 = "eval/knn_top1"  # kNN monitor top-1 (%), k=200, its own temperature 0.1
KNN_FRESH = "eval/knn_fresh"  # 1 if this epoch measured the kNN accuracy, 0 if it is carried forward
KNN_SECONDS = "eval/knn_seconds"
LINEAR_TOP1 = "eval/linear_top1"
LINEAR_TRAIN_TOP1 = "eval/linear_train_top1"
EPOCH = "epoch"
TRAIN_LOSS = train_metric(Diagnostic.LOSS)
LR = "train/lr"
IMAGES_PER_S = "train/images_per_s"
Q_MEAN = train_metric(Diagnostic.Q_MEAN)
Q_CV = train_metric(Diagnostic.Q_CV)
MI_BOUND = train_metric(Diagnostic.MI_BOUND)
Q_HIST = "train/q_hist"  # a list (fraction of anchors per q_B bin): an artifact, not a metric
GRAD_NORM_MEAN = "train/grad_norm_mean"  # DCL Fig. 5's gradient-norm probe
GRAD_NORM_STD = "train/grad_norm_std"
GRAD_NORM_CV = "train/grad_norm_cv"
EPOCH_SECONDS = "time/epoch_seconds"
NUM_NEGATIVES = "derived/num_negatives"  # K, negatives per anchor (config.derive)
EQCO_ALPHA = "derived/eqco_alpha"  # EqCo's α actually used (α = K when unset)
DIVERGED = "diverged"  # 1 in the final report of a trial whose loss became NaN/inf
FAILED = "failed"  # 1 in the final report of a trial that failed the same way twice (not retried)
ERROR = "error"  # that failure's cause, one plain line (a string, not a metric)
