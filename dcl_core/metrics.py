"""Names of what the trainer reports every epoch: the keys of ``metrics.jsonl``, of Ray Tune's results and
of the MLflow metrics. Declared once here; the trainer writes them, the study and its reports read them."""

KNN_TOP1 = "eval/knn_top1"  # kNN monitor top-1 (%), k=200, its own temperature 0.1
KNN_FRESH = "eval/knn_fresh"  # 1 if this epoch measured the kNN accuracy, 0 if it is carried forward
KNN_SECONDS = "eval/knn_seconds"
LINEAR_TOP1 = "eval/linear_top1"
LINEAR_TRAIN_TOP1 = "eval/linear_train_top1"
EPOCH = "epoch"
TRAIN_LOSS = "train/loss"
LR = "train/lr"
IMAGES_PER_S = "train/images_per_s"
Q_MEAN = "train/q_mean"  # NPC multiplier q_B (DCL Eq. 4), mean over anchors
Q_CV = "train/q_cv"
Q_HIST = "train/q_hist"  # a list (fraction of anchors per q_B bin): an artifact, not a metric
MI_BOUND = "train/mi_bound"  # EqCo's empirical MI lower bound
GRAD_NORM_MEAN = "train/grad_norm_mean"  # DCL Fig. 5's gradient-norm probe
GRAD_NORM_STD = "train/grad_norm_std"
GRAD_NORM_CV = "train/grad_norm_cv"
EPOCH_SECONDS = "time/epoch_seconds"
NUM_NEGATIVES = "derived/num_negatives"  # K, negatives per anchor (config.derive)
EQCO_ALPHA = "derived/eqco_alpha"  # EqCo's α actually used (α = K when unset)
DIVERGED = "diverged"  # 1 in the final report of a trial whose loss became NaN/inf
FAILED = "failed"  # 1 in the final report of a trial that failed the same way twice (not retried)
ERROR = "error"  # that failure's cause, one plain line (a string, not a metric)
