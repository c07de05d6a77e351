"""Another library's loss through a study, as docs/own-loss.md shows it: lightly's DCLLoss beside this project's
`dcl` in the smoke temperature study, asked `--compare DCLLoss,dcl`, to a verdict; `answer` then re-asks the
recorded question without importing lightly."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pyrun
import pytest
from mlflow.tracking import MlflowClient

from dcl_core.data import resolve_data_root
from dcl_core.study import summary_dir
from dcl_core.study.analysis.tables import read_table

REPO = Path(__file__).resolve().parents[3]

pytestmark = [
    pytest.mark.slow,  # a smoke study (real Ray, MLflow) and `answer` in subprocesses
    pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(),
                       reason="embedded CIFAR-10 not present"),
    pytest.mark.skipif(importlib.util.find_spec("lightly") is None, reason="lightly comes with the bench extra"),
]


def run(cmd, env, timeout=600):
    proc = pyrun.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_lightly_s_dcl_runs_in_a_study_to_a_verdict_and_answer_reads_it_without_lightly(tmp_path, ray_head):
    out = tmp_path / "lightly"
    proc = run([sys.executable, "studies/temperature_sweep.py", "--smoke", "--losses", "dcl,lightly.loss:DCLLoss",
                "--compare", "DCLLoss,dcl", "--output-dir", str(out), "--address", ray_head.address], ray_head.env)
    summary = summary_dir(out, "temperature_sweep")
    rows = read_table(summary / "results.parquet")
    assert {r["series"] for r in rows} == {"DCLLoss", "dcl"} and all(r["status"] == "ok" for r in rows)
    assert {r["loss"] for r in rows} == {"dcl", "lightly.loss:DCLLoss"}
    (verdict,) = [line for line in proc.stdout.splitlines() if line.startswith("DCLLoss flatter across tau than dcl: ")]
    assert "(your claim, not the paper's)" in verdict
    table = (summary / "table.txt").read_text()
    assert verdict in table
    q_b = next(line for line in table.splitlines() if line.startswith("tau") and "q_B DCLLoss" in line)
    assert q_b  # the q_B column of a loss that reports none is there, its cells "-"
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name("temperature_sweep")
    trials = [r for r in client.search_runs([exp.experiment_id]) if r.data.params.get("loss.name")
              == "lightly.loss:DCLLoss"]
    assert len(trials) == 2 and all(r.data.tags.get("dcl.loss.source", "").endswith("lightly/loss/__init__.py")
                                    for r in trials)
    # answer re-reads the records: lightly made unimportable, the same verdict
    blocker = tmp_path / "blocker"
    (blocker / "lightly").mkdir(parents=True)
    (blocker / "lightly" / "__init__.py").write_text("raise ImportError('answer must not import lightly')\n")
    env = {**ray_head.env, "PYTHONPATH": os.pathsep.join(filter(None, [str(blocker), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "dcl_core.study", "answer", str(out), "-q"], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env={**os.environ, **env})  # PYTHONPATH: a new one
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (summary / "table.txt").read_text() == table
    assert json.loads((summary / "study_options.json").read_text())["command"]["compare"] == "DCLLoss,dcl"
