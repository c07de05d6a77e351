"""The saved view a study leaves in MLflow's UI: its trials grouped into the study's cells, with kNN top-1 and
q_B as columns and charts of kNN against the swept quantity and against q_B, each trial drawn in its series'
colour; and the two tags of a trial run the view relies on: ``cell`` (``dcl τ=0.1``, what it groups by: one short
group name instead of "temperature: 0.1, loss: dcl", which the table cut) and ``mlflow.runColor``.

MLflow's UI (3.x) keeps a named view of the runs page as an experiment tag, ``mlflow.sharedViewState.<id>``,
whose value is a JSON envelope ``{"name", "createdAt", "updatedAt", "state"}``; ``state`` is the page's
serialized search facets and UI state, compressed as ``deflate;`` + base64(zlib). The runs page applies it when
the URL carries ``viewStateShareKey=<id>``, and lists it under "Views". The format here is the one MLflow 3.17's
own "Save as new view" writes (read back from a view saved by clicking, then checked in a real browser by
``.ci/check_mlflow_ui.py``); this module only builds the tag, :class:`dcl_core.study.tracking.StudyTracker`
sets it. No MLflow call here, so the UI's format churn stays in this one file.

Colours: MLflow 3.17 colours a run by its tag ``mlflow.runColor`` (what its colour picker writes), in the table and
in charts of single runs; a group's colour lives only in the browser (localStorage, else a hash of the group's id).
So the charts draw the trials (``useGroupedValuesInCharts`` off), each in its series' fixed colour
(:mod:`dcl_core.study.analysis.colours`, the plot's too); the table still groups them into cells with their means.

A second view, :func:`runs_view`, is the one the printed ``runs:`` URL opens: MLflow's own runs table (3.17 hides
the Description column by default, so a study's row showed neither its verdict nor its kNN) with the summary run's
Description (its ``Verdict: …`` first) and kNN top-1 shown beside the run names.
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dcl_core import metric_names as M
from dcl_core.study.analysis.colours import series_colour
from dcl_core.study.analysis.columns import cell_label
from dcl_core.study.plan.spec import StudySpec, trial_tags

FIGURE_GROUP = "the study's figure"  # the figure's run's cell tag: its group in the compare view
FIGURE_KEY = "study_figure"  # the image key of the study's figure (tracking.runs logs it, the view shows it)

VIEW_TAG_PREFIX = "mlflow.sharedViewState."
VIEW_ID = "dcl_compare"  # one view per study experiment, rewritten by every run of the study
RUNS_VIEW_ID = "dcl_runs"  # the runs table with the verdict: what the printed runs: URL opens
RUNS_VIEW_NAME = "study: verdict and kNN"
NAME_WIDTH = 300  # px: "Group: simclr eqco K=16 α=None" whole (MLflow's default is ~190)
_SECTION = "dcl_compare_section"
CELL_TAG = "cell"  # a trial's cell in a few characters, "dcl τ=0.1": what the view groups by
RUN_COLOR_TAG = "mlflow.runColor"  # MLflow's own tag: a run's colour in its runs table and charts
# Column ids of MLflow 3.17's runs table (its attribute columns are "attributes.`<header>`").
NAME_COLUMN = "attributes.`Run Name`"
DESCRIPTION_COLUMN = "attributes.`Description`"
# The columns MLflow 3.17's runs table selects by default (its "reset columns"): kept so the runs view is its table.
DEFAULT_COLUMNS = ("attributes.`Source`", "attributes.`Models`", "attributes.`Dataset`")
# px: MLflow's Description cell shows a description's first 50 characters and "..." (the whole on hover), about
# 330 px at its font; its default width, 300, cut "Verdict: supports the paper; contradicts the paper" short
DESCRIPTION_WIDTH = 400
METRIC_WIDTH = 130  # px: the header "eval/knn_top1" whole (MLflow's default, 100, cut it to "eval/knn_top")


@dataclass(frozen=True)
class SavedView:
    """A named runs-page view: ``state`` is what MLflow's UI serializes (search facets + UI state)."""

    id: str
    name: str
    state: dict[str, Any]

    def tag(self, now_ms: int | None = None) -> tuple[str, str]:
        """The experiment tag (key, value) that holds the view."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        packed = "deflate;" + base64.b64encode(zlib.compress(json.dumps(self.state).encode())).decode()
        return VIEW_TAG_PREFIX + self.id, json.dumps({"name": self.name, "createdAt": now, "updatedAt": now,
                                                      "state": packed})



def view_query(charts: bool = True) -> str:
    """The runs-page URL query that opens the study's view (``charts``: in the chart view, not the table)."""
    return f"viewStateShareKey={VIEW_ID}" + ("&compareRunsMode=CHART" if charts else "")


def runs_view_query() -> str:
    """The runs-page URL query that opens :func:`runs_view` (the table, MLflow's default mode without a
    ``compareRunsMode``)."""
    return f"viewStateShareKey={RUNS_VIEW_ID}"


def read_tag(value: str) -> tuple[str, dict[str, Any]]:
    """(name, state) of a view tag's value: the inverse of :meth:`SavedView.tag`, for tests and checks."""
    envelope = json.loads(value)
    packed = envelope["state"]
    if packed.startswith("deflate;"):
        packed = zlib.decompress(base64.b64decode(packed[len("deflate;"):])).decode()
    return envelope["name"], json.loads(packed)


def group_tags(spec: StudySpec) -> list[str]:
    """The trial tags that name a study's cell: each grid key's (the swept quantity first), then ``loss``. The
    seed and searched keys are left out: a cell's trials differ in them (:class:`~.plan.spec.TrialTags`)."""
    return list(trial_tags(spec).cell)


def trial_look(tags: Mapping[str, Any], cell: tuple[str, ...], series: str) -> dict[str, str]:
    """A trial run's colour, its series' (``series``: the series value, ``dcl`` or ``simclr+eqco(α=K)``), and its
    ``cell`` tag from the values of its tags naming the cell (``tags``: tag -> value; no ``cell``: no tag)."""
    look = {RUN_COLOR_TAG: series_colour(series)}
    if cell:
        look[CELL_TAG] = cell_label({t: tags[t] for t in cell if t in tags})
    return look


def _metric_col(key: str) -> str:
    return f"metrics.`{key}`"


def _scatter(uid: str, x: tuple[str, str], y: tuple[str, str]) -> dict[str, Any]:
    return {"uuid": uid, "type": "SCATTER", "runsCountToCompare": 1000, "metricSectionId": _SECTION,
            "deleted": False, "isGenerated": False, "xaxis": {"key": x[0], "type": x[1]},
            "yaxis": {"key": y[0], "type": y[1]}}


def _line(uid: str, metric: str) -> dict[str, Any]:
    return {"uuid": uid, "type": "LINE", "runsCountToCompare": 1000, "metricSectionId": _SECTION,
            "deleted": False, "isGenerated": False, "metricKey": metric, "lineSmoothness": 0,
            "xAxisScaleType": "linear", "scaleType": "linear", "range": {}, "xAxisKey": "step",
            "selectedXAxisMetricKey": "", "yAxisKey": "metric", "yAxisExpressions": [], "ignoreOutliers": False,
            "useGlobalXaxisKey": True, "useGlobalLineSmoothing": True}


def _image(uid: str, key: str) -> dict[str, Any]:
    return {"uuid": uid, "type": "IMAGE", "runsCountToCompare": 1000, "metricSectionId": _SECTION,
            "deleted": False, "isGenerated": False, "imageKeys": [key], "step": 0}


def compare_view(spec: StudySpec) -> SavedView:
    """The study's view: trials grouped by cell (mean over seeds), kNN / q_B / loss and the runs' descriptions as
    columns, and charts: first the study's figure (each cell's mean with its 95% interval against the swept
    quantity, a line per series in its colour, the verdicts under it), an image of the run the summary logs
    beside the trials (:data:`FIGURE_KEY`); then every trial's kNN vs the swept quantity (when it is a config key,
    i.e. a run param), kNN vs q_B (the NPC regime) and q_B per epoch. Every run is shown (MLflow's default charts
    only the first 10). MLflow lists the summary run, the trials' parent, in a folded group "Additional runs":
    unfolded, its row's Description is the study's verdict."""
    groups = group_tags(spec)
    by_cell = [{"mode": "tag", "groupByData": CELL_TAG}]
    charts = [_image("dcl_figure", FIGURE_KEY)]
    if "." in spec.x_key:  # a config key is a run param; a derived column (num_negatives) is only a tag
        charts.append(_scatter("dcl_knn_vs_x", (spec.x_key, "PARAM"), (M.KNN_TOP1, "METRIC")))
    charts += [_scatter("dcl_knn_vs_q", (M.Q_MEAN, "METRIC"), (M.KNN_TOP1, "METRIC")), _line("dcl_q_curve", M.Q_MEAN)]
    state = {
        # search facets: the trials only (the summary run, named after the study, holds a hundred summary metrics,
        # each of which would get a chart section; a study name is a plain identifier, so no quote to escape)
        "searchFilter": f"attributes.run_name != '{spec.name}'", "orderByKey": "attributes.start_time",
        # oldest first: a grid's trials start in its order, the swept values ascending, so the cells come in x
        # order (newest first listed the last τ first)
        "orderByAsc": True, "startTime": "ALL",
        "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
        # UI state
        "selectedColumns": [_metric_col(M.KNN_TOP1), _metric_col(M.Q_MEAN), _metric_col(M.TRAIN_LOSS),
                            DESCRIPTION_COLUMN],
        # MLflow applies widths only to the columns in columnOrder (and not in the chart view's narrow run list)
        "columnOrder": [NAME_COLUMN], "columnWidths": {NAME_COLUMN: NAME_WIDTH}, "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": charts,
        # the study's section first, kept there (isAccordionReordered, below: MLflow otherwise sorts sections by
        # name and adds one per metric prefix); the metric prefixes' sections start folded
        "compareRunSections": [{"uuid": _SECTION, "name": f"cells: kNN top-1 and q_B ({spec.name})", "display": True,
                                "isReordered": False, "deleted": False, "isGenerated": False},
                               *({"uuid": f"dcl_{n}", "name": n, "display": False, "isReordered": False,
                                  "deleted": False, "isGenerated": True} for n in ("eval", "time", "train"))],
        "viewMaximized": False, "runListHidden": False, "isAccordionReordered": True,  # keep the sections' order
        # every trial in its run colour (a cell's mean would take a colour the browser picks, one per cell)
        "useGroupedValuesInCharts": False, "hideEmptyCharts": True,
        "groupBy": {"aggregateFunction": "average", "groupByKeys": by_cell},
        # cells start unfolded, "Additional runs" (the summary run, the trials' parent) folded: unfolded, its hundred
        # metrics would join the charts (a section each, and a legend entry in the study's charts)
        "groupsExpanded": {},
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }
    return SavedView(VIEW_ID, f"cells: kNN by {' × '.join(groups)}", state)


def runs_view() -> SavedView:
    """The runs table as MLflow shows it by default, plus two columns where a researcher looks first: the runs'
    Description and kNN top-1, right after the run name. Nothing is filtered or grouped, so a study is one row,
    its summary run (named after the study, its trials nested beneath it, folded), whose Description starts
    with ``Verdict: <words>`` and then the verdict lines (:func:`dcl_core.study.tracking.notes.summary_note`).
    The same for every study (no spec): it names only MLflow's columns and the metric every study logs.

    MLflow merges a view's state over its defaults; the defaults are written out anyway so the view reads as what
    it is. ``columnOrder`` lists the columns whose width is set (MLflow ignores a width of a column not in it) and
    moves them to the front in that order."""
    knn = _metric_col(M.KNN_TOP1)
    state = {
        # search facets: MLflow's defaults, no filter (the study's row is its summary run)
        "searchFilter": "", "orderByKey": "attributes.start_time", "orderByAsc": False, "startTime": "ALL",
        "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
        # UI state: MLflow's default table, with the verdict and kNN columns next to the run name
        "selectedColumns": [*DEFAULT_COLUMNS, DESCRIPTION_COLUMN, knn],
        "columnOrder": [NAME_COLUMN, DESCRIPTION_COLUMN, knn],
        "columnWidths": {DESCRIPTION_COLUMN: DESCRIPTION_WIDTH, knn: METRIC_WIDTH},
        "runsHiddenMode": "FIRST_10_RUNS", "viewMaximized": False, "runListHidden": False,
        "isAccordionReordered": False, "useGroupedValuesInCharts": True, "hideEmptyCharts": True,
        "groupBy": None, "groupsExpanded": {},
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }
    return SavedView(RUNS_VIEW_ID, RUNS_VIEW_NAME, state)
