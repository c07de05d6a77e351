"""Parts of the study layer that the fast tier (``pytest -m "not slow"``) otherwise reached only through a real
study (Ray trials, the end-to-end tests): what a resume is held to, the checks before Ray, the search report's
best rows, the MLflow transport's error handling, the trial reporters, a failure's one-line cause, the presets,
and the dry run's totals. Each on hand-made inputs with a known answer; nothing starts Ray."""

import json
import os
import re
import socket
from pathlib import Path

import pytest

from dcl_core.config import ConfigError, apply_overrides, preset
from dcl_core.study import StudyOptions, StudySpec
from dcl_core.study.analysis.columns import KNN_TOP1, SERIES, STATUS, Status
from dcl_core.study.execution.search_findings import best_per_cell, best_rows
from dcl_core.study.plan.checks import check_ray_address
from dcl_core.study.plan.dry_run import dry_run_lines, estimate_study
from dcl_core.study.plan.prepared import prepare_built
from dcl_core.study.plan.record import (
    check_same_study,
    read_options,
    recorded_rounds,
    span,
    spec_fingerprint,
)
from dcl_core.study.plan.spec import check_set_not_swept
from dcl_core.study.plan.study_presets import CPU_PROTOCOL, PAIR, SMOKE_DATA, cpu, smoke
from dcl_core.study.tracking.transport import UnreplayableError, is_refused, move_credentials, reason
from search_spaces import Grid

REPO = Path(__file__).resolve().parents[3]


def smoke_spec(seeds=(0,), losses=("dcl",), temperatures=(0.1,)):
    return StudySpec(name="s", base=preset("smoke"), x_key="loss.temperature", x_label="tau",
                     grid={"loss.name": Grid(losses), "seed": Grid(seeds), "loss.temperature": Grid(temperatures)})


# ------------------------------------------------------------------------------------------------ record (resume)
def test_a_resume_may_add_seeds_and_nothing_else():
    before = json.loads(json.dumps(spec_fingerprint(smoke_spec(seeds=(0, 1)))))  # as study_options.json holds it
    assert check_same_study(smoke_spec(seeds=(0, 1)), before) == ()
    assert check_same_study(smoke_spec(seeds=(0, 1, 2, 3)), before) == (2, 3)
    with pytest.raises(ConfigError, match="can add seeds, not drop them"):
        check_same_study(smoke_spec(seeds=(0,)), before)
    with pytest.raises(ConfigError, match="its grids changed"):
        check_same_study(smoke_spec(seeds=(0, 1), losses=("dcl", "infonce")), before)
    epochs = before["base"]["optim.epochs"]
    changed = {**before, "base": {**before["base"], "optim.epochs": epochs + 1}}  # a --set since then
    with pytest.raises(ConfigError, match=f"optim.epochs was {epochs + 1}, now {epochs}"):
        check_same_study(smoke_spec(seeds=(0, 1)), changed)


def test_recorded_rounds_seeds_and_spans():
    assert recorded_rounds({"seed_rounds": [[0, 1], [2]]}, [0, 1, 2]) == [[0, 1], [2]]
    assert recorded_rounds({}, [0, 1, 2]) == [[0, 1, 2]]  # a study recorded before rounds existed: one round
    assert recorded_rounds({"seed_rounds": [[0], []]}, [0, 1]) == [[0, 1]]  # not what a study writes: ignored
    assert (span([3, 4, 5]), span([7])) == ("3-5", "7")


@pytest.mark.parametrize(("content", "why"), [("{not json", "not JSON"), ('{"spec": []}', "not the options"),
                                              ("[1, 2]", "not the options"),
                                              ("[" * 100_000 + "]" * 100_000, "nested deeper")])  # a traceback
def test_damaged_options_are_refused_in_one_line(tmp_path, content, why):
    path = tmp_path / "study_options.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=why) as err:
        read_options(path)
    assert "\n" not in str(err.value)
    path.write_text('{"spec": {"base": {}}, "command": {"seeds": 2}}')
    assert read_options(path)["command"] == {"seeds": 2}


# ------------------------------------------------------------------------------------------ checks before Ray
def test_a_cluster_address_is_checked_in_bounded_time():
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        check_ray_address("localhost")
    with pytest.raises(ConfigError, match=r"drop --address to run on this machine$"):  # Ray's "local": ours is no flag
        check_ray_address("local")
    for fine in ("http://127.0.0.1:8265", ""):  # Ray's own forms: not checked here (auto: test_ray_address.py)
        check_ray_address(fine)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        port = listening.getsockname()[1]
        check_ray_address(f"127.0.0.1:{port}")
        check_ray_address(f"ray://127.0.0.1:{port}")
    with pytest.raises(ConfigError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        check_ray_address(f"127.0.0.1:{port}", timeout=2)  # closed now


def test_set_of_a_swept_key_is_refused():
    spec = smoke_spec()
    check_set_not_swept(spec, {"optim.epochs": "3"})
    with pytest.raises(ConfigError, match=r"this study sets loss\.temperature per trial"):
        check_set_not_swept(spec, {"optim.epochs": "3", "loss.temperature": "0.2"})
    with pytest.raises(ConfigError, match="--set output_dir"):
        check_set_not_swept(spec, {"output_dir": "/tmp/x"})
    # an empty --set data.root: refused by the config, with every empty path (tests/test_config.py)


# --------------------------------------------------------------------------------------------- search report
def _row(series, x, knn, status=Status.OK):
    return {SERIES: series, "x": x, KNN_TOP1: knn, STATUS: status}


def test_best_rows_skip_failed_trials_and_best_cells_prefer_finished_ones():
    rows = [_row("dcl", 0.1, 40.0), _row("dcl", 0.2, 45.0), _row("dcl", 0.2, 99.0, Status.ERROR),
            _row("infonce", 0.1, None), _row("infonce", 0.1, 30.0), _row("infonce", 0.2, 50.0, Status.ERROR)]
    best = best_rows(rows)
    assert set(best) == {"dcl", "infonce"} and best["dcl"][KNN_TOP1] == 45.0 and best["infonce"][KNN_TOP1] == 30.0
    cells = {(r[SERIES], r["x"]): r for r in best_per_cell(rows, "x")}
    assert set(cells) == {("dcl", 0.1), ("dcl", 0.2), ("infonce", 0.1), ("infonce", 0.2)}
    assert cells[("dcl", 0.2)][KNN_TOP1] == 45.0 and cells[("infonce", 0.1)][KNN_TOP1] == 30.0
    assert cells[("infonce", 0.2)][STATUS] == Status.ERROR  # a cell whose every trial failed still shows


# ------------------------------------------------------------------------------------------ MLflow transport
def test_transport_retries_only_what_a_retry_can_fix():
    assert not is_refused(ConnectionRefusedError(111, "Connection refused"))  # an OSError: the server may be back
    assert not is_refused(TimeoutError("timed out"))
    assert is_refused(FileNotFoundError("gone")) and is_refused(UnreplayableError("never created"))
    assert is_refused(ValueError("a bug"))  # no retry fixes a bug
    assert reason(ConnectionRefusedError("HTTPConnectionPool(...): [Errno 111] Connection refused')")) == \
        "[Errno 111] Connection refused"
    assert reason(TimeoutError("Read timed out. (read timeout=5)")) == "timed out"
    assert "s3cret" not in reason(RuntimeError("API request to http://alice:s3cret@host:5000/api failed\nmore"))


def test_credentials_leave_the_uri_for_mlflows_variables(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    assert move_credentials("sqlite:////x/mlflow.db") == "sqlite:////x/mlflow.db"
    assert move_credentials("https://alice:p%40ss@mlflow.example:5000/x") == "https://mlflow.example:5000/x"
    assert (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]) == ("alice", "p@ss")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "the user's own")  # a variable the user set wins
    assert move_credentials("http://bob:other@h:1") == "http://h:1"
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "the user's own"


# ------------------------------------------------------------------------------------------------ trial side
def test_the_reporter_carries_the_last_knn_forward_and_says_whether_it_is_fresh():
    from dcl_core import metric_names as M
    from dcl_core.study.tracking.trial_reporters import TuneReporter

    reporter = TuneReporter()
    first = reporter._complete({"train/loss": 1.0})
    assert first[M.KNN_FRESH] == 0.0 and first[M.KNN_TOP1] != first[M.KNN_TOP1]  # NaN before any measurement
    assert reporter._complete({M.KNN_TOP1: 31.5})[M.KNN_FRESH] == 1.0
    later = reporter._complete({"train/loss": 0.5})
    assert later[M.KNN_TOP1] == 31.5 and later[M.KNN_FRESH] == 0.0 and later["train/loss"] == 0.5


def test_a_failures_cause_is_its_innermost_error_in_one_plain_line():
    from dcl_core.study.execution.trainable import error_text

    wrapped = RuntimeError("ray::ImplicitFunc.train() (pid=1, ip=127.0.0.1)\n  File \"x.py\", line 3\n"
                           "\x1b[36mray.exceptions.RayTaskError\x1b[0m: ValueError: outer\n"
                           "ValueError: the real cause")
    assert error_text(wrapped) == "ValueError: the real cause"
    assert error_text(KeyError("k")) == "KeyError: 'k'"
    assert len(error_text(RuntimeError("x" * 1000))) == 300


# ------------------------------------------------------------------------------------------ presets, dry run
def test_presets_share_the_protocol_but_what_a_study_leaves_out():
    s = smoke({"optim.epochs": 2}, seeds=2)
    assert s.base == ("smoke", {**SMOKE_DATA, "optim.epochs": 2}) and s.seeds == 2
    c = cpu({"optim.epochs": 30}, without=("optim.base_lr",))
    config, overrides = c.base
    assert config == "cpu" and overrides["optim.epochs"] == 30 and "optim.base_lr" not in overrides
    assert {k: v for k, v in overrides.items() if k in CPU_PROTOCOL} == {
        k: v for k, v in CPU_PROTOCOL.items() if k != "optim.base_lr"}
    assert cpu({"data.train_per_class": 100}).base[1]["data.train_per_class"] == 100  # the study's own wins


def test_a_preset_resolves_the_command_line_itself():
    """Issue 62, item 3: seeds, samples, losses, grid or search, --data-root and --set are read in one place."""
    p = cpu({"optim.epochs": 5}, axis=(0.1, 0.5), seeds=5, samples=7)
    run = p.resolve(search="grid")
    assert (run.losses, run.seeds, run.samples, run.grid, run.axis) == (PAIR, (0, 1, 2, 3, 4), 7, True, (0.1, 0.5))
    assert run.base == apply_overrides(preset("cpu"), dict(p.overrides)) and run.space({"x": 1}) is None
    assert run.seed_axis == Grid((0, 1, 2, 3, 4))
    run = p.resolve(search="optuna", losses=" dcl,dclw ", seeds=2, samples=3, data_root="/data",
                    overrides=("optim.epochs=9",))
    assert (run.losses, run.seeds, run.samples, run.optuna, run.space({"x": 1})) == (
        ("dcl", "dclw"), (0, 1), 3, True, {"x": 1})
    assert (run.base.optim.epochs, run.base.data.root) == (9, "/data")  # --set over the preset's own
    with pytest.raises(ConfigError, match="names dcl twice"):
        p.resolve(search="grid", losses="dcl,infonce,dcl")
    with pytest.raises(ConfigError, match="both be shown as"):
        p.resolve(search="grid", losses="a.py:Mine,b.py:Mine")
    # a study that fixes its losses or runs one search mode refuses the others here, with its own reason
    assert p.resolve(search="grid", fixed_losses="fixed").losses == PAIR
    with pytest.raises(ConfigError, match=r"^fixed$"):
        p.resolve(search="grid", losses="dcl", fixed_losses="fixed")
    assert p.resolve(search="optuna", only_search=("optuna", "a search")).optuna
    with pytest.raises(ConfigError, match=r"^a search$"):
        p.resolve(search="grid", only_search=("optuna", "a search"))


def test_no_study_script_resolves_its_preset_by_hand():
    """The scripts read a resolved preset, never the options it resolves (issue 62 counted 8 seed ranges, 7
    sample fallbacks and 13 search tests written out by hand; two scripts refused --losses themselves)."""
    hand = re.compile(r"args\.(seeds|num_samples|search|data_root|set|losses)\b|range\(|PRESETS\[")
    found = [f"{path.name}:{n}: {line.strip()}" for path in sorted((REPO / "studies").glob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if hand.search(line)]
    assert not found, found


def test_the_dry_runs_totals_count_the_grid(tmp_path):
    spec = smoke_spec(seeds=(0, 1), temperatures=(0.1, 0.5))
    epochs = spec.base.optim.epochs
    options = StudyOptions(tmp_path / "out", num_cpus=2).resolved()
    _, _, est, slots = estimate_study(spec, options)
    assert (est.trials, est.epochs) == (4, 4 * epochs) and slots >= 1 and est.wall_seconds > 0
    lines = dry_run_lines(prepare_built(spec, options, dry_run=True), "smoke", [])
    assert lines[0] == "dry run of study s (preset smoke, grid): nothing was started or written"
    assert any(line.startswith(f"total: 4 trials, {4 * epochs} epochs") for line in lines)
    assert not (tmp_path / "out").exists()


def test_sync_finds_each_study_s_store_and_journals_but_never_through_a_link(tmp_path):
    import json

    from dcl_core.study.plan.storage import OPTIONS_FILE, default_tracking_uri, summary_dir
    from dcl_core.study.tracking.journal import JOURNAL_FILE
    from dcl_core.study.tracking.sync import journals, study_store

    study = summary_dir(tmp_path, "tau")
    study.mkdir(parents=True)
    own = default_tracking_uri(tmp_path)
    assert study_store(study, tmp_path, None).uri == own  # nothing recorded
    (study / OPTIONS_FILE).write_text(json.dumps({"tracking_uri": "http://u:pw@127.0.0.1:5999"}))
    store = study_store(study, tmp_path, None)  # never followed: the folder's own store, the recorded one named
    assert store.uri == own and store.recorded == "http://***@127.0.0.1:5999" and "pw" not in (store.note() or "")
    assert study_store(study, tmp_path, "sqlite:///given.db").uri == "sqlite:///given.db"
    (study / OPTIONS_FILE).write_text(json.dumps({"tracking_uri": "sqlite:////elsewhere/evil.db"}))
    assert study_store(study, tmp_path, None).uri == own
    # a copied or moved folder: the store it recorded was the original folder's own, so this one's is used quietly
    (study / OPTIONS_FILE).write_text(json.dumps({"tracking_uri": "sqlite:////old/out/mlflow.db",
                                                  "output_dir": "/old/out"}))
    assert study_store(study, tmp_path, None) == type(store)(own)
    (study / OPTIONS_FILE).write_text(json.dumps({"tracking_uri": 123}))  # not a string: nothing recorded
    assert study_store(study, tmp_path, None) == type(store)(own)
    (study / JOURNAL_FILE).write_text("{}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / JOURNAL_FILE).write_text("{}\n")
    (summary_dir(tmp_path, "linked")).symlink_to(elsewhere)
    assert journals(tmp_path, None) == [study / JOURNAL_FILE]
    assert journals(tmp_path, "tau") == [study / JOURNAL_FILE]
    assert journals(tmp_path, "linked") == []
