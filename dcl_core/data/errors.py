"""The data layer's errors: one line each, shown to the user as ``error: <message>`` (exit code 2)."""

from __future__ import annotations

from dcl_core.config import InputError


def printable(text: str) -> str:
    r"""``text`` with each character a terminal would act on (ESC, other control and format characters: what
    ``str.isprintable`` rejects) written as its escape, ``\x1b``: a file or class name read from the data
    cannot recolour, move or rewrite the terminal it is shown on."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class DataError(InputError):
    r"""A dataset could not be found, read or subset.

    The message is always a single line: it is shown to the user as ``error: <msg>``. Runs of whitespace are
    one space and other control characters are escaped (:func:`printable`): names read from the data (a file
    named ``"\x1b[31mred.jpg"``) are shown, never obeyed.
    """

    def __init__(self, message: str) -> None:
        super().__init__(printable(" ".join(str(message).split())))


class UnreadableImageError(DataError):
    """An image file that cannot be read or decoded; the message names the file.

    Raised in a DataLoader worker (``data.loader=stream``), it reaches the main process re-created by torch from
    the worker's formatted traceback (``"Caught UnreadableImageError in DataLoader worker process 0. Original
    Traceback ...: <message>"``); the constructor keeps only the original message, the traceback's last line.
    """

    def __init__(self, message: str) -> None:
        message = str(message)
        if "Original Traceback" in message:
            last = message.strip().splitlines()[-1]  # "dcl_core.data.errors.UnreadableImageError: <message>"
            message = last.partition(": ")[2] or last
        super().__init__(message)
