"""Where a dataset lives: the root a name resolves to, and where and in which format each split is read.

Nothing is decoded here: :mod:`dcl_core.data.datasets` reads what this module locates, and the command lines
use :func:`check_dataset` / :func:`pretraining_images` as pre-flight checks before any compute starts.

Root order (:func:`resolve_data_root`): an explicit ``root``; the ``DCL_DATA_ROOT`` environment variable; for
``cifar10`` the embedded ImageFolder copy beside the repository (:data:`EMBEDDED_CIFAR10`) unless a download
asks for torchvision's binary release; otherwise ``~/.cache/dcl_core/<name>``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from dcl_core.config import DATASET_NAMES
from dcl_core.data.errors import DataError
from dcl_core.data.packed import PACKED_FILE, read_split
from dcl_core.files import real_path

DATASETS: tuple[str, ...] = DATASET_NAMES
"""Names accepted by :func:`load_dataset` and :func:`resolve_data_root`: the config's ``data.dataset`` choices
(one list, kept in the torch-free :mod:`dcl_core.config` so the CLIs can check names without importing torch)."""

DATA_ROOT_ENV = "DCL_DATA_ROOT"
"""Environment variable consulted by :func:`resolve_data_root` when no explicit root is given."""

EMBEDDED_CIFAR10: Path = (Path(__file__).resolve().parents[2] / "../shared/datasets/cifar10").resolve()
"""Location of the embedded CIFAR-10 copy (ImageFolder layout, JPEG), relative to the repository.

It lives outside the repository (``<repo>/../shared/datasets/cifar10``) and is only ever read in place.
"""

PRETTY_NAMES = {
    "cifar10": "CIFAR-10",
    "cifar100": "CIFAR-100",
    "stl10": "STL-10",
    "imagefolder": "ImageFolder",
}
TORCHVISION_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python", "stl10": "stl10_binary"}
EXPECTED_CLASSES = {"cifar10": 10, "cifar100": 100, "stl10": 10}

# ----------------------------------------------------------------------------------------------------
# Root resolution
# ----------------------------------------------------------------------------------------------------


def check_name(name: str) -> None:
    """DataError unless ``name`` is one of :data:`DATASETS`."""
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
    check_name(name)
    if root:
        return real_path(root)
    env_root = os.environ.get(DATA_ROOT_ENV)
    if env_root:
        return real_path(env_root)
    if name == "cifar10" and not download:
        embedded = _find_embedded_cifar10()
        if embedded is not None:
            return embedded
    return _default_cache_dir(name)


def _not_found(name: str, looked: Sequence[Path], download_possible: bool) -> DataError:
    pretty = PRETTY_NAMES[name]
    where = ", ".join(str(p) for p in dict.fromkeys(looked))
    hint = f"pass --data-root DIR or set {DATA_ROOT_ENV}"
    if download_possible:
        hint += ", or add --download to fetch it with torchvision (needs internet)"
    return DataError(f"{pretty} not found (looked in {where}); {hint}")



def locate(name: str, split: str, base: Path, explicit: bool, download: bool) -> tuple[str, Path]:
    """Where and in which format :func:`load_dataset` reads ``split`` under ``base``: ``("folder", dir)`` for an
    ImageFolder layout, ``("packed", file)`` for one packed into ``base/imagefolder.arrow``
    (:mod:`dcl_core.data.packed`), ``("torchvision", dir)`` for torchvision's format (present, or to be
    downloaded).

    Raises:
        DataError: the split is not there (one line naming every place looked at), or cannot be downloaded.
    """
    packed = base / PACKED_FILE
    if name != "stl10" and packed.is_file():  # an ImageFolder packed into one file (dcl_core.data.packed)
        return "packed", packed
    if name == "imagefolder":
        if download:
            raise DataError("the imagefolder dataset cannot be downloaded; point --data-root at it")
        looked = [base / "train"] if split in ("pretrain", "train") else [base / "val", base / "test"]
        split_dir = next((p for p in looked if p.is_dir()), None)
        if split_dir is None:
            raise _not_found(name, looked, download_possible=False)
        return "folder", split_dir
    tv_dir = base / TORCHVISION_FOLDERS[name]
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
    check_name(name)
    return locate(name, split, resolve_data_root(name, root, download), explicit=bool(root), download=download)


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
        if kind == "folder":  # its class folders, counted as torchvision's find_classes lists them (no torch here)
            with os.scandir(where) as entries:
                classes = sum(1 for entry in entries if entry.is_dir())
            if not classes:
                return None
        elif kind == "packed":
            classes = len(read_split(where, "train").classes)
        else:
            classes = EXPECTED_CLASSES[name]
    except (DataError, OSError):  # no class folders: load_dataset says so, in its own words
        return None
    return classes * per_class


def check_dataset(name: str, root: str | None = None, download: bool = False) -> Path:
    """The resolved root, after checking that :func:`load_dataset` will find its train and test splits there
    (or may download them). Nothing is decoded: a pre-flight check for CLIs, before any compute starts.

    Raises:
        DataError: unknown dataset, a split missing (one line saying where it looked and how to get it), or a
            damaged pack.
    """
    for split in ("train", "test"):
        kind, where = split_location(name, split, root, download)
        if kind == "packed":  # its structure checked (offsets, labels, classes), nothing decoded
            read_split(where, split)
    return resolve_data_root(name, root, download)


def check_outside_splits(output: str | Path, root: Path) -> None:
    """DataError unless ``output`` (a folder a run writes) lies outside the data's split folders (``root/train``,
    ``root/test``, ``root/val``): a run writing there adds a class (its folder) or files to the images it reads,
    and every later run on that data is refused (or trains on them)."""
    out = real_path(output)
    for split in ("train", "test", "val"):
        folder = root / split
        if folder.is_dir() and out.is_relative_to(real_path(folder)):
            raise DataError(f"{out} is inside the data's {split}/ folder ({folder}): a run would write among the "
                            "images it reads; write it elsewhere")
