"""Pretrain one configuration: ``python -m dcl_core.train --preset cpu --loss dcl --tau 0.1``.

Every config field is an option (``--loss.temperature 0.2``), with the paper's value and its range in its
help; the common ones have short aliases (``--tau``). Order of application: preset, then options, then
``--set KEY=VALUE``. Bad input (a value out of range, missing data, a batch larger than the data, an output
folder that cannot be written or already holds a run, a checkpoint that cannot be resumed) exits with code 2
and one line, before any training; a run that fails (the loss diverges, the disk fills up) exits with code 1
and one line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import typing
from pathlib import Path
from typing import Any

from dcl_core import metric_names as M
from dcl_core.cli_common import ArgumentParser, add_set_option, run_command, setup_logging
from dcl_core.config import (
    CONFIG_KEYS,
    PRESETS,
    Config,
    ConfigError,
    RunFailedError,
    absolute_reference,
    apply_overrides,
    check_device,
    check_params_used,
    field_specs,
    loss_reference,
    parse_overrides,
    preset,
    to_flat_dict,
)
from dcl_core.files import real_path

log = logging.getLogger("dcl_core.train")

# Short aliases for the knobs people change most.
ALIASES = {
    "--loss": "loss.name",
    "--tau": "loss.temperature",
    "--sigma": "loss.sigma",
    "--alpha": "loss.alpha",
    "--batch-size": "optim.batch_size",
    "--epochs": "optim.epochs",
    "--lr": "optim.base_lr",
    "--dataset": "data.dataset",
    "--data-root": "data.root",
    "--output-dir": "output_dir",
}


def _type_name(tp: Any) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return (args[0] if args else tp).__name__


class _Once(argparse.Action):
    """A config key's flag (``--loss.temperature`` or its alias ``--tau``): the key given once, by one flag; a
    second value, by the same flag or the other, is refused (the last one given won, silently)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        given: dict[str, str] = namespace.__dict__.setdefault("_given_by", {})
        if self.dest in given:
            before = given[self.dest]
            parser.error(f"{option_string} is given twice; give it once" if before == option_string else
                         f"{option_string} and {before} both set {self.dest}; give it once")
        given[self.dest] = option_string or self.dest
        setattr(namespace, self.dest, values)


def build_parser(shown_preset: str = "cpu") -> argparse.ArgumentParser:
    """Every config key as ``--key`` (dest: the dotted key), the short aliases, and the run options. Each key's
    help shows its value in ``shown_preset`` (the preset the command line chose): what the run will use."""
    p = ArgumentParser(
        prog="python -m dcl_core.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        epilog="presets:\n"
        + "\n".join(
            f"  {name}: " + ", ".join(f"{k}={v}" for k, v in values.items())
            for name, values in PRESETS.items()
        ),
    )
    p.add_argument("--preset", default="cpu", help=f"starting point: {', '.join(PRESETS)} (default: cpu)")
    add_set_option(p, "override any config key, e.g. --set loss.alpha=4096 (repeatable)")
    p.add_argument("--resume", action="store_true", help="continue from OUTPUT_DIR/checkpoint.pt if present")
    p.add_argument(
        "--overwrite", action="store_true", help="replace the run already in OUTPUT_DIR (its checkpoint.pt)"
    )
    p.add_argument("--download", action="store_true", help="download the dataset with torchvision if missing")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    short = p.add_argument_group("short aliases")
    for flag, key in ALIASES.items():
        short.add_argument(flag, dest=key, default=None, action=_Once,
                           metavar=_type_name(field_specs()[key][0]).upper(), help=f"= --{key}")
    if shown_preset not in PRESETS:
        shown_preset = "cpu"
    full = p.add_argument_group(f"every config key (its value in preset {shown_preset}, which --preset chooses; "
                                "paper value; range)")
    defaults = to_flat_dict(preset(shown_preset))
    for key, (tp, f) in field_specs().items():
        meta = f.metadata
        extra = [f"preset {shown_preset}: {defaults[key]}"]
        if meta.get("paper") is not None:
            extra.append(f"paper: {meta['paper']}")
        if meta.get("choices"):
            extra.append("one of " + "/".join(map(str, meta["choices"])))
        if meta.get("range") is not None:
            extra.append(f"range {meta['range']}")
        full.add_argument(
            f"--{key}",
            dest=key,
            default=None,
            action=_Once,
            metavar=_type_name(tp).upper(),
            help=f"{meta.get('help', '')} ({'; '.join(extra)})",
        )
    return p


def config_from_args(args: argparse.Namespace) -> Config:
    """Preset, then explicit options, then ``--set``; a user loss's ``file.py:Class`` with the file's absolute
    path, as the run records it (:func:`dcl_core.config.absolute_reference`, as a study does). Raises ConfigError on
    any bad key or value."""
    cfg = preset(args.preset)
    given = vars(args)
    overrides = {k: given[k] for k in CONFIG_KEYS if given.get(k) is not None}
    if args.download:
        if "data.download" in overrides:
            raise ConfigError("--download and --data.download both set data.download; give it once")
        overrides["data.download"] = True
    also = parse_overrides(args.set)
    twice = sorted(set(overrides) & set(also))
    if twice:  # --set won, silently
        raise ConfigError(f"--set {twice[0]} and --{twice[0]} (or its alias) both set {twice[0]}; give it once")
    overrides |= also
    cfg = apply_overrides(cfg, overrides)
    check_params_used(cfg.loss.params, [cfg.loss.name])  # a built-in loss would ignore them
    name = absolute_reference(cfg.loss.name)
    return cfg if name == cfg.loss.name else apply_overrides(cfg, {"loss.name": name})


def main(argv: list[str] | None = None) -> int:
    """Train from the command line (``dcl-train``), the preset's values as the defaults; the exit status."""
    first = ArgumentParser(prog="python -m dcl_core.train", add_help=False)  # --help shows the chosen preset's values
    first.add_argument("--preset", default="cpu")
    parser = build_parser(first.parse_known_args(argv)[0].preset)
    args = parser.parse_args(argv)
    setup_logging(verbose=args.verbose)
    return run_command(lambda: _run(args), interrupted="the checkpoint of the last finished epoch (if one "
                       "finished) is kept; the same command with --resume continues from it")


def _run(args: argparse.Namespace) -> int:
    # Deferred: the data code and the trainer import torchvision (seconds), which --help does not need.
    from dcl_core.training import train

    cfg = config_from_args(args)
    if args.print_config:
        print(json.dumps(to_flat_dict(cfg), indent=1))
        return 0
    preflight(cfg, resume=args.resume, overwrite=args.overwrite)
    from dcl_core.training.runtime import first_line, out_of_memory  # with the trainer above

    try:
        result = train(cfg, resume=args.resume, progress=True)  # a NaN loss, a full disk: exit 1 (RunFailedError)
    except (MemoryError, RuntimeError) as err:  # torch.OutOfMemoryError is a RuntimeError
        if not out_of_memory(err):
            raise
        raise RunFailedError(f"the run ran out of memory ({first_line(err)}); a smaller model "
                             "(model.width), batch (optim.batch_size) or image size may fit") from None
    final = result.final
    log.info(
        "done: kNN top-1 %.2f%%, loss %.4f; checkpoint and metrics in %s",
        final.get(M.KNN_TOP1, float("nan")),
        final.get(M.TRAIN_LOSS, float("nan")),
        result.output_dir,
    )
    return 0


def preflight(cfg: Config, resume: bool, overwrite: bool) -> None:
    """Everything about a run that can be checked before any compute: the data is there, the device exists,
    the batch fits the pretraining set (when its size is known without reading it), the output folder is
    writable and holds no earlier run unless ``resume`` (its checkpoint must then match ``cfg``) or
    ``overwrite`` (its checkpoint is removed) says what to do with it.

    Raises:
        ConfigError, DataError, CheckpointError: one line each.
    """
    # Deferred as in main(): torchvision and the trainer load only once the options parsed.
    from dcl_core.data import check_dataset, check_outside_splits, pretraining_images
    from dcl_core.training.checkpoint import CHECKPOINT_NAME, check_resumable, load_checkpoint
    from dcl_core.training.runtime import launch_world
    from dcl_core.training.schedule import steps_per_epoch

    if resume and overwrite:
        raise ConfigError("--resume continues the run in OUTPUT_DIR and --overwrite replaces it; pass one")
    world = launch_world()
    dc = cfg.data
    root = check_dataset(dc.dataset, dc.root, dc.download)
    check_outside_splits(cfg.output_dir, root)
    check_device(cfg.device)
    if loss_reference(cfg.loss.name) is not None:  # the user's loss imports and builds: before the data loads
        from dcl_core.losses.user import build_user_loss

        build_user_loss(cfg.loss.name, cfg.loss.params, cfg.loss.temperature, False)
    n_images = pretraining_images(dc.dataset, dc.root, dc.download, dc.train_per_class)
    if n_images is not None:  # otherwise the trainer checks once the data is loaded, still before training
        steps_per_epoch(n_images, cfg.optim.batch_size, world)
    out_dir = real_path(cfg.output_dir)
    _check_writable(out_dir)
    checkpoint = out_dir / CHECKPOINT_NAME
    if not checkpoint.exists() and not checkpoint.is_symlink():
        return
    if checkpoint.is_dir() and not checkpoint.is_symlink():  # unlink() would raise IsADirectoryError below
        raise ConfigError(f"{checkpoint} is a folder, not a checkpoint: remove or rename it")
    if resume:
        check_resumable(cfg, load_checkpoint(checkpoint, mmap=True), checkpoint)  # mmap: reads only the config
    elif overwrite:
        if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every rank runs this; one removes
            checkpoint.unlink(missing_ok=True)
    else:
        raise ConfigError(
            f"{out_dir} already holds a run ({CHECKPOINT_NAME}); pass --resume to continue it or --overwrite "
            "to replace it"
        )


def _check_writable(out_dir: Path) -> None:
    """ConfigError unless ``out_dir`` is a directory this process can create files in, or one it can make: checked
    in its nearest existing folder, creating nothing (a run refused later leaves no empty folder behind)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"output_dir {out_dir} exists and is not a directory")
    existing = next(p for p in (out_dir, *out_dir.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"cannot write to output_dir {out_dir}: Not a directory ({existing} is a file)")
    try:
        with tempfile.TemporaryFile(dir=existing):  # O_TMPFILE where the filesystem has it: no name appears
            pass
    except OSError as err:
        raise ConfigError(f"cannot write to output_dir {out_dir}: {err.strerror or err}") from None


if __name__ == "__main__":
    sys.exit(main())
