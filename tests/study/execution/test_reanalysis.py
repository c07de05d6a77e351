"""Re-analysis without training (python -m dcl_core.study answer, --reanalyze): bad input exits 2 with one line
before anything is written; what it will not trust (a recorded script outside studies/, a spec that is not the
study that ran) is refused. The round trip on real studies is in test_studies_e2e.py and test_mi_toy.py."""

import json
import os
import sys
from pathlib import Path

import pyrun
import pytest

from dcl_core.study.cli.answer_command import answer_main as main
from dcl_core.study.execution.reanalysis import read_rows
from dcl_core.study.plan.storage import script_origin
from dcl_core.study.plan.writers import write_table

REPO = Path(__file__).resolve().parents[3]


def _study(tmp_path, command=None, spec=None):
    out = tmp_path / "out"
    d = out / "summary" / "temperature_sweep"
    d.mkdir(parents=True)
    write_table([{"trial_id": "a", "status": "ok", "loss": "dcl", "temperature": 0.1, "seed": 0, "knn_top1": 10.0}], d)
    options = {"tracking_uri": None}
    if command is not None:
        options["command"] = command
    if spec is not None:
        options["spec"] = spec
    (d / "study_options.json").write_text(json.dumps(options))
    return out, d


def _error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    return err


def test_bad_folders_and_names_exit_2_with_one_line(tmp_path, capsys):
    assert "holds no finished study" in _error(capsys, [str(tmp_path / "missing")])
    out, _ = _study(tmp_path, command={"script": "temperature_sweep"})
    assert "no finished study named other" in _error(capsys, [str(out), "--name", "other"])
    assert "must be 1-100 letters" in _error(capsys, [str(out), "--name", "../x"])


def test_a_study_without_a_recorded_command_says_how_to_reanalyse_it(tmp_path, capsys):
    out, _ = _study(tmp_path)
    err = _error(capsys, [str(out)])
    assert "records no command" in err and "--reanalyze" in err


def test_a_study_that_cannot_be_reanalysed_does_not_stop_the_others(tmp_path, capsys):
    out, d = _study(tmp_path)  # no recorded command
    other = out / "summary" / "batch_size_sweep"
    other.mkdir()
    (other / "results.parquet").write_bytes((d / "results.parquet").read_bytes())
    (other / "study_options.json").write_text(json.dumps({"command": {"script": "../evil"}}))
    assert main([str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["=== batch_size_sweep", "", "=== temperature_sweep"]
    errors = captured.err.strip().splitlines()
    assert len(errors) == 2 and errors[0].startswith("error: batch_size_sweep: the recorded study script")
    assert errors[1].startswith("error: temperature_sweep: ") and "records no command" in errors[1]


@pytest.mark.parametrize("script", ["../../tmp/evil", "os", "no_such_study", "Temperature_sweep"])
def test_a_recorded_script_must_be_one_of_this_checkouts_studies(tmp_path, capsys, script):
    out, _ = _study(tmp_path, command={"script": script})
    assert "is not one of" in _error(capsys, [str(out)])


@pytest.mark.parametrize(("path", "origin"), [
    (None, "studies/temperature_sweep.py"),  # recorded before the path was
    ("/elsewhere/clone/studies/temperature_sweep.py", "studies/temperature_sweep.py"),  # another checkout's own
    ("/home/me/exp/temperature_sweep.py", "/home/me/exp/temperature_sweep.py"),  # a copy outside studies/
    ("/elsewhere/clone/studies/my_sweep.py", "/elsewhere/clone/studies/my_sweep.py"),  # a copy beside the original
])
def test_which_script_made_a_study(path, origin):
    command = {"script": "temperature_sweep", **({"script_path": path} if path else {})}
    assert script_origin(command) == origin
    assert script_origin({"preset": "smoke"}) is None and script_origin("damaged") is None


def _made_by_a_copy(tmp_path, write=True):
    """A study whose record says a copy of temperature_sweep.py outside studies/ made it."""
    copy = tmp_path / "mine" / "my_sweep.py"
    if write:
        copy.parent.mkdir()
        copy.write_text((REPO / "studies" / "temperature_sweep.py").read_text())
    out, _ = _study(tmp_path, command={"script": "temperature_sweep", "script_path": str(copy), "preset": "smoke"})
    return out, copy


def test_a_study_a_copied_script_made_is_not_reanalysed_by_the_checkouts_script(tmp_path, capsys):
    """The checkout's studies/temperature_sweep.py would rebuild another grid (and refuse it as another study); the
    copy named in the outputs is not run unasked (anyone who can write the folder could name any file): one line
    saying how to name it."""
    out, copy = _made_by_a_copy(tmp_path)
    err = _error(capsys, [str(out)])
    assert err.startswith(f"error: temperature_sweep: made by {copy}, not one of ")
    assert f"`python -m dcl_core.study answer {out} --name temperature_sweep --script {copy}`" in err


def test_a_copied_script_that_is_gone_is_named_as_missing(tmp_path, capsys):
    out, copy = _made_by_a_copy(tmp_path, write=False)
    assert f"made by {copy}, not one of" in (err := _error(capsys, [str(out)])) and "that file is missing" in err


def test_a_script_named_for_no_study_or_not_a_script_is_refused(tmp_path, capsys):
    out, _ = _made_by_a_copy(tmp_path)
    other = tmp_path / "other.py"
    other.write_text("")
    assert "no study in" in _error(capsys, [str(out), "--script", str(other)])
    assert "not a study script" in _error(capsys, [str(out), "--script", str(tmp_path / "missing.py")])
    assert "not a study script (it defines no build_spec)" in _error(
        capsys, [str(out), "--name", "temperature_sweep", "--script", str(other)])


def test_a_results_file_that_is_not_parquet_is_refused(tmp_path, capsys):
    out, d = _study(tmp_path, command={"script": "temperature_sweep", "preset": "smoke"})
    (d / "results.parquet").write_bytes(b"\x80\x04not a table")
    assert "is not a results table" in _error(capsys, [str(out)])


def test_rows_get_their_config_back_from_the_columns(tmp_path):
    _, d = _study(tmp_path)
    (row,) = read_rows(d / "results.parquet")
    assert row["config"]["loss.temperature"] == 0.1 and row["config"]["loss.name"] == "dcl"
    assert row["config"]["seed"] == 0


@pytest.mark.slow  # runs studies/temperature_sweep.py as a subprocess 4 times
def test_reanalyze_refuses_options_that_describe_another_study(tmp_path):
    """--reanalyze with a preset the study did not run would answer the wrong questions: one line, exit 2."""
    out, _ = _study(tmp_path, command={"script": "temperature_sweep", "preset": "smoke"},
                    spec={"base": {"optim.epochs": 1}, "grids": "[...]"})
    proc = pyrun.run([sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--output-dir", str(out),
                           "--reanalyze"], capture_output=True, text=True, timeout=120, cwd=REPO, env=os.environ.copy())
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: --reanalyze must describe the study that ran")
    assert "optim.epochs" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    for flag in ("--resume", "--overwrite", "--dry-run"):
        proc = pyrun.run([sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--output-dir",
                               str(out), "--reanalyze", flag], capture_output=True, text=True, timeout=120, cwd=REPO)
        assert proc.returncode == 2 and "--reanalyze trains nothing" in proc.stderr


def test_a_named_script_that_changed_since_the_study_ran_gets_a_note(tmp_path, capsys):
    """``--script FILE`` runs FILE as it is now; where its SHA-256 is not the one the study recorded, stderr says so
    (the same file unchanged, or a record made before the hash was kept, gets no note)."""
    from dcl_core.study.cli.answer_command import _script_of
    from dcl_core.study.plan.storage import script_sha256

    out, copy = _made_by_a_copy(tmp_path)
    command = {"script": "temperature_sweep", "script_path": str(copy), "script_sha256": script_sha256(copy)}
    for recorded in (command, {k: v for k, v in command.items() if k != "script_sha256"}):
        assert _script_of(recorded, copy, out, "temperature_sweep").path == copy.resolve()
        assert capsys.readouterr().err == ""
    copy.write_text(copy.read_text() + "\n# my edit\n")
    _script_of(command, copy, out, "temperature_sweep")
    assert capsys.readouterr().err == (f"note: {copy} changed since the study ran; its recorded options are re-run "
                                       "through it as it is now\n")


@pytest.mark.parametrize("uri", ["foo://bar", "sqlite:///{tmp}/notes.txt", "http://127.0.0.1:9"])
def test_a_bad_tracking_uri_is_refused_before_a_reanalysis_as_before_a_study(tmp_path, capsys, uri):
    """Issue reproduction: ``answer --tracking-uri foo://bar`` (or a file that is not a database, or a server that
    does not answer) re-analysed, journaled the answer with a warning per operation and exited 0, where a study
    given the same URI is refused in one line. Now ``answer`` and ``--reanalyze`` refuse it the same way."""
    import importlib.util

    (tmp_path / "notes.txt").write_text("not a database\n")
    uri = uri.format(tmp=tmp_path)
    out, d = _study(tmp_path, command={"script": "temperature_sweep", "preset": "smoke"})
    before = sorted(p.name for p in d.iterdir())
    err = _error(capsys, [str(out), "--tracking-uri", uri])
    assert "is not a valid MLflow tracking URI" in err or "is unreachable" in err, err
    spec = importlib.util.spec_from_file_location("reanalysed_sweep", REPO / "studies" / "temperature_sweep.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    code = script.main(script.__doc__, "temperature_sweep", script.build_spec, presets=script.PRESETS,
                       argv=["--smoke", "--output-dir", str(out), "--reanalyze", "--tracking-uri", uri])
    assert code == 2
    assert capsys.readouterr().err == err  # the same line
    assert sorted(p.name for p in d.iterdir()) == before and not (out / "mlflow.db").exists()  # nothing written


def _script_main(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"reanalysing_{name}", REPO / "studies" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return lambda argv: script.main(script.__doc__, name, script.build_spec, presets=script.PRESETS, argv=argv)


def test_reanalyze_by_another_study_script_is_refused_before_anything_is_written(tmp_path, capsys):
    """Issue reproduction: ``batch_size_sweep.py --reanalyze --name temperature_sweep`` (a record without a spec
    to compare) rewrote the temperature study's table, plots and summary run with an empty batch-size answer. The
    record names the script that ran it: refused in one line, as ``--resume`` is."""
    out, d = _study(tmp_path, command={"script": "temperature_sweep", "preset": "smoke"})
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    code = _script_main("batch_size_sweep")(["--smoke", "--output-dir", str(out), "--reanalyze", "--name",
                                             "temperature_sweep"])
    err = capsys.readouterr().err
    assert code == 2 and err == (f"error: --reanalyze: study temperature_sweep in {out} was run by "
                                 "studies/temperature_sweep.py, not studies/batch_size_sweep.py; run it with that "
                                 "script, or give this one another --name\n"), err
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before and not (out / "mlflow.db").exists()


def test_reanalyze_refuses_a_record_that_is_no_regular_file(tmp_path, capsys):
    """Issue reproduction: with a FIFO at ``study_options.json``, ``--reanalyze`` skipped the record (and its check
    that the spec is the one that ran) and rewrote the summary; ``answer`` refused it. Now both refuse it."""
    out, d = _study(tmp_path, command={"script": "temperature_sweep", "preset": "smoke"})
    (d / "study_options.json").unlink()
    os.mkfifo(d / "study_options.json")
    code = _script_main("temperature_sweep")(["--smoke", "--output-dir", str(out), "--reanalyze"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "study_options.json is a FIFO, not a regular file" in err, err
    assert err.count("\n") == 1 and sorted(p.name for p in d.iterdir()) == ["results.csv", "results.parquet",
                                                                            "study_options.json"]
