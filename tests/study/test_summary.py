"""The study summary step on its own (no Ray): tables, files and the MLflow summary run, per study."""

from mlflow.tracking import MlflowClient

from dcl_core.config import preset
from dcl_core.study import StudySpec, summary_dir
from dcl_core.study.report import read_table
from dcl_core.study.results import summarize
from dcl_core.study.storage import default_tracking_uri
from dcl_core.study.tracking import StudyTracker
from search_spaces import Grid


def _rows(x_col, xs, accuracy):
    return [{"trial_id": f"{loss}{x}", "status": "ok", "loss": loss, x_col: x, "seed": 0,
             "knn_top1": accuracy(loss, x), "config": {}} for loss in ("infonce", "dcl") for x in xs]


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
    assert "DCL−base" in (summary_dir(tmp_path, "batch_study") / "table.txt").read_text()
    # ... and each MLflow summary run holds its own table and plot, with Table 1's gap for the batch study.
    client = MlflowClient(tracking_uri=uri)
    for spec in (tau, batch):
        exp = client.get_experiment_by_name(spec.name)
        (run,) = client.search_runs([exp.experiment_id])
        assert {"results.parquet", "table.txt", f"{spec.name}.png"} <= {a.path for a in client.list_artifacts(
            run.info.run_id)}
    (run,) = client.search_runs([client.get_experiment_by_name("batch_study").experiment_id])
    assert run.data.metrics["gap_dcl_minus_infonce/batch_size_16"] == 2.0
    assert run.data.metrics["gap_dcl_minus_infonce/batch_size_32"] == 2.0
