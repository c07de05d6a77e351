"""``python -m dcl_core.train``: help, bad input -> exit 2 with one line before any compute."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyrun
import pytest
import torch
from cifar10_present import cifar10_present

from dcl_core.config import CONFIG_KEYS
from dcl_core.training.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args, env=None, timeout=120):
    return pyrun.run(
        [sys.executable, "-m", "dcl_core.train", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


def test_help_documents_every_key_with_paper_values():
    out = run_cli("--help")
    assert out.returncode == 0
    for key in CONFIG_KEYS:
        assert f"--{key}" in out.stdout, key
    assert "paper: 0.07" in out.stdout  # tau
    # Each numeric key's range, as validate checks it (whitespace-normalized: argparse wraps the help).
    assert "softmax temperature tau of the training loss (preset cpu: 0.1; paper: 0.07; range (0, 100])" in " ".join(
        out.stdout.split()
    )
    assert "--tau" in out.stdout and "--preset" in out.stdout
    # The values shown are the chosen preset's, not the dataclass defaults (200 epochs belong to no CPU run).
    help_of = {name: " ".join(run_cli("--preset", name, "--help").stdout.split()) for name in ("cpu", "paper")}
    assert "pretraining epochs (preset cpu: 15;" in help_of["cpu"]
    assert "pretraining epochs (preset paper: 200;" in help_of["paper"] and "value in preset paper" in help_of["paper"]


@pytest.mark.slow  # runs the CLI in a subprocess per case (12 x ~7 CPU-s)
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tau", "0"], "loss.temperature must be > 0"),
        (["--tau", "-0.1"], "loss.temperature must be > 0"),
        (["--loss", "dclw", "--sigma", "0"], "loss.sigma must be > 0"),
        (["--loss", "eqco", "--alpha", "-1"], "loss.alpha must be > 0"),
        (["--batch-size", "1"], "batch_size must be >= 2"),
        (["--loss", "nope"], "loss.name must be one of"),
        (["--dataset", "mnist"], "data.dataset must be one of"),
        (["--preset", "huge"], "unknown preset"),
        (["--set", "loss.tau=0.1"], "unknown config key"),
        (["--data-root", "/nonexistent/cifar"], "/nonexistent/cifar"),
        (["--data-root", "/"], "CIFAR-10 not found (looked in /cifar-10-batches-py, /train)"),  # exists, no data
        pytest.param(["--device", "cuda"], "no usable CUDA device",  # checked after the data is found
                     marks=pytest.mark.skipif(torch.cuda.is_available() or not cifar10_present(),
                                              reason="this machine has CUDA, or no CIFAR-10")),
    ],
)
def test_bad_input_exits_2_with_one_line(args, needle, tmp_path):
    out = run_cli(*args, "--output-dir", str(tmp_path / "o"))
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "o" / "checkpoint.pt").exists()


@pytest.mark.slow  # runs the single-run CLI in a subprocess (~7 CPU-s per run, torch's import)
def test_print_config_resolves_preset_and_aliases():
    out = run_cli("--preset", "cpu", "--loss", "dcl", "--tau", "0.2", "--loss.sigma", "0.7", "--print-config")
    assert out.returncode == 0, out.stderr
    assert '"loss.temperature": 0.2' in out.stdout and '"loss.sigma": 0.7' in out.stdout
    assert '"model.width": 0.25' in out.stdout


def test_a_user_loss_file_is_recorded_by_its_absolute_path(monkeypatch, capsys):
    """``--loss docs/examples/my_losses.py:PositiveWeighted`` was recorded as given (config.json, the checkpoint, an
    export's JSON), relative to a folder no record keeps; as a study does, the run makes the file absolute. A
    built-in's name and a module's reference stay as given."""
    from dcl_core.train import main

    monkeypatch.chdir(REPO)
    given = {"docs/examples/my_losses.py:PositiveWeighted": f"{REPO}/docs/examples/my_losses.py:PositiveWeighted",
             "dcl": "dcl", "my_losses:PositiveWeighted": "my_losses:PositiveWeighted"}
    for name, recorded in given.items():
        params = '{}' if name == "dcl" else '{"positive_weight": 0.5}'  # a built-in takes none (refused: test_config)
        assert main(["--preset", "smoke", "--loss", name, "--set", f"loss.params={params}", "--print-config"]) == 0
        config = json.loads(capsys.readouterr().out)
        assert config["loss.name"] == recorded and config["loss.params"] == params


def _has_cifar():
    return cifar10_present()


@pytest.mark.slow  # trains with the CLI, then evaluates, as subprocesses (~45 CPU-s)
@pytest.mark.skipif(not _has_cifar(), reason="embedded CIFAR-10 not present")
def test_train_then_evaluate_the_saved_checkpoint(tmp_path):
    out = tmp_path / "run"
    train = run_cli("--preset", "smoke", "--epochs", "1", "--output-dir", str(out), "--threads", "2", timeout=300)
    assert train.returncode == 0, train.stderr[-2000:]
    assert "epoch 1/1" in train.stderr and "kNN top-1" in train.stderr
    ev = pyrun.run(
        [sys.executable, "-m", "dcl_core.evaluate", str(out / "checkpoint.pt"), "--linear", "--device", "cpu"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert ev.returncode == 0, ev.stderr[-2000:]
    result = json.loads(ev.stdout.strip().splitlines()[-1])
    assert result["epoch"] == 1
    assert 0 <= result["eval/knn_top1"] <= 100 and 0 <= result["eval/linear_top1"] <= 100
    # The standalone kNN equals the trainer's last kNN (same backbone, same bank, same k and t).
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert result["eval/knn_top1"] == pytest.approx(metrics[-1]["eval/knn_top1"])
    # Bad evaluation input: one line, exit 2, no traceback.
    bad = [(["--set", "model.width=0.5"], "do not fit the configured model"),
           (["--set", "data.root"], "--set expects KEY=VALUE")]
    if not torch.cuda.is_available():
        bad.append((["--device", "cuda"], "no usable CUDA device"))
    for extra, needle in bad:
        ev = pyrun.run([sys.executable, "-m", "dcl_core.evaluate", str(out / "checkpoint.pt"), *extra],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
        errors = [line for line in ev.stderr.splitlines() if line.startswith("error:")]
        assert ev.returncode == 2 and len(errors) == 1 and needle in errors[0], ev.stderr[-2000:]
        assert "Traceback" not in ev.stderr


@pytest.mark.slow  # trains with torchrun's 2 DDP processes (~20 CPU-s each)
@pytest.mark.skipif(not _has_cifar(), reason="embedded CIFAR-10 not present")
@pytest.mark.parametrize("loader", ["memory", "stream"])
def test_torchrun_two_process_gloo_ddp(tmp_path, loader):
    out = tmp_path / "ddp"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "dcl_core.train",
            "--preset",
            "smoke",
            "--epochs",
            "1",
            "--output-dir",
            str(out),
            "--device",
            "cpu",
            "--threads",
            "1",
            "--set",
            f"data.loader={loader}",
            "--set",
            "data.workers=1",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on cpu x2" in proc.stderr  # both ranks joined one gloo group; global batch split in two
    # Streamed: each rank's DataLoader reads its DistributedSampler shard of the embedded CIFAR-10 JPEGs.
    assert ("streamed by 1 workers" in proc.stderr) == (loader == "stream")
    assert load_checkpoint(out / "checkpoint.pt")["epoch"] == 1


@pytest.mark.slow  # trains with torchrun's 2 DDP processes
@pytest.mark.skipif(not _has_cifar(), reason="embedded CIFAR-10 not present")
def test_torchrun_divergence_stops_every_rank_with_one_line(tmp_path):
    """A huge lr makes the loss non-finite: both ranks stop together (none is left waiting in an all-reduce),
    and the CLI says so in one line with exit code 1 (a failed run, not bad input)."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
         "dcl_core.train", "--preset", "smoke", "--epochs", "2", "--lr", "1e30", "--output-dir", str(tmp_path),
         "--threads", "1"],
        capture_output=True, text=True, cwd=REPO, timeout=180,
    )
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: the training loss became non-finite")]
    assert len(errors) == 2 and errors[0] == errors[1], proc.stderr[-3000:]  # one line per rank, the same step
    # torchrun itself reports the failed children with a traceback of its launcher; none comes from our code.
    assert f'File "{REPO / "dcl_core"}' not in proc.stderr
