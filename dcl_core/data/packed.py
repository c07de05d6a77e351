"""An ImageFolder packed into one file: the same encoded images, read by the same decoder, carried as one file.

A dataset of many small files (CIFAR-10 as JPEGs: 60,000 files, 197 MB on disk for 55 MB of image bytes) is slow
to copy and is too big for a transfer with a size limit once each file costs a disk block. Packed, it is one
Arrow IPC file (pyarrow) of the encoded bytes, nothing re-encoded: a root folder holding :data:`PACKED_FILE` is read
like the ImageFolder it was packed from (the same files in the same order, the same labels, the same decoder), so
a run on the pack gives the same tensors and the same results as a run on the folder::

    python -m dcl_core.pack ../shared/datasets/cifar10 -o data/cifar10   # writes data/cifar10/imagefolder.arrow
    python -m dcl_core.train --data-root data/cifar10 ...

Columns: ``split`` (``train``, ``test`` or ``val``, as the folder's split folders), ``label`` (the class index,
numbered by the train split's class folders as :class:`torchvision.datasets.ImageFolder` numbers them), ``name``
(the file's path under its split folder) and ``data`` (its bytes); the schema's metadata holds the class names.
Only the in-memory loader (``data.loader=memory``) reads a pack.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from dcl_core.data.errors import DataError
from dcl_core.data.locate import PACKED_FILE, image_folder_samples

log = logging.getLogger(__name__)

SPLIT_FOLDERS = ("train", "test", "val")
_CLASSES_KEY = b"dcl_core.classes"  # the schema metadata entry: the class names, in label order (JSON)
_SCHEMA = pa.schema([("split", pa.string()), ("label", pa.int32()), ("name", pa.string()), ("data", pa.binary())])


@dataclass(frozen=True)
class PackedSplit:
    """One split of a pack: its files' names (as under the split folder), labels and classes, and their encoded
    bytes (still in the memory-mapped file until :meth:`blobs` takes them)."""

    names: list[str]
    labels: list[int]
    classes: list[str]
    data: pa.ChunkedArray  # the whole pack's bytes column
    rows: pa.Array  # this split's rows of it

    def blobs(self, index: Sequence[int] | None = None) -> list[bytes]:
        """The bytes of the split's images at ``index`` (all without it), in that order."""
        rows = self.rows if index is None else self.rows.take(pa.array(index, pa.int64()))
        return self.data.take(rows).to_pylist()


def pack(root: Path, out_dir: Path, splits: Sequence[str] = SPLIT_FOLDERS) -> Path:
    """Pack the ImageFolder ``root`` (``root/<split>/<class>/<file>``, the ``splits`` present) into
    ``out_dir/``:data:`PACKED_FILE`; the file written. Files are listed as the loader lists them (classes
    numbered by the train split's folders)."""
    present = [s for s in splits if (root / s).is_dir()]
    if "train" not in present:
        raise DataError(f"{root} has no train/ folder: not an ImageFolder root")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / PACKED_FILE
    if target.resolve().is_relative_to(root.resolve()):
        raise DataError(f"write the pack outside the folder it packs ({root})")
    partial = target.with_name(target.name + ".partial")
    try:
        _write(root, present, partial)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise DataError(f"cannot pack {root}: {exc}") from exc
    partial.replace(target)
    return target


def _write(root: Path, splits: Sequence[str], partial: Path) -> None:
    with partial.open("wb") as f:
        writer: ipc.RecordBatchFileWriter | None = None
        for split in splits:
            paths, labels, classes = image_folder_samples(root / split, root / "train")
            names = [str(Path(p).relative_to(root / split)) for p in paths]
            if writer is None:
                meta = {_CLASSES_KEY: json.dumps(classes).encode()}
                writer = ipc.new_file(f, _SCHEMA.with_metadata(meta))
            for begin in range(0, len(paths), 4096):  # record batches of 4,096 images
                chunk = range(begin, min(begin + 4096, len(paths)))
                writer.write_batch(pa.record_batch([
                    pa.array([split] * len(chunk), pa.string()), pa.array([labels[i] for i in chunk], pa.int32()),
                    pa.array([names[i] for i in chunk], pa.string()),
                    pa.array([Path(paths[i]).read_bytes() for i in chunk], pa.binary())], schema=_SCHEMA))
            log.info("packed %d %s images of %s", len(paths), split, root)
        assert writer is not None
        writer.close()


def _open(file: Path) -> pa.Table:
    try:
        return ipc.open_file(pa.memory_map(str(file))).read_all()
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataError(f"cannot read the packed images {file}: {exc}") from exc


def splits_of(file: Path) -> set[str]:
    """The splits a pack holds."""
    return set(_open(file).column("split").unique().to_pylist())


def read_split(file: Path, split: str) -> PackedSplit:
    """One split of a pack (``test`` falls back to ``val`` as the folder layout does); DataError if absent."""
    table = _open(file)
    meta = table.schema.metadata or {}
    if _CLASSES_KEY not in meta or table.schema.remove_metadata() != _SCHEMA:
        raise DataError(f"{file} is not a pack of dcl_core.data.packed (columns {table.schema.names})")
    held = set(table.column("split").unique().to_pylist())
    wanted = split if split in held or split != "test" else "val"
    if wanted not in held:
        raise DataError(f"{file} holds no {split} split (it holds: {', '.join(sorted(held))})")
    rows = pc.indices_nonzero(pc.equal(table.column("split"), wanted))  # the bytes stay in the mapped file
    return PackedSplit(table.column("name").take(rows).to_pylist(), table.column("label").take(rows).to_pylist(),
                       json.loads(meta[_CLASSES_KEY]), table.column("data"), rows)
