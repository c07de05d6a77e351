"""The data layer's errors: one line each, shown to the user as ``error: <message>`` (exit code 2)."""

from __future__ import annotations

from dcl_core.config import InputError


class DataError(InputError):
    """A dataset could not be found, read or subset.

    The message is always a single line: it is shown to the user as ``error: <msg>``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


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
