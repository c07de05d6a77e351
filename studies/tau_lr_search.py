r"""Which (τ, lr) pair is best for each loss? (DCL paper, Table 3: tuned (τ, lr) = (0.2, 0.07) for DCL)

A seeded Optuna TPE search over τ (log-uniform 0.05–1) and base lr (log-uniform 0.003–0.3) per loss, run by
Ray Tune; ``--asha`` stops poor trials early (the kNN monitor runs every epoch so ASHA can compare them).
Prints the best pair per loss, and logs Optuna's optimisation-history and hyperparameter-importance plots with
the results table to the study's MLflow summary run (one MLflow run per trial as well).

    python studies/tau_lr_search.py                  # CPU default, 2 cores
    python studies/tau_lr_search.py --asha           # the same budget, poor trials stopped early
    python studies/tau_lr_search.py --smoke          # for tests
    ray job submit --working-dir . -- python studies/tau_lr_search.py --preset paper --data-root /data/imagenet \
        --gpus-per-worker 1 --workers 8

Work: cpu 2 losses × 10 trials × 6 epochs on 2,500 CIFAR-10 images (times: README, Studies); paper = ImageNet-1K,
ResNet-50, batch 256, 200 epochs, 30 trials per loss.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dcl_core.study import StudySpec
from dcl_core.study.analysis.answer import Question
from dcl_core.study.analysis.measures import BEST_GAP
from dcl_core.study.cli.script import main, preset_run
from dcl_core.study.plan.args import StudyArgs
from dcl_core.study.plan.study_presets import StudyPreset, cpu, smoke
from search_spaces import LR, TAU, Grid

PRESETS = {  # an Optuna search: no axis, no seeds (each loss's search runs seed 0)
    "smoke": smoke({"optim.epochs": 2}, samples=3),
    # lr is searched: the shared CPU protocol without its base lr.
    "cpu": cpu({"optim.epochs": 6, "optim.batch_size": 32, "eval.knn_every": 1}, without=("optim.base_lr",),
               samples=10),
    # Table 3: ImageNet-1K, batch 256, 200 epochs (kNN every 10 epochs is what ASHA compares there).
    "paper": StudyPreset("paper_imagenet", samples=30),
}


def build_spec(args: StudyArgs) -> StudySpec:
    """The study's spec: an Optuna search over τ and learning rate for each loss under the preset."""
    run = preset_run(args, PRESETS, only_search=("optuna", "tau_lr_search is an Optuna search; for a τ grid run "
                                                         "studies/temperature_sweep.py"))
    return StudySpec(
        name=args.name, base=run.base, grid={"loss.name": Grid(run.losses)},
        x_key="loss.temperature", x_label="tau", log_x=True, search={**TAU, **LR}, paper="tau_lr_search",
        questions=(Question("tuned DCL beats tuned InfoNCE", BEST_GAP, "dcl", "infonce", label="best gap"),),
        num_samples=run.samples, title="Optuna trials: kNN top-1 vs τ (DCL Table 3)",
    )


if __name__ == "__main__":
    sys.exit(main(__doc__, "tau_lr_search", build_spec, defaults={"search": "optuna"},
                  presets=PRESETS))
