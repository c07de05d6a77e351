"""Image files decoded into one uint8 tensor: JPEGs in batched chunks, other formats one by one, resized (shorter
side, then centre crop) when asked; a decoded set larger than the machine's memory is refused before the tensor
exists (:mod:`~dcl_core.data.image_bytes`). Unreadable files are named in one line
(:class:`~dcl_core.data.errors.UnreadableImageError`)."""

from __future__ import annotations

import functools
import io
import logging
import time
import warnings
from collections.abc import Callable, Sequence

import torch
import torchvision
from PIL import Image
from torchvision.io import ImageReadMode
from torchvision.transforms.v2 import functional as TF

from dcl_core.data.errors import DataError, UnreadableImageError
from dcl_core.data.image_bytes import check_fits_in_memory, read_image_bytes

logger = logging.getLogger(__name__)

DECODE_CHUNK = 1024
_JPEG_MAGIC = b"\xff\xd8\xff"


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
