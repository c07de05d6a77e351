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
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchvision
from torchvision.datasets.folder import IMG_EXTENSIONS, default_loader, find_classes, make_dataset
from torchvision.io import ImageReadMode
from torchvision.transforms.v2 import functional as TF

from dcl_core.config import DATASET_NAMES, InputError

logger = logging.getLogger(__name__)

DATASETS: tuple[str, ...] = DATASET_NAMES
"""Names accepted by :func:`load_dataset` and :func:`resolve_data_root`: the config's ``data.dataset`` choices
(one list, kept in the torch-free :mod:`dcl_core.config` so the CLIs can check names without importing torch)."""

DATA_ROOT_ENV = "DCL_DATA_ROOT"
"""Environment variable consulted by :func:`resolve_data_root` when no explicit root is given."""

SPLITS: tuple[str, ...] = ("pretrain", "train", "test")

EMBEDDED_CIFAR10: Path = (Path(__file__).resolve().parents[2] / "../shared/datasets/cifar10").resolve()
"""Location of the embedded CIFAR-10 copy (ImageFolder layout, JPEG), relative to the repository.

It lives outside the repository (``<repo>/../shared/datasets/cifar10``) and is only ever read in place.
"""

_PRETTY_NAMES = {
    "cifar10": "CIFAR-10",
    "cifar100": "CIFAR-100",
    "stl10": "STL-10",
    "imagefolder": "ImageFolder",
}
_TV_BASE_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python", "stl10": "stl10_binary"}
_EXPECTED_CLASSES = {"cifar10": 10, "cifar100": 100, "stl10": 10}
_STL10_CLASSES = ("airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck")
_LARGE_TENSOR_BYTES = 8 * 1024**3
_DECODE_CHUNK = 1024
_JPEG_MAGIC = b"\xff\xd8\xff"


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
            last = message.strip().splitlines()[-1]  # "dcl_core.data.datasets.UnreadableImageError: <message>"
            message = last.partition(": ")[2] or last
        super().__init__(message)


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
# Root resolution
# ----------------------------------------------------------------------------------------------------


def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")


def _embedded_candidates() -> list[Path]:
    """Places where the embedded CIFAR-10 copy may live, in lookup order (deduplicated)."""
    candidates = [EMBEDDED_CIFAR10, (Path.cwd() / "../shared/datasets/cifar10").resolve()]
    return list(dict.fromkeys(candidates))


def _is_image_folder_root(path: Path, eval_dirs: Sequence[str] = ("test",)) -> bool:
    return (path / "train").is_dir() and any((path / d).is_dir() for d in eval_dirs)


def _find_embedded_cifar10() -> Path | None:
    for candidate in _embedded_candidates():
        if _is_image_folder_root(candidate):
            return candidate
    return None


def _default_cache_dir(name: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(base).expanduser() / "dcl_core" / name).resolve()


def resolve_data_root(name: str, root: str | None, download: bool = False) -> Path:
    """Decides where a dataset is read from (or downloaded to).

    Order: the explicit ``root``; the ``DCL_DATA_ROOT`` environment variable; for ``cifar10`` the
    embedded copy if present (see :data:`EMBEDDED_CIFAR10`, also looked up relative to the current
    directory) unless ``download`` asks for torchvision's original binary release; otherwise
    ``~/.cache/dcl_core/<name>`` (only useful together with ``download``).

    Args:
        name: Dataset name, one of :data:`DATASETS`.
        root: Explicit data directory, or ``None``.
        download: The caller will download if missing: skip the embedded (JPEG re-encoded) copy.

    Returns:
        An absolute path. It is not checked for existence.

    Raises:
        DataError: If ``name`` is not a known dataset.
    """
    _check_name(name)
    if root:
        return Path(root).expanduser().resolve()
    env_root = os.environ.get(DATA_ROOT_ENV)
    if env_root:
        return Path(env_root).expanduser().resolve()
    if name == "cifar10" and not download:
        embedded = _find_embedded_cifar10()
        if embedded is not None:
            return embedded
    return _default_cache_dir(name)


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


# ----------------------------------------------------------------------------------------------------
# Decoding helpers
# ----------------------------------------------------------------------------------------------------


def _resize_center_crop(image: torch.Tensor, size: int) -> torch.Tensor:
    """Resizes the shorter side of ``(..., C, H, W)`` uint8 images to ``size`` and center-crops."""
    height, width = image.shape[-2:]
    if min(height, width) != size:
        image = TF.resize(image, [size], antialias=True)
    if image.shape[-2] != size or image.shape[-1] != size:
        image = TF.center_crop(image, [size, size])
    return image


def _decode_one(data: torch.Tensor, path: str) -> torch.Tensor:
    """Decodes one encoded image to uint8 RGB ``(3, H, W)``; falls back to PIL for exotic formats."""
    try:
        return torchvision.io.decode_image(data, mode=ImageReadMode.RGB, apply_exif_orientation=True)
    except RuntimeError:
        try:
            return TF.pil_to_tensor(default_loader(path))
        except Exception as exc:
            raise UnreadableImageError(f"cannot decode image {path}: {exc}") from exc


def _read_one(path: str) -> torch.Tensor:
    """The bytes of one image file as a uint8 tensor; UnreadableImageError naming the file if it is empty or
    cannot be read."""
    try:
        data = torchvision.io.read_file(path)
    except RuntimeError as exc:  # "read_file, <source>.cpp:83, <reason>"
        raise UnreadableImageError(f"cannot read image {path}: {str(exc).split(', ')[-1]}") from exc
    if data.numel() == 0:  # torchvision refuses an empty file (above) in some versions
        raise UnreadableImageError(f"cannot read image {path}: the file is empty")
    return data


def _decode_files(paths: Sequence[str], image_size: int | None, pretty: str) -> torch.Tensor:
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
        out = _decode_all(paths, image_size, pretty)
    logger.info("decoded %d %s images in %.2f s", len(paths), pretty, time.perf_counter() - start)
    return out


def _decode_all(paths: Sequence[str], image_size: int | None, pretty: str) -> torch.Tensor:
    """The decoding loop of :func:`_decode_files`."""
    out: torch.Tensor | None = None
    for begin in range(0, len(paths), _DECODE_CHUNK):
        chunk = paths[begin : begin + _DECODE_CHUNK]
        encoded = [_read_one(p) for p in chunk]
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
                decoded[k] = _decode_one(encoded[k], chunk[k])
        for k, img in enumerate(decoded):
            assert img is not None
            if image_size is not None:
                img = _resize_center_crop(img, image_size)
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
        for begin in range(0, images.shape[0], _DECODE_CHUNK):
            resized[begin : begin + _DECODE_CHUNK] = _resize_center_crop(
                images[begin : begin + _DECODE_CHUNK], image_size
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


def _image_folder_samples(split_dir: Path, reference_dir: Path) -> tuple[list[str], list[int], list[str]]:
    """Lists ``split_dir/<class>/<file>`` with torchvision's ImageFolder machinery.

    Class indices come from ``reference_dir`` (the train split), so an evaluation split with a missing
    or empty class folder keeps the train split's label numbering.

    Returns:
        ``(paths, labels, classes)`` in ImageFolder order (classes sorted, files sorted).
    """
    if not reference_dir.is_dir():
        reference_dir = split_dir
    try:
        classes, class_to_idx = find_classes(str(reference_dir))
        own_classes, _ = find_classes(str(split_dir))
        unknown = sorted(set(own_classes) - set(classes))
        if unknown:
            raise DataError(
                f"{split_dir} has class folders missing from {reference_dir}: {', '.join(unknown[:5])}"
            )
        samples = make_dataset(
            str(split_dir),
            class_to_idx,
            extensions=IMG_EXTENSIONS,
            allow_empty=split_dir != reference_dir,
        )
    except (FileNotFoundError, ValueError) as exc:
        raise DataError(f"cannot read image folder {split_dir}: {exc}") from exc
    if not samples:
        raise DataError(f"no images found in {split_dir} (supported: {', '.join(IMG_EXTENSIONS)})")
    return [path for path, _ in samples], [label for _, label in samples], classes


def _load_image_folder(
    split_dir: Path,
    reference_dir: Path,
    image_size: int | None,
    per_class: int | None,
    seed: int,
    pretty: str,
) -> ImageTensors:
    """Reads an ImageFolder directory, decoding only the selected files when ``per_class`` is set."""
    paths, label_list, classes = _image_folder_samples(split_dir, reference_dir)
    labels = torch.tensor(label_list, dtype=torch.int64)
    if per_class is not None and per_class > 0:
        index = class_balanced_subset(labels, per_class, seed)
        paths = [paths[i] for i in index.tolist()]
        labels = labels[index]
    images = _decode_files(paths, image_size, pretty)
    return _finish(images, labels, classes, None, pretty)


def _load_torchvision_cifar(
    name: str, root: Path, train: bool, download: bool
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    cls = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
    pretty = _PRETTY_NAMES[name]
    try:
        dataset = cls(str(root), train=train, download=download)
    except RuntimeError as exc:
        if download:
            raise DataError(f"could not download {pretty} to {root}: {exc}") from exc
        raise DataError(
            f"{pretty} files in {root / _TV_BASE_FOLDERS[name]} failed torchvision's integrity check "
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
            f"STL-10 files in {root / _TV_BASE_FOLDERS['stl10']} failed torchvision's integrity check "
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


def _not_found(name: str, looked: Sequence[Path], download_possible: bool) -> DataError:
    pretty = _PRETTY_NAMES[name]
    where = ", ".join(str(p) for p in dict.fromkeys(looked))
    hint = f"pass --data-root DIR or set {DATA_ROOT_ENV}"
    if download_possible:
        hint += ", or add --download to fetch it with torchvision (needs internet)"
    return DataError(f"{pretty} not found (looked in {where}); {hint}")


# ----------------------------------------------------------------------------------------------------
# Public entry point
# ----------------------------------------------------------------------------------------------------


def _locate(name: str, split: str, base: Path, explicit: bool, download: bool) -> tuple[str, Path]:
    """Where and in which format :func:`load_dataset` reads ``split`` under ``base``: ``("folder", dir)`` for an
    ImageFolder layout, ``("torchvision", dir)`` for torchvision's format (present, or to be downloaded).

    Raises:
        DataError: the split is not there (one line naming every place looked at), or cannot be downloaded.
    """
    if name == "imagefolder":
        if download:
            raise DataError("the imagefolder dataset cannot be downloaded; point --data-root at it")
        looked = [base / "train"] if split in ("pretrain", "train") else [base / "val", base / "test"]
        split_dir = next((p for p in looked if p.is_dir()), None)
        if split_dir is None:
            raise _not_found(name, looked, download_possible=False)
        return "folder", split_dir
    tv_dir = base / _TV_BASE_FOLDERS[name]
    if name == "stl10":
        if not tv_dir.is_dir() and not download:
            raise _not_found(name, [tv_dir], download_possible=True)
        return "torchvision", tv_dir
    folder_split = base / ("test" if split == "test" else "train")
    if tv_dir.is_dir() or (download and not _is_image_folder_root(base)):
        return "torchvision", tv_dir
    if _is_image_folder_root(base):
        return "folder", folder_split
    looked = [tv_dir, folder_split]
    if name == "cifar10" and not explicit and not os.environ.get(DATA_ROOT_ENV) and not download:
        looked = [*_embedded_candidates(), *looked]
    raise _not_found(name, looked, download_possible=True)


def split_location(name: str, split: str, root: str | None = None, download: bool = False) -> tuple[str, Path]:
    """Where :func:`load_dataset` reads ``split``: ``("folder", dir)`` for an ImageFolder layout (which the
    streaming loader can read as well), ``("torchvision", dir)`` for torchvision's format. DataError if absent."""
    _check_name(name)
    return _locate(name, split, resolve_data_root(name, root, download), explicit=bool(root), download=download)


def pretraining_images(name: str, root: str | None, download: bool, per_class: int) -> int | None:
    """How many pretraining images :func:`load_dataset` will give, if that is known without reading them: a
    class-balanced subset's ``per_class`` times the number of classes (the train split's class folders, or the
    dataset's fixed count). None otherwise (the whole split, or STL-10's train + unlabeled): only loading it
    tells. A pre-flight for the CLIs, like :func:`check_dataset`.
    """
    if per_class <= 0 or name == "stl10":
        return None
    try:
        kind, where = split_location(name, "train", root, download)
        classes = len(find_classes(str(where))[0]) if kind == "folder" else _EXPECTED_CLASSES[name]
    except (DataError, OSError):  # no class folders: load_dataset says so, in its own words
        return None
    return classes * per_class


def check_dataset(name: str, root: str | None = None, download: bool = False) -> Path:
    """The resolved root, after checking that :func:`load_dataset` will find its train and test splits there
    (or may download them). Nothing is decoded: a pre-flight check for CLIs, before any compute starts.

    Raises:
        DataError: unknown dataset, or a split missing (one line saying where it looked and how to get it).
    """
    for split in ("train", "test"):
        split_location(name, split, root, download)
    return resolve_data_root(name, root, download)


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
    _check_name(name)
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    if image_size is not None and image_size <= 0:
        raise DataError(f"image size must be positive, got {image_size}")
    pretty = _PRETTY_NAMES[name]
    base = resolve_data_root(name, root, download)
    start = time.perf_counter()
    if name == "imagefolder" and image_size is None:
        raise DataError("the imagefolder dataset needs an image size (images are resized to it)")
    kind, source = _locate(name, split, base, explicit=bool(root), download=download)
    if kind == "folder":
        result = _load_image_folder(source, base / "train", image_size, per_class, seed, pretty)
    else:
        if name == "stl10":
            images, labels, classes = _load_torchvision_stl10(base, split, download)
        else:
            images, labels, classes = _load_torchvision_cifar(name, base, split != "test", download)
        images, labels = _subset(images, labels, per_class, seed)
        result = _finish(images, labels, classes, image_size, pretty)

    expected = _EXPECTED_CLASSES.get(name)
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
