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

A pack is meant to travel, so it holds only images from inside the folder: a link out of it (to a file or a
folder), a link loop, anything but a regular file (a FIFO is never opened, a device never read), a file over
:data:`~dcl_core.data.image_bytes.MAX_IMAGE_BYTES`, a total over :data:`MAX_PACK_BYTES` or bytes that are no image
(PIL's header parser) is refused in one line, before anything is written or with nothing left behind. Reading
one, every offset and length is checked against its buffer (``validate(full=True)``) and the labels, classes and
sizes against the schema before a byte of an image is sliced: a damaged or crafted pack is one line, never a
crash.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from dcl_core.data.errors import DataError
from dcl_core.data.folders import image_folder_samples
from dcl_core.data.image_bytes import IMAGE_FORMATS, MAX_IMAGE_BYTES, image_format, read_image_bytes
from dcl_core.files import disk_full, no_space, write_with

log = logging.getLogger(__name__)

PACKED_FILE = "imagefolder.arrow"
"""A data root holding this file is read as the ImageFolder packed into it (:func:`read_split`; :func:`pack` writes
it)."""

SPLIT_FOLDERS = ("train", "test", "val")
_CLASSES_KEY = b"dcl_core.classes"  # the schema metadata entry: the class names, in label order (JSON)
_SCHEMA = pa.schema([("split", pa.string()), ("label", pa.int32()), ("name", pa.string()), ("data", pa.binary())])

MAX_PACK_BYTES = 64 * 1024**3
"""The most image bytes one pack may hold (64 GiB, CIFAR-10's 60,000 JPEGs are 55 MB), summed from the files'
sizes before one is read: a pack is read whole by the in-memory loader; a larger dataset is read from its folder
(``data.loader=stream``)."""
_BATCH_ROWS = 4096  # a record batch's images at most ...
_BATCH_BYTES = 256 * 1024**2  # ... and its bytes: well inside the 2 GiB an Arrow binary column's int32 offsets span


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


@dataclass(frozen=True)
class _Listed:
    """One split's files, checked (regular files inside the folder, each within the byte bound) but not read."""

    split: str
    paths: list[str]
    names: list[str]
    labels: list[int]


def pack(root: Path, out_dir: Path, splits: Sequence[str] = SPLIT_FOLDERS, follow_links: bool = False) -> Path:
    """Pack the ImageFolder ``root`` (``root/<split>/<class>/<file>``, the ``splits`` present) into
    ``out_dir/``:data:`PACKED_FILE`; the file written. Files are listed as the loader lists them (classes
    numbered by the train split's folders); what is not a regular image file inside ``root`` (or, with
    ``follow_links``, wherever a link inside it leads: an ImageNet-100 made of links into ImageNet) within the
    bounds is refused (DataError) before the pack is written, or while it is, leaving nothing behind."""
    present = [s for s in splits if (root / s).is_dir()]
    if "train" not in present:
        raise DataError(f"{root} has no train/ folder: not an ImageFolder root")
    target = out_dir / PACKED_FILE
    if target.resolve().is_relative_to(root.resolve()):
        raise DataError(f"write the pack outside the folder it packs ({root})")
    try:
        listed, classes = _list(root, present, follow_links)
        # a fresh temporary file renamed over the target: a refusal, a full disk or Ctrl-C leaves nothing behind
        write_with(target, lambda f: _write(f, listed, classes))
    except OSError as exc:
        if no_space(exc):
            raise disk_full(out_dir) from exc
        raise DataError(f"cannot pack {root}: {exc}") from exc
    for part in listed:
        log.info("packed %d %s images of %s", len(part.paths), part.split, root)
    return target


def _list(root: Path, splits: Sequence[str], follow_links: bool = False) -> tuple[list[_Listed], list[str]]:
    """The splits' files and the classes, every file checked by its ``stat`` (nothing opened): a regular file
    (through a link inside ``root``, or any link with ``follow_links``) within :data:`MAX_IMAGE_BYTES`, all of
    them within :data:`MAX_PACK_BYTES`."""
    inside = None if follow_links else root.resolve()
    listed: list[_Listed] = []
    classes: list[str] = []
    total = 0
    for split in splits:
        paths, labels, split_classes = image_folder_samples(root / split, root / "train", within=inside)
        classes = classes or split_classes
        for path in paths:
            try:
                st = os.stat(path)
            except OSError as exc:
                raise DataError(f"cannot read image {path}: {exc.strerror or exc}") from exc
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_IMAGE_BYTES:
                read_image_bytes(path)  # refuses it in its own words, before reading a byte (a FIFO never opened)
            total += st.st_size
        if total > MAX_PACK_BYTES:
            raise DataError(f"{root} holds {total:,} bytes of images, more than the {MAX_PACK_BYTES:,} a pack may "
                            "hold: read the folder itself (data.loader=stream)")
        names = [str(Path(p).relative_to(root / split)) for p in paths]
        listed.append(_Listed(split, paths, names, labels))
    return listed, classes


def _write(f: BinaryIO, listed: Sequence[_Listed], classes: list[str]) -> None:
    """The pack of ``listed`` into ``f``: each file read within its bound and checked to be an image."""
    writer = ipc.new_file(f, _SCHEMA.with_metadata({_CLASSES_KEY: json.dumps(classes).encode()}))
    for part in listed:
        rows: list[int] = []
        blobs: list[bytes] = []
        held = 0
        for i, path in enumerate(part.paths):
            data = read_image_bytes(path)  # a regular file again (never a FIFO swapped in), within the bound
            if image_format(data) is None:
                raise DataError(f"{path} is not an image ({', '.join(IMAGE_FORMATS)}): a pack takes only images")
            rows.append(i)
            blobs.append(data)
            held += len(data)
            if len(rows) == _BATCH_ROWS or held >= _BATCH_BYTES:
                writer.write_batch(_batch(part, rows, blobs))
                rows, blobs, held = [], [], 0
        if rows:
            writer.write_batch(_batch(part, rows, blobs))
    writer.close()


def _batch(part: _Listed, rows: list[int], blobs: list[bytes]) -> pa.RecordBatch:
    return pa.record_batch([
        pa.array([part.split] * len(rows), pa.string()), pa.array([part.labels[i] for i in rows], pa.int32()),
        pa.array([part.names[i] for i in rows], pa.string()), pa.array(blobs, pa.binary())], schema=_SCHEMA)


def _open(file: Path) -> tuple[pa.Table, list[str]]:
    """The pack in ``file`` (memory-mapped) and its classes, after every check a crafted file could fail: a
    regular file, Arrow's own file layout with no compressed or dictionary batch (:func:`_check_stored_plain`:
    reading one could expand past any bound), the schema (before a batch is read), Arrow's full validation (each
    offset and length within its buffer: a patched offset would otherwise make a slice read outside the mapping,
    a crash), no nulls, a JSON list of class names, labels that name one, images within :data:`MAX_IMAGE_BYTES`."""
    def damaged(why: object) -> DataError:
        return DataError(f"cannot read the packed images {file}: {why}")

    try:
        if not stat.S_ISREG(os.stat(file).st_mode):  # a FIFO or device is never mapped
            raise damaged("it is not a regular file")
        mapped = pa.memory_map(str(file))
        _check_stored_plain(memoryview(mapped.read_buffer()))
        mapped.seek(0)
        reader = ipc.open_file(mapped)
        meta = reader.schema.metadata or {}
        if _CLASSES_KEY not in meta or reader.schema.remove_metadata() != _SCHEMA:
            raise DataError(f"{file} is not a pack of dcl_core.data.packed (columns {reader.schema.names})")
        table = reader.read_all()  # zero-copy: the batches' buffers are slices of the mapped file
        table.validate(full=True)
    except (OSError, pa.ArrowException) as exc:
        raise damaged(exc) from exc
    except ValueError as exc:  # _check_stored_plain
        raise damaged(f"{exc}: not a pack this project wrote") from exc
    try:
        classes = json.loads(meta[_CLASSES_KEY])
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise damaged(f"its class names are not JSON ({exc})") from None
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        raise damaged("its class names are not a list of names")
    nulls = [name for name in _SCHEMA.names if table.column(name).null_count]
    if nulls:
        raise damaged(f"its {nulls[0]} column has empty (null) entries")
    if table.num_rows:
        low, high = pc.min_max(table.column("label")).values()
        if low.as_py() < 0 or high.as_py() >= len(classes):
            raise damaged(f"labels {low.as_py()}..{high.as_py()} for {len(classes)} classes")
        largest = pc.max(pc.binary_length(table.column("data"))).as_py()
        if largest > MAX_IMAGE_BYTES:
            raise damaged(f"an image of {largest:,} bytes, more than the {MAX_IMAGE_BYTES:,} an image may hold")
    return table, classes


_ARROW_MAGIC = b"ARROW1"


def _at(buf: memoryview, fmt: str, pos: int) -> int:
    """The number of struct format ``fmt`` at ``pos`` of ``buf``; ValueError when it lies outside."""
    if pos < 0 or pos + struct.calcsize(fmt) > len(buf):
        raise ValueError("an offset points outside the file")
    return int(struct.unpack_from(fmt, buf, pos)[0])


def _field(buf: memoryview, table: int, index: int) -> int | None:
    """Where field ``index`` of the flatbuffer table at ``table`` lies (None when absent), by the table's vtable."""
    vtable = table - _at(buf, "<i", table)
    if 4 + 2 * index + 2 > _at(buf, "<H", vtable):
        return None
    offset = _at(buf, "<H", vtable + 4 + 2 * index)
    return table + offset if offset else None


def _follow(buf: memoryview, pos: int) -> int:
    """The table or vector a flatbuffer offset field at ``pos`` points to."""
    return pos + _at(buf, "<I", pos)


def _check_stored_plain(buf: memoryview) -> None:
    """ValueError unless the Arrow IPC file ``buf`` holds its record batches as they are read (as :func:`pack`
    writes them): no dictionary batch, no compressed body (a few kilobytes of zstd can expand to gigabytes when
    read). Read from the file's footer and each batch's message header (Arrow's flatbuffers: ``Footer`` field 2
    dictionaries, 3 recordBatches of 24-byte ``Block`` {offset, metaDataLength, bodyLength}; ``Message`` field 2
    header; ``RecordBatch`` field 3 compression), every offset checked to lie inside the file."""
    end = len(buf)
    if end < 16 or bytes(buf[:6]) != _ARROW_MAGIC or bytes(buf[end - 6:]) != _ARROW_MAGIC:
        raise ValueError("not an Arrow IPC file")
    footer = _follow(buf, end - 10 - _at(buf, "<i", end - 10))
    dictionaries = _field(buf, footer, 2)
    if dictionaries is not None and _at(buf, "<I", _follow(buf, dictionaries)):
        raise ValueError("it holds dictionary batches")
    batches = _field(buf, footer, 3)
    if batches is None:
        return
    vector = _follow(buf, batches)
    for k in range(_at(buf, "<I", vector)):
        start = _at(buf, "<q", vector + 4 + 24 * k)  # the message: [0xFFFFFFFF] int32 size, flatbuffer, body
        message = _follow(buf, start + (8 if _at(buf, "<I", start) == 0xFFFFFFFF else 4))
        header = _field(buf, message, 2)
        if header is None:
            raise ValueError("a record batch has no header")
        if _field(buf, _follow(buf, header), 3) is not None:
            raise ValueError("its record batches are compressed")


def splits_of(file: Path) -> set[str]:
    """The splits a pack holds."""
    return set(_open(file)[0].column("split").unique().to_pylist())


def read_split(file: Path, split: str) -> PackedSplit:
    """One split of a pack (``test`` falls back to ``val`` as the folder layout does); DataError if absent."""
    table, classes = _open(file)
    held = set(table.column("split").unique().to_pylist())
    wanted = split if split in held or split != "test" else "val"
    if wanted not in held:
        raise DataError(f"{file} holds no {split} split (it holds: {', '.join(sorted(held))})")
    rows = pc.indices_nonzero(pc.equal(table.column("split"), wanted))  # the bytes stay in the mapped file
    return PackedSplit(table.column("name").take(rows).to_pylist(), table.column("label").take(rows).to_pylist(),
                       classes, table.column("data"), rows)
