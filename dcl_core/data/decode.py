"""Image files decoded into one uint8 tensor: JPEGs in batched chunks, other formats one by one, resized (shorter
side, then centre crop) when asked; a decoded set larger than the machine's memory is refused before the tensor
exists. Unreadable files are named in one line (:class:`~dcl_core.data.errors.UnreadableImageError`)."""

from __future__ import annotations

import functools
import io
import logging
import os
import time
import warnings
from collections.abc import Callable, Sequence

import torch
import torchvision
from PIL import Image
from torchvision.io import ImageReadMode
from torchvision.transforms.v2 import functional as TF

from dcl_core.config import ConfigError
from dcl_core.data.errors import DataError, UnreadableImageError
from dcl_core.files import read_bounded

logger = logging.getLogger(__name__)

_LARGE_TENSOR_BYTES = 8 * 1024**3
DECODE_CHUNK = 1024
_JPEG_MAGIC = b"\xff\xd8\xff"

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


def resize_center_crop(image: torch.Tensor, size: int) -> torch.Tensor:
    """Resizes the shorter side of ``(..., C, H, W)`` uint8 images to ``size`` and center-crops."""
    height, width = image.shape[-2:]
    if min(height, width) != size:
        image = TF.resize(image, [size], antialias=True)
    if image.shape[-2] != size or image.shape[-1] != size:
        image = TF.center_crop(image, [size, size])
    return image


def pil_image(data: bytes) -> Image.Image:
    """The encoded image ``data`` decoded by PIL, as RGB (the fallback for what torchvision cannot decode)."""
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def _decode_one(data: torch.Tensor, name: str, pil: Callable[[], Image.Image]) -> torch.Tensor:
    """Decodes one encoded image to uint8 RGB ``(3, H, W)``; falls back to PIL (``pil()``) for exotic formats."""
    try:
        return torchvision.io.decode_image(data, mode=ImageReadMode.RGB, apply_exif_orientation=True)
    except RuntimeError:
        try:
            return TF.pil_to_tensor(pil())
        except Exception as exc:
            raise UnreadableImageError(f"cannot decode image {name}: {exc}") from exc


def _read_one(path: str) -> torch.Tensor:
    """The bytes of one image file as a uint8 tensor (:func:`read_image_bytes`: bounded, regular files only)."""
    return torch.frombuffer(bytearray(read_image_bytes(path)), dtype=torch.uint8)


def decode_files(paths: Sequence[str], image_size: int | None, pretty: str) -> torch.Tensor:
    """Decodes image files into one contiguous uint8 tensor of shape ``(N, 3, S, S)``.

    JPEGs are decoded in chunks with torchvision's batched ``decode_jpeg``; other formats one by one
    with ``decode_image``. A thread pool was measured to bring no speed-up here (decoding small JPEGs
    is dominated by Python-side overhead that holds the GIL), so decoding is single-threaded.

    Args:
        paths: Image files.
        image_size: Output size (shorter side resized, then center crop); ``None`` keeps the native
            size, which must then be identical for all files.
        pretty: Dataset name for messages.

    Returns:
        ``uint8`` tensor ``(N, 3, H, W)``.
    """
    start = time.perf_counter()
    with warnings.catch_warnings():
        # torchvision >= 0.29 deprecates torchvision.io decoding in favor of TorchCodec and warns per call.
        warnings.filterwarnings("ignore", ".*image decoding and encoding", category=DeprecationWarning)
        out = _decode_all(paths, image_size, pretty, lambda i: _read_one(paths[i]),
                          lambda i: pil_image(read_image_bytes(paths[i])))
    logger.info("decoded %d %s images in %.2f s", len(paths), pretty, time.perf_counter() - start)
    return out


def decode_bytes(names: Sequence[str], blobs: Sequence[bytes], image_size: int | None, pretty: str) -> torch.Tensor:
    """:func:`decode_files` for images already read: ``blobs[i]`` holds the bytes of the file ``names[i]`` (the
    name for messages only). The same decoding, so the same tensor as from the files themselves."""

    def read(i: int) -> torch.Tensor:
        if not blobs[i]:
            raise UnreadableImageError(f"cannot read image {names[i]}: it is empty")
        return torch.frombuffer(bytearray(blobs[i]), dtype=torch.uint8)

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*image decoding and encoding", category=DeprecationWarning)
        out = _decode_all(names, image_size, pretty, read, lambda i: pil_image(blobs[i]))
    logger.info("decoded %d %s images in %.2f s", len(names), pretty, time.perf_counter() - start)
    return out


def _decode_all(paths: Sequence[str], image_size: int | None, pretty: str, read: Callable[[int], torch.Tensor],
                pil: Callable[[int], Image.Image]) -> torch.Tensor:
    """The decoding loop of :func:`decode_files` and :func:`decode_bytes`: ``read(i)`` gives image ``i``'s bytes,
    ``pil(i)`` the image through PIL (for what torchvision cannot decode); ``paths`` name them in messages."""
    out: torch.Tensor | None = None
    for begin in range(0, len(paths), DECODE_CHUNK):
        chunk = paths[begin : begin + DECODE_CHUNK]
        encoded = [read(begin + k) for k in range(len(chunk))]
        decoded: list[torch.Tensor | None] = [None] * len(chunk)
        jpeg_pos = [k for k, data in enumerate(encoded) if bytes(data[:3].tolist()) == _JPEG_MAGIC]
        if jpeg_pos:
            try:
                batch = torchvision.io.decode_jpeg(
                    [encoded[k] for k in jpeg_pos], mode=ImageReadMode.RGB, apply_exif_orientation=True
                )
                for k, img in zip(jpeg_pos, batch, strict=True):
                    decoded[k] = img
            except RuntimeError:
                logger.debug("batched JPEG decode failed; decoding one by one to find the bad file")
        for k, img in enumerate(decoded):
            if img is None:
                decoded[k] = _decode_one(encoded[k], chunk[k], functools.partial(pil, begin + k))
        for k, img in enumerate(decoded):
            assert img is not None
            if image_size is not None:
                img = resize_center_crop(img, image_size)
            if out is None:
                out_bytes = len(paths) * img.numel()
                check_fits_in_memory(out_bytes, pretty)
                out = torch.empty((len(paths), *img.shape), dtype=torch.uint8)  # (N, 3, H, W)
            if img.shape != out.shape[1:]:
                raise DataError(
                    f"{pretty} images differ in size ({chunk[k]} is {tuple(img.shape[1:])}, expected "
                    f"{tuple(out.shape[2:])}); pass an image size to resize them"
                )
            out[begin + k] = img
    if out is None:
        out = torch.empty((0, 3, image_size or 0, image_size or 0), dtype=torch.uint8)
    return out


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
