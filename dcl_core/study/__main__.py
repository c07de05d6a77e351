"""``python -m dcl_core.study {answer,sync,export,calibrate} ...``: :func:`dcl_core.study.cli.module_main`."""

import sys

from dcl_core.study.cli import module_main

if __name__ == "__main__":
    sys.exit(module_main())
