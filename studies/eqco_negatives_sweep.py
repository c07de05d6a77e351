r"""Does EqCo keep accuracy steady as the number of negatives K shrinks? (EqCo Fig. 3 SimCLR, Fig. 4 SiMo)

EqCo scales the negatives' sum by α/K (margin τ·log(α/K)), so training with K negatives "mimics" α of them;
without it (α = K, i.e. InfoNCE over the same K negatives) accuracy drops at small K. This study trains SimCLR
(K in-batch negatives sampled per anchor) and SiMo (momentum keys, K sampled per query) at several K, each
with α = K and with α fixed (256, the paper's value), and prints kNN top-1 per (framework, α) across K.
``eqco(α=K)`` is exactly InfoNCE with K negatives (tested identity). One MLflow run per trial plus a summary.

    python studies/eqco_negatives_sweep.py                  # CPU default, 2 cores
    python studies/eqco_negatives_sweep.py --smoke          # for tests
    python studies/eqco_negatives_sweep.py --search optuna  # TPE over α per (framework, K)
    ray job submit --working-dir . -- python studies/eqco_negatives_sweep.py --preset paper \
        --data-root /data/imagenet --gpus-per-worker 1 --workers 8

Work: cpu 2 frameworks × 3 K × 2 α × 3 seeds, 6 epochs each on 2,500 CIFAR-10 images (times: README,
Studies); paper = ImageNet, ResNet-50, batch 256, 200 epochs, K ∈ {16, 32, 64, 128, 256} (SiMo's largest K is
the N−1 = 255 other keys).
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
from search_spaces import ALPHA, PAPER_EQCO_KS, Grid

FIXED_ALPHA = 256.0  # EqCo's fixed α (Figs. 3-4), beside α = K
PRESETS = {
    "smoke": smoke({"optim.epochs": 1, "loss.temperature": 0.2}, axis=(4, 16), samples=2),  # axis: K
    # 2 frameworks x 3 K x 2 alpha on 2,500 images; batch 64 so SiMo has up to 63 keys per query.
    "cpu": cpu({"optim.epochs": 6, "optim.batch_size": 64, "loss.temperature": 0.2, "framework.momentum": 0.99,
                "eval.knn_every": 6}, axis=(4, 16, 63), seeds=3, samples=6),
    # EqCo Figs. 3-4: ImageNet, ResNet-50, N = 256 queries, 200 epochs, tau 0.2, alpha 256.
    "paper": StudyPreset("paper_imagenet", {"loss.temperature": 0.2, "optim.base_lr": 0.03}, axis=PAPER_EQCO_KS),
}


def build_spec(args: StudyArgs) -> StudySpec:
    """The study's spec: SimCLR and SiMo × K × α ∈ {K, fixed} (× seeds on a grid) under the preset."""
    run = preset_run(args, PRESETS, fixed_losses="eqco_negatives_sweep fixes the loss (EqCo, with α = K for the "
                     "InfoNCE baseline)")
    n = run.base.optim.batch_size
    common = {"loss.name": "eqco"}
    if run.grid:  # an Optuna search runs once per (framework, K), seed 0, over α
        common |= {"loss.alpha": Grid((None, FIXED_ALPHA)), "seed": run.seed_axis}
    grids = [
        {"framework.name": "simclr", "loss.num_negatives": Grid(tuple(min(k, 2 * n - 2) for k in run.axis)),
         **common},
        {"framework.name": "simo", "framework.num_negatives": Grid(tuple(min(k, n - 1) for k in run.axis)),
         **common},
    ]
    fixed = format(FIXED_ALPHA, "g")
    pairs = tuple((f"{fw}+eqco(α={fixed})", f"{fw}+eqco(α=K)") for fw in ("simclr", "simo"))
    # The paper's range: SimCLR/MoCo-type frameworks keep accuracy with EqCo for K >= 16 (EqCo Sec. 1, Sec. 5);
    # SiMo's claim reaches very small K (Sec. 3, Fig. 4). Cells below a range are shown, not counted.
    ranges = {"SimCLR": (16, "K ≥ 16, EqCo Sec. 1"), "SiMo": (None, "every K, EqCo Sec. 3")}
    questions = tuple(Question(f"EqCo (α = {fixed}) beats α = K at the smallest K ({fw})", GAP_AT_SMALLEST,
                               better, base, label="gap at smallest K", x_min=ranges[fw][0], range_note=ranges[fw][1])
                      for (better, base), fw in zip(pairs, ("SimCLR", "SiMo"), strict=True))
    return StudySpec(
        pairs=pairs, questions=questions, paper="eqco_negatives_sweep",
        name=args.name, base=run.base, grid=grids, x_key="num_negatives", x_label="K", log_x=True,
        series=("framework", "method"), search=run.space(ALPHA),
        num_samples=run.samples, title="kNN top-1 vs negatives K (EqCo Figs. 3-4)",
    )


if __name__ == "__main__":
    sys.exit(main(__doc__, "eqco_negatives_sweep", build_spec, presets=PRESETS))
