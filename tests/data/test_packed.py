"""A packed ImageFolder (``dcl_core.data.packed``) loads exactly as the folder it was packed from: the same tensors,
labels and classes for every split and subset, the same decoder's errors naming the file, and a CLI that refuses
bad input in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc
import pytest
import torch
import torchvision
from PIL import Image

from dcl_core.data import DataError, check_dataset, load_dataset, split_location
from dcl_core.data.locate import EMBEDDED_CIFAR10
from dcl_core.data.packed import PACKED_FILE, pack, read_split, splits_of
from dcl_core.pack import main as pack_main
from dcl_core.study.plan.cost import data_sizes


def _folder(root: Path, eval_split: str = "test") -> Path:
    """Three classes of JPEGs and PNGs (one grayscale, one RGBA: PIL's fallback), an unequal count per class."""
    gen = torch.Generator().manual_seed(7)
    for split, per in (("train", (5, 4, 6)), (eval_split, (2, 3, 2))):
        for cls, n in zip(("cat", "dog", "emu"), per, strict=True):
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                img = torch.randint(0, 256, (3, 12, 12), dtype=torch.uint8, generator=gen)
                where = root / split / cls / f"{i:02d}"
                if i == 1:
                    torchvision.io.write_png(img[:1], f"{where}.png")  # grayscale
                elif i == 3:
                    rgba = torch.cat([img, img[:1]]).permute(1, 2, 0).numpy()  # (12, 12, 4)
                    Image.fromarray(rgba).save(f"{where}.png")
                else:
                    torchvision.io.write_jpeg(img, f"{where}.jpg", quality=85)
    return root


def _same(a, b) -> None:
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels) and a.classes == b.classes


@pytest.mark.parametrize("eval_split", ["test", "val"])
def test_a_pack_loads_as_its_folder_for_every_split_and_subset(tmp_path: Path, eval_split: str) -> None:
    folder = _folder(tmp_path / "folder", eval_split)
    file = pack(folder, tmp_path / "packed")
    assert file == tmp_path / "packed" / PACKED_FILE and splits_of(file) == {"train", eval_split}
    name = "imagefolder" if eval_split == "val" else "cifar10"
    size = 12 if name == "imagefolder" else None
    for split in ("pretrain", "train", "test"):
        for per_class in (None, 2):
            folder_data = load_dataset(name, split, root=str(folder), image_size=size, per_class=per_class, seed=5)
            packed_data = load_dataset(name, split, root=str(file.parent), image_size=size, per_class=per_class,
                                       seed=5)
            _same(folder_data, packed_data)
    assert split_location(name, "train", str(file.parent)) == ("packed", file)
    assert check_dataset(name, str(file.parent)) == file.parent
    # the cost estimate counts a packed ImageFolder's images from the pack
    sizes = data_sizes("imagefolder", str(file.parent), 0, 0)
    assert (sizes.pretrain, sizes.bank, sizes.test) == (15, 15, 7) and sizes.source == f"counted in {file}"


def test_the_embedded_cifar10_subset_loads_identically_from_a_pack_of_it(tmp_path: Path) -> None:
    if not (EMBEDDED_CIFAR10 / "train").is_dir():
        pytest.skip("embedded CIFAR-10 not present")
    # a pack of two classes' folders of the real JPEGs (the whole set: 60,000 files, ~20 s), copied in: a pack
    # takes nothing through a link out of its folder
    small = tmp_path / "cifar"
    for split in ("train", "test"):
        for cls in ("airplane", "cat"):
            (small / split / cls).mkdir(parents=True)
            for f in sorted((EMBEDDED_CIFAR10 / split / cls).iterdir())[:40]:
                shutil.copyfile(f, small / split / cls / f.name)
    file = pack(small, tmp_path / "packed")
    for split in ("pretrain", "test"):
        _same(load_dataset("cifar10", split, root=str(small), per_class=25, seed=1),
              load_dataset("cifar10", split, root=str(file.parent), per_class=25, seed=1))


def _replace_image(file: Path, name: str, data: bytes) -> None:
    """Rewrite the pack ``file`` with ``data`` as the bytes of its image ``name``: a pack another tool wrote (pack
    itself takes only images)."""
    table = pa.ipc.open_file(pa.BufferReader(file.read_bytes())).read_all()  # in memory: the file is rewritten
    blobs = table.column("data").to_pylist()
    blobs[table.column("name").to_pylist().index(name)] = data
    table = table.set_column(3, table.schema.field("data"), pa.array(blobs, pa.binary()))
    with pa.OSFile(str(file), "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
        writer.write_table(table)


def test_an_unreadable_image_in_a_pack_is_named_in_one_line(tmp_path: Path) -> None:
    file = pack(_folder(tmp_path / "folder"), tmp_path / "packed")
    _replace_image(file, "dog/00.jpg", b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(DataError, match="cannot decode image") as info:
        load_dataset("cifar10", "train", root=str(file.parent))
    assert f"{file}:dog/00.jpg" in str(info.value) and "\n" not in str(info.value)
    _replace_image(file, "dog/00.jpg", b"")
    with pytest.raises(DataError, match=r"cannot read image .*dog/00\.jpg: it is empty"):
        load_dataset("cifar10", "train", root=str(file.parent))


def test_a_file_that_is_not_a_pack_or_lacks_the_split_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / PACKED_FILE).write_bytes(b"not arrow")
    with pytest.raises(DataError, match="cannot read the packed images"):
        read_split(tmp_path / PACKED_FILE, "train")
    folder = _folder(tmp_path / "folder")
    shutil.rmtree(folder / "test")
    file = pack(folder, tmp_path / "packed")  # a train split only
    with pytest.raises(DataError, match="holds no test split"):
        read_split(file, "test")


def test_the_pack_command_writes_the_file_and_refuses_bad_input_with_exit_2(tmp_path: Path, capsys) -> None:
    folder = _folder(tmp_path / "folder")
    assert pack_main([str(folder), "-o", str(tmp_path / "out")]) == 0
    assert f"{tmp_path / 'out' / PACKED_FILE}: " in capsys.readouterr().out
    for root, out, message in ((tmp_path / "nothing", tmp_path / "x", "has no train/ folder"),  # not an ImageFolder
                               (folder, folder / "inside", "write the pack outside the folder it packs")):
        assert pack_main([str(root), "-o", str(out)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
