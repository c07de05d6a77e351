"""An image file before it is decoded: its bytes read within a bound, its format as PIL's header parser reads it,
and whether a decoded set fits this machine's memory. No torch: the study driver checks a study's data with these
before any trial (and torch) starts."""

from __future__ import annotations

import io
import logging
import os
import warnings

from PIL import Image

from dcl_core.config import ConfigError
from dcl_core.data.errors import DataError, UnreadableImageError
from dcl_core.files import read_bounded

logger = logging.getLogger(__name__)

_LARGE_TENSOR_BYTES = 8 * 1024**3

MAX_IMAGE_BYTES = 64 * 1024**2
"""The most bytes one encoded image file may hold (64 MiB; ImageNet's largest JPEG is ~15 MB): a larger file is
refused by its size, before a byte of it is read, in a folder (:func:`read_image_bytes`) and in a pack."""

IMAGE_FORMATS = ("JPEG", "MPO", "PNG", "PPM", "BMP", "DIB", "TIFF", "WEBP", "GIF")
"""The formats a pack takes (:func:`image_format`): what the folder's extensions name, as PIL identifies them."""


def read_image_bytes(path: str) -> bytes:
    """The bytes of the image file ``path`` (a link followed), read by :func:`dcl_core.files.read_bounded`: a
    regular file of at most :data:`MAX_IMAGE_BYTES`, a FIFO never opened (no hang), a device never read
    (``/dev/zero`` would fill the memory). UnreadableImageError naming the file otherwise, or when it is empty."""
    target = os.path.realpath(path) if os.path.islink(path) else path  # read_bounded follows no link itself
    try:
        data = read_bounded(target, MAX_IMAGE_BYTES)
    except ConfigError as exc:  # "<target> is a FIFO, not a regular file: not read", "cannot read <target>: ..."
        why = str(exc).removeprefix(f"cannot read {target}: ").replace(f"{target} ", "it ", 1)
        raise UnreadableImageError(f"cannot read image {path}: {why}") from None
    if not data:
        raise UnreadableImageError(f"cannot read image {path}: the file is empty")
    return data


def image_format(data: bytes) -> str | None:
    """The format of the encoded image ``data`` (one of :data:`IMAGE_FORMATS`) as PIL's header parser reads it
    (the decoder's fallback; nothing is decoded), or None when it is none of them: text, an empty or truncated
    header, an image too large to decode (PIL's decompression-bomb bound)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                found = str(image.format)
    except Exception:  # PIL's parsers raise OSError, SyntaxError, ValueError, struct.error, ... on bad headers
        return None
    return found if found in IMAGE_FORMATS else None


def physical_memory() -> int | None:
    """This machine's memory in bytes (``None`` where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def check_fits_in_memory(num_bytes: int, pretty: str) -> None:
    """Refuse a decoded set larger than the machine (before the tensor exists); warn about a large one."""
    total = physical_memory()
    if total is not None and num_bytes > total:
        raise DataError(
            f"{pretty} would take {num_bytes / 1024**3:.1f} GB as decoded images, more than this machine's memory "
            f"({total / 1024**3:.1f} GB); use a smaller data.image_size, a subset (data.train_per_class, "
            "data.test_per_class) or data.loader=stream"
        )
    if num_bytes > _LARGE_TENSOR_BYTES:
        logger.warning(
            "%s will take %.1f GB of memory as a uint8 tensor; consider a smaller image size or subset",
            pretty,
            num_bytes / 1024**3,
        )
