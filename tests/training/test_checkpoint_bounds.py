"""A checkpoint may ask only for a model its own weights fill (issue 46, items 4 and 10): a 1.5 MB file whose config
says ``model.arch=resnet50, model.width=16`` built 22.4 GiB of parameters in ``evaluate``, ``export`` and ``study
export`` (an OOM kill), and one whose projection head is 2**20 wide a traceback. The model the config describes is
sized on the meta device and compared with the bytes the file holds, before anything is built: one line, exit 2.

The command-line tests run under an address-space limit (``ulimit -v``) so that code that does build the model
fails at once with a traceback instead of taking the machine's memory."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dcl_core.config import Config, apply_overrides, preset, to_flat_dict
from dcl_core.study.plan.writers import write_table
from dcl_core.training.builders import build_model, model_state_bytes
from dcl_core.training.checkpoint import CheckpointError, held_bytes, load_checkpoint, save_checkpoint

REPO = Path(__file__).resolve().parents[2]
SMOKE = {"model.width": 0.125}  # the smoke preset's model: 0.7 MiB of weights
# What the files asked for: 22.4 GiB (a wide ResNet-50), 0.25 GiB and 4 TiB (projection heads)
GREEDY = {
    "resnet50_x16": {"model.arch": "resnet50", "model.width": 16},
    "proj_dim_2_20": {"model.proj_dim": 2**20},
    "proj_2_20_by_2_20": {"model.proj_dim": 2**20, "model.proj_hidden_dim": 2**20},
}
LIMIT = 6 * 2**30  # the subprocesses' address space: torch and the data fit, a greedy model does not


def _checkpoint(path: Path, asks: dict, extra_weights: dict | None = None) -> Path:
    """A real checkpoint of the smoke model (untrained) whose stored config then says ``asks``."""
    cfg = apply_overrides(preset("smoke"), SMOKE)
    weights = build_model(cfg).state_dict() | (extra_weights or {})
    state = {"epoch": 1, "model": weights, "optimizer": {}, "scaler": {}, "config": to_flat_dict(cfg) | asks,
             "history": [{"eval/knn_top1": 12.5}]}
    return save_checkpoint(state, path)


def test_the_size_on_the_meta_device_is_what_the_model_holds() -> None:
    for overrides in ({}, SMOKE, {"model.arch": "resnet50", "model.width": 0.25, "model.proj_dim": 64}):
        cfg = apply_overrides(Config(), overrides)
        built = sum(t.numel() * t.element_size() for t in build_model(cfg).state_dict().values())
        assert model_state_bytes(cfg) == built == held_bytes(build_model(cfg).state_dict())
    wide = model_state_bytes(apply_overrides(Config(), GREEDY["resnet50_x16"]))
    assert wide / 2**30 == pytest.approx(22.43, abs=0.01)  # the 22.4 GiB, measured without allocating it


@pytest.mark.parametrize("name", list(GREEDY))
def test_a_checkpoint_asking_for_more_than_its_weights_is_refused_before_building(tmp_path: Path, name: str) -> None:
    path = _checkpoint(tmp_path / "checkpoint.pt", GREEDY[name])
    with pytest.raises(CheckpointError, match=r"not a dcl_core checkpoint: .* of weights, but it holds 7\d\d\.\d KiB: "
                                              r"refused before building the model"):
        load_checkpoint(path)
    assert load_checkpoint(_checkpoint(tmp_path / "honest.pt", {}))["epoch"] == 1  # its own config: loaded


def test_weights_it_does_not_hold_do_not_count(tmp_path: Path) -> None:
    """A zero-stride view counts as one value however large it says it is: 24 GiB "held" in 4 bytes."""
    fake = {"pad": torch.zeros(1).expand(6 * 2**30)}
    path = _checkpoint(tmp_path / "checkpoint.pt", GREEDY["resnet50_x16"], extra_weights=fake)
    assert path.stat().st_size < 2**20
    with pytest.raises(CheckpointError, match="refused before building the model"):
        load_checkpoint(path)


def test_the_stored_model_is_read_as_a_checkpoint_s_not_as_a_command_line(tmp_path: Path) -> None:
    """A bad stored model value makes the file "not a dcl_core checkpoint" (a study trial then restarts from
    scratch, as for any unreadable checkpoint); a model key this version does not know builds nothing and is left
    out, as a resume's config check leaves it."""
    with pytest.raises(CheckpointError, match=r"\(its config: model.width must be >= 0.015625, got 1e-09\)"):
        load_checkpoint(_checkpoint(tmp_path / "bad.pt", {"model.width": 1e-9}))
    assert load_checkpoint(_checkpoint(tmp_path / "old.pt", {"model.retired_key": 3}))["epoch"] == 1


def _tampered(path: Path, value: float = float("nan"), epoch: int = 1) -> Path:
    """A checkpoint of the smoke model whose first weight holds ``value`` everywhere and whose epoch is ``epoch``."""
    cfg = apply_overrides(preset("smoke"), SMOKE)
    name, weight = next((k, v) for k, v in build_model(cfg).state_dict().items() if v.is_floating_point())
    state = load_checkpoint(_checkpoint(path, {}, {name: torch.full_like(weight, value)}), mmap=True)
    return save_checkpoint({**state, "epoch": epoch}, path)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_weights_that_are_not_finite_are_refused_where_they_are_used(tmp_path: Path, value: float) -> None:
    """``evaluate`` reported chance accuracy for a file whose weights were NaN, and ``export`` wrote them out as an
    encoder; training stops at a non-finite loss before it saves, so such a file was changed since: refused in one
    line naming the first such weight. A look at the config alone (``mmap``: a resume's check) reads no weight."""
    path = _tampered(tmp_path / "checkpoint.pt", value)
    with pytest.raises(CheckpointError, match=r"\(its weight backbone\.conv1\.weight holds NaN or infinite values"):
        load_checkpoint(path)
    assert load_checkpoint(path, mmap=True)["epoch"] == 1


def test_a_negative_epoch_is_refused(tmp_path: Path) -> None:
    """The epochs a checkpoint has trained: a resume started from epoch -5 and ran 5 epochs more than asked."""
    with pytest.raises(CheckpointError, match=r"\(its epoch is -5, not a count of epochs trained\)"):
        load_checkpoint(_tampered(tmp_path / "checkpoint.pt", 0.5, epoch=-5))
    assert load_checkpoint(_tampered(tmp_path / "zero.pt", 0.5, epoch=0))["epoch"] == 0


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, cwd=REPO,
                          preexec_fn=_limited)


def _one_line(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and needle in errors[0], proc.stderr[-3000:]


@pytest.mark.slow  # three commands in subprocesses (torch's import each)
def test_evaluate_export_and_study_export_refuse_it_in_one_line(tmp_path: Path) -> None:
    needle = "asks for a resnet50 at width 16"
    path = _checkpoint(tmp_path / "checkpoint.pt", GREEDY["resnet50_x16"])
    _one_line(_run("-m", "dcl_core.evaluate", str(path), "--device", "cpu"), needle)
    _one_line(_run("-m", "dcl_core.export", str(path), "-o", str(tmp_path / "out.pt")), needle)
    # the same file as a finished study's trial checkpoint
    study = tmp_path / "study"
    write_table([{"trial_id": "ab_00001", "series": "dcl", "knn_top1": 33.5, "status": "ok"}], study / "summary" / "s")
    trial = study / "ray_results" / "s" / "dcl_s0_ab_00001" / "checkpoint_000000"
    trial.mkdir(parents=True)
    (trial / "checkpoint.pt").write_bytes(path.read_bytes())
    _one_line(_run("-m", "dcl_core.study", "export", str(study), "--best", "-o", str(tmp_path / "best.pt")), needle)
    assert not (tmp_path / "out.pt").exists() and not (tmp_path / "best.pt").exists()


@pytest.mark.slow  # two commands in subprocesses
def test_evaluate_and_export_refuse_weights_that_are_not_finite_in_one_line(tmp_path: Path) -> None:
    path = _tampered(tmp_path / "checkpoint.pt")
    needle = "its weight backbone.conv1.weight holds NaN or infinite values"
    _one_line(_run("-m", "dcl_core.evaluate", str(path), "--device", "cpu"), needle)
    _one_line(_run("-m", "dcl_core.export", str(path), "-o", str(tmp_path / "out.pt")), needle)
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.slow  # runs evaluate in a subprocess
def test_evaluate_sizes_a_set_model_before_building_it(tmp_path: Path) -> None:
    """``--set model.width=16`` on a checkpoint's command line asks the same of its weights: the key that differs,
    before 22 GiB are built."""
    path = _checkpoint(tmp_path / "checkpoint.pt", {})
    proc = _run("-m", "dcl_core.evaluate", str(path), "--device", "cpu", "--set", "model.arch=resnet50",
                "--set", "model.width=16")
    _one_line(proc, "do not fit the configured model: model.arch is resnet18 in the checkpoint, resnet50 here; "
                    "model.width is 0.125 in the checkpoint, 16.0 here")
    assert not proc.stdout.strip()
