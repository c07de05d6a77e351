"""Evaluate a saved checkpoint: ``python -m dcl_core.eval runs/latest/checkpoint.pt [--linear] [--no-knn]``.

Rebuilds the backbone and the data from the config stored in the checkpoint (data root and subset sizes can be
overridden), then runs the kNN monitor (k=200, t=0.1 by default) and/or the linear probe on frozen features.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

import torch

from dcl_core.config import ConfigError, apply_overrides, check_device, from_flat_dict


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dcl_core.eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoint", help="checkpoint.pt written by dcl_core.train")
    p.add_argument("--no-knn", action="store_true", help="skip the kNN monitor")
    p.add_argument("--linear", action="store_true", help="train a linear probe on frozen features")
    p.add_argument(
        "--linear-preset",
        default=None,
        choices=("paper", "cpu", "smoke"),
        help="linear-probe protocol (default: the checkpoint's eval.linear_preset)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override config keys for evaluation, e.g. data.root=/data/cifar, data.test_per_class=0",
    )
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )

    from dcl_core.data import DataError
    from dcl_core.training.builders import build_data, build_model
    from dcl_core.training.checkpoint import load_checkpoint
    from dcl_core.training.trainer import _linear_eval, evaluate_knn

    try:
        from dcl_core.study_cli import parse_overrides

        overrides: dict[str, str] = parse_overrides(args.set)
        overrides["device"] = args.device
        if args.linear_preset:
            overrides["eval.linear_preset"] = args.linear_preset
        check_device(args.device)
        state = load_checkpoint(args.checkpoint)
        cfg = apply_overrides(from_flat_dict(state["config"]), overrides)
        device = torch.device("cuda" if cfg.device != "cpu" and torch.cuda.is_available() else "cpu")
        model = build_model(cfg)
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as err:  # e.g. --set model.width=... against the trained encoder
            first = str(err).splitlines()[0]
            raise ConfigError(f"the checkpoint's weights do not fit the configured model: {first}") from None
        model.to(device)
        data = build_data(cfg)
    except (ConfigError, DataError, FileNotFoundError, ValueError) as err:
        sys.stderr.write(f"error: {err}\n")  # one write: ranks sharing stderr keep whole lines
        return 2
    results: dict[str, float] = {"epoch": state["epoch"]}
    if not args.no_knn:
        results["eval/knn_top1"] = evaluate_knn(
            model.backbone, data, cfg.eval.knn_k, cfg.eval.knn_temperature, cfg.eval.batch_size, device
        )
    if args.linear:
        results |= _linear_eval(cfg, model, data, device)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
