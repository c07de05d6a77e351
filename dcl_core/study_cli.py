"""The command line shared by every study script (so ``studies/*.py`` stay thin).

A study script supplies its question (docstring), per-preset study specs, and calls :func:`main`. Everything
is validated before Ray starts: bad values exit with code 2 and one line.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dcl_core.cli import setup_logging
from dcl_core.config import ConfigError, apply_overrides, parse_overrides, preset
from dcl_core.data import DataError, check_dataset, resolve_data_root
from dcl_core.study.spec import StudyInterruptedError, StudyOptions, validate_spec, with_base
from search_spaces import keys_of

MAX_SEEDS = 1000
SpecBuilder = Callable[[argparse.Namespace], "object"]


def build_parser(doc: str, default_name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    g = p.add_argument_group("what to run")
    g.add_argument("--preset", choices=("smoke", "cpu", "paper"), default="cpu",
                   help="smoke: tests (~1 min); cpu: answers the question on 2 CPU cores (default); "
                        "paper: the paper's protocol for a GPU cluster")
    g.add_argument("--smoke", dest="preset", action="store_const", const="smoke", help="same as --preset smoke")
    g.add_argument("--search", choices=("grid", "optuna"), default="grid",
                   help="grid: the paper's exact sweep; optuna: TPE search (seeded) per loss")
    g.add_argument("--num-samples", type=int, default=None, help="trials per Optuna search (default: preset's)")
    g.add_argument("--asha", action="store_true", help="early-stop poor Optuna trials with ASHA")
    g.add_argument("--losses", default=None, help="comma-separated losses (default: preset's)")
    g.add_argument("--seeds", type=int, default=None, help="number of seeds per cell (default: preset's)")
    g.add_argument("--data-root", default=None, help="dataset root (default: embedded CIFAR-10 / $DCL_DATA_ROOT)")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a base config key for every trial, e.g. --set optim.epochs=50")
    o = p.add_argument_group("where results go")
    o.add_argument("--name", default=default_name, help=f"study / MLflow experiment name (default: {default_name})")
    o.add_argument("--output-dir", default="outputs", help="study folder: Ray results, MLflow store, summary")
    o.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: sqlite store in OUTPUT_DIR/mlflow.db)")
    o.add_argument("--storage", default=None, help="Ray storage path or URI (default: OUTPUT_DIR/ray_results)")
    o.add_argument("--resume", action="store_true", help="continue an interrupted study from its storage")
    o.add_argument("--overwrite", action="store_true", help="delete an existing study of the same name first")
    o.add_argument("--save-checkpoints", action="store_true", help="log each trial's final checkpoint to MLflow")
    r = p.add_argument_group("resources")
    r.add_argument("--workers", type=int, default=1, help="DDP workers per trial (TorchTrainer when > 1)")
    r.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs per worker; also its torch threads")
    r.add_argument("--gpus-per-worker", type=float, default=0.0, help="GPUs per worker (paper preset: 1)")
    r.add_argument("--max-concurrent", type=int, default=None, help="cap on concurrent trials")
    r.add_argument("--max-failures", type=int, default=2, help="retries of a crashed trial")
    r.add_argument("--address", default=None, help="Ray cluster address (default: local, or $RAY_ADDRESS)")
    r.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray (default: all)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def base_config(args: argparse.Namespace, base: tuple[str, dict[str, Any]]) -> Any:
    """A study preset's base config: ``(core preset, overrides)``, then ``--data-root``, then ``--set``."""
    name, overrides = base
    overrides = {**overrides, **({"data.root": args.data_root} if args.data_root else {})}
    return apply_overrides(apply_overrides(preset(name), overrides), parse_overrides(args.set))


def losses_arg(args: argparse.Namespace, default: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(x.strip() for x in args.losses.split(",")) if args.losses else default


def main(doc: str, default_name: str, build_spec: SpecBuilder, argv: list[str] | None = None,
         defaults: dict[str, Any] | None = None) -> int:
    """Parse, validate (exit 2 on bad input), run the study, print the table, plot path and experiment.

    ``defaults`` changes option defaults for one study (e.g. ``{"search": "optuna"}``)."""
    parser = build_parser(doc, default_name)
    parser.set_defaults(**(defaults or {}))
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    try:
        if args.num_samples is not None and args.num_samples < 1:
            raise ConfigError(f"--num-samples must be >= 1, got {args.num_samples}")
        if args.seeds is not None and not 1 <= args.seeds <= MAX_SEEDS:
            raise ConfigError(f"--seeds must be in [1, {MAX_SEEDS}], got {args.seeds}")
        options = StudyOptions.from_namespace(args)
        spec = build_spec(args)
        validate_spec(spec)
        _check_set_not_swept(spec, parse_overrides(args.set))
        data = spec.base.data
        on_cluster = bool(args.address or os.environ.get("RAY_ADDRESS"))
        if on_cluster:  # the data lives on the cluster's nodes, not necessarily on this driver
            root = data.root or str(resolve_data_root(data.dataset, None, data.download))
            if not Path(args.output_dir).expanduser().is_absolute():
                # Under `ray job submit --working-dir .` a relative folder is inside the job's temporary copy.
                raise ConfigError("on a cluster, pass an absolute --output-dir on storage that outlives the job "
                                  "(a relative one lands in the job's temporary working directory)")
            if not args.storage:
                logging.getLogger(__name__).warning(
                    "no --storage: Ray results go to %s/ray_results; with trials on several nodes it must be "
                    "shared storage (NFS, s3://, gs://)", args.output_dir)
        else:
            root = str(check_dataset(data.dataset, data.root, data.download))
            if args.gpus_per_worker > 0 and not torch.cuda.is_available():
                raise ConfigError("--gpus-per-worker needs GPUs, and the local Ray has none (no CUDA device "
                                      "here); submit to a GPU cluster (--address or ray job submit)")
        spec = with_base(spec, {"data.root": str(Path(root).expanduser().resolve())})
        # Ray, Optuna and MLflow take seconds to import: bad input is refused before.
        from dcl_core.study.results import summary_lines
        from dcl_core.study.runner import run_study
        from dcl_core.study.tracking import preflight

        if options.tracking_uri:  # a bad or unreachable MLflow store: one line now, not minutes after Ray starts
            preflight(options.tracking_uri)

        outcome = run_study(spec, options)
    except (ConfigError, DataError) as err:
        sys.stderr.write(f"error: {err}\n")  # one write: ranks sharing stderr keep whole lines
        return 2
    except (StudyInterruptedError, KeyboardInterrupt) as err:  # Ctrl-C; a second Ctrl-C skips Tune's last save
        why = f" ({err})" if str(err) else ""
        sys.stderr.write(f"interrupted{why}: finished trials and checkpoints are kept, nothing was summarized. "
                         f"Continue with:\n  {resume_command(argv)}\n")
        return 130
    print("\n".join(summary_lines(outcome)))
    failed = [r for r in outcome.rows if r["status"] != "ok"]
    if outcome.rows and len(failed) == len(outcome.rows):
        sys.stderr.write(f"error: every trial failed; the first: {failed[0].get('error') or failed[0]['status']}\n")
        return 1
    return 0


def resume_command(argv: list[str] | None) -> str:
    """The command line that continues this study: the same options, ``--resume`` instead of ``--overwrite``."""
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("--overwrite", "--resume")]
    return " ".join(shlex.quote(a) for a in [sys.executable, sys.argv[0], *args, "--resume"])


def _check_set_not_swept(spec: Any, overrides: dict[str, str]) -> None:
    """``--set`` of a key the study itself sets per trial would be silently overridden: refused."""
    swept = set().union(*map(keys_of, spec.grids)) | (keys_of(spec.search) if spec.search else set())
    clash = sorted(swept & set(overrides))
    if clash:
        raise ConfigError(f"--set {clash[0]}: this study sets {clash[0]} per trial (its grid or search space), "
                          "so a fixed value would be ignored; drop it (or use --losses / --seeds / --search)")
