"""Export a checkpoint's encoder: ``python -m dcl_core.export CHECKPOINT -o backbone.pt``.

Writes the backbone's weights (no projection head, no optimizer) as a plain state dict in a weights-only torch file,
and beside it ``backbone.json``, what it is; a width-1 ResNet-18/50 loads into torchvision's own model by the recipe
in :mod:`dcl_core.training.backbone_export`. A study's trial: ``python -m dcl_core.study export OUTPUT_DIR --trial
NAME`` (or ``--best``). Bad input exits with code 2 and one line.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dcl_core.cli_common import ArgumentParser, run_command, setup_logging
from dcl_core.training.backbone_export import describe, description_path, export, weights_path


def main(argv: list[str] | None = None) -> int:
    """Export the checkpoint named on the command line; the exit status."""
    parser = ArgumentParser(prog="python -m dcl_core.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="checkpoint.pt written by dcl_core.train or a study's trial")
    parser.add_argument("-o", "--out", default="backbone.pt",
                        help="the weights file (default: backbone.pt): a new path or a regular file, not .json; its "
                             "description goes beside it as .json")
    args = parser.parse_args(argv)
    setup_logging()

    def body() -> int:
        out = weights_path(args.out)
        meta = export(args.checkpoint, out)
        print(f"{out}: {describe(meta)}; described in {description_path(out)}")
        return 0

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
