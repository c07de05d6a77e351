"""``python -m dcl_core.study calibrate``: the verdicts' error rates on simulated studies."""

from __future__ import annotations

from collections.abc import Sequence

from dcl_core import cli_common

MAX_STUDIES = 100_000  # per block: 100 times the default (the time grows in proportion); more is a typo


def calibrate_main(argv: Sequence[str] | None = None) -> int:
    """``python -m dcl_core.study calibrate``: the verdicts' error rates on simulated studies."""
    from dcl_core.study.analysis.calibration import (  # numpy, scipy: not for --help
        GROUP_EFFECTS,
        KINDS,
        SETTINGS,
        calibrate,
        format_group_rows,
        format_report,
        group_row,
    )

    p = cli_common.ArgumentParser(prog="python -m dcl_core.study calibrate",
                                  description="Simulate studies with a known truth through the verdict code and "
                                              "print resolution rates and coverage (the calibration table).")
    p.add_argument("--studies", type=int, default=1000, help="simulated studies per kind × setting × seeds block")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--design", action="store_true",
                   help="instead: --until-resolved's group-sequential design against the fixed design with 80%% "
                        "power at δ (mean seeds, power, error rates; --studies per truth and kind)")
    args = p.parse_args(argv)
    if not 1 <= args.studies <= MAX_STUDIES:
        return cli_common.error(f"--studies must be 1 to {MAX_STUDIES:,}, got {args.studies}")
    if args.seed < 0:
        return cli_common.error(f"--seed must be >= 0 (numpy's seed), got {args.seed}")
    if args.design:
        rows = [group_row(k, args.studies) for k in KINDS if k.name in GROUP_EFFECTS]
        print(f"{args.studies:,} simulated studies per truth and kind ({SETTINGS[0].name}; first look at 3 seeds, "
              "last at the fewest seeds that give the design 80% power at δ)")
        print(format_group_rows(rows))
        return 0
    report = calibrate(studies=args.studies, rng_seed=args.seed)
    n = args.studies * len(SETTINGS)
    print(f"{n:,} simulated studies per cell ({args.studies:,} in each of {len(SETTINGS)} settings: "
          + "; ".join(s.name for s in SETTINGS) + ")")
    print(format_report(report))
    return 0
