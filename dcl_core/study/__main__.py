"""``python -m dcl_core.study {answer,sync,export,calibrate} ...``."""

import sys
from collections.abc import Callable, Sequence

from dcl_core import cli_common
from dcl_core.study.cli.answer_command import answer_main
from dcl_core.study.cli.calibrate_command import calibrate_main
from dcl_core.study.cli.export_command import export_main
from dcl_core.study.cli.sync_command import sync_main

COMMANDS: dict[str, Callable[[Sequence[str] | None], int]] = {
    "answer": answer_main, "sync": sync_main, "export": export_main, "calibrate": calibrate_main}


def module_main(argv: Sequence[str] | None = None) -> int:
    """``python -m dcl_core.study {answer,sync,export,calibrate} ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        usage = ("usage: python -m dcl_core.study {answer,sync,export,calibrate} ...\n"
                 "  answer OUTPUT_DIR   re-analyse the finished studies in OUTPUT_DIR\n"
                 "  sync OUTPUT_DIR     push to MLflow what the studies journaled while it was unreachable\n"
                 "  export OUTPUT_DIR   a trial's trained encoder for another codebase (--trial NAME or --best)\n"
                 "  calibrate           the verdicts' error rates on simulated studies\n")
        if argv and argv[0] in ("-h", "--help"):
            sys.stdout.write(usage)
            return 0
        return cli_common.error(f"choose a command: {', '.join(COMMANDS)}" + (f" (got {argv[0]!r})" if argv else "")
                                + " (see python -m dcl_core.study --help)")
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(module_main())
