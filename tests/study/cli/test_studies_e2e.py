"""End-to-end studies with real Ray, real Optuna and a real MLflow store, read back with MlflowClient.

Each study runs as its own process (as a user runs it), on the embedded CIFAR-10 at smoke scale.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pyrun
import pytest
import torch
from mlflow.tracking import MlflowClient

from dcl_core.config import CONFIG_KEYS
from dcl_core.data import resolve_data_root
from dcl_core.study import summary_dir
from dcl_core.study.analysis.answer import Question, build_answer
from dcl_core.study.analysis.columns import x_column
from dcl_core.study.analysis.measures import STD_DIFFERENCE
from dcl_core.study.analysis.sequential import GroupSequential
from dcl_core.study.analysis.tables import read_table
from dcl_core.study.execution import ray_session
from dcl_core.study.tracking.mlflow_runs import rounded
from dcl_core.study.tracking.mlflow_view import read_tag
from dcl_core.training.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[3]
STUDIES = REPO / "studies"

pytestmark = [
    pytest.mark.slow,  # every test runs study scripts (real Ray) or refuses many in subprocesses
    pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(),
                       reason="embedded CIFAR-10 not present"),
]


def study_cmd(script, out, *args, cpus=1, head=None):
    """A study's command line on ``cpus`` CPUs of a local Ray of its own, or attached to the suite's shared
    ``head`` (conftest.py's ``ray_head``, 1 CPU; run it with ``env=head.env``). One CPU, unless a test is about
    trials running side by side: a study on 2 CPUs starts a second trial process importing torch (a smoke study
    41 -> 29 CPU-seconds, the suite's cost)."""
    where = ["--address", head.address] if head is not None else ["--num-cpus", str(cpus)]
    return [sys.executable, str(STUDIES / script), "--output-dir", str(out), *where, *args]


def run(cmd, timeout=600, env=None, fork=True, cwd=REPO):
    """A python command, forked from tests/pyrun.py's fork server, or with ``fork=False`` a new interpreter (for what
    happens at an interpreter's start and exit)."""
    launch = pyrun.run if fork else subprocess.run
    proc = launch(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def runs_of(out, name):
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    exp = client.get_experiment_by_name(name)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    trials = [r for r in runs if "trial_id" in r.data.tags]  # not the summary's run, nor its figure's
    summary = [r for r in runs if r.data.tags.get("dcl.summary") == "true"]
    return client, trials, summary


def quick_start_commands():
    """The README's quick start: its `python studies/...` lines, in order, as written."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Quick start"):text.index("\n## ", text.index("## Quick start") + 1)]
    return [line.split("#")[0].split() for line in section.splitlines() if line.startswith("python studies/")]


@pytest.mark.core  # the README's quick start, as a user runs it: CI runs it on every change
def test_temperature_study_smoke_end_to_end(tmp_path):
    smoke, real = quick_start_commands()  # the toy, then the real study, run in one folder as the README says
    assert smoke == ["python", "studies/temperature_sweep.py", "--smoke"] and real == smoke[:2]
    out = tmp_path / "outputs" / "smoke"  # the smoke preset's own folder
    # a new interpreter, as a user starts it: its whole console, exit included (2 CPUs, checkpoints kept: what this
    # test also reads)
    proc = run([sys.executable, str(REPO / smoke[1]), *smoke[2:], "--save-checkpoints", "--num-cpus", "2"],
               fork=False, cwd=tmp_path)
    # A console that answers: a line per finished trial, no Tune tables, no traceback, the answer last.
    assert "[4/4] " in proc.stdout and "Trial status" not in proc.stdout and "Configuration for experiment" not in (
        proc.stdout) and "Traceback" not in proc.stderr
    assert len(proc.stdout.splitlines()) + len(proc.stderr.splitlines()) < 60
    # off a terminal: a first line before Ray starts, a status line as the first trial starts (no long silence)
    first, second = proc.stdout.splitlines()[:2]
    assert first == ("temperature_sweep: 4 trials; starting Ray, then a line per finished trial and a status line "
                     "every minute")
    assert second.startswith("temperature_sweep: 0 of 4 trials done, ")
    # The Table-18-shaped table, the plot and the experiment name are printed.
    assert "tau" in proc.stdout and "Std" in proc.stdout and "infonce" in proc.stdout and "dcl" in proc.stdout
    assert "temperature_sweep.png" in proc.stdout and "experiment 'temperature_sweep'" in proc.stdout

    rows = read_table(summary_dir(out, "temperature_sweep") / "results.parquet")
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    assert {(r["loss"], r["temperature"]) for r in rows} == {(lo, t) for lo in ("infonce", "dcl") for t in (0.1, 0.5)}
    # Tune's CSV and JSON logs of every trial, and no TensorBoard file (its logger would import torch in the driver)
    trial_dirs = [p.parent for p in (out / "ray_results" / "temperature_sweep").glob("*/params.json")]
    assert len(trial_dirs) == 4 and all((d / "result.json").stat().st_size and (d / "progress.csv").exists()
                                        for d in trial_dirs)
    assert list((out / "ray_results").rglob("events.out.tfevents*")) == []

    client, trials, summary = runs_of(out, "temperature_sweep")
    assert len(trials) == 4 and len(summary) == 1
    for r in trials:
        assert r.info.status == "FINISHED"
        assert set(CONFIG_KEYS) <= set(r.data.params)  # every config value, flattened dotted keys
        assert r.data.tags["study"] == "temperature_sweep" and r.data.tags["loss"] in ("infonce", "dcl")
        assert r.data.tags["seed"] == "0" and len(r.data.tags["git_commit"]) in (40, 7)
        assert r.data.tags["temperature"] in ("0.1", "0.5")  # the swept key, for the runs table to group by
        # the cell the saved view groups by, and the loss's colour (the plot's too)
        assert r.data.tags["cell"] == f"{r.data.tags['loss']} τ={r.data.tags['temperature']}"
        assert r.data.tags["mlflow.runColor"] == {"dcl": "#1f77b4", "infonce": "#ff7f0e"}[r.data.tags["loss"]]
        assert r.data.metrics["eval/knn_top1"] == float(f"{r.data.metrics['eval/knn_top1']:.6g}")  # no float32 noise
        assert r.data.tags["mlflow.note.content"].startswith(f"loss {r.data.tags['loss']}, seed 0, temperature ")
        assert r.data.tags["mlflow.parentRunId"] == summary[0].info.run_id  # nested under the study's run
        for metric in ("train/loss", "eval/knn_top1", "train/q_mean", "train/q_cv", "train/lr", "train/images_per_s"):
            assert metric in r.data.metrics, metric
        history = client.get_metric_history(r.info.run_id, "train/loss")
        assert [m.step for m in history] == [1]
        # Diagnostics: gradient norms (DCL Fig. 5) as metrics, the q_B distribution (Fig. 1) as artifacts.
        assert {"train/grad_norm_mean", "train/grad_norm_std", "train/grad_norm_cv"} <= set(r.data.metrics)
        npc = {a.path for a in client.list_artifacts(r.info.run_id, "npc")}
        assert npc == {"npc/q_hist_epoch0001.json", "npc/q_hist.png"}
        hist = json.loads(Path(client.download_artifacts(r.info.run_id, "npc/q_hist_epoch0001.json", str(tmp_path)))
                          .read_text())
        assert len(hist["fraction"]) == 40 and abs(sum(hist["fraction"]) - 1) < 1e-6
        # --save-checkpoints: the final checkpoint Tune kept, loadable by the standalone evaluator.
        ckpt = Path(client.download_artifacts(r.info.run_id, "checkpoint/checkpoint.pt", str(tmp_path / r.info.run_id)))
        assert load_checkpoint(ckpt)["epoch"] == 1
    arts = {a.path for a in client.list_artifacts(summary[0].info.run_id)}
    assert {"results.parquet", "results.csv", "temperature_sweep.png", "table.txt", "npc_q_hist.png"} <= arts
    assert "infonce/std" in summary[0].data.metrics and "dcl/std" in summary[0].data.metrics
    # The answer, last: one seed per cell gives no interval, so the verdict cannot be anything but unresolved.
    last = [ln for ln in proc.stdout.splitlines() if ln.strip() and "Checkpoint successfully" not in ln][-1]
    assert last.startswith("DCL flatter across τ than InfoNCE: not resolved — Δstd ") and "no interval" in last
    # Table 18's std difference over this study's τ (0.1, 0.5), its reported +0.46 beside it
    assert "(paper: +0.49 over tau 0.1, 0.5; it reports +0.46" in last
    assert summary[0].data.tags["verdict_0_line"] == last
    # the answer where MLflow's UI shows a run's description: the verdict, its line, the plot from the run's artifacts
    note = summary[0].data.tags["mlflow.note.content"].split("\n\n")
    estimate = last.split(" — Δstd ")[1].split(",")[0]  # as the verdict line rounds it
    assert note[:2] == [f"Verdict: not resolved, Δstd {estimate}", last]
    # the cells, each mean (one seed: no interval) in τ order, then the figure
    assert note[2].startswith("Per cell: kNN top-1 (%), mean [95% CI, t over seeds], 1 seed(s) per cell")
    assert [row.split()[0] for row in note[3].strip("`\n").splitlines()] == ["tau", "0.1", "0.5"]
    plot = f"get-artifact?path=temperature_sweep.png&run_uuid={summary[0].info.run_id}"
    assert note[4] == f"![temperature\\_sweep.png]({plot})"
    assert "Paper: DCL Table 18" in proc.stdout and "NPC regime: InfoNCE cells: mean q_B" in proc.stdout
    exp = client.get_experiment_by_name("temperature_sweep")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert exp.tags["mlflow.note.content"].startswith("Is DCL less sensitive to the temperature τ than InfoNCE?")
    runs = f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning"
    # The runs URL opens the runs view: MLflow's table with the study's row showing its verdict (Description).
    assert (f"answer:  http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs/{summary[0].info.run_id}"
            "?workflowType=machine_learning\n") in (
        proc.stdout)  # the summary run's page: the verdict in full, the cells' intervals, the figure
    assert f"runs:    {runs}&viewStateShareKey=dcl_runs\n" in proc.stdout
    assert read_tag(exp.tags["mlflow.sharedViewState.dcl_runs"])[0] == "study: verdict and kNN"
    # The saved view the compare URL opens: the trials grouped into the study's cells, kNN charted against τ.
    assert f"compare: {runs}&viewStateShareKey=dcl_compare&compareRunsMode=CHART" in proc.stdout
    # The README's next command, the real study, in the same folder: not refused by the smoke study's files (its dry
    # run says whether the command would be)
    planned = run([sys.executable, str(REPO / real[1]), *real[2:], "--dry-run"], cwd=tmp_path)
    assert "study output exists" not in planned.stdout and str(tmp_path / "outputs") in planned.stdout
    name, state = read_tag(exp.tags["mlflow.sharedViewState.dcl_compare"])
    assert name == "cells: kNN by temperature × loss" and state["runsHiddenMode"] == "SHOW_ALL"
    assert [g["groupByData"] for g in state["groupBy"]["groupByKeys"]] == ["cell"]
    assert all("cell" in t.data.tags for t in trials)  # the tag it groups by exists on every trial
    assert_reanalysis_reproduces(out, "temperature_sweep", proc, script="temperature_sweep.py", args=("--smoke",))
    assert_export_of_the_best_trial(out, rows, client, tmp_path)


def assert_export_of_the_best_trial(out, rows, client, tmp_path):
    """``python -m dcl_core.study export OUT --best --mlflow``: the finished trial with the highest kNN, its encoder
    exactly the backbone of the checkpoint the study kept (``--save-checkpoints``), logged into its MLflow run."""
    target = tmp_path / "best" / "backbone.pt"
    proc = run([sys.executable, "-m", "dcl_core.study", "export", str(out), "--best", "-o", str(target), "--mlflow"],
               timeout=300)
    name = re.search(r": trial (\S+) of temperature_sweep: ", proc.stdout)
    assert name is not None, proc.stdout + proc.stderr
    best = max(sorted(rows, key=lambda r: r["trial_id"]), key=lambda r: r["knn_top1"])
    assert name[1].endswith("_" + best["trial_id"])
    (run_,) = [r for r in client.search_runs([client.get_experiment_by_name("temperature_sweep").experiment_id])
               if r.data.tags.get("trial_id") == best["trial_id"]]
    assert run_.info.run_name == name[1]  # the name the study printed and MLflow shows
    assert {a.path for a in client.list_artifacts(run_.info.run_id, "backbone")} == {
        "backbone/backbone.pt", "backbone/backbone.json"}
    assert_export_is_the_backbone(target, client.download_artifacts(run_.info.run_id, "checkpoint/checkpoint.pt",
                                                                    str(tmp_path / "kept")))
    assert json.loads(target.with_suffix(".json").read_text())["knn_top1"] == pytest.approx(best["knn_top1"])


def assert_reanalysis_reproduces(out, name, proc, script, args):
    """``python -m dcl_core.study answer OUT`` (and the script's ``--reanalyze``) recompute the finished study's
    answer from its stored rows without training: the same printout from "results:" on, the same table.txt
    byte for byte, the same verdict tags, on the same (one) MLflow summary run and the same trials."""
    table = summary_dir(out, name) / "table.txt"
    before = table.read_bytes()
    _, trials_before, (summary_before,) = runs_of(out, name)
    printed = proc.stdout[proc.stdout.index("results: "):]
    again = run([sys.executable, "-m", "dcl_core.study", "answer", str(out)], timeout=300)
    assert again.stdout == printed and table.read_bytes() == before
    assert "Traceback" not in again.stderr
    _, trials, (summary,) = runs_of(out, name)
    assert summary.info.run_id == summary_before.info.run_id and summary.info.status == "FINISHED"
    assert sorted(t.info.run_id for t in trials) == sorted(t.info.run_id for t in trials_before)
    verdicts = {k: v for k, v in summary.data.tags.items() if k.startswith("verdict")}
    assert verdicts == {k: v for k, v in summary_before.data.tags.items() if k.startswith("verdict")}
    lines = [v for k, v in sorted(verdicts.items()) if k.endswith("_line")]
    assert lines and printed.strip().splitlines()[-len(lines):] == lines
    # the script's own flag, with the options it ran with: the same again
    flag = run(study_cmd(script, out, *args, "--reanalyze"), timeout=300)
    assert flag.stdout == printed and table.read_bytes() == before
    # another question of the same rows: printed, written nowhere; the study keeps answering the one it recorded
    other = run(study_cmd(script, out, *args, "--reanalyze", "--compare", "infonce,dcl"), timeout=300)
    assert "infonce" in other.stdout.split("Verdict (")[1] and "asked of its stored results and written nowhere" in (
        other.stdout)
    assert table.read_bytes() == before
    _, _, (summary,) = runs_of(out, name)
    assert {k: v for k, v in summary.data.tags.items() if k.startswith("verdict")} == verdicts
    again = run([sys.executable, "-m", "dcl_core.study", "answer", str(out)], timeout=300)
    assert again.stdout == printed


def assert_export_is_the_backbone(exported_file, checkpoint):
    """The exported weights are exactly the backbone's in ``checkpoint`` (the trial's own)."""
    kept = load_checkpoint(checkpoint)["model"]
    exported = torch.load(exported_file, weights_only=True)
    backbone = {k.removeprefix("backbone."): v for k, v in kept.items() if k.startswith("backbone.")}
    assert exported.keys() == backbone.keys() and all(torch.equal(exported[k], backbone[k]) for k in backbone)


def test_batch_study_with_optuna_search(tmp_path, ray_head):
    out = tmp_path / "b"
    proc = run(study_cmd("batch_size_sweep.py", out, "--smoke", "--search", "optuna", "--num-samples", "2",
                         head=ray_head), env=ray_head.env)
    assert "\ndcl−infonce " in proc.stdout  # Table 1's gap row, named by its pair
    rows = read_table(summary_dir(out, "batch_size_sweep") / "results.parquet")
    # one Optuna search (2 samples) per (loss, batch size); tau and lr sampled inside the space's bounds
    assert len(rows) == 8 and sorted({r["batch_size"] for r in rows}) == [16, 32]
    assert all(0.05 <= r["temperature"] <= 1.0 and 0.003 <= r["base_lr"] <= 0.3 for r in rows)
    _, trials, summary = runs_of(out, "batch_size_sweep")
    assert len(trials) == 8 and len(summary) == 1
    gaps = {k for k in summary[0].data.metrics if k.startswith("gap_dcl_minus_infonce/")}
    assert gaps == {"gap_dcl_minus_infonce/batch_size_16", "gap_dcl_minus_infonce/batch_size_32"}
    # Each search persists as an Optuna study that Optuna itself reads back (optuna-dashboard shows the same DB).
    storage = f"sqlite:///{out / 'optuna.db'}"
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(storage))
    assert names == sorted(f"batch_size_sweep+{lo}-{b}" for lo in ("infonce", "dcl") for b in (16, 32))
    study = optuna.load_study(study_name="batch_size_sweep+dcl-16", storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 2 and {"loss.temperature", "optim.base_lr"} <= set(done[0].params)
    ours = sorted(r["knn_top1"] for r in rows if r["loss"] == "dcl" and r["batch_size"] == 16)
    assert sorted(t.value for t in done) == pytest.approx(ours)
    # a search's table lists each cell's tuned trial with its sampled τ and lr: re-analysed from the stored rows
    assert_reanalysis_reproduces(out, "batch_size_sweep", proc, script="batch_size_sweep.py",
                                 args=("--smoke", "--search", "optuna", "--num-samples", "2"))


def test_bad_input_exits_2_before_ray_starts(tmp_path):
    (tmp_path / "empty").mkdir()
    cases = [
        (["--set", "loss.temperature=0"], "loss.temperature must be > 0"),
        (["--losses", "simclr"], "loss.name must be one of"),
        (["--seeds", "0"], "--seeds must be in [1, 1000]"),
        (["--data-root", str(tmp_path / "missing")], "missing"),
        (["--data-root", str(tmp_path / "empty")], "CIFAR-10 not found"),  # exists, but holds no dataset
        (["--set", "optim.batch_size=1"], "batch_size must be >= 2"),
        (["--set", "loss.alpha=256"], "loss.alpha is EqCo's and has no effect"),
        (["--effect-of-interest", "gap_slope=1"], "not a question of study temperature_sweep (its questions: "
                                                  "std_difference_0)"),
        (["--effect-of-interest", "std_difference=0"], "must be a finite, non-zero number"),
        (["--effect-of-interest", "std_difference"], "takes KEY=VALUE"),
    ]

    if not torch.cuda.is_available():  # a local Ray without GPUs would leave every trial pending forever
        cases.append((["--gpus-per-worker", "1"], "--gpus-per-worker 1 needs GPUs"))
    for args, needle in cases:
        t0 = time.monotonic()
        proc = pyrun.run(
            study_cmd("temperature_sweep.py", tmp_path / "x", "--smoke", *args),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert proc.returncode == 2, (args, proc.stderr[-2000:])
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and needle in errors[0], proc.stderr
        others = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("error:"))
        assert "Traceback" not in proc.stderr and "ray" not in others.lower().replace("array", "")  # Ray never ran
        assert time.monotonic() - t0 < 60
    assert not (tmp_path / "x" / "ray_results").exists()


def _epochs(result_file):
    """The epochs a trial reported, from Tune's own per-trial log in the study's storage."""
    if not result_file.exists():
        return []
    return [json.loads(line)["epoch"] for line in result_file.read_text().splitlines() if line.strip()]


def test_resume_after_killed_driver(tmp_path):
    out = tmp_path / "r"
    epochs = 12
    cmd = study_cmd(
        "temperature_sweep.py",
        out,
        "--smoke",
        "--losses",
        "dcl",
        "--max-concurrent",
        "1",
        "--set",
        f"optim.epochs={epochs}",
    )
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    exp = out / "ray_results" / "temperature_sweep"
    deadline = time.monotonic() + 600  # a loaded CI machine took over 300 s to reach the state killed below
    finished, partial = None, None
    try:
        while time.monotonic() < deadline:
            trials = {d.name: _epochs(d / "result.json") for d in exp.glob("dcl_*")} if exp.exists() else {}
            done = [n for n, e in trials.items() if e and e[-1] == epochs]
            running = [n for n, e in trials.items() if e and 2 <= e[-1] < epochs - 3]
            if done and running:
                finished, partial = done[0], running[0]
                break
            time.sleep(0.2)
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # kill -9 the driver, as the OOM killer would
        proc.wait()
    assert finished and partial, "never saw one finished and one running trial"
    before_finished = (exp / finished / "result.json").read_text()
    killed_at = _epochs(exp / partial / "result.json")[-1]
    _, trials_before, (parent,) = runs_of(out, "temperature_sweep")
    parent_before = parent.info.run_id
    assert parent.info.status == "RUNNING" and len(trials_before) == 2
    # What the dead driver left of its own Ray (its raylet's agents and workers): the next start ends it.
    session = json.loads((out / ".temperature_sweep.ray_session").read_text())["session_dir"]
    time.sleep(2)
    agents = [p for p in ray_session._processes_of(session)  # these run on for minutes; the rest are exiting
              if Path(f"/proc/{p}/comm").read_text().startswith(("ray::Dashboard", "ray::RuntimeEnv"))]

    assert agents, "the dead driver's Ray left no agents: the case below is not tested"
    try:
        resumed = run([*cmd, "--resume"])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever else of the dead driver's session group is left
    assert re.search(r"ended \d+ process\(es\) of this study's earlier Ray", resumed.stderr), resumed.stderr[-3000:]
    assert ray_session._processes_of(session) == []
    # The console counts the restored trial: the interrupted one finishes as the second of two, and Ray's
    # "Failed to fetch metrics" from the dead session's agents is not shown.
    assert re.search(r"^\[2/2\] ", resumed.stdout, re.M) and "[3/2]" not in resumed.stdout, resumed.stdout[-3000:]
    assert "Failed to fetch metrics" not in resumed.stdout + resumed.stderr
    # The finished trial was not rerun; the interrupted one continued from its checkpoint (no restart at 1).
    assert (exp / finished / "result.json").read_text() == before_finished
    resumed = _epochs(exp / partial / "result.json")
    assert resumed.count(1) == 1 and resumed[-1] == epochs and max(resumed.count(e) for e in resumed) <= 2
    assert killed_at < epochs
    rows = read_table(summary_dir(out, "temperature_sweep") / "results.parquet")
    assert len(rows) == 2 and all(r["status"] == "ok" and r["epochs"] == epochs for r in rows)
    client, trials, summary = runs_of(out, "temperature_sweep")
    assert len(trials) == 2  # one MLflow run per trial, even across the resume
    # ... nested under the study's one parent run, which the resume reused (and which holds the summary).
    assert len(summary) == 1 and summary[0].info.run_id == parent_before and summary[0].info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in trials} == {parent_before}
    for r in trials:
        steps = [m.step for m in client.get_metric_history(r.info.run_id, "train/loss")]
        assert sorted(steps) == list(range(1, epochs + 1))  # each epoch once, even one retrained after the kill


def test_crashed_trial_is_retried_from_its_checkpoint(tmp_path):
    out = tmp_path / "c"
    run(
        study_cmd("temperature_sweep.py", out, "--smoke", "--losses", "dcl", "--set", "optim.epochs=3"),
        env={"DCL_CRASH_ONCE_AT_EPOCH": "2"},
    )
    rows = read_table(summary_dir(out, "temperature_sweep") / "results.parquet")
    assert len(rows) == 2 and all(r["status"] == "ok" and r["epochs"] == 3 for r in rows)
    for d in (out / "ray_results" / "temperature_sweep").glob("dcl_*"):
        assert (d / ".crashed_once").exists()
        assert _epochs(d / "result.json") == [1, 2, 3]  # resumed after epoch 2, not restarted
    _, trials, _ = runs_of(out, "temperature_sweep")
    assert len(trials) == 2


def test_nan_trial_is_reported_as_diverged_and_the_study_completes(tmp_path):
    out = tmp_path / "n"
    # A grid over the learning rate where the huge one diverges.
    from dcl_core.config import apply_overrides, preset
    from dcl_core.study import StudyOptions, StudySpec, prepare, run_study
    from search_spaces import Grid

    base = apply_overrides(preset("smoke"), {"optim.epochs": 2, "data.train_per_class": 8, "data.test_per_class": 4})
    spec = StudySpec(
        name="nan_study", base=base, grid={"optim.base_lr": Grid((0.03, 1e30))}, x_key="optim.base_lr", x_label="lr"
    )
    try:
        outcome = run_study(prepare(spec, StudyOptions(out, num_cpus=1)))
    finally:
        import ray

        ray.shutdown()
    by_lr = {r["base_lr"]: r for r in outcome.rows}
    assert by_lr[0.03]["status"] == "ok" and by_lr[1e30]["status"] == "diverged"
    assert "failed" in outcome.table
    _, trials, summary = runs_of(out, "nan_study")
    statuses = sorted(r.info.status for r in trials)
    assert statuses == ["FAILED", "FINISHED"] and len(summary) == 1
    (bad,) = [r for r in trials if r.info.status == "FAILED"]
    assert bad.data.tags["diverged"].startswith("epoch ") and "diverged" not in bad.data.metrics  # a tag, not a curve

    # --overwrite: the new study's runs replace the old ones in MLflow (soft-deleted, not mixed in).
    try:
        run_study(prepare(spec, StudyOptions(out, num_cpus=1, overwrite=True)))
    finally:
        import ray

        ray.shutdown()
    _, trials_again, summary_again = runs_of(out, "nan_study")
    assert len(trials_again) == 2 and len(summary_again) == 1
    assert not {r.info.run_id for r in trials_again} & {r.info.run_id for r in trials}


@contextlib.contextmanager
def another_ray(tmp_path):
    """Another local Ray instance on this machine while the block runs (someone else's, or a notebook's)."""
    code = ("import time, ray\nray.init(address='local', num_cpus=1, include_dashboard=False)\n"
            "print('up', flush=True)\ntime.sleep(3600)\n")
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                             start_new_session=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "up"
        yield
    finally:
        os.killpg(other.pid, signal.SIGTERM)  # its raylet and GCS are in its session
        other.wait(timeout=60)


def test_two_worker_ddp_trainable_on_cpu(tmp_path):
    """A 2-worker Ray Train run of each trial, training a user's own loss (tests/losses/planted_losses.py, given
    by a path relative to the study's working folder) with its keyword arguments, its negatives gathered over the
    ranks. Its module notes every import in a file: the study imports it, `answer`, `sync` and `export`, which read
    its name from the study's records, never do. Another Ray instance runs on the machine meanwhile: the console
    shows the study's lines only (no traceback of Ray Train's placement-group cleaner asking "which Ray?", no line
    of a Ray Train controller or worker)."""
    out = tmp_path / "d"
    module, imports = tmp_path / "user" / "planted_losses.py", tmp_path / "user" / "imports.log"
    module.parent.mkdir()
    note = f"\nimport os\nwith open({str(imports)!r}, 'a') as log:\n    log.write(f'{{os.getpid()}}\\n')\n"
    module.write_text((REPO / "tests" / "losses" / "planted_losses.py").read_text() + note)
    user_loss = os.path.relpath(module, REPO) + ":PositiveWeighted"  # relative to the study's folder, REPO
    with another_ray(tmp_path):
        proc = run(
            study_cmd(
                "temperature_sweep.py",
                out,
                "--smoke",
                "--losses",
                user_loss,
                "--set",
                'loss.params={"positive_weight": 0.5}',
                "--workers",
                "2",
                "--cpus-per-worker",
                "0.9",  # no --max-concurrent: DDP trials are capped to what the 2 CPUs hold (one at a time)
                "--save-checkpoints",
                cpus=2,
            ),
            timeout=600,
        )
    console = proc.stdout + proc.stderr
    assert "Traceback" not in console and "Found multiple active Ray instances" not in console, console[-4000:]
    assert not re.search(r"\((TrainController|RayTrainWorker|PlacementGroupCleaner) pid=", console), console[-4000:]
    rows = read_table(summary_dir(out, "temperature_sweep") / "results.parquet")
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)
    assert {r["series"] for r in rows} == {"PositiveWeighted"}
    assert {r["loss"] for r in rows} == {f"{module}:PositiveWeighted"}
    assert imports.read_text().count("\n") >= 2  # the study's driver and its trials
    imports.unlink()
    client, trials, _ = runs_of(out, "temperature_sweep")
    assert len(trials) == 2 and all("eval/knn_top1" in r.data.metrics for r in trials)
    assert all(r.data.params["loss.params"] == '{"positive_weight": 0.5}' for r in trials)
    assert all(r.info.run_name.startswith("PositiveWeighted_") for r in trials)
    assert all(r.data.tags["dcl.loss.source"] == str(module.resolve()) for r in trials)
    assert all(len(r.data.tags["dcl.loss.source_sha256"]) == 64 for r in trials)
    kept = {}
    for r in trials:  # the Ray Train run's final checkpoint, logged from the study's storage
        ckpt = Path(client.download_artifacts(r.info.run_id, "checkpoint/checkpoint.pt", str(tmp_path / r.info.run_id)))
        assert load_checkpoint(ckpt)["epoch"] == 1  # the smoke preset's last
        kept[r.info.run_name] = ckpt
    # the export finds a DDP trial's checkpoint in its Ray Train run (the trial's own folder holds none)
    target = tmp_path / "ddp" / "backbone.pt"
    run([sys.executable, "-m", "dcl_core.study", "export", str(out), "--trial", trials[0].info.run_name, "-o",
         str(target)], timeout=300)
    assert_export_is_the_backbone(target, kept[trials[0].info.run_name])
    run([sys.executable, "-m", "dcl_core.study", "answer", str(out)], timeout=300)
    pyrun.run([sys.executable, "-m", "dcl_core.study", "sync", str(out)], capture_output=True, text=True,
              timeout=300, cwd=REPO)
    assert not imports.exists()  # no command that reads the study's records imported the user's module


def test_a_sweep_of_any_key_asks_your_claim_of_your_loss_until_resolved(tmp_path, ray_head):
    """studies/sweep.py over a key no results column shows (weight decay) with the docs' example loss against
    DCL, asking a gap at one value with --until-resolved: the rows carry the swept values, every look's verdict
    speaks of the claim (no paper), the summary run's tags say the same, and `answer` re-asks it to the letter."""
    out = tmp_path / "s"
    mine = "docs/examples/my_losses.py:PositiveWeighted"
    proc = run(study_cmd("sweep.py", out, "--smoke", "--key", "optim.weight_decay", "--values", "0,0.001",
                         "--losses", f"{mine},dcl", "--statistic", "gap_at", "--at", "0.001",
                         "--effect-of-interest", "gap_at=40", "--seeds", "2", "--until-resolved", "--max-seeds", "3",
                         head=ray_head), env=ray_head.env)
    assert "look 1 of 2: 2 seeds per cell" in proc.stdout, proc.stdout[-3000:]
    summary = summary_dir(out, "sweep")
    rows = read_table(summary / "results.parquet")
    assert {r["swept"] for r in rows} == {0.0, 0.001} and {r["series"] for r in rows} == {"PositiveWeighted", "dcl"}
    assert len(rows) in (8, 12) and all(r["status"] == "ok" for r in rows)
    table = (summary / "table.txt").read_text()
    (line,) = [x for x in table.splitlines() if x.startswith("PositiveWeighted beats dcl at weight_decay 0.001: ")]
    said = line.split(": ", 1)[1].split(" — ")[0]
    assert said in ("supports the claim", "contradicts the claim", "rules out an effect of +40.00", "not resolved")
    assert "(your claim, not the paper's; effect of interest +40.00 (--effect-of-interest))" in line
    assert "the paper" not in line.split(" — ")[0]
    _, _, (parent, *_) = runs_of(out, "sweep")
    assert parent.data.tags["verdict_0"] == said and parent.data.tags["verdict_0_line"] == line
    record = json.loads((summary / "study_options.json").read_text())["command"]
    assert (record["key"], record["statistic"], record["at"]) == ("optim.weight_decay", "gap_at", "0.001")
    run([sys.executable, "-m", "dcl_core.study", "answer", str(out), "-q"], timeout=300)
    assert (summary / "table.txt").read_text() == table


def test_the_batch_study_asks_its_two_questions_of_your_loss_against_dcl(tmp_path, ray_head):
    """docs/own-loss.md's batch command (--compare with the example loss): the batch study's two statistics asked of
    PositiveWeighted against DCL, in the claim's words the page shows, with no paper's value beside them, and the
    summary run's tags saying the same."""
    out = tmp_path / "b"
    proc = run(study_cmd("batch_size_sweep.py", out, "--smoke", "--losses",
                         "docs/examples/my_losses.py:PositiveWeighted,dcl", "--compare", "PositiveWeighted,dcl",
                         head=ray_head), env=ray_head.env)
    rows = read_table(summary_dir(out, "batch_size_sweep") / "results.parquet")
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    table = (summary_dir(out, "batch_size_sweep") / "table.txt").read_text()
    words = ("supports the claim", "contradicts the claim", "not resolved")
    claims = ("PositiveWeighted beats dcl at the smallest batch", "PositiveWeighted's gain over dcl shrinks as batch "
              "grows")
    lines = [line for line in table.splitlines() if line.startswith(claims)]
    assert len(lines) == 2 and all(line.split(": ", 1)[1].split(" — ")[0] in words for line in lines), table[-3000:]
    assert all(line in proc.stdout and "(your claim, not the paper's" in line for line in lines)
    _, _, (parent, *_) = runs_of(out, "batch_size_sweep")
    assert sorted(parent.data.tags[f"verdict_{i}_line"] for i in (0, 1)) == sorted(lines)


def test_a_loss_module_only_the_driver_has_travels_to_the_cluster_with_the_study(tmp_path, ray_head):
    """A study attached to a cluster (the suite's head, as --address) with a loss named by module, which only the
    driver's PYTHONPATH holds: Ray's py_modules ships it, and the trials import the shipped copy (its file lies in
    Ray's runtime resources, as it would on another node), not the driver's."""
    user = tmp_path / "user"
    user.mkdir()
    log = tmp_path / "imported_from.log"
    (user / "shipped_losses.py").write_text((REPO / "docs" / "examples" / "my_losses.py").read_text() + (
        f"\nwith open({str(log)!r}, 'a') as _log:\n    _log.write(__file__ + '\\n')\n"))
    env = {**ray_head.env, "PYTHONPATH": os.pathsep.join(p for p in (str(user), ray_head.env.get("PYTHONPATH"))
                                                          if p)}
    out = tmp_path / "c"
    run(study_cmd("temperature_sweep.py", out, "--smoke", "--losses", "shipped_losses:PositiveWeighted,dcl",
                  head=ray_head), env=env, fork=False)  # a new interpreter: PYTHONPATH is read at its start
    rows = read_table(summary_dir(out, "temperature_sweep") / "results.parquet")
    assert {r["series"] for r in rows} == {"PositiveWeighted", "dcl"} and all(r["status"] == "ok" for r in rows)
    files = set(log.read_text().split())
    trials = {f for f in files if f != str(user / "shipped_losses.py")}
    assert str(user / "shipped_losses.py") in files  # the driver's own pre-flight check
    assert trials and all("runtime_resources" in f and f.endswith("shipped_losses.py") for f in trials), files


def test_uri_storage_and_resume_of_a_study_whose_later_experiment_never_started(tmp_path):
    """Ray storage given as a URI (as s3://... on a cluster; file:// here) and a two-experiment study (SimCLR's
    and SiMo's K live in different keys) killed before its second experiment began: --resume keeps the first
    experiment's finished trial and starts the second afresh."""
    import pyarrow.fs

    from dcl_core.config import ConfigError, apply_overrides, preset
    from dcl_core.study import StudyOptions, StudySpec, prepare, run_study, storage_join
    from search_spaces import Grid

    base = apply_overrides(preset("smoke"), {"optim.epochs": 1, "data.train_per_class": 8, "data.test_per_class": 4,
                                             "loss.name": "eqco", "optim.batch_size": 16})
    spec = StudySpec(name="two_part", base=base, x_key="num_negatives", x_label="K", series=("framework", "method"),
                     grid=[{"framework.name": "simclr", "loss.num_negatives": Grid((8,))},
                           {"framework.name": "simo", "framework.num_negatives": Grid((8,))}])
    storage = (tmp_path / "ray").as_uri()  # file:///...: resolved by pyarrow exactly like s3:// or gs://
    out = tmp_path / "out"
    try:
        first = run_study(prepare(spec, StudyOptions(out, storage=storage, num_cpus=1)))
        ids = {r["framework"]: r["trial_id"] for r in first.rows}
        experiments = sorted(p.name for p in (tmp_path / "ray").iterdir())
        assert experiments == ["two_part+simclr", "two_part+simo"]  # at the URI's path, not in a folder "file:"
        with pytest.raises(ConfigError, match="study output exists at file://"):
            run_study(prepare(spec, StudyOptions(out, storage=storage, num_cpus=1)))
        # As if the driver had died before the SiMo experiment started.
        fs, path = pyarrow.fs.FileSystem.from_uri(storage_join(storage, "two_part+simo"))
        fs.delete_dir(path)
        resumed = run_study(prepare(spec, StudyOptions(out, storage=storage, num_cpus=1, resume=True)))
    finally:
        import ray

        ray.shutdown()
    again = {r["framework"]: r["trial_id"] for r in resumed.rows}
    assert all(r["status"] == "ok" for r in resumed.rows) and set(again) == {"simclr", "simo"}
    assert again["simclr"] == ids["simclr"] and again["simo"] != ids["simo"]  # kept, and started afresh
    _, _, summary = runs_of(out, "two_part")
    assert len(summary) == 1  # the resumed study's summary replaced the first one


def test_more_seeds_on_resume_run_only_the_new_seeds(tmp_path, ray_head):
    """``--seeds 3 --resume`` on a finished 2-seed study: the 2 finished seeds' trials stay as they are (no rerun,
    one MLflow run each), only seed 2's run, in their own Tune experiment, and the answer counts all 3 seeds.
    The study is a researcher's copy of temperature_sweep.py with its own τ grid (outside studies/): `answer`
    re-analyses it with the copy once named (--script), never with the checkout's script of the same name."""
    out = tmp_path / "t"
    mine = tmp_path / "mine" / "my_sweep.py"
    mine.parent.mkdir()
    original = (STUDIES / "temperature_sweep.py").read_text()
    assert original.count("axis=(0.1, 0.5)") == 1
    mine.write_text(original.replace("axis=(0.1, 0.5)", "axis=(0.2, 1.0)"))
    run(study_cmd(mine, out, "--smoke", "--seeds", "2", "-q", head=ray_head), env=ray_head.env)
    first = out / "ray_results" / "temperature_sweep"
    before = {p: p.read_bytes() for p in first.glob("*/result.json")}
    assert len(before) == 8  # 2 losses x 2 τ x 2 seeds
    _, trials, _ = runs_of(out, "temperature_sweep")
    first_runs = {r.info.run_id for r in trials}

    proc = run(study_cmd(mine, out, "--smoke", "--seeds", "3", "--resume", head=ray_head),
               env=ray_head.env)
    assert "adding seeds 2 to every cell (2 finished seeds kept)" in proc.stdout + proc.stderr
    assert {p: p.read_bytes() for p in first.glob("*/result.json")} == before  # nothing of the first 8 reran
    added = [json.loads(p.read_text().splitlines()[-1])["config"]["seed"]
             for p in (out / "ray_results" / "temperature_sweep+s2-2").glob("*/result.json")]
    assert sorted(added) == [2, 2, 2, 2]
    _, trials, summary = runs_of(out, "temperature_sweep")
    assert len(trials) == 12 and first_runs < {r.info.run_id for r in trials} and len(summary) == 1
    assert sorted((r.data.params["loss.name"], r.data.params["loss.temperature"], r.data.params["seed"])
                  for r in trials) == sorted({(r.data.params["loss.name"], r.data.params["loss.temperature"],
                                               r.data.params["seed"]) for r in trials})  # one run per trial
    rows = read_table(summary_dir(out, "temperature_sweep") / "results.parquet")
    assert len(rows) == 12 and {r["seed"] for r in rows} == {0, 1, 2} and all(r["status"] == "ok" for r in rows)
    assert "3 seed(s) per cell" in (summary_dir(out, "temperature_sweep") / "table.txt").read_text()

    # A plain --resume (no --seeds) continues with the 3 seeds it has; fewer seeds are refused in one line.
    again = run(study_cmd(mine, out, "--smoke", "--resume", "-q", head=ray_head), env=ray_head.env)
    assert "adding seeds" not in again.stdout + again.stderr
    assert len(runs_of(out, "temperature_sweep")[1]) == 12
    fewer = pyrun.run(study_cmd(mine, out, "--smoke", "--seeds", "2", "--resume", head=ray_head),
                           capture_output=True, text=True, timeout=300, cwd=REPO, env=ray_head.env)
    assert fewer.returncode == 2 and "can add seeds, not drop them" in fewer.stderr, fewer.stderr[-2000:]
    other = pyrun.run(study_cmd(mine, out, "--smoke", "--seeds", "4", "--resume",
                                "--losses", "dcl", head=ray_head),
                      capture_output=True, text=True, timeout=300, cwd=REPO, env=ray_head.env)
    assert other.returncode == 2 and "its grids changed" in other.stderr, other.stderr[-2000:]

    table = (summary_dir(out, "temperature_sweep") / "table.txt").read_text()
    assert {r["temperature"] for r in rows} == {0.2, 1.0}  # the copy's grid
    unasked = pyrun.run([sys.executable, "-m", "dcl_core.study", "answer", str(out), "-q"], capture_output=True,
                        text=True, timeout=300, cwd=REPO)
    assert unasked.returncode == 2 and unasked.stderr.count("\n") == 1, unasked.stderr[-2000:]
    assert f"made by {mine}, not one of" in unasked.stderr and f"--script {mine}`" in unasked.stderr
    run([sys.executable, "-m", "dcl_core.study", "answer", str(out), "-q", "--script", str(mine)], timeout=300)
    assert (summary_dir(out, "temperature_sweep") / "table.txt").read_text() == table


def test_until_resolved_adds_seeds_in_rounds_under_its_recorded_design(tmp_path, ray_head):
    """``--until-resolved --max-seeds 3`` from 2 seeds: a look after each round, each verdict at the sequential
    design's level (what the summary run logs is the design's interval, not the fixed one), the design recorded so
    that a re-analysis reproduces the answer and a later --resume cannot look past it; a time cap stops after the
    first look."""
    out = tmp_path / "u"
    proc = run(study_cmd("temperature_sweep.py", out, "--smoke", "--seeds", "2", "--until-resolved",
                         "--max-seeds", "3", head=ray_head), env=ray_head.env)
    assert "look 1 of 2: 2 seeds per cell" in proc.stdout, proc.stdout[-3000:]
    summary = summary_dir(out, "temperature_sweep")
    record = json.loads((summary / "study_options.json").read_text())
    assert record["command"]["design"] == {"first": 2, "max_seeds": 3, "looks": 6, "step": None, "shape": 0.2,
                                           "paper_side": 0.045}
    rows = read_table(summary / "results.parquet")
    # 2 smoke seeds leave Δstd's interval tens of points wide: the first look cannot resolve, one more round runs
    assert "look 2 of 2: 3 seeds per cell" in proc.stdout and len(rows) == 12
    assert record["seed_rounds"] == [[0, 1], [2]] and {r["seed"] for r in rows} == {0, 1, 2}
    table = (summary / "table.txt").read_text()
    assert "Sequential design (--until-resolved): looks at 2, 3 seeds per cell" in table

    question = Question("DCL flatter across τ than InfoNCE", STD_DIFFERENCE, "dcl", "infonce", label="Δstd")
    x = x_column("loss.temperature")
    sequential = build_answer(rows, x, "tau", [question], design=GroupSequential(2, 3)).verdicts[0].estimate
    fixed = build_answer(rows, x, "tau", [question]).verdicts[0].estimate
    assert sequential.hi - sequential.lo > fixed.hi - fixed.lo  # the design's interval is wider than one look's
    logged = runs_of(out, "temperature_sweep")[2][0].data.metrics
    # MLflow gets 6 significant digits (tracker.rounded): 3.979845795 arrives as 3.97985
    assert logged["verdict/std_difference_0/ci_lo"] == rounded(sequential.lo)
    assert logged["verdict/std_difference_0/ci_hi"] == rounded(sequential.hi)
    # δ, Table 18's Δstd over the smoke's τ, with how far its one-decimal cells leave it open
    paper = build_answer(rows, x, "tau", [question], paper="temperature_sweep").verdicts[0]
    assert paper.spread > 0 and logged["verdict/std_difference_0/effect_spread"] == rounded(paper.spread)

    run(study_cmd("temperature_sweep.py", out, "--smoke", "--reanalyze", "-q", head=ray_head), env=ray_head.env)
    assert (summary / "table.txt").read_text() == table  # the recorded design, re-applied
    beyond = pyrun.run(study_cmd("temperature_sweep.py", out, "--smoke", "--seeds", "4", "--resume", head=ray_head),
                            capture_output=True, text=True, timeout=300, cwd=REPO, env=ray_head.env)
    assert beyond.returncode == 2 and "void its 5% guarantee" in beyond.stderr, beyond.stderr[-2000:]

    capped = run(study_cmd("temperature_sweep.py", tmp_path / "c", "--smoke", "--seeds", "2", "--until-resolved",
                           "--max-seeds", "5", "--max-minutes", "0.02", head=ray_head), env=ray_head.env)
    assert "look 1 of 4: 2 seeds per cell" in capped.stdout and "would end after --max-minutes 0.02" in capped.stdout
    # (6 looks from 2 to 5 round to 4: 2, 3, 4, 5)
    assert len(read_table(summary_dir(tmp_path / "c", "temperature_sweep") / "results.parquet")) == 8
