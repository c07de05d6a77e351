"""The MLflow UI shows a study as docs/outputs.md says, clicked through in a real headless Chromium driven by
Playwright (``.ci/check_mlflow_ui.py``; ``.ci/run`` installs Debian's chromium, the ``test`` extra Playwright):
the printed ``runs:`` URL (its saved view: the verdict legible in the study's row, no click), the ``compare:``
URL's saved view (the verdict in the study's row, one colour per loss in its chart), the study's run page (its
verdict and plot), and the clicks from the experiment list."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dcl_core.config import preset
from dcl_core.study import StudySpec
from dcl_core.study.analysis.answer import Question
from dcl_core.study.analysis.measures import STD_DIFFERENCE
from dcl_core.study.execution.results import summarize
from dcl_core.study.plan.spec import trial_tags
from dcl_core.study.plan.storage import default_tracking_uri
from dcl_core.study.tracking import StudyTracker
from dcl_core.study.tracking.mlflow_view import compare_view, read_tag, runs_view, trial_look
from search_spaces import Grid

REPO = Path(__file__).resolve().parents[3]


def _study(tmp_path: Path):
    """A two-loss, two-τ, two-seed study's MLflow store as the runner writes it (tracker, the callback's trial
    tags with their cell and colour, saved view), with made-up accuracies instead of training."""
    spec = StudySpec(name="ui_study", base=preset("smoke"),
                     grid={"loss.name": Grid(("infonce", "dcl")), "seed": Grid((0, 1)),
                           "loss.temperature": Grid((0.1, 0.5))},
                     x_key="loss.temperature", x_label="tau", description="Is the UI on the runs?",
                     questions=(Question("DCL flatter across τ than InfoNCE", STD_DIFFERENCE, "dcl", "infonce",
                                         label="Δstd"),))
    tracker = StudyTracker(default_tracking_uri(tmp_path), "ui_study", tmp_path / "mlartifacts", {},
                           description=spec.description, experiment_tags=dict([compare_view(spec).tag()])).open()
    rows = []
    tag_keys = trial_tags(spec)
    for loss in ("infonce", "dcl"):
        for tau in (0.1, 0.5):
            for seed in (0, 1):
                knn = 30.0 + (loss == "dcl") - tau + seed / 10
                tags = {"loss": loss, "seed": str(seed), "temperature": str(tau)}
                tags |= trial_look(tags, tag_keys.cell, loss)  # as MLflowTrialCallback tags a trial's run
                run = tracker.trial_run(f"{loss}{tau}{seed}", f"{loss}_s{seed}_t{tau}", tags,
                                        {"loss.name": loss, "loss.temperature": tau, "seed": seed})
                tracker.log_metrics(run, {"eval/knn_top1": knn, "train/q_mean": 0.9 - tau / 10}, step=1)
                tracker.end_run(run)
                rows.append({"trial_id": run, "status": "ok", "loss": loss, "temperature": tau, "seed": seed,
                             "knn_top1": knn, "config": {}})
    return summarize(spec, rows, tmp_path, tracker)


@pytest.mark.slow  # an MLflow store with a study's runs: ~5 s
def test_the_saved_view_groups_by_the_tags_the_trials_carry(tmp_path):
    outcome = _study(tmp_path)
    runs = outcome.runs_url.removesuffix("&viewStateShareKey=dcl_runs")
    assert runs.endswith("/runs?workflowType=machine_learning") and runs != outcome.runs_url
    assert outcome.compare_url == runs + "&viewStateShareKey=dcl_compare&compareRunsMode=CHART"
    from mlflow.tracking import MlflowClient
    exp = MlflowClient(default_tracking_uri(tmp_path)).get_experiment_by_name("ui_study")
    assert read_tag(exp.tags["mlflow.sharedViewState.dcl_runs"]) == ("study: verdict and kNN", runs_view().state)
    name, state = read_tag(exp.tags["mlflow.sharedViewState.dcl_compare"])
    assert name == "cells: kNN by temperature × loss"  # the seed is what a cell averages over, not a group
    assert state["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "cell"}]
    # Its filter, as MLflow's search runs it, keeps the 8 trials and leaves out the summary run.
    client = MlflowClient(default_tracking_uri(tmp_path))
    kept = client.search_runs([exp.experiment_id], state["searchFilter"])
    assert all(r.data.tags.get("dcl.summary") != "true" for r in kept)
    (figure,) = [r for r in kept if r.data.tags.get("dcl.figure") == "true"]  # the study's figure, its own run
    kept = [r for r in kept if r is not figure]
    assert len(kept) == 8 and all("trial_id" in r.data.tags for r in kept)
    # The view's first chart is an image grid of the figure: the run holds it as an image (mlflow.log_image) of
    # that key, nested under the summary run.
    assert state["compareRunCharts"][0]["type"] == "IMAGE" and state["compareRunCharts"][0]["imageKeys"] == [
        "study_figure"]
    images = [a.path for a in client.list_artifacts(figure.info.run_id, "images")]
    assert any(p.startswith("images/study_figure+step+0+") and p.endswith(".png") for p in images), images
    assert figure.data.tags["mlflow.loggedImages"] == "True" and figure.info.status == "FINISHED"
    (summary,) = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("dcl.summary") == "true"]
    assert figure.data.tags["mlflow.parentRunId"] == summary.info.run_id
    # a second summary (a resumed or re-analysed study) replaces the figure's run: one figure, the latest
    _study(tmp_path)  # the same trials found again by their ids, summarized once more
    figures = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("dcl.figure") == "true"]
    assert len(figures) == 1 and figures[0].info.run_id != figure.info.run_id
    # the 4 cells it groups into, each of one loss's colour
    assert {r.data.tags["cell"]: r.data.tags["mlflow.runColor"] for r in kept} == {
        "dcl τ=0.1": "#1f77b4", "dcl τ=0.5": "#1f77b4", "infonce τ=0.1": "#ff7f0e", "infonce τ=0.5": "#ff7f0e"}
    charts = {(c["xaxis"]["key"], c["yaxis"]["key"]) for c in state["compareRunCharts"] if c["type"] == "SCATTER"}
    assert charts == {("loss.temperature", "eval/knn_top1"), ("train/q_mean", "eval/knn_top1")}


def test_a_new_run_of_the_study_rewrites_its_view(tmp_path):
    # docs/outputs.md says the view is rewritten by each run: a study whose grid changed must not keep the old grouping.
    from mlflow.tracking import MlflowClient
    _study(tmp_path)
    spec = StudySpec(name="ui_study", base=preset("smoke"),
                     grid={"loss.name": Grid(("infonce", "dcl")), "optim.batch_size": Grid((16, 32))},
                     x_key="optim.batch_size", x_label="batch")
    StudyTracker(default_tracking_uri(tmp_path), "ui_study", tmp_path / "mlartifacts", {},
                 experiment_tags=dict([compare_view(spec).tag()])).open()
    exp = MlflowClient(default_tracking_uri(tmp_path)).get_experiment_by_name("ui_study")
    name, state = read_tag(exp.tags["mlflow.sharedViewState.dcl_compare"])
    assert name == "cells: kNN by batch_size × loss"
    assert "mlflow.sharedViewState.dcl_runs" in exp.tags  # the runs view too, though the caller passed only one
    assert state["compareRunCharts"][1]["xaxis"] == {"key": "optim.batch_size", "type": "PARAM"}


# CI installs both, and there a missing one fails the test (the check exits 2) instead of skipping it.
@pytest.mark.slow  # an mlflow server and headless Chromium
@pytest.mark.skipif((shutil.which("chromium") is None or importlib.util.find_spec("playwright") is None)
                    and not os.environ.get("CI"),
                    reason="no chromium (apt-get install chromium) or no playwright (the test extra)")
@pytest.mark.core  # what a study prints, read in the browser, with the screenshots CI keeps: every change
def test_readme_clicks_in_a_real_browser(tmp_path):
    """Every step's screenshot is kept: under .ci/run in .ci-artifacts/mlflow_ui/ (``DCL_CI_ARTIFACTS``), for a
    person to read the views as a researcher sees them."""
    _study(tmp_path)
    shots = Path(os.environ["DCL_CI_ARTIFACTS"]) / "mlflow_ui" if os.environ.get("DCL_CI_ARTIFACTS") else (
        tmp_path / "shots")
    proc = subprocess.run([sys.executable, str(REPO / ".ci" / "check_mlflow_ui.py"), str(tmp_path), "ui_study",
                           "--screenshots", str(shots)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(ln.startswith("ok ") for ln in lines) == 18 and not any(ln.startswith("FAIL") for ln in lines)
    assert len(list(shots.glob("*.png"))) == 18
    # the answer's page: the verdict line and every cell's mean and interval whole in the window
    (answer,) = [ln for ln in lines if "legible at a glance" in ln]
    assert "the 1 verdict line(s) in full and the cells' table (2 rows" in answer, answer
    assert "one colour per loss" in proc.stdout and "the verdict" in proc.stdout  # the steps this test adds
    # the first steps: the printed runs: URL shows the study's verdict in its row, legibly, with no click
    assert lines[0].startswith("ok   1. runs: URL") and "its verdict ('Verdict: " in lines[0], lines[0]
    assert lines[1].startswith("ok   2. ... legible"), lines[1]
    assert lines[2].startswith("ok   3. ... and unfolding the study's row (+) lists its trials"), lines[2]
