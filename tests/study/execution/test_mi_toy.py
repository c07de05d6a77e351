"""EqCo's toy MI experiment: the closed forms it relies on, the bounds' ceilings, and the smoke study."""

import math
import os
import sys
from pathlib import Path

import pyrun
import pytest
import torch
from mlflow.tracking import MlflowClient

from dcl_core.study.execution.mi_toy_runs import ToyConfig, critic_similarities, rho_for, run_toy, sample_pairs

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("mi", [2.0, 4.0, 10.0])
def test_rho_gives_the_requested_gaussian_mutual_information(mi):
    rho = rho_for(mi, 20)
    assert -(20 / 2) * math.log(1 - rho**2) == pytest.approx(mi)
    x, y = sample_pairs(20000, 20, rho, torch.Generator().manual_seed(0))
    corr = ((x - x.mean(0)) * (y - y.mean(0))).mean(0) / (x.std(0) * y.std(0))
    assert corr.mean().item() == pytest.approx(rho, abs=0.02)


def test_critic_similarities_layout():
    gx, hy = torch.randn(5, 3), torch.randn(5, 3)
    sims = critic_similarities(gx, hy)
    scores = gx @ hy.T
    assert torch.equal(sims.pos, scores.diagonal())
    assert sims.neg.shape == (5, 4)
    assert torch.equal(sims.neg[2], torch.cat([scores[2, :2], scores[2, 3:]]))


def test_bounds_learn_and_respect_their_ceilings():
    k, alpha = 32, 512.0
    nce = run_toy(ToyConfig(true_mi=6.0, k=k, method="infonce", steps=300, eval_repeats=20))
    eq = run_toy(ToyConfig(true_mi=6.0, k=k, method="eqco", alpha=alpha, steps=300, eval_repeats=20))
    assert 1.0 < nce["mi_estimate"] <= math.log(k) + 1e-6  # InfoNCE cannot exceed log K
    assert eq["mi_estimate"] <= math.log1p(alpha) + 1e-6
    assert eq["mi_estimate"] > nce["mi_estimate"]  # with MI 6 > log 32, EqCo's estimate is not capped at log K


@pytest.mark.slow  # runs the study script with real Ray
def test_smoke_study_logs_table_to_mlflow_and_prints_only_its_answer_with_q(tmp_path):
    proc = pyrun.run(
        [
            sys.executable,
            str(REPO / "studies" / "eqco_mi_toy.py"),
            "--smoke",
            "--output-dir",
            str(tmp_path),
            "--num-cpus",
            "2",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=os.environ.copy(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # -q prints the answer only, as a study's does: Ray's start-up lines and its advice to turn token authentication
    # off (Ray's when no mode was asked for), and the MLflow store's set-up lines, were on the console
    assert proc.stderr == ""
    assert "I_NCE" in proc.stdout and "I_EqCo" in proc.stdout and "(1.7)" in proc.stdout  # paper numbers beside
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("eqco_mi_toy")
    (run,) = client.search_runs([exp.experiment_id])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"mi_toy.parquet", "mi_toy.png", "table.txt"}
    assert len([k for k in run.data.metrics if not k.startswith("verdict/")]) == 2 * 2 * 2
    # The verdict (EqCo's claim: I_NCE − I_EqCo grows with K), printed last and logged as tag and metrics.
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("InfoNCE's MI bound grows with K, EqCo's does not (true MI 6): ")
    assert run.data.tags["verdict_0_line"] == last and run.data.tags["verdict_0"] in last
    # Table 5's slope at MI 6 over the K both grids share (64, 128): gaps −1.5, −0.9 → +0.6 per doubling
    assert run.data.metrics["verdict/gap_slope_0/paper"] == pytest.approx(0.6)
    assert "over K 64, 128" in last and "t-interval over 2 critic(s) per cell at true MI 6" in proc.stdout
    assert run.data.metrics["verdict/gap_slope_0/ci_lo"] <= run.data.metrics["verdict/gap_slope_0/estimate"]
    # Re-analysis from the stored rows (python -m dcl_core.study answer): the same table and verdict, same run.
    table = tmp_path / "summary" / "eqco_mi_toy" / "table.txt"
    before = table.read_text()
    again = pyrun.run([sys.executable, "-m", "dcl_core.study", "answer", str(tmp_path)], capture_output=True,
                           text=True, timeout=300, cwd=REPO, env=os.environ.copy())
    assert again.returncode == 0, again.stderr[-2000:]
    assert table.read_text() == before and again.stdout.strip() == before.strip()
    assert again.stdout.strip().splitlines()[-1] == last
    (rerun,) = client.search_runs([exp.experiment_id])
    assert rerun.info.run_id == run.info.run_id and rerun.data.tags["verdict_0_line"] == last


@pytest.mark.slow  # runs studies/eqco_mi_toy.py as a subprocess
def test_dry_run_lists_the_runs_and_an_estimate_without_starting_anything(tmp_path):
    out = tmp_path / "out"
    proc = pyrun.run(
        [sys.executable, str(REPO / "studies" / "eqco_mi_toy.py"), "--smoke", "--dry-run", "--output-dir", str(out)],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=os.environ.copy(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "12 runs" in proc.stdout and "2 seeds at true MI 6" in proc.stdout
    assert "K=64: 6 runs" in proc.stdout and "cost estimate" in proc.stdout
    assert not out.exists()  # no MLflow store, no summary folder
