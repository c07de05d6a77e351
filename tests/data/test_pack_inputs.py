"""Hostile and clumsy input to ``python -m dcl_core.pack`` and to a pack's reader (issue 46, items 4, 5, 7, 10, 11):
a FIFO, a device node, a link loop, a link out of the folder, a file that is no image or is too large are refused in
one line (exit 2) before anything is read or with nothing left behind, never hang or fill the memory; a crafted pack
(a patched offset, a label out of range, class names that are not a JSON list) is one line, never a crash or a
traceback; a name read from the data is shown escaped. Real FIFOs, device nodes (``mknod``: the tests run as root),
links and crafted Arrow files; each hang or memory blow-up the old code showed is bounded here by an alarm and an
address-space limit, so that it fails the test instead of the machine."""

from __future__ import annotations

import os
import resource
import signal
import stat
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc
import pyrun
import pytest
import torch
import torchvision
from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

from dcl_core.data import DataError, check_dataset, load_dataset, pretraining_images
from dcl_core.data import folders as folders_module
from dcl_core.data.folders import folder_samples
from dcl_core.data.image_bytes import MAX_IMAGE_BYTES, read_image_bytes
from dcl_core.data.packed import MAX_PACK_BYTES, PACKED_FILE, pack, read_split
from dcl_core.data.streaming import folder_split, load_image
from dcl_core.pack import main as pack_main

REPO = Path(__file__).resolve().parents[2]
SECRET = b"the-secret-text-0123456789"


def _folder(root: Path) -> Path:
    """A tiny ImageFolder: train/{bird,cat} with two 8x8 JPEGs each, test/{bird,cat} with one."""
    gen = torch.Generator().manual_seed(0)
    for split, n in (("train", 2), ("test", 1)):
        for cls in ("bird", "cat"):
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                img = torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8, generator=gen)
                torchvision.io.write_jpeg(img, str(root / split / cls / f"{i}.jpg"))
    return root


def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/self/status")


@contextmanager
def _bounded(seconds: int = 60, extra_bytes: int = 1024**3) -> Iterator[None]:
    """What runs inside is stopped after ``seconds`` (TimeoutError: an open of a FIFO blocks forever) and may map
    only ``extra_bytes`` more memory (MemoryError: reading /dev/zero never ends), so a regression fails the test,
    not the machine."""
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    # pyarrow's allocator (mimalloc) reserves its arena at its first allocation in a process: done before the
    # bound, or pyarrow 26 fails a 64-byte malloc under it (a worker whose first pack runs here)
    pa.array(["warm"], pa.string())
    previous = signal.signal(signal.SIGALRM, expired)
    resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + extra_bytes, hard))
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, previous)


def _refused(capsys: pytest.CaptureFixture[str], root: Path, out: Path, needle: str) -> str:
    """``python -m dcl_core.pack root -o out`` (in this process, bounded): exit 2, one line holding ``needle``,
    and nothing left in ``out`` (no pack, no ``.partial``, no temporary file)."""
    capsys.readouterr()
    with _bounded():
        code = pack_main([str(root), "-o", str(out)])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], captured
    assert not out.exists() or not list(out.iterdir()), list(out.iterdir())
    return lines[0]


def test_an_empty_output_folder_is_one_line_and_nothing_is_written_here(tmp_path: Path, monkeypatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 61, item 11: ``python -m dcl_core.pack ROOT -o ''`` wrote the pack into the folder it ran from. Now one
    line, exit 2, nothing written (``-o .`` still names this folder)."""
    root = _folder(tmp_path / "root")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert pack_main([str(root), "-o", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: -o is empty: name the folder to write {PACKED_FILE} into (-o . for this one)"], err
    assert list(here.iterdir()) == []


def _char_device(path: Path) -> Path:
    """A character device with /dev/zero's numbers (1, 5), made here."""
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))
    return path


# ------------------------------------------------------------------------------------------------------------
# Item 4: inputs that hang or exhaust memory
# ------------------------------------------------------------------------------------------------------------


def test_a_fifo_named_like_an_image_is_refused_and_never_opened(tmp_path: Path, capsys) -> None:
    folder = _folder(tmp_path / "if")
    fifo = folder / "train" / "bird" / "f.jpg"
    os.mkfifo(fifo)  # the old pack blocked in its open forever
    _refused(capsys, folder, tmp_path / "out", f"{fifo}: it is a FIFO, not a regular file")
    with _bounded(), pytest.raises(DataError, match="it is a FIFO"):  # the folder's own loaders as well
        load_dataset("imagefolder", "train", root=str(folder), image_size=8)
    with _bounded(), pytest.raises(DataError, match="it is a FIFO"):
        load_image(str(fifo))


@pytest.mark.parametrize("where", ["in the folder", "linked inside the folder", "linked from outside"])
def test_a_device_node_is_refused_and_never_read(tmp_path: Path, capsys, where: str) -> None:
    folder = _folder(tmp_path / "if")
    name = folder / "train" / "bird" / "z.jpg"
    if where == "in the folder":
        _char_device(name)
        needle = f"{name}: it is a character device, not a regular file"
    elif where == "linked inside the folder":
        (folder / "nodes").mkdir()
        name.symlink_to(_char_device(folder / "nodes" / "zero"))
        needle = f"{name}: it is a character device, not a regular file"
    else:  # the reproduction: a link to /dev/zero (the old pack read it until a MemoryError)
        name.symlink_to(_char_device(tmp_path / "zero"))
        needle = f"{name} is a link out of {folder}"
    _refused(capsys, folder, tmp_path / "out", needle)
    with _bounded(), pytest.raises(DataError, match="it is a character device"):
        read_image_bytes(str(name))


def test_a_link_loop_is_refused_not_walked(tmp_path: Path, capsys) -> None:
    folder = _folder(tmp_path / "if")
    up = folder / "train" / "bird" / "up"
    up.symlink_to("..")  # the old pack walked up/bird/up/bird/... until the path was too long
    _refused(capsys, folder, tmp_path / "out", f"{up} is a link to a folder it lies in (a loop")
    for read in (lambda: load_dataset("imagefolder", "train", root=str(folder), image_size=8),
                 lambda: folder_split(folder / "train", None)):  # the in-memory and the streaming loader
        with _bounded(), pytest.raises(DataError, match="a link to a folder it lies in"):
            read()


def test_links_that_multiply_the_listing_are_refused_at_the_file_bound(tmp_path: Path, monkeypatch) -> None:
    """Two links to the next folder at each of 12 levels: no loop, but 4,096 ways to each file at the bottom (at
    24 levels, 16 million: the walk would take hours). The bound, lowered here so the test walks little, stops it."""
    monkeypatch.setattr(folders_module, "MAX_FOLDER_FILES", 1000)
    folder = _folder(tmp_path / "if")
    levels = [folder / "deep" / f"d{i:02d}" for i in range(13)]
    for level in levels:
        level.mkdir(parents=True)
    torchvision.io.write_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8), str(levels[-1] / "x.jpg"))
    for upper, lower in zip([folder / "train" / "bird", *levels[1:-1]], levels[1:], strict=True):
        (upper / "a").symlink_to(lower)
        (upper / "b").symlink_to(lower)
    with _bounded(), pytest.raises(DataError, match="lists more than 1,000 files and folders"):
        load_dataset("imagefolder", "train", root=str(folder), image_size=8)


def test_the_listing_is_torchvisions_where_links_make_no_loop(tmp_path: Path) -> None:
    """Folder links that make no loop (two links to one folder, a nested folder) list as torchvision lists them."""
    folder = _folder(tmp_path / "if")
    (folder / "extra" / "deep").mkdir(parents=True)
    for i, where in enumerate((folder / "extra", folder / "extra" / "deep")):
        torchvision.io.write_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8), str(where / f"x{i}.jpg"))
    (folder / "train" / "bird" / "more").symlink_to(folder / "extra")
    (folder / "train" / "cat" / "again").symlink_to(folder / "extra")
    (folder / "train" / "cat" / "sub").mkdir()
    (folder / "train" / "cat" / "sub" / "n.txt").write_text("not listed: no image extension")
    _, class_to_idx = find_classes(str(folder / "train"))
    ours = folder_samples(str(folder / "train"), class_to_idx)
    assert ours == make_dataset(str(folder / "train"), class_to_idx, extensions=IMG_EXTENSIONS)
    assert len(ours) == 8 and folder_samples(str(folder / "train"), class_to_idx, within=folder.resolve()) == ours
    packed = read_split(pack(folder, tmp_path / "out"), "train")  # links inside the folder are packed
    assert packed.names == [os.path.relpath(path, folder / "train") for path, _ in ours]
    assert packed.names[2:4] == ["bird/more/x0.jpg", "bird/more/deep/x1.jpg"]


def test_an_image_over_the_byte_bound_is_refused_by_its_size(tmp_path: Path, capsys) -> None:
    folder = _folder(tmp_path / "if")
    big = folder / "train" / "cat" / "big.jpg"
    with big.open("wb") as f:  # sparse: no disk used
        f.truncate(MAX_IMAGE_BYTES + 1)
    _refused(capsys, folder, tmp_path / "out", f"{big}: it holds more than {MAX_IMAGE_BYTES:,} bytes")
    with pytest.raises(DataError, match=f"more than {MAX_IMAGE_BYTES:,} bytes"):
        load_dataset("imagefolder", "train", root=str(folder), image_size=8)


def test_a_pack_over_the_total_bound_is_refused_before_a_file_is_read(tmp_path: Path, capsys) -> None:
    folder = _folder(tmp_path / "if")
    for i in range(MAX_PACK_BYTES // MAX_IMAGE_BYTES + 1):  # each within the image bound, together over
        with (folder / "train" / "cat" / f"s{i:04d}.jpg").open("wb") as f:  # sparse: no disk used
            f.truncate(MAX_IMAGE_BYTES)
    # the old pack read them (64 GiB of zeros): here the 1 GiB of memory _bounded allows ends that
    _refused(capsys, folder, tmp_path / "out", f"more than the {MAX_PACK_BYTES:,} a pack may hold")


# ------------------------------------------------------------------------------------------------------------
# Item 5: nothing from outside the folder, nothing but images
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("link", ["a file", "a folder", "a class folder", "an image"])
def test_a_link_out_of_the_folder_is_refused_and_nothing_of_it_packed(tmp_path: Path, capsys, link: str) -> None:
    folder = _folder(tmp_path / "if")
    outside = tmp_path / "home"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    torchvision.io.write_jpeg(torch.zeros(3, 8, 8, dtype=torch.uint8), str(outside / "photo.jpg"))
    name = {"a file": folder / "train" / "bird" / "zz.jpg", "a folder": folder / "train" / "bird" / "home",
            "a class folder": folder / "train" / "owl", "an image": folder / "train" / "bird" / "zz.jpg"}[link]
    name.symlink_to({"a file": outside / "secret.txt", "an image": outside / "photo.jpg"}.get(link, outside))
    if link == "a folder":
        (outside / "secret.jpg").write_bytes(SECRET)
    _refused(capsys, folder, tmp_path / "out", f"{name} is a link out of {folder}")


def test_a_file_that_is_no_image_is_refused(tmp_path: Path, capsys) -> None:
    folder = _folder(tmp_path / "if")
    notes = folder / "test" / "cat" / "notes.jpg"
    notes.write_bytes(SECRET)
    _refused(capsys, folder, tmp_path / "out", f"{notes} is not an image (JPEG, ")
    notes.write_bytes(b"")
    _refused(capsys, folder, tmp_path / "out", f"cannot read image {notes}: the file is empty")


# ------------------------------------------------------------------------------------------------------------
# Items 7 and 10: crafted packs
# ------------------------------------------------------------------------------------------------------------


def _patch_offset(file: Path, column: str, slot: int, value: int) -> None:
    """Overwrite the int32 offset ``slot`` of ``column``'s first chunk in the pack ``file``, where it lies in the
    file (Arrow's IPC file holds the buffers as they are mapped)."""
    mapped = pa.memory_map(str(file))
    base = mapped.read_buffer(mapped.size()).address
    mapped.seek(0)
    offsets = pa.ipc.open_file(mapped).read_all().column(column).chunk(0).buffers()[1]
    where = offsets.address - base + 4 * slot
    old = struct.unpack_from("<i", offsets.to_pybytes(), 4 * slot)[0]
    del offsets
    mapped.close()
    with file.open("r+b") as f:
        f.seek(where)
        assert struct.unpack("<i", f.read(4))[0] == old > 0
        f.seek(where)
        f.write(struct.pack("<i", value))


def _rewrite(file: Path, labels: list[int | None] | None = None, classes: bytes | None = None,
             compression: str | None = None, dictionary: bool = False) -> None:
    """Rewrite the pack ``file`` with other labels or other class metadata, compressed (zstd: a few kilobytes that
    read as gigabytes) or with a dictionary-encoded split column: a pack another tool wrote."""
    table = pa.ipc.open_file(pa.BufferReader(file.read_bytes())).read_all()
    if labels is not None:
        table = table.set_column(1, table.schema.field("label"), pa.array(labels, pa.int32()))
    if classes is not None:
        table = table.replace_schema_metadata({b"dcl_core.classes": classes})
    if dictionary:
        table = table.set_column(0, "split", table.column("split").dictionary_encode())
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.OSFile(str(file), "wb") as f, pa.ipc.new_file(f, table.schema, options=options) as writer:
        writer.write_table(table)


def _crafted(tmp_path: Path, damage: str) -> Path:
    """A pack of the tiny folder, damaged as ``damage`` says; its folder (a data root)."""
    file = pack(_folder(tmp_path / "if"), tmp_path / "pack")
    rows = pa.ipc.open_file(pa.BufferReader(file.read_bytes())).read_all().num_rows
    if damage == "offset":  # the reproduction: the old reader crashed (exit 139, nothing printed)
        _patch_offset(file, "data", 2, 2**31 - 1000)
    elif damage == "name offset":
        _patch_offset(file, "name", 1, 2**31 - 1000)
    elif damage == "compressed":
        _rewrite(file, compression="zstd")
    elif damage == "dictionary-encoded":
        _rewrite(file, dictionary=True)
    elif damage in ("label 2 of 2 classes", "label -1", "a null label"):
        value = {"label 2 of 2 classes": 2, "label -1": -1, "a null label": None}[damage]
        _rewrite(file, labels=[value] + [0] * (rows - 1))
    else:
        _rewrite(file, classes={"classes a dict": b'{"bird": 0}', "classes not JSON": b"bird,cat",
                                "classes nested too deep": b"[" * 100_000, "classes not names": b"[1, 2]",
                                "no classes": b"[]"}[damage])
    return file.parent


CRAFTED = ["offset", "name offset", "compressed", "dictionary-encoded", "label 2 of 2 classes", "label -1",
           "a null label", "classes a dict", "classes not JSON", "classes nested too deep", "classes not names",
           "no classes"]


@pytest.mark.parametrize("damage", CRAFTED)
def test_a_crafted_pack_is_refused_in_one_line_before_a_byte_is_sliced(tmp_path: Path, damage: str) -> None:
    root = _crafted(tmp_path, damage)
    file = root / PACKED_FILE
    with pytest.raises(DataError, match=f"cannot read the packed images {file}: ") as info:
        read_split(file, "train")
    assert "\n" not in str(info.value)
    with pytest.raises(DataError, match="cannot read the packed images"):  # the pre-flight of every command
        check_dataset("imagefolder", str(root))
    with pytest.raises(DataError, match="cannot read the packed images"):
        load_dataset("imagefolder", "train", root=str(root), image_size=8)


@pytest.mark.slow  # the training CLI in a subprocess (~7 CPU-s, torch's import)
@pytest.mark.parametrize("damage", ["offset", "label 2 of 2 classes", "classes a dict"])
def test_train_on_a_crafted_pack_exits_2_in_one_line(tmp_path: Path, damage: str) -> None:
    root = _crafted(tmp_path, damage)
    for per_class in ("0", "1"):  # the whole split, and a subset (the pre-flight counted a pack's classes by name)
        proc = pyrun.run([sys.executable, "-m", "dcl_core.train", "--dataset", "imagefolder", "--data-root",
                          str(root), "--set", "data.image_size=8", "--set", f"data.train_per_class={per_class}",
                          "--output-dir", str(tmp_path / "o"), "--threads", "1"], cwd=REPO, timeout=300)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
        assert "cannot read the packed images" in errors[0] and "Traceback" not in proc.stderr


def test_the_preflight_counts_a_packed_imagefolders_classes(tmp_path: Path) -> None:
    """``pretraining_images`` read a packed ImageFolder's class count from a table of named datasets (KeyError)."""
    root = pack(_folder(tmp_path / "if"), tmp_path / "pack").parent
    assert pretraining_images("imagefolder", str(root), False, 2) == 4


# ------------------------------------------------------------------------------------------------------------
# Item 11: names from the data are shown escaped
# ------------------------------------------------------------------------------------------------------------


def test_a_name_with_terminal_escapes_is_shown_escaped(tmp_path: Path, capsys) -> None:
    folder = _folder(tmp_path / "if")
    (folder / "train" / "cat" / "\x1b[31mred.jpg").write_bytes(SECRET)
    line = _refused(capsys, folder, tmp_path / "out", "\\x1b[31mred.jpg is not an image")
    assert "\x1b" not in line
    with pytest.raises(DataError, match="cannot decode image") as info:  # the folder's loader
        load_dataset("imagefolder", "train", root=str(folder), image_size=8)
    assert "\\x1b[31mred.jpg" in str(info.value) and "\x1b" not in str(info.value)
    # a pack another tool wrote, whose image of that name does not decode
    (folder / "train" / "cat" / "\x1b[31mred.jpg").unlink()
    file = pack(folder, tmp_path / "pack")
    table = pa.ipc.open_file(pa.BufferReader(file.read_bytes())).read_all()
    table = table.set_column(2, table.schema.field("name"),
                             pa.array(["\x1b]0;owned\x07" + n for n in table.column("name").to_pylist()]))
    table = table.set_column(3, table.schema.field("data"), pa.array([SECRET] * table.num_rows, pa.binary()))
    with pa.OSFile(str(file), "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(DataError, match="cannot decode image") as info:
        load_dataset("imagefolder", "train", root=str(file.parent), image_size=8)
    assert "\\x1b]0;owned\\x07bird/0.jpg" in str(info.value) and "\x1b" not in str(info.value)


def test_follow_links_packs_images_that_links_lead_to_outside_the_folder(tmp_path: Path, capsys) -> None:
    """A subset made of links into a larger dataset (ImageNet-100 into ImageNet) packs with --follow-links: the
    bytes of what the links point to, still checked to be regular image files within the bounds."""
    folder = _folder(tmp_path / "if")
    outside = tmp_path / "imagenet"
    outside.mkdir()
    photo = outside / "photo.jpg"
    torchvision.io.write_jpeg(torch.full((3, 8, 8), 7, dtype=torch.uint8), str(photo))
    (folder / "train" / "bird" / "zz.jpg").symlink_to(photo)
    _refused(capsys, folder, tmp_path / "out", "pack with --follow-links")
    assert pack_main([str(folder), "-o", str(tmp_path / "out"), "--follow-links"]) == 0
    split = read_split(tmp_path / "out" / PACKED_FILE, "train")
    assert photo.read_bytes() in split.blobs()
    (outside / "secret.jpg").write_bytes(SECRET)  # followed, but still no image: refused
    (folder / "train" / "bird" / "zy.jpg").symlink_to(outside / "secret.jpg")
    assert pack_main([str(folder), "-o", str(tmp_path / "out2"), "--follow-links"]) == 2
    assert "is not an image" in capsys.readouterr().err and not (tmp_path / "out2" / PACKED_FILE).exists()
