"""Evaluate a saved checkpoint: ``python -m dcl_core.evaluate runs/latest/checkpoint.pt [--linear] [--no-knn]``.

Rebuilds the backbone from the config stored in the checkpoint and measures it on the data the checkpoint names
(dataset, image size, subsets), then runs the kNN monitor (k=200, t=0.1 by default) and/or the linear probe on
frozen features, and prints the results as one JSON line. Bad
input exits with code 2 and one line.

Where and how data is read (``data.root``, ``data.download``, ``data.loader``, ``data.workers``,
``eval.batch_size``) is this machine's business: it comes from this command line (``--set``) and the project's
defaults, never from the checkpoint, which may be someone else's file.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

import torch

from dcl_core import metric_names as M
from dcl_core.cli_common import ArgumentParser, add_set_option, run_command, setup_logging
from dcl_core.config import (
    Config,
    ConfigError,
    InputError,
    RunFailedError,
    apply_overrides,
    check_device,
    from_flat_dict,
    parse_overrides,
    to_flat_dict,
)
from dcl_core.training.checkpoint import CheckpointError, check_model_fits, load_checkpoint
from dcl_core.training.runtime import first_line, out_of_memory

# A checkpoint says what the model is and what it was measured on; these keys say where this machine reads data and
# how much it holds at once, so a file can neither create folders, download, fork workers nor size batches here.
LOCAL_KEYS = ("data.root", "data.download", "data.loader", "data.workers", "eval.batch_size")


def build_parser(prog: str = "python -m dcl_core.evaluate") -> argparse.ArgumentParser:
    """The command line of ``dcl-evaluate``: a checkpoint and the evaluations to run on it."""
    p = ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="checkpoint.pt written by dcl_core.train")
    p.add_argument("--no-knn", action="store_true", help="skip the kNN monitor")
    p.add_argument("--linear", action="store_true", help="train a linear probe on frozen features")
    p.add_argument(
        "--linear-preset",
        default=None,
        choices=("paper", "cpu", "smoke"),
        help="linear-probe protocol (default: the checkpoint's eval.linear_preset)",
    )
    add_set_option(p, "override config keys for evaluation, e.g. data.root=/data/cifar, data.test_per_class=0")
    p.add_argument("--device", default=None, choices=("auto", "cpu", "cuda"),
                   help="where to evaluate (default: auto, a GPU if there is one)")
    return p


def main(argv: list[str] | None = None, prog: str = "python -m dcl_core.evaluate") -> int:
    """Evaluate a checkpoint from the command line (``dcl-evaluate``); the exit status."""
    args = build_parser(prog).parse_args(argv)
    setup_logging()
    return run_command(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    # Deferred: the data code imports torchvision (seconds), which --help does not need.
    from dcl_core.training.probes import evaluate_knn, linear_eval

    try:
        cfg, state, model, data, device = _load(args)
    except (FileNotFoundError, ValueError) as err:  # what the model and data builders raise on odd input
        if isinstance(err, InputError):
            raise
        raise ConfigError(str(err)) from None
    ev = cfg.eval
    results: dict[str, float] = {"epoch": state["epoch"]}
    try:
        if not args.no_knn:  # a streamed image that cannot be decoded is a DataError found here: exit 2 as well
            results[M.KNN_TOP1] = evaluate_knn(
                model.backbone, data, k=ev.knn_k, temperature=ev.knn_temperature, batch_size=ev.batch_size,
                device=device,
            )
        if args.linear:
            results |= linear_eval(
                model.backbone, data, preset=ev.linear_preset, seed=cfg.seed, batch_size=ev.batch_size,
                device=device,
            )
    except (MemoryError, RuntimeError) as err:  # torch.OutOfMemoryError is a RuntimeError
        if not out_of_memory(err):
            raise
        raise RunFailedError(f"the evaluation ran out of memory on {device} ({first_line(err)}); a smaller batch "
                             "may fit: --set eval.batch_size=N") from None
    print(json.dumps(results))
    return 0




def _load(args: argparse.Namespace) -> tuple[Config, dict[str, Any], Any, Any, torch.device]:
    """(config, checkpoint state, model with its weights on its device, data, device) for the evaluation."""
    # torchvision and the models load once the options parsed (``--help`` stays instant)
    from dcl_core.data import DataError
    from dcl_core.training.builders import build_data, build_model

    overrides = parse_overrides(args.set)
    for key, flag in (("device", args.device), ("eval.linear_preset", args.linear_preset)):
        if flag is not None and key in overrides:  # the flag won, silently (--device's default too)
            raise ConfigError(f"--set {key} and --{key.rpartition('.')[2].replace('_', '-')} both set {key}; "
                              "give it once")
    if "output_dir" in overrides:
        raise ConfigError("--set output_dir: an evaluation writes nothing (it prints its metrics)")
    if args.no_knn and not args.linear:
        raise ConfigError("--no-knn without --linear leaves nothing to evaluate: add --linear, or drop --no-knn")
    overrides.setdefault("device", args.device or "auto")
    if args.linear_preset:
        overrides["eval.linear_preset"] = args.linear_preset
    check_device(overrides["device"])
    state = load_checkpoint(args.checkpoint)
    trained = from_flat_dict(state["config"])
    defaults, stored = to_flat_dict(Config()), to_flat_dict(trained)
    cfg = apply_overrides(trained, {k: defaults[k] for k in LOCAL_KEYS} | overrides)
    used = to_flat_dict(cfg)
    elsewhere = _stored_elsewhere(stored, used)
    if elsewhere:
        logging.getLogger(__name__).info("the checkpoint was trained with %s; this evaluation reads with its own "
                                         "settings (--set to change them)", elsewhere)
    device = torch.device("cuda" if cfg.device != "cpu" and torch.cuda.is_available() else "cpu")
    if cfg.model != trained.model:  # --set model.width=16: the model the weights must fill, sized before it is built
        try:
            check_model_fits(cfg, state, args.checkpoint)
        except CheckpointError:
            raise ConfigError(f"the checkpoint's weights do not fit the configured model: {_misfit(trained, cfg)}"
                              ) from None
    model = build_model(cfg)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:  # e.g. --set model.width=... against the trained encoder
        raise ConfigError(
            f"the checkpoint's weights do not fit the configured model: {_misfit(trained, cfg, err)}"
        ) from None
    model.to(device)
    try:
        data = build_data(cfg)
    except DataError as err:
        hint = _stored_elsewhere(stored, used, keys=("data.root",))
        if not hint:
            raise
        raise DataError(f"{err} (the checkpoint was trained with {hint}: pass --set {hint} to read there)") from None
    return cfg, state, model, data, device


def _stored_elsewhere(stored: dict, used: dict, keys: tuple[str, ...] = LOCAL_KEYS) -> str:
    """``data.root=/x, data.loader=stream``: the checkpoint's values of ``keys`` that this evaluation does not use."""
    return ", ".join(f"{k}={stored[k]}" for k in keys if stored[k] != used[k])


def _misfit(trained: Config, cfg: Config, err: RuntimeError | None = None) -> str:
    """Why the trained weights do not load into the model ``cfg`` builds: the model keys that differ from the
    checkpoint's (``model.width is 0.125 in the checkpoint, 0.5 here``), else the first specific line of
    torch's error (``size mismatch for ...``)."""
    before, now = to_flat_dict(trained), to_flat_dict(cfg)
    changed = [k for k in now if k.startswith("model.") and before[k] != now[k]]
    if changed:
        return "; ".join(f"{k} is {before[k]} in the checkpoint, {now[k]} here" for k in changed)
    if err is None:
        return "its model keys differ"
    lines = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
    detail = lines[0] if lines else str(err).strip()
    return detail if len(detail) <= 300 else detail[:297] + "..."


if __name__ == "__main__":
    sys.exit(main())
