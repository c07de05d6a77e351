"""Dataset loading into in-memory uint8 tensors.

Every dataset is decoded once into a single contiguous ``uint8`` tensor of shape ``(N, 3, H, W)``
plus ``int64`` labels. Augmentation then runs batched on that tensor (see
:mod:`dcl_core.data.augment`), so there is no per-sample PIL pipeline and no DataLoader workers.

Supported datasets (``DATASETS``):

* ``cifar10`` / ``cifar100``: either torchvision's binary format (``cifar-10-batches-py/`` resp.
  ``cifar-100-python/`` under the root, read through :class:`torchvision.datasets.CIFAR10` /
  :class:`~torchvision.datasets.CIFAR100` and their ``.data`` arrays) or an ImageFolder layout
  ``root/train/<class>/*`` and ``root/test/<class>/*``. For CIFAR-10 an embedded ImageFolder copy
  shipped next to the repository (``../shared/datasets/cifar10``) is used when nothing else is given.
* ``stl10``: torchvision's binary format (``stl10_binary/``) via :class:`torchvision.datasets.STL10`.
* ``imagefolder``: ``root/train/<class>/*`` and ``root/val/<class>/*`` (or ``root/test``), decoded
  with :mod:`torchvision.io` and resized (shorter side, then center crop) to ``image_size``.

Splits: ``"pretrain"`` are the images used for self-supervised pretraining (CIFAR train, STL-10
train+unlabeled as in the DCL paper, imagefolder train), ``"train"`` is the labeled training set
(kNN bank / linear-probe train set) and ``"test"`` the labeled evaluation set.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchvision

from dcl_core.data.decode import (
    DECODE_CHUNK,
    decode_bytes,
    decode_files,
    resize_center_crop,
)
from dcl_core.data.errors import DataError
from dcl_core.data.folders import image_folder_samples
from dcl_core.data.image_bytes import check_fits_in_memory
from dcl_core.data.locate import (
    EXPECTED_CLASSES,
    PRETTY_NAMES,
    TORCHVISION_FOLDERS,
    check_name,
    locate,
    resolve_data_root,
)
from dcl_core.data.packed import read_split

logger = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("pretrain", "train", "test")

_STL10_CLASSES = ("airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck")


@dataclass(frozen=True)
class ImageTensors:
    """A whole dataset split held in memory.

    Attributes:
        images: ``uint8`` tensor of shape ``(N, 3, H, W)``, contiguous.
        labels: ``int64`` tensor of shape ``(N,)``; ``-1`` marks unlabeled images.
        classes: Class names; label ``k`` is ``classes[k]``.
    """

    images: torch.Tensor
    labels: torch.Tensor
    classes: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.dim() != 4 or self.images.shape[1] != 3:
            raise ValueError(
                f"images must be uint8 (N, 3, H, W), got {self.images.dtype} {tuple(self.images.shape)}"
            )
        if self.labels.dtype != torch.int64 or self.labels.shape != (self.images.shape[0],):
            raise ValueError(
                f"labels must be int64 of shape ({self.images.shape[0]},), "
                f"got {self.labels.dtype} {tuple(self.labels.shape)}"
            )
        if not self.images.is_contiguous():
            raise ValueError("images must be contiguous")

    def __len__(self) -> int:
        return int(self.images.shape[0])

    @property
    def num_classes(self) -> int:
        """Number of classes (unlabeled images do not count as a class)."""
        return len(self.classes)


# ----------------------------------------------------------------------------------------------------
# Subsetting
# ----------------------------------------------------------------------------------------------------


def class_balanced_subset(labels: torch.Tensor, per_class: int, seed: int) -> torch.Tensor:
    """Chooses ``per_class`` random examples of every class.

    Classes are visited in increasing label order and each draws a random permutation from a single
    ``torch.Generator().manual_seed(seed)``, so the result is a deterministic function of
    ``(labels, per_class, seed)``.

    Args:
        labels: Integer labels of shape ``(N,)``; ``-1`` marks unlabeled examples.
        per_class: Examples to keep per class. ``<= 0`` keeps everything (unlabeled included);
            ``> 0`` excludes unlabeled examples.
        seed: Seed of the selection.

    Returns:
        ``int64`` indices into ``labels``, sorted ascending.

    Raises:
        DataError: If some class has fewer than ``per_class`` examples, or nothing is labeled.
    """
    labels = labels.detach().to("cpu", torch.int64).flatten()
    if per_class <= 0:
        return torch.arange(labels.numel(), dtype=torch.int64)
    classes = torch.unique(labels[labels >= 0])
    if classes.numel() == 0:
        raise DataError(f"cannot take {per_class} examples per class: the data has no labeled examples")
    generator = torch.Generator().manual_seed(seed)
    chosen: list[torch.Tensor] = []
    for cls in classes.tolist():
        members = torch.nonzero(labels == cls).flatten()
        if members.numel() < per_class:
            raise DataError(
                f"class {cls} has only {members.numel()} examples, "
                f"fewer than the {per_class} per class requested"
            )
        order = torch.randperm(members.numel(), generator=generator)
        chosen.append(members[order[:per_class]])
    return torch.sort(torch.cat(chosen)).values  # (num_classes * per_class,)


def _subset(
    images: torch.Tensor, labels: torch.Tensor, per_class: int | None, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if per_class is None or per_class <= 0:
        return images, labels
    index = class_balanced_subset(labels, per_class, seed)
    return images[index], labels[index]


def _finish(
    images: torch.Tensor,
    labels: torch.Tensor,
    classes: Sequence[str],
    image_size: int | None,
    pretty: str,
) -> ImageTensors:
    """Resizes (if requested and needed) and packs tensors into :class:`ImageTensors`."""
    if image_size is not None and (images.shape[-1] != image_size or images.shape[-2] != image_size):
        start = time.perf_counter()
        check_fits_in_memory(images.shape[0] * 3 * image_size * image_size, pretty)
        resized = torch.empty((images.shape[0], 3, image_size, image_size), dtype=torch.uint8)
        for begin in range(0, images.shape[0], DECODE_CHUNK):
            resized[begin : begin + DECODE_CHUNK] = resize_center_crop(
                images[begin : begin + DECODE_CHUNK], image_size
            )
        elapsed = time.perf_counter() - start
        logger.info("resized %d %s images to %d px in %.2f s", len(images), pretty, image_size, elapsed)
        images = resized
    return ImageTensors(
        images=images.contiguous(),
        labels=labels.to(torch.int64).contiguous(),
        classes=tuple(str(c) for c in classes),
    )


# ----------------------------------------------------------------------------------------------------
# Format readers
# ----------------------------------------------------------------------------------------------------


def _load_image_folder(
    split_dir: Path,
    reference_dir: Path,
    image_size: int | None,
    per_class: int | None,
    seed: int,
    pretty: str,
) -> ImageTensors:
    """Reads an ImageFolder directory, decoding only the selected files when ``per_class`` is set."""
    paths, label_list, classes = image_folder_samples(split_dir, reference_dir)
    labels = torch.tensor(label_list, dtype=torch.int64)
    if per_class is not None and per_class > 0:
        index = class_balanced_subset(labels, per_class, seed)
        paths = [paths[i] for i in index.tolist()]
        labels = labels[index]
    images = decode_files(paths, image_size, pretty)
    return _finish(images, labels, classes, None, pretty)


def _load_packed(
    file: Path, split: str, image_size: int | None, per_class: int | None, seed: int, pretty: str
) -> ImageTensors:
    """Reads a split of a pack (:mod:`dcl_core.data.packed`) as :func:`_load_image_folder` reads the folder it
    was packed from: the same files in the same order, the same subset, the same decoder."""
    part = read_split(file, "test" if split == "test" else "train")
    labels = torch.tensor(part.labels, dtype=torch.int64)
    index = list(range(len(labels)))
    if per_class is not None and per_class > 0:
        index = class_balanced_subset(labels, per_class, seed).tolist()
        labels = labels[index]
    names = [f"{file}:{part.names[i]}" for i in index]
    images = decode_bytes(names, part.blobs(index), image_size, pretty)
    return _finish(images, labels, part.classes, None, pretty)


def _load_torchvision_cifar(
    name: str, root: Path, train: bool, download: bool
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    cls = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
    pretty = PRETTY_NAMES[name]
    try:
        dataset = cls(str(root), train=train, download=download)
    except RuntimeError as exc:
        if download:
            raise DataError(f"could not download {pretty} to {root}: {exc}") from exc
        raise DataError(
            f"{pretty} files in {root / TORCHVISION_FOLDERS[name]} failed torchvision's integrity check "
            f"({exc}); delete that directory and fetch it again with --download"
        ) from exc
    except OSError as exc:  # network errors (urllib.error.URLError is an OSError) and file errors
        raise DataError(f"could not {'download' if download else 'read'} {pretty} at {root}: {exc}") from exc
    data = np.ascontiguousarray(dataset.data.transpose(0, 3, 1, 2))  # (N, 32, 32, 3) -> (N, 3, 32, 32)
    images = torch.from_numpy(data)
    labels = torch.as_tensor(np.asarray(dataset.targets), dtype=torch.int64)
    return images, labels, list(dataset.classes)


def _load_torchvision_stl10(
    root: Path, split: str, download: bool
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    tv_split = {"pretrain": "train+unlabeled", "train": "train", "test": "test"}[split]
    try:
        dataset = torchvision.datasets.STL10(str(root), split=tv_split, download=download)
    except RuntimeError as exc:
        if download:
            raise DataError(f"could not download STL-10 to {root}: {exc}") from exc
        raise DataError(
            f"STL-10 files in {root / TORCHVISION_FOLDERS['stl10']} failed torchvision's integrity check "
            f"({exc}); delete that directory and fetch it again with --download"
        ) from exc
    except OSError as exc:
        raise DataError(f"could not {'download' if download else 'read'} STL-10 at {root}: {exc}") from exc
    # torchvision already transposes STL-10's column-major layout to (N, 3, 96, 96); make it contiguous.
    images = torch.from_numpy(np.ascontiguousarray(dataset.data))
    assert dataset.labels is not None
    labels = torch.as_tensor(dataset.labels.astype(np.int64))
    classes = list(getattr(dataset, "classes", None) or _STL10_CLASSES)
    return images, labels, classes


# ----------------------------------------------------------------------------------------------------
# Public entry point
# ----------------------------------------------------------------------------------------------------


def fetch_dataset(name: str, root: str | None = None) -> Path:
    """Download CIFAR-10/100 or STL-10 with torchvision into ``root`` (default: ``~/.cache/dcl_core/<name>``)
    unless it is there already; the root to read it from. One fetch of the archive gives every split.

    Raises:
        DataError: an ImageFolder (nothing to download), or the download failed (one line).
    """
    check_name(name)
    if name == "imagefolder":
        raise DataError("the imagefolder dataset cannot be downloaded; point --data-root at it")
    load_dataset(name, "test", root, download=True)  # torchvision fetches the whole archive for any split
    return resolve_data_root(name, root, download=True)


# long: its signature and docstring (every argument, the return, the errors) are 33 of its lines; the code is 38
def load_dataset(
    name: str,
    split: str,
    root: str | None = None,
    download: bool = False,
    image_size: int | None = None,
    per_class: int | None = None,
    seed: int = 0,
) -> ImageTensors:
    """Loads one split of a dataset into memory as uint8 tensors.

    Args:
        name: One of :data:`DATASETS`.
        split: ``"pretrain"`` (images for self-supervised pretraining: CIFAR train, STL-10
            train+unlabeled, imagefolder train), ``"train"`` (labeled train set) or ``"test"``.
        root: Data directory; ``None`` resolves it with :func:`resolve_data_root`.
        download: Let torchvision fetch cifar10/cifar100/stl10 if absent (needs internet).
        image_size: Output side length. Required for ``imagefolder`` (shorter side resized with
            antialiasing, then center crop). For the other datasets it is optional; images are
            resized the same way only if their native size differs.
        per_class: If set and ``> 0``, keep only ``per_class`` labeled images per class, exactly the
            subset ``class_balanced_subset(full.labels, per_class, seed)`` of the full split (unlabeled
            images are dropped). For ImageFolder layouts only the selected files are decoded, which
            makes small CPU runs start fast.
        seed: Seed of the ``per_class`` selection.

    Returns:
        The split as :class:`ImageTensors`.

    Raises:
        DataError: Unknown name or split, missing or unreadable data, failed download, or too few
            examples for ``per_class``.
    """
    check_name(name)
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if image_size is not None and image_size <= 0:
        raise DataError(f"image size must be positive, got {image_size}")
    pretty = PRETTY_NAMES[name]
    base = resolve_data_root(name, root, download)
    start = time.perf_counter()
    if name == "imagefolder" and image_size is None:
        raise DataError("the imagefolder dataset needs an image size (images are resized to it)")
    kind, source = locate(name, split, base, explicit=bool(root), download=download)
    if kind == "folder":
        result = _load_image_folder(source, base / "train", image_size, per_class, seed, pretty)
    elif kind == "packed":
        result = _load_packed(source, split, image_size, per_class, seed, pretty)
    else:
        if name == "stl10":
            images, labels, classes = _load_torchvision_stl10(base, split, download)
        else:
            images, labels, classes = _load_torchvision_cifar(name, base, split != "test", download)
        images, labels = _subset(images, labels, per_class, seed)
        result = _finish(images, labels, classes, image_size, pretty)

    expected = EXPECTED_CLASSES.get(name)
    if expected is not None and result.num_classes != expected:
        logger.warning("%s at %s has %d classes, expected %d", pretty, source, result.num_classes, expected)
    logger.info(
        "loaded %s %s split from %s: %d images of %dx%d, %d classes (%.2f s)",
        pretty,
        split,
        source,
        len(result),
        result.images.shape[-2],
        result.images.shape[-1],
        result.num_classes,
        time.perf_counter() - start,
    )
    return result
