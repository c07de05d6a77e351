"""What every command line shares: one logging setup."""

from __future__ import annotations

import logging


def setup_logging(verbose: bool = False, quiet: bool = False) -> None:
    """Log to stderr as ``12:34:56 INFO dcl_core.train: ...``: INFO by default, DEBUG with ``verbose``,
    warnings and errors only with ``quiet``."""
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
