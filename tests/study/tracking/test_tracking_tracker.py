"""What the tracker writes to MLflow for the UI: metric values without float32 noise, the summary run's
description (the verdict, the plot), and each trial run's cell and colour, live and replayed from the journal.
A real SQLite store; an unreachable one is a closed loopback port."""

import math
import socket
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from dcl_core.config import LossSource, preset
from dcl_core.study import StudySpec
from dcl_core.study.analysis.colours import SUMMARY_COLOUR, series_colour
from dcl_core.study.plan.spec import trial_tags
from dcl_core.study.plan.storage import default_tracking_uri
from dcl_core.study.tracking import MLflowTrialCallback, StudyTracker
from dcl_core.study.tracking.mlflow_runs import rounded
from dcl_core.study.tracking.notes import summary_note, verdict_lines
from search_spaces import Grid


def eqco_spec() -> StudySpec:
    """The EqCo study's shape: K set by the loss (SimCLR) or by the framework (SiMo), both tagged num_negatives."""
    common = {"loss.name": "eqco", "loss.alpha": Grid((None, 256.0))}
    return StudySpec(name="eqco", base=preset("smoke"),
                     grid=[{"framework.name": "simclr", "loss.num_negatives": Grid((4, 16)), **common},
                           {"framework.name": "simo", "framework.num_negatives": Grid((4, 16)), **common}],
                     x_key="num_negatives", x_label="K", series=("framework", "method"))


@pytest.mark.parametrize(("logged", "shown"), [
    (float(np.float32(28.2)), 28.2),  # 28.200000762939453: a float32 measurement
    (100 * float(np.float32(0.075)), 7.5),  # 7.500000298023224: a float32 scaled in float64, no float32 at all
    (4.8490118980407715, 4.84901), (0.973717987537384, 0.973718), (-1.7677669529663689, -1.76777),
    (1.2345678e-05, 1.23457e-05), (448.2420978016087, 448.242),
    (1234567.0, 1234567.0), (4096.0, 4096.0),  # integers (counts) exactly
])
def test_metrics_are_rounded_to_six_significant_digits(logged, shown):
    assert rounded(logged) == shown


def test_rounding_passes_non_finite_values_through():
    assert math.isnan(rounded(math.nan)) and rounded(math.inf) == math.inf


def test_logged_metrics_carry_no_float32_noise(tmp_path):
    uri = default_tracking_uri(tmp_path)
    tracker = StudyTracker(uri, "noise", tmp_path / "mlartifacts").open()
    run = tracker.trial_run("t0", "t0", {}, {})
    knn = float(np.float32(28.2))
    metrics = {"eval/knn_top1": knn}
    tracker.log_metrics(run, metrics, step=1)
    assert MlflowClient(uri).get_run(run).data.metrics["eval/knn_top1"] == 28.2
    assert metrics["eval/knn_top1"] == knn  # the caller's numbers (the study's table) are untouched


def test_a_metric_name_longer_than_mlflow_takes_loses_no_metric(tmp_path):
    """A series named with 300 characters once made MLflow refuse the summary's whole batch, verdicts included."""
    uri = default_tracking_uri(tmp_path)
    tracker = StudyTracker(uri, "long", tmp_path / "mlartifacts").open()
    run = tracker.trial_run("t0", "t0", {}, {})
    long_a, long_b = "a" * 300 + "/std", "a" * 300 + "/range"
    tracker.log_metrics(run, {long_a: 1.0, long_b: 2.0, "verdict/std_difference_0/ci_lo": 3.0})
    logged = MlflowClient(uri).get_run(run).data.metrics
    assert logged["verdict/std_difference_0/ci_lo"] == 3.0 and len(logged) == 3
    assert {len(k) for k in logged} == {250, len("verdict/std_difference_0/ci_lo")}


def test_the_summary_note_is_the_verdict_then_the_plot():
    lines = ["Q1: supports the paper — gap +2.1 [0.4, 3.8]", "Q_2: not resolved — *n* = 1"]
    note = summary_note(lines, "supports the paper; not resolved", "study.png", "abc123")
    paragraphs = note.split("\n\n")
    assert paragraphs[0] == "Verdict: supports the paper; not resolved"  # what a table cell's 40 characters show
    assert paragraphs[1] == lines[0]
    assert paragraphs[2] == r"Q\_2: not resolved — \*n\* = 1"  # literal text, not emphasis
    assert paragraphs[3] == r"![study.png](get-artifact?path=study.png&run_uuid=abc123)"
    # a run created while MLflow was down has a placeholder id: no image pointing at nothing
    assert "get-artifact" not in summary_note(lines, "x", "study.png", "offline-abc")
    assert summary_note([], "", None, "abc123") == ""


def test_the_summary_note_shows_the_cells_aligned_and_literal_before_the_plot():
    rows = [["batch", "dcl", "my`loss|x"], ["16", "38.0 [36.9, 39.1]", "33.0 [31.8, 34.2]"],
            ["32", "34.0 [33.1, 34.9]", "33.1 (n=1)"]]
    note = summary_note(["Q: supports the paper"], "supports the paper, gap +5.00", "study.png", "abc123",
                        ("Per cell: kNN top-1 (%)", rows))
    paragraphs = note.split("\n\n")
    assert paragraphs[0] == "Verdict: supports the paper, gap +5.00"
    assert paragraphs[2].startswith("Per cell: kNN top-1 (%)")
    assert paragraphs[3].splitlines() == [
        "```",
        "batch                dcl          my'loss|x",  # a backtick from a name cannot close the block
        "16     38.0 [36.9, 39.1]  33.0 [31.8, 34.2]",
        "32     34.0 [33.1, 34.9]         33.1 (n=1)",
        "```"]
    assert paragraphs[4].startswith("![study.png]") and paragraphs[5].startswith("The paper's numbers")


def test_verdict_lines_come_in_the_answers_order():
    tags = {f"verdict_{i}_line": f"line {i}" for i in (10, 2, 0, 1)} | {"verdict_0": "w", "verdict": "w"}
    assert verdict_lines(tags) == ["line 0", "line 1", "line 2", "line 10"]


def test_the_summary_run_describes_itself_with_its_verdict_and_plot(tmp_path):
    uri = default_tracking_uri(tmp_path)
    tracker = StudyTracker(uri, "study", tmp_path / "mlartifacts").open()
    (tmp_path / "study.png").write_bytes(b"png")
    (tmp_path / "gap_vs_npc.png").write_bytes(b"png")
    tags = {"verdict_0": "not resolved", "verdict_0_line": "Q: not resolved — no interval",
            "verdict": "not resolved"}
    rid = tracker.log_summary({"trials": 4}, [tmp_path / "gap_vs_npc.png", tmp_path / "study.png"], tags=tags)
    run = MlflowClient(uri).get_run(rid)
    assert run.data.tags["mlflow.note.content"] == (
        f"Verdict: not resolved\n\nQ: not resolved — no interval\n\n"
        f"![study.png](get-artifact?path=study.png&run_uuid={rid})\n\n"
        "The cells, the paper's numbers and the NPC regime: table.txt among the artifacts.")
    assert run.data.tags["mlflow.runColor"] == SUMMARY_COLOUR


def test_trial_runs_get_their_cell_and_series_colour(tmp_path, fake_trial):
    uri = default_tracking_uri(tmp_path)
    tracker = StudyTracker(uri, "eqco", tmp_path / "mlartifacts").open()
    callback = MLflowTrialCallback(tracker, trial_tags(eqco_spec()))
    for i, alpha in enumerate((None, 256.0)):  # a SimCLR trial's config also holds the framework's unused K, 0
        callback.on_trial_start(0, [], fake_trial(f"t{i}", {"loss.name": "eqco", "framework.name": "simclr",
                                                           "loss.num_negatives": 16, "framework.num_negatives": 0,
                                                           "loss.alpha": alpha}))
    client = MlflowClient(uri)
    k, fixed = (client.get_run(callback.runs[t]).data.tags for t in ("t0", "t1"))
    assert (k["cell"], fixed["cell"]) == ("simclr eqco K=16 α=None", "simclr eqco K=16 α=256")
    assert k["num_negatives"] == "16"  # the K the trial trains with, as its results row has it
    # the series the plot draws, simclr+eqco(α=K) and simclr+eqco(α=256), each in its own colour
    assert k["mlflow.runColor"] == series_colour("simclr+eqco(α=K)") != fixed["mlflow.runColor"]
    assert fixed["mlflow.runColor"] == series_colour("simclr+eqco(α=256)")


def test_a_trial_run_made_offline_keeps_its_cell_and_colour_when_replayed(tmp_path, fake_trial):
    with socket.socket() as s:  # a port nothing listens on: MLflow is down
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    spec = StudySpec(name="tau", base=preset("smoke"), grid={"loss.temperature": Grid((0.1,))},
                     x_key="loss.temperature", x_label="tau")
    offline = StudyTracker(dead, "tau", tmp_path / "mlartifacts", journal_dir=tmp_path / "journal",
                           http_retries=0, http_timeout=2).open()
    callback = MLflowTrialCallback(offline, trial_tags(spec))
    callback.on_trial_start(0, [], fake_trial("t0", {"loss.name": "dcl", "loss.temperature": 0.1}))
    assert callback.runs["t0"].startswith("offline-") and offline.pending()
    uri = default_tracking_uri(tmp_path)
    assert StudyTracker(uri, "tau", tmp_path / "mlartifacts", journal_dir=tmp_path / "journal").sync()
    client = MlflowClient(uri)
    (trial,) = client.search_runs([client.get_experiment_by_name("tau").experiment_id], "tags.trial_id = 't0'")
    assert trial.data.tags["cell"] == "dcl τ=0.1" and trial.data.tags["mlflow.runColor"] == series_colour("dcl")


def test_a_resumed_trial_run_from_an_older_version_gets_the_tags_it_lacks(tmp_path, fake_trial):
    uri = default_tracking_uri(tmp_path)
    tracker = StudyTracker(uri, "tau", tmp_path / "mlartifacts").open()
    old = tracker.trial_run("t0", "trial_t0", {"loss": "infonce"}, {"loss.name": "infonce"})  # no cell, no colour
    spec = StudySpec(name="tau", base=preset("smoke"), grid={"loss.temperature": Grid((0.5,))},
                     x_key="loss.temperature", x_label="tau")
    callback = MLflowTrialCallback(tracker, trial_tags(spec))
    callback.on_trial_start(0, [], fake_trial("t0", {"loss.name": "infonce", "loss.temperature": 0.5}))
    assert callback.runs["t0"] == old
    tags = MlflowClient(uri).get_run(old).data.tags
    assert tags["cell"] == "infonce τ=0.5" and tags["mlflow.runColor"] == "#ff7f0e"


def test_a_callback_pickled_before_cells_existed_still_tags_its_runs(tmp_path, fake_trial):
    # Tune restores a study's callbacks from its pickle on --resume: one from an older version lacks cell/series
    import pickle

    uri = default_tracking_uri(tmp_path)
    callback = MLflowTrialCallback(StudyTracker(uri, "old", tmp_path / "mlartifacts").open(), {"loss": "loss.name"})
    state = pickle.loads(pickle.dumps(callback))
    del state.__dict__["cell"], state.__dict__["series"]
    state.on_trial_start(0, [], fake_trial("t0", {"loss.name": "dcl"}))
    assert MlflowClient(uri).get_run(state.runs["t0"]).data.tags["mlflow.runColor"] == "#1f77b4"


def test_every_name_of_the_tracking_package_resolves_to_what_its_module_defines():
    # The package imports its names on first use (a trial's process needs only .trial_reporters): each name of __all__
    # must reach its module's object, never a submodule of the same name (``preflight``: module and function).
    import importlib
    import types

    from dcl_core.study import tracking

    for name in tracking.__all__:
        value = getattr(tracking, name)
        assert not isinstance(value, types.ModuleType), name
    importlib.import_module("dcl_core.study.tracking.preflight")
    assert callable(tracking.preflight) and not isinstance(tracking.preflight, types.ModuleType)


def test_a_user_loss_trial_carries_its_source_file_and_hash(tmp_path, fake_trial):
    source = tmp_path / "my_losses.py"
    source.write_text("# my loss\n")
    name = f"{source}:MyLoss"
    uri = default_tracking_uri(tmp_path)
    tracker = StudyTracker(uri, "tau", tmp_path / "mlartifacts").open()
    sources = (LossSource(name, str(source), "ab" * 32, str(tmp_path), (("my_losses.py", "cd" * 32),)),)
    callback = MLflowTrialCallback(tracker, {"loss": "loss.name"}, loss_sources=sources)
    callback.on_trial_start(0, [], fake_trial("t0", {"loss.name": name}))
    callback.on_trial_start(0, [], fake_trial("t1", {"loss.name": "dcl"}))
    client = MlflowClient(uri)
    user, built_in = (client.get_run(callback.runs[t]) for t in ("t0", "t1"))
    assert user.data.tags["dcl.loss.source"] == str(source) and user.data.tags["dcl.loss.source_sha256"] == "ab" * 32
    assert user.data.tags["dcl.loss.source_files"] == "1"
    assert user.data.tags["mlflow.runColor"] == series_colour("MyLoss")  # its series: the class's name
    kept = client.download_artifacts(user.info.run_id, "loss_source/my_losses.py", str(tmp_path / "dl"))
    assert Path(kept).read_text() == "# my loss\n"
    assert "dcl.loss.source" not in built_in.data.tags and not client.list_artifacts(built_in.info.run_id)
