r"""Does DCL reach a given accuracy in fewer epochs than InfoNCE? (DCL paper, Table 6 and Fig. 4)

The paper trains SimCLR and MoCo-v2 with and without DCL for 100 and 200 epochs (ImageNet-1K, batch 256):
SimCLR + DCL at 100 epochs (64.6%) nearly matches its 200-epoch result, while the SimCLR baseline drops to
57.5%. This study trains InfoNCE and DCL at several epoch budgets (each a full warm-up + cosine schedule, as a
shorter training run is, not a truncated longer one), prints kNN top-1 per (loss, budget) with the
DCL − InfoNCE gap, and logs every trial's per-epoch kNN curve to MLflow (compare runs for Fig. 4).

    python studies/few_epochs.py                  # CPU default, 2 cores
    python studies/few_epochs.py --smoke          # for tests
    python studies/few_epochs.py --set framework.name=moco --set framework.momentum=0.99   # MoCo-v2 instead
    ray job submit --working-dir . -- python studies/few_epochs.py --preset paper --data-root /data/imagenet \
        --gpus-per-worker 1 --workers 8

Work: cpu 2 losses × budgets {2, 4, 8} × 3 seeds on 2,500 CIFAR-10 images (times: README, Studies); paper =
ImageNet-1K, ResNet-50, batch 256, SimCLR and MoCo-v2 (queue 65536) × {100, 200} epochs.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dcl_core.study import StudySpec
from dcl_core.study.analysis.answer import Question
from dcl_core.study.analysis.measures import GAP_AT_SMALLEST
from dcl_core.study.cli.script import main, preset_run
from dcl_core.study.plan.args import StudyArgs
from dcl_core.study.plan.study_presets import StudyPreset, cpu, smoke
from search_spaces import LR, TAU, Grid

PRESETS = {
    "smoke": smoke({"optim.warmup_epochs": 0.0}, axis=(1, 2), samples=2),  # axis: epoch budget
    "cpu": cpu({"optim.batch_size": 32, "loss.temperature": 0.1}, axis=(2, 4, 8), seeds=3, samples=6),
    # Table 6: SimCLR (tau 0.1, lr 0.3) and MoCo-v2 (queue 65536, tau 0.2, lr 0.03), 100 and 200 epochs.
    "paper": StudyPreset("paper_imagenet", axis=(100, 200),
                         variants=({"framework.name": "simclr"},
                                   {"framework.name": "moco", "framework.queue_size": 65536,
                                    "loss.temperature": 0.2, "optim.base_lr": 0.03})),
}


def build_spec(args: StudyArgs) -> StudySpec:
    """The study's spec: losses × epoch budgets (× seeds on a grid) per framework variant under the preset."""
    run = preset_run(args, PRESETS)
    grids = []
    for fw in run.preset.variants:
        grid = {**fw, "loss.name": Grid(run.losses), "optim.epochs": Grid(run.axis)}
        if run.grid:  # an Optuna search runs once per (loss, budget), seed 0
            grid["seed"] = run.seed_axis
        grids.append(grid)
    prefix = "simclr+" if len(grids) > 1 else ""
    question = Question("DCL beats InfoNCE at the smallest epoch budget", GAP_AT_SMALLEST, f"{prefix}dcl",
                        f"{prefix}infonce", label="gap at smallest budget")
    return StudySpec(
        questions=(question,), paper="few_epochs",
        name=args.name, base=run.base, grid=grids if len(grids) > 1 else grids[0], x_key="optim.epochs",
        x_label="epochs", log_x=True, gap=True, series=("framework", "loss") if len(grids) > 1 else ("loss",),
        search=run.space({**TAU, **LR}), num_samples=run.samples,
        title="kNN top-1 vs epoch budget (DCL Table 6)",
    )


if __name__ == "__main__":
    sys.exit(main(__doc__, "few_epochs", build_spec, presets=PRESETS))
