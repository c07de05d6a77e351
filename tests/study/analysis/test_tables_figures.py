"""Summary tables, robustness statistics, Parquet/CSV round trip and the plot (pure, no Ray)."""

import math
import statistics

import pytest

from dcl_core.study.analysis.figures import gap_vs_q_figure, knn_figure, q_hists_figure
from dcl_core.study.analysis.tables import all_gaps, cells, format_table, gap_pairs, gaps, read_table, robustness
from dcl_core.study.plan.writers import save_figure, write_table


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
    assert "81.0±1.4" in text and "86.0±0.0*" in text and "\ndcl−infonce " in text
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


def test_the_study_figure_is_written_as_a_png_and_a_pdf(tmp_path):
    figure, rect = knn_figure(ROWS, "temperature", "tau", "t")
    path = save_figure(figure, tmp_path / "p.png", rect=rect, with_pdf=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.with_suffix(".pdf").read_bytes().startswith(b"%PDF")


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
    assert "\nmoco dcl−infonce " in format_table(rows, "temperature", "tau", gap=True, series="series")


def gap_point(study, one_minus_q, gap, **cell):
    """A point of the gap-vs-q_B figure; ``cell``: its cell columns' values."""
    base = {"framework": "simclr", "temperature": 0.1, "batch_size": 32, "queue_size": None}
    return {"label": study, "gap": gap, "lo": gap - 0.5, "hi": gap + 0.5, "one_minus_q": one_minus_q, "n": 3,
            "cell": base | cell}


def test_the_gap_figure_labels_each_point_with_what_tells_its_cell_apart():
    points = [gap_point("tau_study", 0.05, 1.0, temperature=0.07), gap_point("tau_study", 0.03, 0.5),
              gap_point("tau_study", 0.02, 0.1, temperature=0.5),
              gap_point("batch_study", 0.06, 1.5, batch_size=16), gap_point("batch_study", 0.031, 0.55),
              gap_point("queue_study", 0.04, 0.4, framework="moco", temperature=0.2, queue_size=256)]
    fig = gap_vs_q_figure(points, "t")
    (ax,) = fig.axes
    labels = sorted(t.get_text() for t in ax.texts)
    # a study's points by what varies between them; a lone point by what varies between all points
    assert labels == sorted(["τ=0.07", "τ=0.1", "τ=0.5", "batch=16", "batch=32",
                             "moco τ=0.2 batch=32 queue=256"])
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])  # two points 0.001 apart


def test_crowded_gap_labels_do_not_overlap():
    points = [gap_point("tau_study", 0.02 + i * 0.0004, 0.2 + (i % 2) * 0.03, temperature=t)
              for i, t in enumerate((0.07, 0.1, 0.2, 0.5))] + [gap_point("other", 0.05, 2.0, batch_size=64)]
    fig = gap_vs_q_figure(points, "t")
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts]
    assert len(boxes) == 5 and not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_gap_points_without_a_cell_are_drawn_unlabelled():
    points = [{k: v for k, v in gap_point("s", q, 1.0).items() if k != "cell"} for q in (0.02, 0.05)]
    assert len(gap_vs_q_figure(points, "t").axes[0].texts) == 0


def test_the_q_hist_figure_zooms_to_where_the_mass_is_and_keeps_every_line_visible():
    """At the CPU defaults q_B's mass sits in its last bins: the axis spans those (and a bin either side), and
    two x whose histograms coincide are still two distinguishable lines."""
    bins = 40
    near_one = [0.0] * 37 + [0.1, 0.3, 0.6]  # bins 37-39: q_B in [0.925, 1]
    rows = [{**row(loss, tau, 0, 50.0), "q_hist": near_one} for loss in ("dcl", "infonce") for tau in (0.1, 0.5)]
    fig = q_hists_figure(rows, "temperature", "τ")
    for ax in fig.axes:
        assert ax.get_xlim() == pytest.approx((36 / bins, 1.0))
        lines = ax.get_lines()
        assert len(lines) == 2 and len({(ln.get_marker(), ln.get_linestyle()) for ln in lines}) == 2
        assert "zoomed" in ax.get_xlabel()
    spread = [{**r, "q_hist": [0.5] + [0.0] * 38 + [0.5]} for r in rows]  # mass at both ends: the whole range
    assert q_hists_figure(spread, "temperature", "τ").axes[0].get_xlim() == pytest.approx((0.0, 1.0))
    assert q_hists_figure([row("dcl", 0.1, 0, 50.0)], "temperature", "τ") is None
