"""The study summary step on its own (no Ray): tables, files and the MLflow summary run, per study."""

import pytest
from mlflow.tracking import MlflowClient

from dcl_core.config import preset
from dcl_core.study import StudySpec, summary_dir
from dcl_core.study.analysis.tables import read_table
from dcl_core.study.execution.results import summarize
from dcl_core.study.plan.storage import default_tracking_uri
from dcl_core.study.tracking import StudyTracker
from search_spaces import Grid

SUMMARY_RUN = "tags.`dcl.summary` = 'true'"  # the study's run (beside it: its figure's run, the trials')

def _rows(x_col, xs, accuracy):
    return [{"trial_id": f"{loss}{x}", "status": "ok", "loss": loss, x_col: x, "seed": 0,
             "knn_top1": accuracy(loss, x), "config": {}} for loss in ("infonce", "dcl") for x in xs]


@pytest.mark.slow  # MLflow stores and two summaries: ~6 s
def test_two_studies_in_one_output_dir_keep_their_own_summaries(tmp_path):
    uri = default_tracking_uri(tmp_path)
    base = preset("smoke")
    tau = StudySpec(name="tau_study", base=base, grid={"loss.temperature": Grid((0.1, 0.5))},
                    x_key="loss.temperature", x_label="tau")
    batch = StudySpec(name="batch_study", base=base, grid={"optim.batch_size": Grid((16, 32))},
                      x_key="optim.batch_size", x_label="batch", gap=True)
    tags = {"study": "x", "git_commit": "unknown"}
    trackers = {spec.name: StudyTracker(uri, spec.name, tmp_path / "mlartifacts", tags).open() for spec in (tau, batch)}
    summarize(tau, _rows("temperature", (0.1, 0.5), lambda lo, x: 40 + 10 * x), tmp_path, trackers["tau_study"])
    summarize(batch, _rows("batch_size", (16, 32), lambda lo, x: 30 + x / 4 + (2 if lo == "dcl" else 0)),
              tmp_path, trackers["batch_study"])

    # Both studies' tables are still on disk, each with its own swept values.
    assert {r["temperature"] for r in read_table(summary_dir(tmp_path, "tau_study") / "results.parquet")} == {0.1, 0.5}
    assert {r["batch_size"] for r in read_table(summary_dir(tmp_path, "batch_study") / "results.parquet")} == {16, 32}
    assert "tau" in (summary_dir(tmp_path, "tau_study") / "table.txt").read_text()
    assert "dcl−infonce" in (summary_dir(tmp_path, "batch_study") / "table.txt").read_text()
    # ... and each MLflow summary run holds its own table and plot, with Table 1's gap for the batch study.
    client = MlflowClient(tracking_uri=uri)
    for spec in (tau, batch):
        exp = client.get_experiment_by_name(spec.name)
        (run,) = client.search_runs([exp.experiment_id], SUMMARY_RUN)
        assert {"results.parquet", "table.txt", f"{spec.name}.png"} <= {a.path for a in client.list_artifacts(
            run.info.run_id)}
    (run,) = client.search_runs([client.get_experiment_by_name("batch_study").experiment_id], SUMMARY_RUN)
    assert run.data.metrics["gap_dcl_minus_infonce/batch_size_16"] == 2.0
    assert run.data.metrics["gap_dcl_minus_infonce/batch_size_32"] == 2.0


def test_a_row_without_a_grid_point_is_stored_and_in_no_cell(tmp_path):
    # A trial whose config was lost (before: one killed before its first report) has no grid point: its row is in
    # the stored table and the trial counts, but no cell shows it; the summary did not sort None among the floats.
    spec = StudySpec(name="tau_study", base=preset("smoke"), grid={"loss.temperature": Grid((0.1, 0.5))},
                     x_key="loss.temperature", x_label="tau")
    lost = {"trial_id": "lost", "status": "error", "error": "killed", "loss": None, "temperature": None, "seed": None,
            "knn_top1": None, "config": {}}
    rows = [*_rows("temperature", (0.1, 0.5), lambda lo, x: 40 + 10 * x), lost]
    tracker = StudyTracker(default_tracking_uri(tmp_path), spec.name, tmp_path / "mlartifacts", {}).open()
    outcome = summarize(spec, rows, tmp_path, tracker)
    assert len(read_table(summary_dir(tmp_path, "tau_study") / "results.parquet")) == 5
    assert len(outcome.rows) == 5 and "None" not in outcome.table and "0.5" in outcome.table

@pytest.mark.slow  # an MLflow store and a summary with its figure: ~6 s
def test_summary_run_holds_the_answer_verdict_paper_and_regime(tmp_path):
    # A batch study with a planted DCL gain at small batches (3 seeds, a shared per-seed offset), summarized
    # beside an earlier study in the same folder: the MLflow summary run must hold the verdicts (tags and
    # metrics), per-cell CIs, the regime, and the plots (paper curve, gap vs 1 − q_B over both studies).
    from dcl_core.study.analysis.answer import Question
    from dcl_core.study.analysis.measures import GAP_AT_SMALLEST

    uri = default_tracking_uri(tmp_path)
    gap = Question("DCL beats InfoNCE at the smallest batch", GAP_AT_SMALLEST, "dcl", "infonce", label="gap")
    spec = StudySpec(name="batch_study", base=preset("smoke"), grid={"optim.batch_size": Grid((16, 32, 64))},
                     x_key="optim.batch_size", x_label="batch", gap=True, questions=(gap,), paper="batch_size_sweep")
    rows = [{"trial_id": f"{loss}{b}{s}", "status": "ok", "loss": loss, "batch_size": b, "seed": s,
             # the last term: noise that differs between the losses, so each seed's gap is its own
             "knn_top1": 30 + 3 * s + (8 - b / 8 if loss == "dcl" else 0) + 0.1 * ((s * 7 + b + (loss == "dcl")) % 3),
             "q_mean": 0.5 + b / 128, "config": {}}
            for loss in ("infonce", "dcl") for b in (16, 32, 64) for s in range(3)]
    earlier = StudySpec(name="tau_study", base=preset("smoke"), grid={"loss.temperature": Grid((0.1,))},
                        x_key="loss.temperature", x_label="tau")
    summarize(earlier, [{**r, "temperature": 0.1, "batch_size": None, "trial_id": "t" + r["trial_id"]}
                        for r in rows if r["batch_size"] == 16],
              tmp_path, StudyTracker(uri, "tau_study", tmp_path / "mlartifacts", {}).open())
    outcome = summarize(spec, rows, tmp_path, StudyTracker(uri, "batch_study", tmp_path / "mlartifacts", {}).open())

    text = (summary_dir(tmp_path, "batch_study") / "table.txt").read_text().strip()
    assert text.splitlines()[-1] == outcome.verdicts[-1]
    assert outcome.verdicts[0].startswith("DCL beats InfoNCE at the smallest batch: supports the paper")
    assert "(paper: +4.80 over batch 32, 64; it has no batch 16)" in outcome.verdicts[0]
    assert "Paper: DCL Table 1" in text
    assert "NPC regime: InfoNCE cells: mean q_B 0.62–1.00" in text and "1 of 3 cells" not in text
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("batch_study").experiment_id], SUMMARY_RUN)
    assert run.data.tags["verdict_0"] == "supports the paper"
    assert run.data.tags["verdict_0_line"] == outcome.verdicts[0]
    # its description, what MLflow's runs table and run page show: the verdict first, then the study's plot
    note = run.data.tags["mlflow.note.content"]
    estimate = outcome.verdicts[0].split(" — gap ")[1].split(",")[0]  # as the line rounds it
    assert note.startswith(f"Verdict: supports the paper, gap {estimate}\n\n{outcome.verdicts[0]}\n\n")
    # the cells: each mean with its 95% interval, in x order, as table.txt's per-cell table has them
    block = note.split("```")[1].strip("\n").splitlines()
    assert block[0].split() == ["batch", "dcl", "infonce", "dcl", "−", "infonce"]
    assert [r.split()[0] for r in block[1:]] == ["16", "32", "64"]
    per_cell = text[text.index("Per cell:"):].splitlines()
    for row in block[1:]:
        mean_ci = " ".join(row.split()[1:5])  # dcl's "38.0 [36.9, 39.1]"
        assert any(line.startswith(row.split()[0]) and mean_ci in " ".join(line.split()) for line in per_cell), row
    assert f"(get-artifact?path=batch_study.png&run_uuid={run.info.run_id})" in note
    assert run.data.tags["npc_regime"].startswith("NPC regime")
    m = run.data.metrics
    assert m["verdict/gap_at_smallest_0/supports"] == 1.0 and m["verdict/gap_at_smallest_0/paper"] == 4.8
    assert m["verdict/gap_at_smallest_0/ci_lo"] > 0 and m["cell/infonce/16/q_b"] == 0.625
    assert m["cell/dcl/16/ci_hi"] > m["cell/dcl/16/mean"] > m["cell/dcl/16/ci_lo"]
    exp = client.get_experiment_by_name("batch_study")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # not a GenAI experiment
    assert outcome.runs_url == (
        f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning"
        "&viewStateShareKey=dcl_runs")  # the runs view: the verdict in the study's row (tracker-written, not masked)
    assert "mlflow.sharedViewState.dcl_runs" in exp.tags
    # the answer: URL, printed first: the summary run's page, whose description is the note above
    assert outcome.answer_url == (f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs/{run.info.run_id}"
                                  "?workflowType=machine_learning")  # the model-training mode, not GenAI's
    assert {"gap_vs_npc.png", "batch_study.png", "table.txt"} <= {
        a.path for a in client.list_artifacts(run.info.run_id)}


def test_trial_runs_hold_knn_only_at_measured_epochs_and_no_flag_curves(tmp_path):
    # With eval.knn_every > 1 Tune carries the last kNN forward (ASHA needs a value every epoch); the MLflow
    # curve must show only the epochs that measured it, and the 0/1 "fresh" flag is no curve at all.
    from dcl_core.study.tracking import MLflowTrialCallback

    class Trial:
        trial_id, config = "t1", {"loss.name": "dcl"}

        def __str__(self):
            return "dcl_t1"

    uri = default_tracking_uri(tmp_path)
    callback = MLflowTrialCallback(StudyTracker(uri, "knn_curve", tmp_path / "mlartifacts", {}).open(),
                                   {"loss": "loss.name"})
    for epoch, fresh, knn in ((1, 0.0, float("nan")), (2, 1.0, 30.0), (3, 0.0, 30.0), (4, 1.0, 35.0)):
        callback.on_trial_result(0, [], Trial(), {"epoch": epoch, "train/loss": 1.0 / epoch, "eval/knn_top1": knn,
                                                 "eval/knn_fresh": fresh})
    client = MlflowClient(tracking_uri=uri)
    run_id = callback.runs["t1"]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/knn_top1")] == [(2, 30.0), (4, 35.0)]
    assert len(client.get_metric_history(run_id, "train/loss")) == 4
    assert "eval/knn_fresh" not in client.get_run(run_id).data.metrics
