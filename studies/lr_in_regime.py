"""Does DCL's deficit in the NPC regime survive tuning each loss's learning rate? (DCL Eq. 4; follows Table 18)

In the `cpu_long` temperature study (batch 16, 40 epochs) the τ = 0.07 cells are the only ones where InfoNCE's
q_B falls to ~0.6, and there DCL trailed InfoNCE at the same learning rate. DCL's gradient is InfoNCE's divided by
q_B (DCL Eq. 4), so at q_B ≈ 0.6 DCL takes ~1.7× larger steps: a shared lr may favour one loss. This study runs
that cell (batch 16, τ 0.07, 40 epochs, the CPU protocol) for both losses at base lr 0.12, 0.24 (the cpu_long
value) and 0.48, and compares each loss at its best lr (tuned against tuned). The paper reports no run at this
batch and τ: its sign (DCL ahead) is what the verdict is read against.

    python studies/lr_in_regime.py                   # CPU default: 2 seeds
    python studies/lr_in_regime.py --preset cpu_long  # 5 seeds (docs/results.md)
    python studies/lr_in_regime.py --until-resolved --max-minutes 90   # seeds until resolved
    python studies/lr_in_regime.py --smoke            # for tests
    python studies/lr_in_regime.py --dry-run          # the trials and their estimated cost, nothing run

It ends with the answer: per-cell 95% CIs with q_B (each loss's best lr is its highest row mean), DCL − InfoNCE
paired by seed at each lr, and two verdicts: tuned DCL − tuned InfoNCE (best lr each; paired t bounds corrected
for picking the best of 3 lrs, calibrated by simulated studies) and DCL − InfoNCE at the shared lr 0.24.

Work: each trial is one cpu_long cell, 2 at a time on 2 cores: cpu_long 30 trials (2 losses × 3 lrs × 5 seeds), cpu
12 trials (× 2 seeds); measured times: the README's studies table. The paper protocol has no such run (a ResNet-18
at batch 16 for 500 epochs would be the analogue; not offered).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dcl_core.study import StudySpec
from dcl_core.study.analysis.answer import Question
from dcl_core.study.analysis.measures import BEST_GAP, GAP_AT
from dcl_core.study.cli.script import main, preset_run
from dcl_core.study.plan.args import StudyArgs
from dcl_core.study.plan.study_presets import cpu, smoke
from search_spaces import Grid

SHARED_LR = 0.24  # the CPU protocol's base lr, at which cpu_long ran both losses
# The regime cell of the cpu_long temperature study: batch 16, τ 0.07, 40 epochs, kNN every 10; the lr is the axis.
REGIME = {"optim.epochs": 40, "optim.batch_size": 16, "loss.temperature": 0.07, "eval.knn_every": 10}
LRS = (0.12, SHARED_LR, 0.48)  # half, the same and twice the shared lr: DCL's steps are ~1.7x InfoNCE's here

PRESETS = {
    "smoke": smoke({"optim.epochs": 1, "optim.batch_size": 16, "loss.temperature": 0.07},
                   axis=(0.12, SHARED_LR)),
    "cpu": cpu(REGIME, without=("optim.base_lr",), axis=LRS, seeds=2),
    "cpu_long": cpu(REGIME, without=("optim.base_lr",), axis=LRS, seeds=5),
}


def build_spec(args: StudyArgs) -> StudySpec:
    """The study's spec: losses × base learning rates × seeds under the preset."""
    run = preset_run(args, PRESETS, only_search=("grid", "lr_in_regime is a grid over base lr; for an Optuna search "
                                                       "run studies/tau_lr_search.py"))
    grid = {"loss.name": Grid(run.losses), "optim.base_lr": Grid(run.axis), "seed": run.seed_axis}
    questions = (
        Question("tuned DCL beats tuned InfoNCE in the regime (best lr each)", BEST_GAP, "dcl", "infonce",
                 label="best gap"),
        Question(f"DCL beats InfoNCE at the shared lr {SHARED_LR:g}", GAP_AT, "dcl", "infonce", at_x=SHARED_LR,
                 label=f"gap at lr {SHARED_LR:g}", paper_key="gap_at"),
    )
    return StudySpec(
        name=args.name, base=run.base, grid=grid, x_key="optim.base_lr", x_label="base lr",
        log_x=True, gap=True, questions=questions, paper="lr_in_regime",
        title="kNN top-1 vs base lr at batch 16, τ 0.07 (NPC regime)",
    )


if __name__ == "__main__":
    sys.exit(main(__doc__, "lr_in_regime", build_spec, presets=PRESETS))
