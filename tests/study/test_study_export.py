"""``python -m dcl_core.study export``: which trial a name or ``--best`` picks, and where its checkpoint is found
(Tune's folder, or for a DDP trial the Ray Train run its last result names, never outside the storage). The export
of a real study, logged to its MLflow run, is checked end to end in ``test_studies_e2e.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dcl_core.config import ConfigError
from dcl_core.study.cli import export_main
from dcl_core.study.execution.export import choose_row, final_checkpoint, trial_folder


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
