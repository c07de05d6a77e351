"""Your own sweep: any numeric config key over the values you give, for the losses you name, with the seeds,
intervals and verdicts of every study.

No paper stands behind the question, so the verdict speaks of your claim: "supports the claim", "contradicts the
claim", "rules out an effect of δ" (δ from --effect-of-interest) or "not resolved". The claim is a statistic of
two series (--compare BETTER,BASE, default: the first two losses) chosen with --statistic: best_gap (tuned against
tuned: each series at its best value; the default), gap_at (with --at), gap_at_smallest, gap_slope (per doubling)
or std_difference (BASE's std across the values minus BETTER's: BETTER flatter).

    python studies/sweep.py --smoke --key loss.temperature --values 0.1,0.5 --losses my_losses.py:MyLoss,dcl
    python studies/sweep.py --key optim.batch_size --values 16,32,64 --losses my_losses.py:MyLoss,dcl,infonce
        --compare MyLoss,dcl --statistic gap_at_smallest --seeds 5 --until-resolved --max-seeds 20   # one line
    python studies/sweep.py --key optim.weight_decay --values 0,1e-4,1e-3 --dry-run

It ends like every study: per-cell 95% CIs, BETTER − BASE paired by seed, the cells' q_B regime and the verdict;
`python -m dcl_core.study answer OUTPUT_DIR` re-asks it from the stored results. Docs: docs/own-loss.md.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dcl_core.config import Config, ConfigError, apply_overrides, loss_label, to_flat_dict
from dcl_core.study import StudySpec
from dcl_core.study.analysis.answer import Question
from dcl_core.study.analysis.measures import BEST_GAP
from dcl_core.study.cli.script import main, preset_run
from dcl_core.study.plan.args import StudyArgs
from dcl_core.study.plan.questions import claim_text
from dcl_core.study.plan.study_presets import cpu, smoke
from search_spaces import Grid

# Per preset: the base config, seeds and losses; the axis is --key and --values. The claim is the first loss's
# against the second's: with --losses, yours first.
YOURS_FIRST = ("dcl", "infonce")
PRESETS = {
    "smoke": smoke({"optim.epochs": 1, "optim.batch_size": 32}, seeds=1, losses=YOURS_FIRST),
    # The shared CPU protocol of the papers' studies (5 epochs, batch 32, kNN after the last epoch), 5 seeds.
    "cpu": cpu({"optim.epochs": 5, "optim.batch_size": 32, "eval.knn_every": 5}, seeds=5, losses=YOURS_FIRST),
}
NOT_SWEPT = ("loss.name", "seed", "output_dir", "device")  # a loss is --losses, a seed --seeds
MAX_VALUES = 64


def axis(args: StudyArgs, base: Config) -> tuple[str, tuple[float, ...]]:
    """``--key`` and its ``--values``, each value parsed and checked by the config as ``--set`` would be."""
    if not args.key or not args.values:
        raise ConfigError("the sweep needs --key (a config key, e.g. optim.batch_size) and --values (e.g. 16,32,64)")
    key = args.key.strip()
    if key in NOT_SWEPT:
        raise ConfigError(f"--key {key}: sweep it with {'--losses' if key == 'loss.name' else '--seeds'} instead"
                          if key in ("loss.name", "seed") else f"--key {key} cannot be swept")
    texts = [v.strip() for v in args.values.split(",") if v.strip()]
    values = []
    for text in texts:
        try:
            value = to_flat_dict(apply_overrides(base, {key: text}))[key]  # as --set would parse and check it
        except ConfigError as err:
            raise ConfigError(f"--key/--values: {err}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"--key {key} is not a number ({text!r}): the sweep's statistics need ordered values")
        values.append(value)
    values = list(dict.fromkeys(values))
    if not 2 <= len(values) <= MAX_VALUES:
        raise ConfigError(f"--values: give 2 to {MAX_VALUES} different values of {key}, got {len(values)}")
    return key, tuple(sorted(values))


def build_spec(args: StudyArgs) -> StudySpec:
    """The losses × --values of --key × seeds, asking the claim --compare/--statistic state (tuned against tuned by
    default) of the first two losses."""
    run = preset_run(args, PRESETS, only_search=("grid", "the sweep runs the values given: drop --search optuna "
                                                       "(tau_lr_search.py searches)"))
    key, values = axis(args, run.base)
    losses = run.losses
    grid = {"loss.name": Grid(losses), "seed": run.seed_axis, key: Grid(values)}
    label = key.rsplit(".", 1)[-1]
    questions = ()
    if len(losses) >= 2:
        better, base_series = loss_label(losses[0]), loss_label(losses[1])
        questions = (Question(claim_text("best_gap", better, base_series, label), BEST_GAP, better, base_series,
                              label="best gap", own=True),)
    return StudySpec(name=args.name, base=run.base, grid=grid, x_key=key, x_label=label, questions=questions,
                     log_x=min(values) > 0 and max(values) / min(values) >= 16, title=f"kNN top-1 vs {key}")


if __name__ == "__main__":
    sys.exit(main(__doc__, "sweep", build_spec, presets=PRESETS, extra=("key", "values")))
