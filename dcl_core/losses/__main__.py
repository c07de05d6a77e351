"""``python -m dcl_core.losses check LOSS``: run the built-in losses' properties on a loss (``dcl``, or your own
``my_losses:MyLoss`` / ``path/to/my_loss.py:MyLoss``) and print a table of pass/fail with the measured errors.
Exit 0 when every property holds, 1 when one fails (the loss's code ending or hanging the check included), 2 when
the loss cannot be loaded (one line). The loss runs in a process of its own (``dcl_core.losscheck.isolation``)."""

from __future__ import annotations

import argparse
import sys

from dcl_core.cli_common import EXIT_FAILED, ArgumentParser, run_command
from dcl_core.config import (
    LOSS_NAMES,
    REFERENCE_FORMS,
    Config,
    InputError,
    apply_overrides,
    loss_params,
    loss_reference,
)
from dcl_core.losscheck.isolation import STEP_TIMEOUT_S, run_isolated
from dcl_core.losscheck.rows import format_checks


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``check`` command's options (torch-free: ``--help`` loads no torch)."""
    parser = ArgumentParser(prog="python -m dcl_core.losses", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="run the built-in losses' properties on a loss",
                                description="Run the built-in losses' properties on a loss; see "
                                            "docs/own-loss.md for each property, its tolerance and what a pass "
                                            "does not cover.")
    check.add_argument("loss", help=f"a built-in loss name, or your own as {REFERENCE_FORMS}")
    check.add_argument("--params", default="{}", metavar="JSON",
                       help="your loss's keyword arguments, as loss.params takes them (default: {})")
    check.add_argument("--reference", default=None, metavar="REF",
                       help="a plain-loop transcription of the equation, module:function or file.py:function, "
                            "called as function(z1, z2, temperature, **params) on float64 inputs")
    check.add_argument("--no-ddp", action="store_true", help="skip the 2-process gloo check (it spawns 2 processes)")
    check.add_argument("--timeout", type=_positive, default=STEP_TIMEOUT_S, metavar="SECONDS",
                       help=f"each property's time bound; the loss's code overrunning it fails that property "
                            f"(default: {STEP_TIMEOUT_S:g})")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``check`` on the loss named in ``argv``; the exit code (0 passed, 1 a property failed, 2 bad input)."""
    args = build_parser().parse_args(argv)

    def body() -> int:
        apply_overrides(Config(), {"loss.name": args.loss, "loss.params": args.params})  # the form, torch-free
        if args.loss in LOSS_NAMES and loss_params(args.params):
            raise InputError(f"--params: the built-in loss {args.loss} is checked at its defaults and takes none "
                             "here (its own keys, such as loss.sigma, are a run's)")
        if args.reference is not None and loss_reference(args.reference, "--reference") is None:
            raise InputError(f"--reference={args.reference}: expected {REFERENCE_FORMS}")
        checks = run_isolated(args.loss, args.params, args.reference, ddp=not args.no_ddp, timeout=args.timeout)
        print(format_checks(args.loss, checks, args.reference))
        return 0 if all(c.ok for c in checks) else EXIT_FAILED

    return run_command(body)


if __name__ == "__main__":
    sys.exit(main())
