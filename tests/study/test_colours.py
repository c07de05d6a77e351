"""One fixed colour per series value: the same in every study and process, distinct between the series a study
draws together, and the study's plot draws each series in it (pure, no MLflow)."""

import subprocess
import sys

from dcl_core.config import LOSS_NAMES
from dcl_core.study.analysis import report
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


def test_the_study_plot_draws_each_series_in_its_colour(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(report, "save_figure", lambda fig, path, rect=None: figures.append(fig) or path)
    rows = [{"loss": loss, "temperature": t, "seed": 0, "status": "ok", "knn_top1": 10.0 + t}
            for loss in ("infonce", "dclw", "dcl") for t in (0.1, 0.5)]
    report.plot(rows, "temperature", "tau", tmp_path / "p.png", "t", paper={"dcl": {0.1: 90.0, 0.5: 91.0}})
    (ax, twin) = figures[0].axes
    drawn = {bars.get_label(): bars.lines[0].get_color() for bars in ax.containers}
    assert drawn == {"dcl (ours)": "#1f77b4", "dclw (ours)": series_colour("dclw"), "infonce (ours)": "#ff7f0e"}
    assert [line.get_color() for line in twin.get_lines()] == ["#1f77b4"]  # the paper's curve: its series' colour
