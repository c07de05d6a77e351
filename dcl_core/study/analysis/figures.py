"""A study's figures: kNN accuracy per cell with its interval and the paper's points, the gap against the NPC
multiplier, the q_B histograms; each returned unsaved (:mod:`dcl_core.study.plan.writers` saves it), matplotlib
imported only when one is drawn (:func:`pyplot`).

Pure functions over a list of row dicts (one per trial), so they are tested without Ray. The tables of the same rows:
:mod:`.tables`.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from dcl_core.study.analysis.colours import series_colour
from dcl_core.study.analysis.columns import (
    STATUS,
    Row,
    Status,
    cell_label,
    fmt_x,
)
from dcl_core.study.analysis.intervals import t_quantile
from dcl_core.study.analysis.tables import cells

Rect = tuple[float, float, float, float]  # a part of a figure, in figure fractions: left, bottom, right, top


def pyplot() -> Any:
    """Matplotlib's pyplot on the file-only Agg backend, imported when a plot is drawn (it is slow to import)."""
    import matplotlib  # slow to import: when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is chosen

    return plt


DODGE = 0.06  # each series' points shifted by this much of the x spacing (log: of an octave): bars apart


def knn_figure(rows: Sequence[Row], x_key: str, x_label: str, title: str, log_x: bool = False,
               series: str = "loss", paper: Mapping[str, Mapping[Any, float]] | None = None,
               paper_label: str = "paper", notes: Sequence[str] = ()) -> tuple[Any, Rect]:
    """The kNN top-1 vs x, one line per series in its fixed colour
    (:func:`~dcl_core.study.analysis.colours.series_colour`, its MLflow runs' too), with the 95% t-interval over
    seeds of each cell (the tables' intervals; none for a single seed), the series dodged sideways so that their
    bars do not overlap, ``notes`` (the verdicts: statistic and interval) under the axes. Returned unsaved, with
    the part of the figure its axes are laid out in (above the notes).

    ``paper`` (``{series: {x: value}}``, e.g. DCL Table 18) is drawn dashed in each series' colour on its own
    y axis (right): the paper's level (88% on full CIFAR-10) and ours differ, what is compared is the shape."""
    plt = pyplot()

    height = 4.2 + 0.16 * (len(notes) + 1)  # inches: room for the notes under the axes
    fig, ax = plt.subplots(figsize=(6.5, height), dpi=120)
    colours = {}
    by_series = cells(rows, x_key, series)
    all_xs = sorted({x for by_x in by_series.values() for x in by_x})
    numeric = all(isinstance(x, int | float) for x in all_xs)
    for i, (loss, by_x) in enumerate(by_series.items()):
        xs = [x for x in sorted(by_x) if not math.isnan(by_x[x]["mean"])]
        shift = (i - (len(by_series) - 1) / 2) * DODGE
        drawn_at = [_dodged(x, shift, all_xs, log_x) for x in xs] if numeric else xs
        half = [_half_width(by_x[x]) for x in xs]
        line = ax.errorbar(drawn_at, [by_x[x]["mean"] for x in xs], yerr=half, marker="o", capsize=3,
                           label=f"{loss} (ours)" if paper else loss, color=series_colour(loss))
        colours[loss] = line.lines[0].get_color()
    if log_x:
        ax.set_xscale("log", base=2)
    if numeric and all_xs:
        ax.set_xticks(all_xs, [fmt_x(x) for x in all_xs])  # the grid's own values, not the dodged positions
        ax.minorticks_off()
    ax.set_xlabel(x_label + (" (log scale)" if log_x else ""))
    ax.set_ylabel("kNN top-1 (%), ours: mean, 95% CI over seeds")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    drawn = {name: values for name, values in (paper or {}).items() if name in colours and values}
    footer = list(notes)
    if drawn:
        twin = ax.twinx()
        for name, values in drawn.items():
            xs = sorted(values)
            (line,) = twin.plot(xs, [values[x] for x in xs], linestyle="--", marker="x", color=colours[name],
                                alpha=0.8, label=f"{name} (paper)")
            handles.append(line)
            labels.append(line.get_label())
        twin.set_ylabel(f"{paper_label} (dashed, own axis)", fontsize=7)
        footer.append("Dashed: the paper, on its own axis; compare the shape (ranking, spread, gap sign), not the "
                      "level.")
    line_height = 0.15 / height  # figure fraction of one 6.5-point line
    for k, text in enumerate(reversed(footer)):
        fig.text(0.01, 0.01 + k * line_height, text, fontsize=6.5)
    ax.legend(handles, labels, fontsize=7)
    return fig, (0.0, 0.015 + len(footer) * line_height, 1.0, 1.0)


def _half_width(cell: Mapping[str, float]) -> float:
    """Half the width of a cell's 95% t-interval over its seeds (0 with fewer than 2: no interval)."""
    n = int(cell["n"])
    if n < 2 or not math.isfinite(cell["std"]):
        return 0.0
    return t_quantile(0.975, n - 1) * cell["std"] / math.sqrt(n)


def _dodged(x: Any, shift: float, xs: Sequence[Any], log_x: bool) -> float:
    """Where a series' point at ``x`` is drawn: ``shift`` of the grid's spacing to the side (of an octave on a log
    axis)."""
    if log_x:
        return float(x) * float(2.0**shift)
    numeric = sorted(float(v) for v in xs)
    gaps = [b - a for a, b in itertools.pairwise(numeric) if b > a]
    return float(x) + shift * (min(gaps) if gaps else 1.0)


def gap_vs_q_figure(points: Sequence[Mapping[str, Any]], title: str) -> Any:
    """DCL − InfoNCE gap vs InfoNCE's 1 − q_B, one point per cell: the paper's mechanism predicts the gap grows
    with 1 − q_B. The points carry ``gap``, ``lo``, ``hi``, ``one_minus_q``, ``label`` (the study, the legend's)
    and a ``cell`` each point is labelled with (a text, or its cell columns' values, of which the label shows those
    that tell the study's points apart, ``τ=0.1``). Returned unsaved, so its labels can be read."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for p in points:
        groups[str(p["label"])].append(p)
    labelled = []
    for label, members in sorted(groups.items()):
        xs = [p["one_minus_q"] for p in members]
        ys = [p["gap"] for p in members]
        err = [[p["gap"] - p["lo"] if math.isfinite(p["lo"]) else 0.0 for p in members],
               [p["hi"] - p["gap"] if math.isfinite(p["hi"]) else 0.0 for p in members]]
        ax.errorbar(xs, ys, yerr=err, fmt="o", capsize=3, label=label)
        labelled += [((p["one_minus_q"], p["gap"]), text) for p, text in zip(members, point_labels(members, points),
                                                                             strict=True) if text]
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("1 − q_B of the InfoNCE cell (last epoch)")
    ax.set_ylabel("DCL − InfoNCE kNN top-1 (points), 95% CI")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    if groups:
        ax.legend(fontsize=7)
    fig.tight_layout()  # the labels are placed where the saved figure will draw them
    _annotate(ax, labelled)
    return fig


def point_labels(members: Sequence[Mapping[str, Any]], everyone: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each point's cell in a few characters: a text ``cell`` as it is; cell values (column -> value) by the
    columns that differ between ``members`` (one study's points), else between ``everyone``; ``""`` without a
    ``cell`` or when nothing differs (a lone point: the legend names it)."""
    def varying(group: Sequence[Mapping[str, Any]]) -> list[str]:
        cells = [p["cell"] for p in group if isinstance(p.get("cell"), Mapping)]
        columns = list(dict.fromkeys(c for cell in cells for c in cell))
        return [c for c in columns if len({repr(cell.get(c)) for cell in cells}) > 1]

    shown = varying(members) or varying(everyone)
    out = []
    for p in members:
        cell = p.get("cell")
        out.append(cell_label({c: cell.get(c) for c in shown}) if isinstance(cell, Mapping) else str(cell or ""))
    return out


# Where a point's label goes, tried in turn: (dx, dy) in points, horizontal and vertical alignment.
_OFFSETS = ((5, 4, "left", "bottom"), (5, -4, "left", "top"), (-5, 4, "right", "bottom"),
            (-5, -4, "right", "top"), (0, 9, "center", "bottom"), (0, -9, "center", "top"))


def _annotate(ax: Any, labelled: Sequence[tuple[tuple[float, float], str]]) -> None:
    """Small labels beside their points, each at the first offset where it overlaps no label placed before and
    no other point, inside the axes (else at the first offset)."""
    renderer = ax.figure.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    marks = [ax.transData.transform(xy) for xy, _ in labelled]

    def note(xy: tuple[float, float], text: str, offset: tuple[float, float, str, str]) -> Any:
        dx, dy, ha, va = offset
        return ax.annotate(text, xy, xytext=(dx, dy), textcoords="offset points", ha=ha, va=va, fontsize=6.5,
                           color="0.2", bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.7})

    placed: list[Any] = []
    for i, (xy, text) in enumerate(labelled):
        others = marks[:i] + marks[i + 1:]
        chosen = _OFFSETS[0]
        for offset in _OFFSETS:
            trial = note(xy, text, offset)
            box = trial.get_window_extent(renderer)
            trial.remove()
            if (not any(box.overlaps(b) for b in placed) and not any(box.contains(*m) for m in others)
                    and inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1)):
                chosen = offset
                break
        placed.append(note(xy, text, chosen).get_window_extent(renderer))


def q_hist_edges(bins: int) -> list[float]:
    """The edges of ``bins`` equal bins over q_B's range [0, 1]."""
    return [i / bins for i in range(bins + 1)]


def q_hist_epochs_figure(hists: Mapping[int, Sequence[float]], title: str) -> Any:
    """One trial's NPC multiplier distribution per epoch (DCL Fig. 1): fraction of anchors per q_B bin; unsaved."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    epochs = sorted(hists)
    shown = epochs if len(epochs) <= 6 else [epochs[round(i * (len(epochs) - 1) / 5)] for i in range(6)]
    for epoch in shown:
        h = list(hists[epoch])
        centers = [(i + 0.5) / len(h) for i in range(len(h))]
        ax.plot(centers, h, marker=".", label=f"epoch {epoch}")
    ax.set_xlabel("NPC multiplier q_B")
    ax.set_ylabel("fraction of anchors")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">")


Q_MASS_SHOWN = 0.001  # a q_B bin holding less than this fraction of anchors in every line is outside the zoom


def q_hists_figure(rows: Sequence[Row], x_key: str, x_label: str, series: str = "loss") -> Any:
    """Final-epoch q_B distributions (DCL Fig. 1): one panel per series, one line per x (seeds averaged), unsaved
    (``None`` when no row carries a histogram, ``q_hist``). The x axis spans the bins that
    hold at least :data:`Q_MASS_SHOWN` of the anchors in some line, and a bin either side (at the CPU defaults all
    the mass sits in q_B's last few bins, which a [0, 1] axis draws as one spike); each x has its own marker and
    line style, so lines that coincide stay visible."""
    groups: dict[str, dict[Any, list[Sequence[float]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("q_hist") and r[STATUS] == Status.OK:
            groups[r[series]][r[x_key]].append(r["q_hist"])
    if not groups:
        return None
    plt = pyplot()

    means = {name: {x: [statistics.fmean(col) for col in zip(*hs, strict=True)] for x, hs in by_x.items()}
             for name, by_x in groups.items()}
    bins = max(len(m) for by_x in means.values() for m in by_x.values())
    held = [i for by_x in means.values() for m in by_x.values() for i, v in enumerate(m) if v >= Q_MASS_SHOWN]
    lo, hi = (max(0, min(held) - 1) / bins, min(bins, max(held) + 2) / bins) if held else (0.0, 1.0)
    names = sorted(means)
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.5), dpi=120, sharey=True, squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for k, x in enumerate(sorted(means[name])):
            mean = means[name][x]
            centers = [(i + 0.5) / len(mean) for i in range(len(mean))]
            ax.plot(centers, mean, marker=_MARKERS[k % len(_MARKERS)], markersize=4, alpha=0.8,
                    linestyle=("-", "--", "-.", ":")[k % 4], label=f"{x_label} {fmt_x(x)}")
        ax.set_xlim(lo, hi)
        ax.set_title(str(name))
        ax.set_xlabel("NPC multiplier q_B" + (f" (zoomed to {fmt_x(lo)}-{fmt_x(hi)})" if (lo, hi) != (0, 1) else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("fraction of anchors (last epoch)")
    fig.tight_layout()
    return fig
