"""``python -m dcl_core.eval CHECKPOINT ...``: the same command as ``python -m dcl_core.evaluate``."""

import sys

from dcl_core.evaluate import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m dcl_core.eval"))
