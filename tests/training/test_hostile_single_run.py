"""Hostile and clumsy input to a single run (issue: nothing lost, nobody in): ``python -m dcl_core.train`` and
``python -m dcl_core.evaluate`` answer bad input with exit code 2 and one line before any compute, a failed run with
exit code 1 and one line, never a traceback; a checkpoint file cannot run code. Real processes, real files."""

import json
import os
import pathlib
import pickle
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyrun
import pytest
import torch
from PIL import Image

from dcl_core.data import resolve_data_root

REPO = Path(__file__).resolve().parents[2]
needs_cifar = pytest.mark.skipif(
    not (resolve_data_root("cifar10", None) / "train").is_dir(), reason="embedded CIFAR-10 not present"
)


def run(module, *args, timeout=300, env=None):
    return pyrun.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=REPO,
                     timeout=timeout, env=env)


def assert_one_line(proc, needle, code=2):
    assert proc.returncode == code, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return errors[0]


# Under pytest-xdist, one worker runs the module fixture trained_run once.
pytestmark = pytest.mark.xdist_group("hostile_single_run")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A real one-epoch smoke run of the CLI (checkpoint.pt, config.json, metrics.jsonl); copy before changing."""
    out = tmp_path_factory.mktemp("trained") / "run"
    proc = run("dcl_core.train", "--preset", "smoke", "--epochs", "1", "--threads", "2", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def copy_run(trained_run, tmp_path):
    return Path(shutil.copytree(trained_run, tmp_path / "run"))


class TouchOnLoad:
    """Unpickling this creates ``path``: what a crafted checkpoint would do (run code) if loaded as a pickle."""

    def __init__(self, path):
        self.path = pathlib.Path(path)

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))


def crafted_files(tmp_path, marker, real_checkpoint=None):
    """{name: path} of files that are not checkpoints: code-running pickles (torch.save'd and plain), a
    directory, text, an empty file, a foreign torch file, a truncated real checkpoint."""
    files = {}
    files["evil_torch"] = tmp_path / "evil_torch.pt"
    torch.save({"format": 1, "epoch": 1, "model": TouchOnLoad(marker), "config": {}}, files["evil_torch"])
    files["evil_pickle"] = tmp_path / "evil_pickle.pt"
    files["evil_pickle"].write_bytes(pickle.dumps({"format": 1, "model": TouchOnLoad(marker)}))
    files["directory"] = tmp_path / "dir.pt"
    files["directory"].mkdir()
    files["text"] = tmp_path / "text.pt"
    files["text"].write_text("not a checkpoint\n")
    files["empty"] = tmp_path / "empty.pt"
    files["empty"].write_bytes(b"")
    files["foreign"] = tmp_path / "foreign.pt"
    torch.save({"weight": torch.zeros(3)}, files["foreign"])
    if real_checkpoint is not None:
        data = Path(real_checkpoint).read_bytes()
        files["truncated"] = tmp_path / "truncated.pt"
        files["truncated"].write_bytes(data[: len(data) // 2])
    return files


# ------------------------------------------------------------------------------------------------------------
# Item 7: every value has a range, checked before anything runs


@pytest.mark.slow  # runs the single-run CLI in a subprocess (~7 CPU-s per run, torch's import)
@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("data.jitter_strength=-0.5", "data.jitter_strength must be in [0, 2.5]"),
        ("data.jitter_strength=nan", "data.jitter_strength must be in [0, 2.5]"),
        ("optim.min_lr_ratio=1.5", "optim.min_lr_ratio must be in [0, 1], got 1.5"),
        ("model.width=1e-9", "model.width must be >= 0.015625"),
        ("loss.temperature=1e308", "loss.temperature must be <= 100"),
        ("data.image_size=100000", "data.image_size must be <= 1024"),
        ("optim.base_lr=inf", "optim.base_lr must be in (0, inf), got inf"),
        ("loss.sigma=nan", "loss.sigma must be in (0, 1e+06], got nan"),
    ],
)
def test_out_of_range_values_exit_2_in_one_line(setting, needle):
    assert_one_line(run("dcl_core.train", "--print-config", "--set", setting, timeout=120), needle)


# ------------------------------------------------------------------------------------------------------------
# Item 2: a checkpoint can run code


def test_load_checkpoint_never_runs_a_crafted_pickle_and_names_every_bad_file(tmp_path):
    from dcl_core.training.checkpoint import CheckpointError, load_checkpoint

    marker = tmp_path / "pwned"
    files = crafted_files(tmp_path, marker)
    files["missing"] = tmp_path / "missing.pt"
    for name, path in files.items():
        with pytest.raises(CheckpointError, match="not a dcl_core checkpoint") as err:
            load_checkpoint(path)
        assert str(path) in str(err.value) and "\n" not in str(err.value), name
        assert isinstance(err.value, ValueError)
    assert not marker.exists()


@pytest.mark.slow  # uses trained_run, a real one-epoch training run of the CLI
@needs_cifar
def test_eval_refuses_crafted_and_damaged_checkpoints_in_one_line(trained_run, tmp_path, capsys):
    from dcl_core.evaluate import main

    marker = tmp_path / "pwned"
    files = crafted_files(tmp_path, marker, real_checkpoint=trained_run / "checkpoint.pt")
    files["missing"] = tmp_path / "missing.pt"
    for path in files.values():  # in-process: the same main() as the command, without a torch import each
        assert main([str(path), "--device", "cpu"]) == 2
        errors = capsys.readouterr().err.splitlines()
        assert len(errors) == 1 and errors[0].startswith(f"error: not a dcl_core checkpoint: {path} ("), errors
    proc = run("dcl_core.evaluate", str(files["evil_torch"]), "--device", "cpu", timeout=120)
    assert_one_line(proc, f"not a dcl_core checkpoint: {files['evil_torch']} (it would call ")
    assert not marker.exists()


@pytest.mark.slow  # uses trained_run, a real one-epoch training run of the CLI
@needs_cifar
@pytest.mark.parametrize("name", ["evil_torch", "truncated"])
def test_resume_refuses_a_bad_checkpoint_before_training(trained_run, tmp_path, name):
    out = copy_run(trained_run, tmp_path)
    marker = tmp_path / "pwned"
    (tmp_path / "bad").mkdir()
    bad = crafted_files(tmp_path / "bad", marker, real_checkpoint=out / "checkpoint.pt")[name]
    shutil.move(bad, out / "checkpoint.pt")
    proc = run("dcl_core.train", "--preset", "smoke", "--epochs", "1", "--output-dir", str(out), "--resume")
    assert_one_line(proc, f"not a dcl_core checkpoint: {out / 'checkpoint.pt'} (")
    assert "decoded" not in proc.stderr  # refused before the data was loaded
    assert not marker.exists()


@pytest.mark.slow  # uses trained_run, a real one-epoch training run of the CLI
@needs_cifar
def test_checkpoints_get_the_permissions_of_the_other_outputs(trained_run):
    checkpoint = stat.S_IMODE((trained_run / "checkpoint.pt").stat().st_mode)
    assert checkpoint == stat.S_IMODE((trained_run / "config.json").stat().st_mode)  # 0644 under umask 022


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002], ids=["022", "077", "002"])
def test_save_checkpoint_respects_the_umask(tmp_path, umask):
    from dcl_core.config import Config, apply_overrides, to_flat_dict
    from dcl_core.training.builders import build_model
    from dcl_core.training.checkpoint import load_checkpoint, save_checkpoint

    cfg = apply_overrides(Config(), {"model.width": 1 / 64, "model.proj_hidden_dim": 1, "model.proj_dim": 1})
    old = os.umask(umask)
    try:
        path = save_checkpoint({"epoch": 1, "model": build_model(cfg).state_dict(), "optimizer": {}, "scaler": {},
                                "config": to_flat_dict(cfg),
                                "history": [{"loss": 1.5, "q_hist": [0.5, 0.5]}]}, tmp_path / "c" / "checkpoint.pt")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert load_checkpoint(path)["history"] == [{"loss": 1.5, "q_hist": [0.5, 0.5]}]
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint.pt"]  # no temporary file left


# ------------------------------------------------------------------------------------------------------------
# Second pass, item 9: an untrusted checkpoint's config steered evaluation


def steered_checkpoint(trained_run, tmp_path, **config):
    """The trained run's checkpoint with ``config`` written over its stored config (a file from someone else)."""
    state = torch.load(trained_run / "checkpoint.pt", weights_only=True)
    state["config"] |= config
    path = tmp_path / "steered.pt"
    torch.save(state, path)
    return path


@pytest.mark.slow  # uses trained_run, a real one-epoch training run of the CLI
@needs_cifar
def test_eval_reads_data_where_its_own_command_line_says_not_where_the_checkpoint_says(trained_run, tmp_path):
    """Issue reproduction: a checkpoint's ``data.download=true`` with a ``data.root`` elsewhere made ``python -m
    dcl_core.eval`` create folders there and try to download. Where and how to read data is this machine's."""
    elsewhere = tmp_path / "elsewhere"
    path = steered_checkpoint(trained_run, tmp_path, **{
        "data.root": str(elsewhere / "cifar"), "data.download": True, "data.loader": "stream",
        "data.workers": 256, "eval.batch_size": 2**20})
    proc = run("dcl_core.evaluate", str(path), "--device", "cpu", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not elsewhere.exists()
    # The same measurement as the trainer's own: the embedded data, the checkpoint's subsets, k and t.
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    last = json.loads((trained_run / "metrics.jsonl").read_text().splitlines()[-1])
    assert result["eval/knn_top1"] == pytest.approx(last["eval/knn_top1"])
    assert "trained with data.root=" in proc.stderr  # what the file said, as a note


@pytest.mark.slow  # uses trained_run, a real one-epoch training run of the CLI
@needs_cifar
def test_eval_refuses_an_image_size_that_cannot_fit_in_memory_before_decoding_it(trained_run, tmp_path):
    """Issue reproduction: a checkpoint's ``data.image_size=1024`` made eval allocate 157 GB (a traceback)."""
    path = steered_checkpoint(trained_run, tmp_path, **{
        "data.image_size": 1024, "data.train_per_class": 0, "data.test_per_class": 0})
    proc = run("dcl_core.evaluate", str(path), "--device", "cpu", timeout=120)
    assert_one_line(proc, "more than this machine's memory")


# ------------------------------------------------------------------------------------------------------------
# Item 15: a previous run is not overwritten silently; the width mismatch says what differs


@pytest.mark.slow  # uses trained_run, a real one-epoch training run of the CLI
@needs_cifar
def test_a_second_run_into_the_same_folder_needs_resume_or_overwrite(trained_run, tmp_path):
    out = copy_run(trained_run, tmp_path)
    before = (out / "checkpoint.pt").read_bytes()
    proc = run("dcl_core.train", "--preset", "smoke", "--epochs", "1", "--output-dir", str(out))
    assert_one_line(proc, f"{out} already holds a run (checkpoint.pt); pass --resume to continue it or "
                          "--overwrite to replace it")
    assert (out / "checkpoint.pt").read_bytes() == before and "decoded" not in proc.stderr
    proc = run("dcl_core.train", "--preset", "smoke", "--epochs", "1", "--output-dir", str(out), "--resume",
               "--overwrite")
    assert_one_line(proc, "pass one")
    # --overwrite replaces it: a new run of another config, from epoch 1.
    proc = run("dcl_core.train", "--preset", "smoke", "--epochs", "1", "--tau", "0.3", "--output-dir", str(out),
               "--overwrite", "--threads", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert torch.load(out / "checkpoint.pt", weights_only=True)["config"]["loss.temperature"] == 0.3
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.slow  # uses trained_run, a real one-epoch training run of the CLI
@needs_cifar
def test_resume_with_a_changed_config_exits_2_before_training(trained_run, tmp_path):
    out = copy_run(trained_run, tmp_path)
    proc = run("dcl_core.train", "--preset", "smoke", "--epochs", "1", "--tau", "0.3", "--output-dir", str(out),
               "--resume")
    line = assert_one_line(proc, f"cannot resume {out / 'checkpoint.pt'}: config differs in loss.temperature")
    assert "0.1" in line and "0.3" in line
    assert "decoded" not in proc.stderr


@pytest.mark.slow  # uses trained_run, a real one-epoch training run of the CLI
@needs_cifar
def test_eval_with_another_width_says_which_key_differs(trained_run):
    proc = run("dcl_core.evaluate", str(trained_run / "checkpoint.pt"), "--set", "model.width=0.5", "--device", "cpu",
               timeout=120)
    assert_one_line(proc, "do not fit the configured model: model.width is 0.125 in the checkpoint, 0.5 here")


# ------------------------------------------------------------------------------------------------------------
# Item 11: batch larger than the data, corrupt images, unwritable output, full disk


@pytest.mark.slow  # runs the single-run CLI in a subprocess (~7 CPU-s per run, torch's import)
@needs_cifar
def test_a_batch_larger_than_the_data_exits_2_before_loading_it(tmp_path):
    proc = run("dcl_core.train", "--preset", "smoke", "--set", "optim.batch_size=4096", "--output-dir",
               str(tmp_path / "o"))
    assert_one_line(proc, "160 pretraining images give no full batch of 4096")
    assert "decoded" not in proc.stderr  # known from the config: 16 per class x 10 classes


def write_folder(root, per_class=4, size=20):
    """root/{train,val}/{a,b,c}/<i>.jpg with random pixels."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in ("a", "b", "c"):
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / c / f"{i}.jpg")


def folder_args(root, out, *extra):
    return ["--preset", "smoke", "--dataset", "imagefolder", "--data-root", str(root), "--set",
            "data.image_size=16", "--set", "data.train_per_class=0", "--set", "data.test_per_class=0", "--set",
            "eval.knn_k=3", "--output-dir", str(out), "--threads", "1", *extra]


@pytest.mark.slow  # runs the single-run CLI in a subprocess (~7 CPU-s per run, torch's import)
def test_a_batch_larger_than_a_whole_folder_exits_2_once_loaded_before_training(tmp_path):
    write_folder(tmp_path / "data")  # 12 training images; their number is known only once listed
    proc = run("dcl_core.train", *folder_args(tmp_path / "data", tmp_path / "o", "--batch-size", "16"))
    assert_one_line(proc, "12 pretraining images give no full batch of 16")
    assert "training simclr" not in proc.stderr and not (tmp_path / "o" / "checkpoint.pt").exists()


@pytest.mark.slow  # runs the single-run CLI in a subprocess (~7 CPU-s per run, torch's import)
@pytest.mark.parametrize(
    ("loader", "workers", "damage"),
    [("memory", 0, "truncated"), ("memory", 0, "text"), ("memory", 0, "empty"), ("stream", 0, "truncated"),
     ("stream", 1, "empty")],  # stream with workers: the error crosses from a DataLoader worker process
)
def test_a_corrupt_image_is_named_in_one_line(tmp_path, loader, workers, damage):
    write_folder(tmp_path / "data")
    bad = tmp_path / "data" / "train" / "b" / "1.jpg"
    good = bad.read_bytes()
    bad.write_bytes({"truncated": good[: len(good) // 2], "text": b"not an image\n", "empty": b""}[damage])
    proc = run("dcl_core.train", *folder_args(tmp_path / "data", tmp_path / "o", "--batch-size", "4", "--set",
                                              f"data.loader={loader}", "--set", f"data.workers={workers}"))
    assert_one_line(proc, f"image {bad}")
    if loader == "memory":
        assert "training simclr" not in proc.stderr  # decoded, and refused, before training
        assert not (tmp_path / "o").exists()  # the output folder is made once the data is loaded


@pytest.mark.slow  # runs the single-run CLI in a subprocess (~7 CPU-s per run, torch's import)
def test_an_output_folder_among_the_images_is_refused_before_anything_is_written(tmp_path):
    """Issue reproduction: ``--output-dir DATA/train/a/run`` trained and wrote its checkpoint among the class's
    images (and ``DATA/train/run`` made a class of its empty folder, refusing every later run on that data)."""
    write_folder(tmp_path / "data")
    proc = run("dcl_core.train", *folder_args(tmp_path / "data", tmp_path / "data" / "train" / "a" / "run"))
    assert_one_line(proc, "run is inside the data's train/ folder")
    assert not (tmp_path / "data" / "train" / "a" / "run").exists()


@pytest.mark.slow  # runs the single-run CLI in a subprocess (~7 CPU-s per run, torch's import)
def test_a_user_loss_that_cannot_be_built_is_refused_before_the_data_loads(tmp_path):
    """Issue reproduction: a missing user loss file was refused after the data had been decoded (60,000 images
    under --preset paper), leaving an empty output folder behind."""
    write_folder(tmp_path / "data")
    proc = run("dcl_core.train", *folder_args(tmp_path / "data", tmp_path / "o", "--loss",
                                              str(tmp_path / "nope.py") + ":L"))
    assert_one_line(proc, f"no such file {tmp_path / 'nope.py'}")
    assert "decoded" not in proc.stderr and not (tmp_path / "o").exists()


@pytest.mark.slow  # runs the single-run CLI in a subprocess (~7 CPU-s per run, torch's import)
def test_eval_of_a_streamed_run_names_a_corrupt_image_in_one_line(tmp_path):
    write_folder(tmp_path / "data")
    proc = run("dcl_core.train", *folder_args(tmp_path / "data", tmp_path / "o", "--batch-size", "4", "--epochs",
                                              "1", "--set", "data.loader=stream", "--set", "data.workers=0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    bad = tmp_path / "data" / "val" / "c" / "2.jpg"
    bad.write_bytes(b"not an image\n")
    checkpoint = str(tmp_path / "o" / "checkpoint.pt")
    # The checkpoint's data root is not read unless this command line says so; the error says how (with no
    # $DCL_DATA_ROOT to fall back on: a developer's shell may set one).
    no_root = {k: v for k, v in os.environ.items() if k != "DCL_DATA_ROOT"}
    proc = run("dcl_core.evaluate", checkpoint, "--device", "cpu", env=no_root)
    assert_one_line(proc, f"(the checkpoint was trained with data.root={tmp_path / 'data'}: pass --set data.root=")
    proc = run("dcl_core.evaluate", checkpoint, "--device", "cpu", "--set", f"data.root={tmp_path / 'data'}", "--set",
               "data.loader=stream", "--set", "data.workers=0")
    assert_one_line(proc, f"cannot decode image {bad}")


@pytest.mark.slow  # runs the single-run CLI in a subprocess (~7 CPU-s per run, torch's import)
@needs_cifar
def test_an_output_dir_that_cannot_be_written_exits_2_before_training(tmp_path):
    (tmp_path / "file").write_text("x")
    proc = run("dcl_core.train", "--preset", "smoke", "--output-dir", str(tmp_path / "file"))
    assert_one_line(proc, f"output_dir {tmp_path / 'file'} exists and is not a directory")
    proc = run("dcl_core.train", "--preset", "smoke", "--output-dir", str(tmp_path / "file" / "run"))
    assert_one_line(proc, f"cannot write to output_dir {tmp_path / 'file' / 'run'}: Not a directory")
    assert "decoded" not in proc.stderr
    if os.geteuid() != 0:  # root writes anywhere
        (tmp_path / "ro").mkdir(mode=0o555)
        proc = run("dcl_core.train", "--preset", "smoke", "--output-dir", str(tmp_path / "ro"))
        assert_one_line(proc, "Permission denied")


@pytest.mark.slow  # trains one epoch with the CLI in a subprocess
@needs_cifar
def test_a_full_disk_during_training_stops_the_run_in_one_line(tmp_path):
    # Files may not grow beyond 256 KB (ulimit -f, in KB): the 1.5 MB checkpoint cannot be written, as on a full
    # disk. Python ignores SIGXFSZ, so the write fails with EFBIG instead of killing the process.
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "dcl_core.train", "--preset", "smoke", "--epochs", "1", "--threads", "2",
           "--output-dir", str(out)]
    proc = subprocess.run(["bash", "-c", f"ulimit -f 256 && exec {shlex.join(cmd)}"], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    assert_one_line(proc, f"cannot write {out / 'checkpoint.pt'}: File too large", code=1)
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]  # no half-written checkpoint left


@pytest.mark.slow  # runs the single-run CLI in a subprocess (~7 CPU-s per run, torch's import)
@needs_cifar
@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl"])
def test_a_link_planted_in_the_output_folder_is_never_written_through(tmp_path, name):
    """Issue reproduction: ``ln -s ~/precious.txt x/config.json; python -m dcl_core.train --preset smoke
    --output-dir x`` overwrote the target. Now the run replaces the link with its own file; the target is kept."""
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    out = tmp_path / "x"
    out.mkdir()
    (out / name).symlink_to(precious)
    proc = run("dcl_core.train", "--preset", "smoke", "--epochs", "1", "--threads", "1", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert precious.read_text() == "keep me"
    assert not (out / name).is_symlink() and (out / name).stat().st_size > 0


@pytest.mark.slow  # runs the single-run CLI in a subprocess (~7 CPU-s per run, torch's import)
@needs_cifar
def test_overwrite_with_a_folder_at_the_checkpoint_exits_2_in_one_line(tmp_path):
    """Issue reproduction: ``train --overwrite`` with checkpoint.pt a directory gave IsADirectoryError's traceback."""
    (tmp_path / "run" / "checkpoint.pt").mkdir(parents=True)
    proc = run("dcl_core.train", "--preset", "smoke", "--epochs", "1", "--output-dir", str(tmp_path / "run"),
               "--overwrite")
    assert_one_line(proc, "checkpoint.pt is a folder, not a checkpoint")


@pytest.mark.slow  # runs the single-run CLI in a subprocess (~7 CPU-s per run, torch's import)
@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_checkpoint_that_is_a_pipe_or_a_device_exits_2_at_once(tmp_path, kind):
    """Issue reproduction: a FIFO blocked ``python -m dcl_core.evaluate`` forever; a link to /dev/zero read 4.9 GB
    in 8 s."""
    path = tmp_path / "checkpoint.pt"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    proc = run("dcl_core.evaluate", str(path), "--device", "cpu", timeout=60)  # before: never returned
    assert_one_line(proc, f"not a dcl_core checkpoint: {path} (not a regular file")


def test_a_checkpoint_larger_than_any_is_refused_without_reading_it(tmp_path, monkeypatch):
    from dcl_core.training import checkpoint as ck

    path = tmp_path / "huge.pt"
    with path.open("wb") as f:  # sparse: no disk used
        f.truncate(ck.MAX_CHECKPOINT_BYTES + 1)
    with pytest.raises(ck.CheckpointError, match="larger than any checkpoint"):
        ck.load_checkpoint(path)


@pytest.mark.parametrize(("env", "needle"), [
    ({"WORLD_SIZE": "abc"}, "$WORLD_SIZE must be a whole number in [1, 65536], got 'abc'"),  # a ValueError's traceback
    ({"WORLD_SIZE": "0"}, "$WORLD_SIZE must be a whole number"),  # a ZeroDivisionError's traceback
    ({"WORLD_SIZE": "-1"}, "$WORLD_SIZE must be a whole number"),  # accepted, silently
    ({"RANK": "abc"}, "$RANK must be a whole number in [0, 0]"),  # accepted, silently
    ({"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "$RANK must be a whole number in [0,"),
    ({"WORLD_SIZE": "2", "RANK": "0"}, "$MASTER_ADDR or $MASTER_PORT is not set: start them with torchrun"),
])
def test_a_launch_environment_torchrun_would_not_set_is_one_line(monkeypatch, env, needle):
    """Issue reproductions: dcl_core.train under an environment torchrun would not set answered with torch's
    tracebacks (a ValueError, a ZeroDivisionError, no MASTER_ADDR) or not at all; every rank checks it first."""
    from dcl_core.config import ConfigError
    from dcl_core.training.runtime import launch_world

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert launch_world() == 1
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as err:
        launch_world()
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_run_waiting_for_a_peer_that_never_starts_says_what_it_waits_for(tmp_path):
    """``WORLD_SIZE=2`` and a rendezvous left in the shell (no torchrun, no second process): the run waited for
    torch's timeout (minutes) without a word. Now rank 0 says, before it waits, what it waits for and how not to."""
    import select
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = os.environ | {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "dcl_core.train", "--preset", "smoke", "--set", "threads=1",
                             "--set", f"output_dir={tmp_path / 'run'}"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while (left := deadline - time.monotonic()) > 0 and proc.poll() is None:
            if not select.select([proc.stderr], [], [], left)[0]:  # silent until the deadline: the old behaviour
                break
            lines.append(proc.stderr.readline())
            if "to join at" in lines[-1]:
                break
    finally:
        proc.kill()
        proc.wait()
    said = [x for x in lines if "to join at" in x]
    assert said, "".join(lines)[-2000:]
    assert (f"waiting for the 2 processes of $WORLD_SIZE to join at 127.0.0.1:{port} (torchrun sets these; unset "
            "WORLD_SIZE to train in one process)") in said[0]


@pytest.mark.parametrize(("argv", "needle"), [
    (["--tau", "0.1", "--loss.temperature", "0.3"], "--loss.temperature and --tau both set loss.temperature"),
    (["--tau", "0.1", "--tau", "0.3"], "--tau is given twice"),
    (["--tau", "0.1", "--set", "loss.temperature=0.3"], "--set loss.temperature and --loss.temperature (or its alias)"),
    (["--download", "--data.download", "false"], "--download and --data.download both set data.download"),
])
def test_a_key_given_twice_on_the_train_command_line_is_refused(capsys, argv, needle):
    """Issue reproductions: the last value given (or --set's, or --download's) won, silently."""
    from dcl_core.train import main

    try:  # argparse's refusals exit, the later ones return the exit code
        code = main(["--preset", "smoke", "--print-config", *argv])
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and needle in err, err


@pytest.mark.slow  # a real subprocess under an address-space limit (~10 CPU-s: torch's import)
@needs_cifar
@pytest.mark.skipif(not hasattr(os, "fork"), reason="sets a resource limit in the child")
def test_a_run_out_of_memory_is_one_line_exit_1(tmp_path):
    """Issue reproduction: a model the machine cannot hold (ResNet-50 at width 16, in range) ended the run with a
    55-line traceback of the CPU allocator's; now one line, exit 1, as evaluate says it."""
    import resource

    def limited():  # 6 GiB of address space: torch imports, 22 GiB of parameters do not fit
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    proc = subprocess.run([sys.executable, "-m", "dcl_core.train", "--preset", "smoke", "--model.arch", "resnet50",
                           "--model.width", "16", "--output-dir", str(tmp_path / "o")], cwd=REPO, text=True,
                          capture_output=True, timeout=300, preexec_fn=limited)
    assert_one_line(proc, "the run ran out of memory", code=1)
    assert not (tmp_path / "o").exists()
