"""An ImageFolder's files, listed as torchvision lists them: no folder link loop walked, no link out of the folder
followed unless asked, a bounded count.

The in-memory loader (:mod:`dcl_core.data.datasets`), the streaming loader (:mod:`dcl_core.data.streaming`) and the
pack (:mod:`dcl_core.data.packed`) list a folder through :func:`image_folder_samples` / :func:`folder_samples`, so
all three see the same files in the same order with the same labels.
"""

from __future__ import annotations

import os
from pathlib import Path

from dcl_core.data.errors import DataError

MAX_FOLDER_FILES = 10_000_000
"""The most files and folders one split of an ImageFolder may list (ImageNet-1K's train split: 1.28M files), one
reached through several folder links counted each time: a tree of links that multiplies the listing is refused."""


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _inside(path: str, within: str) -> bool:
    return os.path.commonpath([os.path.realpath(path), within]) == within


# long: one walk that checks every folder link for a loop or a way out as it descends (11 lines of docstring)
def folder_samples(directory: str, class_to_idx: dict[str, int], allow_empty: bool = False,
                   within: Path | None = None) -> list[tuple[str, int]]:
    """The ImageFolder's files as torchvision's ``make_dataset`` lists them (those with an image extension under
    each class folder, following folder links, in its order: folders sorted by path, files by name), but a folder
    link back to a folder it lies in (a loop: ``ln -s .. up``) is refused by its path, not walked until the path
    is too long, and no more than :data:`MAX_FOLDER_FILES` files are listed. With ``within`` (a resolved folder),
    a class folder, folder or file reached by a link that leads out of it is refused: nothing outside ``within``
    is listed.

    Raises:
        DataError: a link loop, a link out of ``within``, too many files, or an empty class (unless
            ``allow_empty``).
    """
    from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension  # torch: on first listing

    outside = str(within) if within is not None else None
    listed: list[tuple[str, int]] = []
    count = 0
    for target_class in sorted(class_to_idx):
        top = os.path.join(directory, target_class)
        if not os.path.isdir(top):
            continue
        if outside is not None and not _inside(top, outside):
            raise DataError(f"{top} is a link out of {outside}: only files inside the folder are taken (copy it in, "
                            "or pack with --follow-links)")
        try:
            ancestors = {top: frozenset({_identity(top)})}  # each folder walked: the folders it lies in, itself
        except OSError:
            continue
        walked: list[tuple[str, list[str]]] = []
        for root, dirs, files in os.walk(top, followlinks=True):  # unreadable folders skipped, as torchvision
            here = ancestors.pop(root)
            for name in list(dirs):
                sub = os.path.join(root, name)
                try:
                    identity = _identity(sub)
                except OSError:
                    dirs.remove(name)
                    continue
                if identity in here:
                    link = next((q for q in (sub, *map(str, Path(sub).parents)) if os.path.islink(q)), sub)
                    raise DataError(f"{link} is a link to a folder it lies in (a loop, {sub}): remove it")
                if outside is not None and os.path.islink(sub) and not _inside(sub, outside):
                    raise DataError(f"{sub} is a link out of {outside}: only files inside the folder are taken "
                                    "(copy it in, or pack with --follow-links)")
                ancestors[sub] = here | {identity}
            count += len(files) + len(dirs)
            if count > MAX_FOLDER_FILES:
                raise DataError(f"{directory} lists more than {MAX_FOLDER_FILES:,} files and folders (one reached "
                                "through several folder links counts each time): too many for one split")
            walked.append((root, files))
        for root, files in sorted(walked):
            for name in sorted(files):
                path = os.path.join(root, name)
                if not has_file_allowed_extension(path, IMG_EXTENSIONS):
                    continue
                if outside is not None and os.path.islink(path) and not _inside(path, outside):
                    raise DataError(f"{path} is a link out of {outside}: only files inside the folder are taken "
                                    "(copy it in, or pack with --follow-links)")
                listed.append((path, class_to_idx[target_class]))
    found = {label for _, label in listed}
    empty = sorted(c for c, label in class_to_idx.items() if label not in found)
    if empty and not allow_empty:
        raise DataError(f"{directory} has no image files in the class folders {', '.join(empty[:5])} (supported: "
                        f"{', '.join(IMG_EXTENSIONS)})")
    return listed


def image_folder_samples(split_dir: Path, reference_dir: Path,
                         within: Path | None = None) -> tuple[list[str], list[int], list[str]]:
    """Lists ``split_dir/<class>/<file>`` as torchvision's ImageFolder does (:func:`folder_samples`: no link loops;
    with ``within``, nothing outside it).

    Class indices come from ``reference_dir`` (the train split), so an evaluation split with a missing
    or empty class folder keeps the train split's label numbering.

    Returns:
        ``(paths, labels, classes)`` in ImageFolder order (classes sorted, files sorted).
    """
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes  # torch: on first listing

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
        samples = folder_samples(str(split_dir), class_to_idx, split_dir != reference_dir, within)
    except (FileNotFoundError, ValueError) as exc:
        raise DataError(f"cannot read image folder {split_dir}: {exc}") from exc
    if not samples:
        raise DataError(f"no images found in {split_dir} (supported: {', '.join(IMG_EXTENSIONS)})")
    return [path for path, _ in samples], [label for _, label in samples], classes
