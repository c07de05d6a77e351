"""One fixed colour per series value: the same in every study and process, distinct between the series a study
draws together, and the study's plot draws each series in it (pure, no MLflow)."""

import subprocess
import sys

import pytest

from dcl_core.config import LOSS_NAMES
from dcl_core.study.analysis import figures
from dcl_core.study.analysis.colours import SUMMARY_COLOUR, series_colour


def test_every_loss_has_its_own_fixed_colour():
    colours = [series_colour(name) for name in LOSS_NAMES]
    assert len(set(colours)) == len(colours) and SUMMARY_COLOUR not in colours
    # the plots had DCL and InfoNCE in matplotlib's first two cycle colours: kept, so old and new PNGs agree
    assert series_colour("dcl") == "#1f77b4" and series_colour("infonce") == "#ff7f0e"


def test_eqco_series_keep_their_alpha_apart_and_frameworks_shade_the_loss():
    eqco = ["simclr+eqco(α=256)", "simclr+eqco(α=K)", "simo+eqco(α=256)", "simo+eqco(α=K)"]
    assert len({series_colour(s) for s in eqco}) == 4  # the EqCo study's four lines
    assert series_colour("simclr+eqco(α=256)") == series_colour("eqco") == series_colour("eqco(α=1024)")
    assert series_colour("simclr+dcl") == series_colour("dcl")  # SimCLR is the loss's own hue
    assert len({series_colour(f"{fw}+dcl") for fw in ("simclr", "moco", "simo", "nnclr")}) == 4
    assert series_colour("byol+dcl") != series_colour("dcl")  # a framework not listed is still shaded


def test_a_name_not_listed_gets_the_same_colour_in_another_process():
    # str hashes are salted per process: a colour from hash() would differ between a study and its reanalysis
    here = series_colour("my_new_loss")
    there = subprocess.run([sys.executable, "-c", "from dcl_core.study.analysis.colours import series_colour; "
                            "print(series_colour('my_new_loss'))"], capture_output=True, text=True, check=True)
    assert there.stdout.strip() == here and here.startswith("#") and len(here) == 7


def test_the_study_plot_draws_each_series_in_its_colour():
    rows = [{"loss": loss, "temperature": t, "seed": 0, "status": "ok", "knn_top1": 10.0 + t}
            for loss in ("infonce", "dclw", "dcl") for t in (0.1, 0.5)]
    figure, _ = figures.knn_figure(rows, "temperature", "tau", "t", paper={"dcl": {0.1: 90.0, 0.5: 91.0}})
    (ax, twin) = figure.axes
    drawn = {bars.get_label(): bars.lines[0].get_color() for bars in ax.containers}
    assert drawn == {"dcl (ours)": "#1f77b4", "dclw (ours)": series_colour("dclw"), "infonce (ours)": "#ff7f0e"}
    assert [line.get_color() for line in twin.get_lines()] == ["#1f77b4"]  # the paper's curve: its series' colour


def test_the_study_plot_shows_95_percent_intervals_dodged_and_the_verdicts():
    """The bars are the tables' 95% t-intervals over seeds (not ±1 std), the series sit apart at each x, the grid's
    own x values label the axis, and the verdicts are written under it."""
    rows = [{"loss": loss, "temperature": t, "seed": s, "status": "ok", "knn_top1": 10.0 + t + s}
            for loss in ("infonce", "dcl") for t in (0.1, 0.5) for s in (0, 1, 2)]
    note = "DCL flatter across τ than InfoNCE: Δstd +0.0 [-1.0, +1.0], not resolved"
    fig, _ = figures.knn_figure(rows, "temperature", "τ", "t", log_x=True, notes=[note])
    (ax,) = fig.axes
    bars = {c.get_label(): c for c in ax.containers}
    # seeds 0, 1, 2 -> values x+10, x+11, x+12: mean x+11, sd 1, half-width t(0.975, 2) / sqrt(3) = 2.484
    segment = bars["dcl"].lines[2][0].get_segments()[0]  # [[x, low], [x, high]] of the first x
    assert segment[1][1] - segment[0][1] == pytest.approx(2 * 4.302653 / 3 ** 0.5, rel=1e-4)
    xs = {label: c.lines[0].get_xdata() for label, c in bars.items()}
    assert all(a != b for a, b in zip(xs["dcl"], xs["infonce"], strict=True))  # dodged apart
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.1", "0.5"]
    assert note in [t.get_text() for t in fig.texts]
