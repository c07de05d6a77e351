"""Summary tables, robustness statistics, Parquet/CSV round trip and the plot (pure, no Ray)."""

import math
import statistics

import pytest

from dcl_core.study.report import (
    all_gaps,
    cells,
    format_table,
    gap_pairs,
    gaps,
    plot,
    read_table,
    robustness,
    write_table,
)


def row(loss, tau, seed, acc, status="ok", batch=128):
    return {
        "trial_id": f"{loss}{tau}{seed}",
        "status": status,
        "loss": loss,
        "temperature": tau,
        "batch_size": batch,
        "seed": seed,
        "knn_top1": acc if status == "ok" else None,
    }


ROWS = [
    row("infonce", 0.1, 0, 80.0),
    row("infonce", 0.1, 1, 82.0),
    row("infonce", 0.5, 0, 86.0),
    row("infonce", 0.5, 1, 88.0),
    row("dcl", 0.1, 0, 85.0),
    row("dcl", 0.1, 1, 87.0),
    row("dcl", 0.5, 0, 86.0),
    row("dcl", 0.5, 1, 88.0, status="diverged"),
]


def test_cells_mean_std_over_seeds_excluding_failures():
    c = cells(ROWS, "temperature")
    assert c["infonce"][0.1] == {"mean": 81.0, "std": statistics.stdev([80, 82]), "n": 2, "failed": 0}
    assert c["dcl"][0.5]["mean"] == 86.0 and c["dcl"][0.5]["n"] == 1 and c["dcl"][0.5]["failed"] == 1


def test_robustness_is_std_across_tau_of_cell_means():
    rob = robustness(ROWS, "temperature")
    assert rob["infonce"]["std"] == pytest.approx(statistics.stdev([81.0, 87.0]))
    assert rob["infonce"]["range"] == pytest.approx(6.0)
    assert rob["dcl"]["std"] == pytest.approx(statistics.stdev([86.0, 86.0]))
    assert gaps(ROWS, "temperature") == {0.1: pytest.approx(5.0), 0.5: pytest.approx(-1.0)}


def test_table_text_has_cells_std_and_failure_marker():
    text = format_table(ROWS, "temperature", "tau", gap=True)
    assert "81.0±1.4" in text and "86.0±0.0*" in text and "DCL−base" in text
    assert "some seeds failed" in text
    all_failed = [row("dcl", 0.1, 0, 0, status="diverged")]
    assert "failed" in format_table(all_failed, "temperature", "tau").splitlines()[1]


def test_parquet_and_csv_round_trip(tmp_path):
    parquet, csv = write_table(ROWS, tmp_path)
    back = read_table(parquet)
    assert len(back) == len(ROWS)
    assert [r["knn_top1"] for r in back] == [r["knn_top1"] for r in ROWS]
    assert back[-1]["status"] == "diverged" and math.isnan(back[-1]["q_mean"] or math.nan)
    assert csv.read_text().splitlines()[0].startswith('"trial_id","status","series","loss"')


def test_plot_writes_a_png(tmp_path):
    path = plot(ROWS, "temperature", "tau", tmp_path / "p.png", "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gaps_pair_dcl_with_infonce_within_each_framework():
    # Series named framework+loss (Table 6's SimCLR and MoCo-v2 lines): each DCL line against its own baseline.
    names = ["moco+dcl", "moco+infonce", "simclr+dcl", "simclr+infonce", "simclr+dclw", "dcl", "infonce"]
    assert gap_pairs(names) == [("", "dcl", "infonce"), ("moco", "moco+dcl", "moco+infonce"),
                                ("simclr", "simclr+dcl", "simclr+infonce")]
    assert gap_pairs(["moco+dcl", "simclr+infonce"]) == []  # never across frameworks
    rows = [{**row(loss, 0.1, 0, acc), "series": f"{fw}+{loss}"}
            for fw, loss, acc in (("moco", "dcl", 70.0), ("moco", "infonce", 66.0),
                                  ("simclr", "dcl", 60.0), ("simclr", "infonce", 61.0))]
    assert all_gaps(rows, "temperature", series="series") == {"moco": {0.1: 4.0}, "simclr": {0.1: -1.0}}
    assert "DCL−base moco" in format_table(rows, "temperature", "tau", gap=True, series="series")
