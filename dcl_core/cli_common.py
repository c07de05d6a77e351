"""What every command line shares: its parser (:class:`ArgumentParser`), one logging setup, the argument groups
several of them take, and one error and exit-code path (:func:`run_command`): 0 done, 1 a run that failed, 2 bad
input (before any compute), 130 Ctrl-C, 143 SIGTERM; an error is one line, ``error: <message>``, written in one
piece (ranks sharing stderr keep whole lines)."""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TypeVar

from dcl_core.config import InputError, RunFailedError

EXIT_FAILED = 1  # a run that started and failed
EXIT_BAD_INPUT = 2  # refused before any compute
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
EXIT_TERMINATED = 143  # SIGTERM (128 + SIGTERM)

T = TypeVar("T")


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with a bad option answered as every other bad input is: one line, ``error: …`` and the
    ``--help`` that lists the options, exit 2 (argparse's own answer is its whole usage, ~20 lines for a study, and
    a line that starts with the program's name). Subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        """Exit 2 with ``message`` as the one ``error:`` line."""
        self.exit(EXIT_BAD_INPUT, f"error: {one_line(message)} (see {self.prog} --help)\n")


def setup_logging(verbose: bool = False, quiet: bool = False) -> None:
    """Log to stderr as ``12:34:56 INFO dcl_core.train: ...``: INFO by default, DEBUG with ``verbose``,
    warnings and errors only with ``quiet``."""
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    handler = logging.StreamHandler()
    handler.setFormatter(_Printable("%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
    logging.basicConfig(level=level, handlers=[handler])


class _Printable(logging.Formatter):
    """Log lines a terminal shows as they are: each line of a message through :func:`one_line` (a path or a user's
    text with a terminal escape, such as an output folder whose name holds ESC ] 0 ; title BEL, set the terminal's
    title when the run logged it)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return "\n".join(one_line(line) for line in super().formatMessage(record).split("\n"))


def error(message: object, code: int = EXIT_BAD_INPUT) -> int:
    """Write ``error: <message>`` as one line (:func:`one_line`), credentials in a URL hidden
    (:func:`hide_credentials`), in one write, and return ``code``."""
    sys.stderr.write(f"error: {one_line(hide_credentials(str(message)))}\n")
    return code


def hide_credentials(text: str) -> str:
    """``text`` with the ``user:password@`` of every URL in it as ``***@``, also where a path collapsed its ``//``
    (``https:/bob:pw@host/x``, a URL given where a file was expected and echoed back as the path)."""
    return re.sub(r"\b([A-Za-z][A-Za-z0-9+.-]*:/{1,2})[^\s/@]+@", r"\1***@", text)


def one_line(text: object) -> str:
    r"""``text`` as one line that a terminal shows as it is: a newline, a tab, a terminal's escape (ESC, BEL) or any
    other character that is not printable appears as its Python escape (``\n``, ``\x1b``), so neither a path
    nor the message of a user's own code can break the line or drive the terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C's KeyboardInterrupt is, so that what a command holds (a child
    process, a temporary folder, a half-written file) is released on the way out rather than left behind."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def run_command(body: Callable[[], int], interrupted: str = "") -> int:
    """Run a command's ``body`` (after its options parsed) through the one exit path: what ``body`` returns;
    bad input (:class:`~dcl_core.config.InputError`: config, data, checkpoint) exit 2, a failed run
    (:class:`~dcl_core.config.RunFailedError`) exit 1, each as one line; Ctrl-C exit 130 and SIGTERM exit 143,
    each as the one line ``interrupted (…)`` and ``interrupted`` (what is kept, if anything) after it."""
    on_main = threading.current_thread() is threading.main_thread()  # only the main thread may set a handler
    before = signal.signal(signal.SIGTERM, _terminate) if on_main else None
    try:
        return body()
    except InputError as err:
        return error(err, EXIT_BAD_INPUT)
    except RunFailedError as err:
        return error(err, EXIT_FAILED)
    except KeyboardInterrupt as err:
        terminated = isinstance(err, Terminated)
        sys.stderr.write(f"interrupted ({'SIGTERM' if terminated else 'Ctrl-C'}){': ' if interrupted else ''}"
                         f"{one_line(interrupted)}\n")
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    finally:
        if on_main:
            signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


def add_set_option(parser: Any, help: str) -> None:  # parser: an ArgumentParser or one of its groups
    """``--set KEY=VALUE`` (repeatable): a dotted config key, parsed by :func:`dcl_core.config.parse_overrides`."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=help)


def add_store_options(parser: Any, output_help: str, output_default: str | None = "outputs",
                      default_text: str | None = None) -> None:
    """Where a study's results are: ``--output-dir`` (its folder; positional when ``output_default`` is None; None
    when not given and ``default_text`` says what the caller puts there) and ``--tracking-uri`` (its MLflow store).
    An empty folder or URI is refused (:func:`given`): it meant the current folder or the default store, silently."""
    if output_default is None:
        parser.add_argument("output_dir", type=given(Path, FOLDER_HINT), help=output_help)
    elif default_text is not None:
        parser.add_argument("--output-dir", default=None, help=f"{output_help} (default: {default_text})")
    else:
        parser.add_argument("--output-dir", type=given(Path, FOLDER_HINT), default=output_default,
                            help=f"{output_help} (default: {output_default}/)")
    parser.add_argument("--tracking-uri", type=given(str, "name one, or leave it out for the folder's own store"),
                        default=None,
                        help="MLflow tracking URI (default: the study's own, an SQLite store in OUTPUT_DIR/mlflow.db)")


FOLDER_HINT = "name the folder (. for this one)"


def given(kind: Callable[[str], T], hint: str) -> Callable[[str], T]:
    """An argparse ``type`` that refuses an empty value, saying ``hint`` (``"$OUT"`` with ``OUT`` unset:
    ``Path("")`` is the current folder, an empty URI the default store, each silently) before ``kind`` reads it."""
    def read(text: str) -> T:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"is empty; {hint}")
        return kind(text)

    read.__name__ = getattr(kind, "__name__", "value")  # argparse names the type in its "invalid ..." line
    return read
