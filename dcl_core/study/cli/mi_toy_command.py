"""The EqCo MI toy's command line (``studies/eqco_mi_toy.py``): its presets, α, where the results go."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from dcl_core import cli_common
from dcl_core.config import ConfigError
from dcl_core.files import real_path
from dcl_core.study.plan.storage import default_tracking_uri


def toy_main(doc: str, presets: Mapping[str, Mapping[str, Any]], argv: Sequence[str] | None = None) -> int:
    """The MI toy study's command line: its presets (true MIs, Ks, steps, evaluation batches, seeds), α, where the
    results go; ``--dry-run`` times a few steps instead."""
    p = cli_common.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=tuple(presets), default="cpu",
                   help="cpu (default: the paper's scale, 3 critics per cell at MI 10), paper (1 critic per cell) "
                        "or smoke")
    p.add_argument("--smoke", dest="preset", action="store_const", const="smoke")
    p.add_argument("--alpha", type=float, default=512.0, help="EqCo alpha (paper: 512)")
    cli_common.add_store_options(p, "study folder shared with the other studies: MLflow store, summary/eqco_mi_toy/")
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--dry-run", action="store_true", help="print the runs and an estimated time, then exit")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the answer (table and verdict)")
    args = p.parse_args(argv)
    cli_common.setup_logging(quiet=args.quiet)
    if not (args.alpha > 0 and math.isfinite(args.alpha)):
        return cli_common.error(f"--alpha must be a finite number > 0, got {args.alpha}")
    from dcl_core.study.execution import mi_toy_runs  # torch: not for --help or a bad argument

    pr = presets[args.preset]
    configs = mi_toy_runs.toy_configs(pr["mis"], pr["ks"], pr["steps"], pr["repeats"], pr["seeds"], args.alpha)
    if args.dry_run:
        print(mi_toy_runs.dry_run(configs, args.num_cpus or os.cpu_count() or 1))
        return 0
    # MLflow (seconds): not for --help, a bad argument or a dry run
    from dcl_core.study.tracking import preflight

    try:
        root = real_path(args.output_dir)
        uri = args.tracking_uri or default_tracking_uri(root)
        preflight(uri)
    except ConfigError as err:
        return cli_common.error(err)
    params = {"alpha": args.alpha, "steps": pr["steps"], "repeats": pr["repeats"], "seeds": pr["seeds"]}
    table, plot = mi_toy_runs.run_toy_study(configs, root, uri, args.num_cpus, params, pr["ks"],
                                               quiet=args.quiet)
    if not args.quiet:
        print(f"plot: {plot}\nMLflow: experiment 'eqco_mi_toy' at {uri}\n")
    print(table)
    return 0
