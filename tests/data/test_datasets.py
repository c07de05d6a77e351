"""Tests of dcl_core.data.datasets on small fake datasets written to tmp_path (and the embedded CIFAR-10)."""

from __future__ import annotations

import hashlib
import logging
import pickle
import tarfile
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from torchvision.datasets import CIFAR10, CIFAR100, STL10
from torchvision.datasets.folder import find_classes
from torchvision.transforms.v2 import functional as TF

from dcl_core.config import apply_overrides, preset
from dcl_core.data import (
    DATA_ROOT_ENV,
    DATASETS,
    EMBEDDED_CIFAR10,
    DataError,
    ImageTensors,
    check_dataset,
    class_balanced_subset,
    decode,
    fetch_dataset,
    image_bytes,
    load_dataset,
    resolve_data_root,
)
from dcl_core.data import locate as locate_module
from dcl_core.training.builders import build_data

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _dump(obj: object, path: Path) -> None:
    with path.open("wb") as f:
        pickle.dump(obj, f, protocol=2)


def _write_cifar10_batches(base: Path, seed: int = 0) -> dict[str, tuple[np.ndarray, list[int]]]:
    """Writes a tiny CIFAR-10 in torchvision's pickle format; returns {file: (data (N, 3072), labels)}."""
    rng = np.random.default_rng(seed)
    base.mkdir(parents=True)
    written = {}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for k, name in enumerate(names):
        n = 4 if name != "test_batch" else 6
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)  # rows: 1024 R, 1024 G, 1024 B
        labels = [(k * 4 + i) % 10 for i in range(n)]  # every class twice in the train batches
        files = [f"{i}.png" for i in range(n)]
        entry = {"batch_label": name, "labels": labels, "data": data, "filenames": files}
        _dump(entry, base / name)
        written[name] = (data, labels)
    _dump({"num_cases_per_batch": 4, "label_names": CIFAR10_CLASSES, "num_vis": 3072}, base / "batches.meta")
    return written


def _patch_md5s(monkeypatch: pytest.MonkeyPatch, cls: type, base: Path, archive: Path | None = None) -> None:
    """Makes torchvision's integrity check accept our fake files.

    torchvision's CIFAR10/CIFAR100/STL10 verify the md5 of every file (``_check_integrity`` and
    ``_load_meta`` call ``check_integrity(path, md5)``) even with ``download=False``, so fake files fail
    it. We replace ONLY the expected checksums (class attributes) with those of our files; the real
    integrity-check code still runs.
    """
    monkeypatch.setattr(cls, "train_list", [[name, _md5(base / name)] for name, _ in cls.train_list])
    monkeypatch.setattr(cls, "test_list", [[name, _md5(base / name)] for name, _ in cls.test_list])
    if hasattr(cls, "meta"):
        meta = dict(cls.meta)
        meta["md5"] = _md5(base / meta["filename"])
        monkeypatch.setattr(cls, "meta", meta)
    if archive is not None:
        monkeypatch.setattr(cls, "tgz_md5", _md5(archive))


def _forbid_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("the test must not touch the network")

    monkeypatch.setattr(torchvision.datasets.utils, "_get_redirect_url", fail)
    monkeypatch.setattr(torchvision.datasets.utils, "_urlretrieve", fail)


def _expected(written: dict, names: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    data = np.concatenate([written[n][0] for n in names])
    labels = [label for n in names for label in written[n][1]]
    images = torch.from_numpy(data.reshape(-1, 3, 32, 32))  # (N, 3072) -> (N, 3, 32, 32)
    return images, torch.tensor(labels, dtype=torch.int64)


@pytest.fixture(autouse=True)
def _no_env_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)


# ----------------------------------------------------------------------------------------------------
# torchvision binary formats
# ----------------------------------------------------------------------------------------------------


def test_cifar10_torchvision_format_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "cifar-10-batches-py"
    written = _write_cifar10_batches(base)
    _patch_md5s(monkeypatch, CIFAR10, base)

    train = load_dataset("cifar10", "train", root=str(tmp_path))
    images, labels = _expected(written, [f"data_batch_{i}" for i in range(1, 6)])
    assert isinstance(train, ImageTensors)
    assert train.images.dtype == torch.uint8 and train.images.is_contiguous()
    assert train.images.shape == (20, 3, 32, 32)
    assert torch.equal(train.images, images)
    assert torch.equal(train.labels, labels) and train.labels.dtype == torch.int64
    assert train.classes == tuple(CIFAR10_CLASSES) and train.num_classes == 10 and len(train) == 20

    pretrain = load_dataset("cifar10", "pretrain", root=str(tmp_path))
    assert torch.equal(pretrain.images, train.images)

    test = load_dataset("cifar10", "test", root=str(tmp_path))
    images, labels = _expected(written, ["test_batch"])
    assert torch.equal(test.images, images) and torch.equal(test.labels, labels)

    # A pixel spot check against the raw CIFAR row layout: channel planes of 32x32, row-major.
    raw = written["test_batch"][0][2]
    assert int(test.images[2, 1, 3, 5]) == int(raw[1024 + 3 * 32 + 5])


def test_cifar10_torchvision_checks_md5_even_without_download(tmp_path: Path) -> None:
    # Why the other tests patch checksums: unpatched, torchvision rejects the fake files.
    _write_cifar10_batches(tmp_path / "cifar-10-batches-py")
    with pytest.raises(DataError, match="integrity") as info:
        load_dataset("cifar10", "train", root=str(tmp_path))
    assert "\n" not in str(info.value)


def _local_cifar10_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> tuple[Path, dict]:
    """A root holding cifar-10-python.tar.gz built like the real one, with torchvision's md5s patched to match and
    the network forbidden: its download_url finds the archive and skips the network, then really extracts it.
    Returns (root, the batches written)."""
    staging = tmp_path / "staging"
    written = _write_cifar10_batches(staging / "cifar-10-batches-py", seed=seed)
    root = tmp_path / "root"
    root.mkdir()
    archive = root / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(staging / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    _patch_md5s(monkeypatch, CIFAR10, staging / "cifar-10-batches-py", archive=archive)
    _forbid_network(monkeypatch)
    return root, written


def test_cifar10_download_extracts_local_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, written = _local_cifar10_archive(tmp_path, monkeypatch, seed=5)

    test = load_dataset("cifar10", "test", root=str(root), download=True)
    assert (root / "cifar-10-batches-py" / "test_batch").is_file()
    images, labels = _expected(written, ["test_batch"])
    assert torch.equal(test.images, images) and torch.equal(test.labels, labels)


def test_fetch_dataset_downloads_once_and_names_the_root_to_read(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """What a study's --download does before anything runs: fetch the archive (here a local copy with matching
    md5s, no network), and return the root the trials then read."""
    root, written = _local_cifar10_archive(tmp_path, monkeypatch, seed=6)
    assert fetch_dataset("cifar10", str(root)) == root.resolve()
    train = load_dataset("cifar10", "train", root=str(root))  # every split is there, read without downloading
    images, labels = _expected(written, [f"data_batch_{i}" for i in range(1, 6)])
    assert torch.equal(train.images, images) and torch.equal(train.labels, labels)
    with pytest.raises(DataError, match="imagefolder dataset cannot be downloaded"):
        fetch_dataset("imagefolder", str(root))


def test_download_network_failure_is_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Offline, torchvision's download path fails in its URL handling; simulate exactly that failure.
    def offline(*args: object, **kwargs: object) -> None:
        raise urllib.error.URLError("[Errno -3] Temporary failure\nin name resolution")

    monkeypatch.setattr(torchvision.datasets.utils, "_get_redirect_url", offline)
    with pytest.raises(DataError) as info:
        load_dataset("cifar10", "train", root=str(tmp_path), download=True)
    message = str(info.value)
    assert "\n" not in message
    assert "download" in message and str(tmp_path) in message and "name resolution" in message


def test_cifar100_torchvision_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    rng = np.random.default_rng(1)
    classes = [f"class_{i:03d}" for i in range(100)]
    train_data = rng.integers(0, 256, size=(8, 3072), dtype=np.uint8)
    train_labels = [3, 99, 0, 3, 50, 7, 7, 1]
    _dump({"data": train_data, "fine_labels": train_labels, "coarse_labels": [0] * 8}, base / "train")
    _dump({"data": train_data[:2], "fine_labels": [5, 6], "coarse_labels": [0, 0]}, base / "test")
    _dump({"fine_label_names": classes, "coarse_label_names": ["c"] * 20}, base / "meta")
    _patch_md5s(monkeypatch, CIFAR100, base)

    train = load_dataset("cifar100", "train", root=str(tmp_path))
    expected = torch.from_numpy(train_data.reshape(8, 3, 32, 32))  # (8, 3072) -> (8, 3, 32, 32)
    assert torch.equal(train.images, expected)
    assert train.labels.tolist() == train_labels
    assert train.num_classes == 100 and train.classes[99] == "class_099"
    assert load_dataset("cifar100", "test", root=str(tmp_path)).labels.tolist() == [5, 6]


def _write_stl10(base: Path) -> dict[str, np.ndarray]:
    """Writes a tiny STL-10 in its binary, column-major format; returns the images as (N, 3, 96, 96)."""
    rng = np.random.default_rng(2)
    base.mkdir(parents=True)
    arrays = {
        "train": rng.integers(0, 256, size=(3, 3, 96, 96), dtype=np.uint8),
        "test": rng.integers(0, 256, size=(2, 3, 96, 96), dtype=np.uint8),
        "unlabeled": rng.integers(0, 256, size=(4, 3, 96, 96), dtype=np.uint8),
    }
    for split, images in arrays.items():
        # STL-10 stores each channel column-major: transpose H and W before writing.
        (base / f"{split}_X.bin").write_bytes(np.ascontiguousarray(images.transpose(0, 1, 3, 2)).tobytes())
    (base / "train_y.bin").write_bytes(np.array([1, 10, 4], dtype=np.uint8).tobytes())  # 1-based labels
    (base / "test_y.bin").write_bytes(np.array([2, 2], dtype=np.uint8).tobytes())
    names = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]
    (base / "class_names.txt").write_text("\n".join(names) + "\n")
    return arrays


def test_stl10_torchvision_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "stl10_binary"
    arrays = _write_stl10(base)
    _patch_md5s(monkeypatch, STL10, base)

    train = load_dataset("stl10", "train", root=str(tmp_path))
    assert torch.equal(train.images, torch.from_numpy(arrays["train"]))
    assert train.labels.tolist() == [0, 9, 3] and train.images.is_contiguous()
    assert train.classes[7] == "monkey"

    pretrain = load_dataset("stl10", "pretrain", root=str(tmp_path))
    assert pretrain.images.shape == (7, 3, 96, 96)
    assert torch.equal(pretrain.images[3:], torch.from_numpy(arrays["unlabeled"]))
    assert pretrain.labels.tolist() == [0, 9, 3, -1, -1, -1, -1]

    test = load_dataset("stl10", "test", root=str(tmp_path), image_size=48)
    assert test.images.shape == (2, 3, 48, 48)

    # per_class on the pretrain split drops the unlabeled part.
    sub = load_dataset("stl10", "pretrain", root=str(tmp_path), per_class=1)
    assert sub.labels.tolist() == [0, 9, 3]


# ----------------------------------------------------------------------------------------------------
# ImageFolder layouts
# ----------------------------------------------------------------------------------------------------


def _write_png_folder(
    root: Path, classes: list[str], per_class: int, size: tuple[int, int], seed: int
) -> dict[tuple[str, int], torch.Tensor]:
    """Writes root/<class>/<i>.png with random pixels; returns {(class, i): uint8 (3, H, W)}."""
    gen = torch.Generator().manual_seed(seed)
    images = {}
    for cls in classes:
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            img = torch.randint(0, 256, (3, *size), dtype=torch.uint8, generator=gen)
            torchvision.io.write_png(img, str(root / cls / f"{i:04d}.png"))
            images[(cls, i)] = img
    return images


@pytest.fixture
def cifar_png_root(tmp_path: Path) -> tuple[Path, dict, dict]:
    root = tmp_path / "cifar_png"
    train = _write_png_folder(root / "train", CIFAR10_CLASSES, 4, (32, 32), seed=0)
    test = _write_png_folder(root / "test", CIFAR10_CLASSES, 2, (32, 32), seed=1)
    return root, train, test


def test_cifar10_image_folder_round_trip(cifar_png_root: tuple[Path, dict, dict]) -> None:
    root, train_imgs, test_imgs = cifar_png_root
    train = load_dataset("cifar10", "train", root=str(root))
    assert train.images.shape == (40, 3, 32, 32) and train.images.dtype == torch.uint8
    assert train.classes == tuple(CIFAR10_CLASSES)
    assert train.labels.tolist() == [c for c in range(10) for _ in range(4)]
    for n, (cls, i) in enumerate((c, i) for c in CIFAR10_CLASSES for i in range(4)):
        assert torch.equal(train.images[n], train_imgs[(cls, i)])  # PNG is lossless

    test = load_dataset("cifar10", "test", root=str(root))
    assert len(test) == 20 and torch.equal(test.images[-1], test_imgs[("truck", 1)])
    assert torch.equal(load_dataset("cifar10", "pretrain", root=str(root)).images, train.images)


def test_per_class_equals_subsetting_the_full_split(cifar_png_root: tuple[Path, dict, dict]) -> None:
    root, _, _ = cifar_png_root
    full = load_dataset("cifar10", "train", root=str(root))
    for seed in (0, 3):
        index = class_balanced_subset(full.labels, 2, seed)
        sub = load_dataset("cifar10", "train", root=str(root), per_class=2, seed=seed)
        assert torch.equal(sub.images, full.images[index])
        assert torch.equal(sub.labels, full.labels[index])
    with pytest.raises(DataError, match="fewer than"):
        load_dataset("cifar10", "test", root=str(root), per_class=3)


def test_per_class_on_tensor_format_equals_subset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "cifar-10-batches-py"
    _write_cifar10_batches(base)
    _patch_md5s(monkeypatch, CIFAR10, base)
    full = load_dataset("cifar10", "train", root=str(tmp_path))
    sub = load_dataset("cifar10", "train", root=str(tmp_path), per_class=1, seed=7)
    index = class_balanced_subset(full.labels, 1, 7)
    assert len(sub) == 10
    assert torch.equal(sub.images, full.images[index]) and torch.equal(sub.labels, full.labels[index])


@pytest.mark.parametrize("chunk", [decode.DECODE_CHUNK, 4])  # one batch of JPEGs, or chunks that split the folder
def test_jpeg_and_png_mixed_folder_decodes_like_torchvision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(decode, "DECODE_CHUNK", chunk)
    root = tmp_path / "mixed"
    gen = torch.Generator().manual_seed(4)
    for cls in ("a", "b"):
        (root / "train" / cls).mkdir(parents=True)
        (root / "test" / cls).mkdir(parents=True)
        for i in range(3):
            img = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8, generator=gen)
            if i % 2:
                torchvision.io.write_png(img, str(root / "train" / cls / f"{i}.png"))
            else:
                torchvision.io.write_jpeg(img, str(root / "train" / cls / f"{i}.jpg"), quality=90)
    train = load_dataset("cifar10", "train", root=str(root))
    paths = sorted(root.glob("train/*/*"))
    expected = torch.stack([torchvision.io.decode_image(str(p), mode=torchvision.io.ImageReadMode.RGB)
                            for p in paths])  # 6 x (3, 32, 32) -> (6, 3, 32, 32)
    assert torch.equal(train.images, expected)
    assert train.classes == ("a", "b") and train.labels.tolist() == [0, 0, 0, 1, 1, 1]


def test_imagefolder_resize_and_center_crop(tmp_path: Path) -> None:
    root = tmp_path / "imgs"
    for split in ("train", "val"):
        for cls in ("x", "y"):
            (root / split / cls).mkdir(parents=True)
    # A 20x40 image: left quarter red, middle half green, right quarter blue.
    wide = torch.zeros(3, 20, 40, dtype=torch.uint8)
    wide[0, :, :10] = 255
    wide[1, :, 10:30] = 255
    wide[2, :, 30:] = 255
    torchvision.io.write_png(wide, str(root / "train" / "x" / "wide.png"))
    flat = torch.full((3, 50, 30), 77, dtype=torch.uint8)
    torchvision.io.write_png(flat, str(root / "train" / "y" / "flat.png"))
    torchvision.io.write_png(flat, str(root / "val" / "y" / "flat.png"))

    train = load_dataset("imagefolder", "train", root=str(root), image_size=16)
    assert train.images.shape == (2, 3, 16, 16) and train.labels.tolist() == [0, 1]
    # Shorter side 20 -> 16 gives 16x32; the center 16 columns are the green half.
    crop = train.images[0].to(torch.int32)
    assert (crop[1, :, 2:14] == 255).all() and (crop[0, :, 2:14] == 0).all() and (crop[2, :, 2:14] == 0).all()
    assert (train.images[1] == 77).all()

    # val/x is empty: the val labels still use the train split's class numbering.
    val = load_dataset("imagefolder", "test", root=str(root), image_size=16)
    assert len(val) == 1 and val.labels.tolist() == [1] and val.classes == ("x", "y")

    (root / "val" / "z").mkdir()
    with pytest.raises(DataError, match="missing from"):
        load_dataset("imagefolder", "test", root=str(root), image_size=16)

    with pytest.raises(DataError, match="image size"):
        load_dataset("imagefolder", "train", root=str(root))


def test_differently_sized_images_need_an_image_size(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _write_png_folder(root / "train", ["a"], 1, (32, 32), seed=0)
    _write_png_folder(root / "train2", ["a"], 1, (16, 16), seed=0)
    (root / "train2" / "a" / "0000.png").rename(root / "train" / "a" / "0001.png")
    (root / "test").mkdir()
    with pytest.raises(DataError, match="differ in size"):
        load_dataset("cifar10", "train", root=str(root))
    assert load_dataset("cifar10", "train", root=str(root), image_size=32).images.shape == (2, 3, 32, 32)


def test_grayscale_rgba_and_corrupt_files(tmp_path: Path) -> None:
    root = tmp_path / "c"
    (root / "train" / "a").mkdir(parents=True)
    (root / "test").mkdir()
    gray = torch.arange(64, dtype=torch.uint8).view(1, 8, 8)  # (64,) -> (1, 8, 8)
    torchvision.io.write_png(gray, str(root / "train" / "a" / "0.png"))
    rgba = torch.randint(0, 256, (4, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    # torchvision cannot encode RGBA PNGs; PIL (a torchvision dependency) can.
    Image.fromarray(rgba.permute(1, 2, 0).numpy()).save(root / "train" / "a" / "1.png")
    data = load_dataset("cifar10", "train", root=str(root))
    assert data.images.shape == (2, 3, 8, 8)
    assert torch.equal(data.images[0], gray.expand(3, 8, 8)) and torch.equal(data.images[1], rgba[:3])

    bad = root / "train" / "a" / "2.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    with pytest.raises(DataError, match="cannot decode") as info:
        load_dataset("cifar10", "train", root=str(root))
    assert str(bad) in str(info.value) and "\n" not in str(info.value)
    # An empty file: torchvision's own message names a C++ source line, not the file.
    bad.write_bytes(b"")
    with pytest.raises(DataError, match="cannot read image") as info:
        load_dataset("cifar10", "train", root=str(root))
    assert str(bad) in str(info.value) and "\n" not in str(info.value) and ".cpp" not in str(info.value)


def test_large_tensor_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "c"
    _write_png_folder(root / "train", ["a"], 2, (8, 8), seed=0)
    (root / "test").mkdir()
    monkeypatch.setattr(image_bytes, "_LARGE_TENSOR_BYTES", 100)
    with caplog.at_level(logging.INFO, logger="dcl_core.data"):
        load_dataset("cifar10", "train", root=str(root))
    assert any(r.levelno == logging.WARNING and "GB" in r.getMessage() for r in caplog.records)
    assert any("decoded 2" in r.getMessage() for r in caplog.records)


def test_images_that_cannot_fit_in_memory_are_refused_before_the_tensor_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue reproduction: ``data.image_size=1024`` on CIFAR-10 allocated 157 GB and died in a traceback."""
    root = tmp_path / "c"
    _write_png_folder(root / "train", ["a"], 2, (8, 8), seed=0)
    (root / "test").mkdir()
    monkeypatch.setattr(image_bytes, "physical_memory", lambda: 1000)  # a machine with 1000 bytes
    load_dataset("cifar10", "train", root=str(root))  # 2 x 3 x 8 x 8 = 384 bytes fit
    with pytest.raises(DataError, match=r"would take .* more than this machine's memory") as info:
        load_dataset("cifar10", "train", root=str(root), image_size=16)  # 2 x 3 x 16 x 16 = 1536 do not
    assert "data.image_size" in str(info.value) and "\n" not in str(info.value)
    assert image_bytes.physical_memory is not None


# ----------------------------------------------------------------------------------------------------
# Errors and root resolution
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "stl10"])
def test_missing_data_is_a_one_line_error_naming_the_paths(tmp_path: Path, name: str) -> None:
    with pytest.raises(DataError) as info:
        load_dataset(name, "train", root=str(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    assert "not found" in message and str(tmp_path.resolve()) in message
    assert "--download" in message and DATA_ROOT_ENV in message


def test_missing_imagefolder_error(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        load_dataset("imagefolder", "test", root=str(tmp_path), image_size=32)
    message = str(info.value)
    assert "\n" not in message and str(tmp_path / "val") in message and str(tmp_path / "test") in message
    assert "--download" not in message
    with pytest.raises(DataError, match="cannot be downloaded"):
        load_dataset("imagefolder", "train", root=str(tmp_path), image_size=32, download=True)


def test_unknown_dataset_and_split() -> None:
    with pytest.raises(DataError) as info:
        load_dataset("mnist", "train")
    assert all(name in str(info.value) for name in DATASETS)
    with pytest.raises(DataError, match="cifar100"):
        resolve_data_root("svhn", None)
    with pytest.raises(DataError, match="pretrain"):
        load_dataset("cifar10", "validation")


def test_data_error_is_one_line() -> None:
    assert str(DataError("first line\n  second\tline")) == "first line second line"


def test_resolve_data_root_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_data_root("cifar100", "rel/dir") == tmp_path / "rel" / "dir"
    assert resolve_data_root("cifar100", "rel/dir").is_absolute()

    monkeypatch.setenv(DATA_ROOT_ENV, "from_env")
    assert resolve_data_root("stl10", None) == tmp_path / "from_env"
    assert resolve_data_root("stl10", str(tmp_path / "explicit")) == tmp_path / "explicit"
    assert resolve_data_root("cifar10", None) == tmp_path / "from_env"  # env beats the embedded copy

    monkeypatch.delenv(DATA_ROOT_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert resolve_data_root("cifar100", None) == tmp_path / "cache" / "dcl_core" / "cifar100"


def test_cifar10_default_root_without_embedded_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locate_module, "EMBEDDED_CIFAR10", tmp_path / "nowhere")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "dcl_core" / "cifar10"
    assert resolve_data_root("cifar10", None) == cache
    with pytest.raises(DataError) as info:
        load_dataset("cifar10", "train")
    message = str(info.value)
    assert str(tmp_path / "nowhere") in message and str(cache) in message


# ----------------------------------------------------------------------------------------------------
# Embedded CIFAR-10
# ----------------------------------------------------------------------------------------------------


def _embedded_present() -> bool:
    return (EMBEDDED_CIFAR10 / "train").is_dir() and (EMBEDDED_CIFAR10 / "test").is_dir()


@pytest.mark.skipif(not _embedded_present(), reason="embedded CIFAR-10 copy not present")
def test_embedded_cifar10_found_and_loads_a_subset_quickly() -> None:
    assert resolve_data_root("cifar10", None) == EMBEDDED_CIFAR10
    train = load_dataset("cifar10", "train", per_class=3, seed=0)
    assert train.images.shape == (30, 3, 32, 32)
    assert torch.bincount(train.labels, minlength=10).tolist() == [3] * 10
    assert train.classes == tuple(CIFAR10_CLASSES)
    assert train.images.float().std() > 20  # real photos, not blank
    again = load_dataset("cifar10", "train", per_class=3, seed=0)
    assert torch.equal(again.images, train.images)
    test = load_dataset("cifar10", "test", per_class=2, seed=1)
    assert len(test) == 20


# ----------------------------------------------------------------------------------------------------
# class_balanced_subset and ImageTensors
# ----------------------------------------------------------------------------------------------------


def test_class_balanced_subset_counts_and_determinism() -> None:
    shuffle = torch.randperm(200, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(10).repeat_interleave(20)[shuffle]
    index = class_balanced_subset(labels, 5, seed=1)
    assert index.dtype == torch.int64 and index.shape == (50,)
    assert torch.equal(index, torch.sort(index).values) and index.unique().numel() == 50
    assert torch.bincount(labels[index], minlength=10).tolist() == [5] * 10
    assert torch.equal(index, class_balanced_subset(labels, 5, seed=1))
    assert not torch.equal(index, class_balanced_subset(labels, 5, seed=2))
    assert torch.equal(class_balanced_subset(labels, 20, seed=0), torch.arange(200))


def test_class_balanced_subset_unlabeled_and_errors() -> None:
    labels = torch.tensor([0, 1, -1, 0, 1, -1, 2, 2])
    assert torch.equal(class_balanced_subset(labels, 0, seed=0), torch.arange(8))
    assert torch.equal(class_balanced_subset(labels, -1, seed=0), torch.arange(8))
    assert torch.equal(class_balanced_subset(labels, 2, seed=0), torch.tensor([0, 1, 3, 4, 6, 7]))
    with pytest.raises(DataError, match="class 0 has only 2"):
        class_balanced_subset(labels, 3, seed=0)
    with pytest.raises(DataError, match="no labeled"):
        class_balanced_subset(torch.full((4,), -1), 1, seed=0)


def test_image_tensors_validation() -> None:
    data = ImageTensors(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.tensor([0, 1]), ("a", "b", "c"))
    assert len(data) == 2 and data.num_classes == 3
    with pytest.raises(ValueError, match="uint8"):
        ImageTensors(torch.zeros(2, 3, 4, 4), torch.tensor([0, 1]), ("a",))
    with pytest.raises(ValueError, match="labels"):
        ImageTensors(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.tensor([0, 1, 2]), ("a",))


# ----------------------------------------------------------------------------------------------------
# Pre-flight checks and where data is read from
# ----------------------------------------------------------------------------------------------------


def test_check_dataset_locates_splits_without_decoding(tmp_path: Path) -> None:
    # An existing folder without the dataset is an error naming where it looked, not a later crash.
    with pytest.raises(DataError) as info:
        check_dataset("cifar10", str(tmp_path))
    assert "\n" not in str(info.value) and str(tmp_path / "cifar-10-batches-py") in str(info.value)
    with pytest.raises(DataError, match="ImageFolder not found"):
        (tmp_path / "inet" / "train").mkdir(parents=True)  # an ImageFolder root without val/ or test/
        check_dataset("imagefolder", str(tmp_path / "inet"))
    # Present in torchvision's format: found (nothing decoded), and a download target is accepted as such.
    _write_cifar10_batches(tmp_path / "tv" / "cifar-10-batches-py")
    assert check_dataset("cifar10", str(tmp_path / "tv")) == tmp_path / "tv"
    assert check_dataset("cifar100", str(tmp_path / "empty"), download=True) == tmp_path / "empty"


def test_download_skips_the_embedded_jpeg_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    embedded = tmp_path / "embedded"
    for split in ("train", "test"):
        (embedded / split / "airplane").mkdir(parents=True)
    monkeypatch.setattr(locate_module, "EMBEDDED_CIFAR10", embedded)
    monkeypatch.delenv("DCL_DATA_ROOT", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert resolve_data_root("cifar10", None) == embedded
    # --download asks for torchvision's original release, not the re-encoded JPEG copy.
    assert resolve_data_root("cifar10", None, download=True) == tmp_path / "cache" / "dcl_core" / "cifar10"


def test_stl10_is_stored_at_the_training_size_with_antialiasing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arrays = _write_stl10(tmp_path / "stl10_binary")
    _patch_md5s(monkeypatch, STL10, tmp_path / "stl10_binary")
    cfg = apply_overrides(preset("smoke"), {"data.dataset": "stl10", "data.root": str(tmp_path),
                                            "data.image_size": 32, "data.train_per_class": 0,
                                            "data.test_per_class": 0})
    data = build_data(cfg)
    assert data.pretrain.images.shape == (7, 3, 32, 32) and data.test.images.shape == (2, 3, 32, 32)
    full = torch.from_numpy(arrays["train"])  # (3, 3, 96, 96)
    reference = TF.resize(full, [32, 32], antialias=True)
    assert (data.bank.images.int() - reference.int()).abs().max() <= 1
    # Not every third pixel, which is what cropping-and-resizing the 96 px images without antialiasing gave.
    assert (data.bank.images.int() - full[..., 1::3, 1::3].int()).abs().float().mean() > 5


def test_pretraining_images_is_known_from_the_config_when_subsetting(tmp_path: Path) -> None:
    from dcl_core.data import pretraining_images

    for c in ("a", "b", "c"):  # an ImageFolder of 3 classes: per_class x 3, nothing decoded (no images at all)
        (tmp_path / "f" / "train" / c).mkdir(parents=True)
    (tmp_path / "f" / "val").mkdir()
    (tmp_path / "f" / "train" / "notes.txt").write_text("not a class")  # torchvision's find_classes skips it
    assert len(find_classes(str(tmp_path / "f" / "train"))[0]) == 3  # the rule pretraining_images counts by
    assert pretraining_images("imagefolder", str(tmp_path / "f"), False, per_class=5) == 15
    (tmp_path / "e" / "train").mkdir(parents=True)  # no class folder: unknown (loading it says why)
    (tmp_path / "e" / "val").mkdir()
    assert pretraining_images("imagefolder", str(tmp_path / "e"), False, per_class=5) is None
    assert pretraining_images("imagefolder", str(tmp_path / "f"), False, per_class=0) is None  # all: unknown
    assert pretraining_images("cifar100", str(tmp_path / "dl"), True, per_class=4) == 400  # to be downloaded
    assert pretraining_images("stl10", str(tmp_path), False, per_class=4) is None  # train + unlabeled


def test_unreadable_image_error_keeps_its_message_across_a_dataloader_worker() -> None:
    from dcl_core.data import UnreadableImageError

    # What torch's ExceptionWrapper hands the constructor in the main process:
    reraised = (
        "Caught UnreadableImageError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n    raise UnreadableImageError(...)\n'
        "dcl_core.data.datasets.UnreadableImageError: cannot decode image /d/a: b.jpg: Truncated File Read\n"
    )
    assert str(UnreadableImageError(reraised)) == "cannot decode image /d/a: b.jpg: Truncated File Read"
    assert str(UnreadableImageError("cannot decode image x.jpg: y")) == "cannot decode image x.jpg: y"
    assert isinstance(UnreadableImageError("x"), DataError)
