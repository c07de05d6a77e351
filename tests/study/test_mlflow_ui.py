"""The MLflow UI opens a study's experiment on its runs, checked in a real headless Chromium
(``.ci/check_mlflow_ui.py``; ``.ci/run`` installs Debian's chromium)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dcl_core.config import preset
from dcl_core.study import StudySpec
from dcl_core.study.results import summarize
from dcl_core.study.storage import default_tracking_uri
from dcl_core.study.tracking import StudyTracker
from search_spaces import Grid

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium (apt-get install chromium)")
def test_runs_url_opens_the_runs_table_not_the_genai_overview(tmp_path):
    spec = StudySpec(name="ui_study", base=preset("smoke"), grid={"loss.temperature": Grid((0.1,))},
                     x_key="loss.temperature", x_label="tau", description="Is the UI on the runs?")
    rows = [{"trial_id": f"{lo}", "status": "ok", "loss": lo, "temperature": 0.1, "seed": 0, "knn_top1": 30.0,
             "config": {}} for lo in ("infonce", "dcl")]
    tracker = StudyTracker(default_tracking_uri(tmp_path), "ui_study", tmp_path / "mlartifacts", {},
                           description=spec.description).open()
    outcome = summarize(spec, rows, tmp_path, tracker)
    assert outcome.runs_url.endswith("/runs?workflowType=machine_learning")
    proc = subprocess.run([sys.executable, str(REPO / ".ci" / "check_mlflow_ui.py"), str(tmp_path), "ui_study"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "title: 'Runs - Experiment" in proc.stdout
