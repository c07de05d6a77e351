"""``python -m dcl_core.study export``: which trial a name or ``--best`` picks, and where its checkpoint is found
(Tune's folder, or for a DDP trial the Ray Train run its last result names, never outside the storage). The export
of a real study, logged to its MLflow run, is checked end to end in ``test_studies_e2e.py``; ``-o`` never replaces
a device, a FIFO or a link, and a full disk is one line."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from test_full_disk import disk, fill  # noqa: F401 - disk: a fixture (a small tmpfs of the test's own)

from dcl_core.config import ConfigError, apply_overrides, preset, to_flat_dict
from dcl_core.study.cli.export_command import export_main
from dcl_core.study.execution.trial_choice import choose_row, final_checkpoint, trial_folder
from dcl_core.study.plan.writers import write_table
from dcl_core.training.builders import build_model
from dcl_core.training.checkpoint import save_checkpoint


def _row(trial_id: str, series: str, knn: float | None, status: str = "ok") -> dict:
    return {"trial_id": trial_id, "series": series, "knn_top1": knn, "status": status}


ROWS = [_row("ab_00000", "dcl", 30.0), _row("ab_00001", "infonce", 33.5), _row("ab_00002", "dcl", 33.5),
        _row("ab_00003", "dcl", None, "failed"), _row("ab_00004", "dcl", 31.0)]


def test_best_is_the_highest_final_knn_of_the_finished_trials_earliest_id_on_a_tie() -> None:
    assert choose_row(ROWS, "s", None, "")["trial_id"] == "ab_00001"  # 33.5 twice: the earlier id
    assert choose_row(ROWS, "s", None, "dcl")["trial_id"] == "ab_00002"
    assert choose_row(list(reversed(ROWS)), "s", None, "")["trial_id"] == "ab_00001"  # not the table's order
    with pytest.raises(ConfigError, match=r"no finished trial of series 'dclw' to export \(its series: dcl, infonce"):
        choose_row(ROWS, "s", None, "dclw")


def test_a_trial_is_named_by_its_id_or_its_folder_name_and_must_have_finished() -> None:
    assert choose_row(ROWS, "s", "ab_00004", None)["trial_id"] == "ab_00004"
    assert choose_row(ROWS, "s", "dcl_s0_t0.1_ab_00004", None)["trial_id"] == "ab_00004"
    with pytest.raises(ConfigError, match=r"did not finish \(status failed"):
        choose_row(ROWS, "s", "ab_00003", None)
    with pytest.raises(ConfigError, match=r"no trial 'ab_00009' \(its trial ids: ab_00000, ab_00001"):
        choose_row(ROWS, "s", "ab_00009", None)


def _trial(storage: Path, experiment: str, name: str, checkpoints: int = 0, result: dict | None = None) -> Path:
    folder = storage / experiment / name
    folder.mkdir(parents=True)
    for i in range(checkpoints):
        (folder / f"checkpoint_{i:06d}").mkdir()
        (folder / f"checkpoint_{i:06d}" / "checkpoint.pt").write_bytes(b"x")
    if result is not None:
        (folder / "result.json").write_text(json.dumps({"epoch": 1}) + "\n" + json.dumps(result) + "\n")
    return folder


def test_the_checkpoint_is_the_last_tune_kept_or_the_ddp_run_s_inside_the_storage(tmp_path: Path) -> None:
    storage = tmp_path / "ray_results"
    tuned = _trial(storage, "s+dcl-16", "dcl_s0_b16_ab_00001", checkpoints=2)
    assert trial_folder(storage, "s", "ab_00001") == tuned  # a study's other experiments are searched too
    assert final_checkpoint(tuned, storage) == tuned / "checkpoint_000001" / "checkpoint.pt"
    run = storage / "s" / "TorchTrainer_x" / "checkpoint_000002"
    run.mkdir(parents=True)
    (run / "checkpoint.pt").write_bytes(b"x")
    ddp = _trial(storage, "s", "dcl_s0_ab_00002", result={"checkpoint_path": str(run)})
    assert final_checkpoint(ddp, storage) == run / "checkpoint.pt"
    # a folder moved from where it ran: the result names the old place, found again under this storage
    moved = _trial(storage, "s", "dcl_s0_ab_00006", result={"checkpoint_path": f"/old/ray_results/s/{run.parent.name}"
                                                                               f"/{run.name}"})
    assert final_checkpoint(moved, storage) == run / "checkpoint.pt"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "checkpoint.pt").write_bytes(b"x")
    planted = _trial(storage, "s", "dcl_s0_ab_00003", result={"checkpoint_path": str(outside)})
    with pytest.raises(ConfigError, match="outside the study's storage"):
        final_checkpoint(planted, storage)
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        final_checkpoint(_trial(storage, "s", "dcl_s0_ab_00004"), storage)
    with pytest.raises(ConfigError, match="has no folder in"):
        trial_folder(storage, "s", "ab_00009")
    _trial(storage, "sx", "dcl_s0_ab_00005", checkpoints=1)  # another study whose name starts the same
    with pytest.raises(ConfigError, match="has no folder in"):
        trial_folder(storage, "s", "ab_00005")
    with pytest.raises(ConfigError, match="not a Tune trial id"):
        trial_folder(storage, "s", "../x")


def test_bad_input_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert export_main([str(tmp_path), "--best"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path} holds no finished study"
    assert export_main([str(tmp_path), "--best", "--name", "../x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "../x" in err[0]
    # a URI was read as a local folder (s3://b/x as ./s3:/b/x); export reads a local copy
    assert export_main([str(tmp_path), "--best", "--name", "s", "--storage", "s3://b/x"]) == 2
    assert capsys.readouterr().err.startswith("error: --storage s3://b/x: export reads the study's Tune storage "
                                              "from a local folder")



def _finished_study(root: Path) -> Path:
    """A study folder as a finished study leaves it, for ``export``: its results (one finished trial) and the
    trial's Tune folder holding a real checkpoint (the smoke model at width 0.125, untrained)."""
    write_table([_row("ab_00001", "dcl", 33.5)], root / "summary" / "s")
    cfg = apply_overrides(preset("smoke"), {"model.width": 0.125})
    state = {"epoch": 1, "model": build_model(cfg).state_dict(), "optimizer": {}, "scaler": {},
             "config": to_flat_dict(cfg), "history": []}
    save_checkpoint(state, _trial(root / "ray_results", "s", "dcl_s0_ab_00001") / "checkpoint_000000" /
                    "checkpoint.pt")
    return root


def _export_line(study: Path, out: Path, capsys: pytest.CaptureFixture[str], code: int) -> str:
    """The one line ``study export STUDY --best -o OUT`` exits ``code`` with."""
    assert export_main([str(study), "--best", "-o", str(out)]) == code
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in captured.err, captured.err
    return err[0]


@pytest.mark.parametrize("given", ["", ".", "/", "..", "sub/.."])
def test_an_output_that_names_no_file_is_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str], given: str) -> None:
    """Issue 61, item 11: ``study export OUT --best -o ''`` (``-o .``, ``-o /``) was 27 lines of traceback; a path
    that names a folder, not a file, is one line, exit 2, and nothing is written where the command ran."""
    study = _finished_study(tmp_path / "out")
    here = tmp_path / "here"
    (here / "sub").mkdir(parents=True)
    monkeypatch.chdir(here)
    line = _export_line(study, Path(given), capsys, 2)
    assert line == f"error: -o {Path(given)} names a folder, not a file: name the weights file (e.g. -o encoder.pt)"
    assert sorted(p.name for p in here.iterdir()) == ["sub"] and not list((here / "sub").iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_export_never_replaces_a_device_a_fifo_or_a_link(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 46, item 2: ``study export OUT --best -o /dev/null`` as root made the device a 742 KB file (and wrote
    /dev/null.json); ``-o /proc/self/x`` was a traceback (item 10)."""
    study = _finished_study(tmp_path / "out")
    os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the device /dev/null is, made here
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link.pt").symlink_to(tmp_path / "precious")
    assert _export_line(study, tmp_path / "null", capsys, 2).endswith(
        "null is a character device, not a regular file: refusing to replace it (name a regular file or a new path)")
    assert "fifo is a FIFO, not a regular file" in _export_line(study, tmp_path / "fifo", capsys, 2)
    assert "link.pt is a symbolic link" in _export_line(study, tmp_path / "link.pt", capsys, 2)
    assert "cannot go to a .json file" in _export_line(study, tmp_path / "w.json", capsys, 2)
    assert _export_line(study, Path("/proc/self/x"), capsys, 2).startswith("error: cannot write /proc/self/x: ")
    assert stat.S_ISCHR(os.lstat(tmp_path / "null").st_mode) and stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.pt", "null", "out"]
    assert export_main([str(study), "--best", "-o", str(tmp_path / "b.pt")]) == 0  # a new path: written
    assert json.loads((tmp_path / "b.json").read_text())["width"] == 0.125 and (tmp_path / "b.pt").stat().st_size


def test_export_onto_a_full_disk_is_one_line_exit_1(tmp_path: Path, disk: Path,  # noqa: F811 - the fixture
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 46, item 10: Errno 28 while writing the weights was a traceback; now one line, exit 1 (a failed run,
    as a study on a full disk), and neither file nor a temporary one left (``python -m dcl_core.export`` writes
    through the same code)."""
    study = _finished_study(tmp_path / "out")
    fill(disk, leave=300_000)  # the weights are about 740 KB
    line = _export_line(study, disk / "b.pt", capsys, 1)
    assert line == f"error: no space left on the device holding {disk}: free some space"
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]
