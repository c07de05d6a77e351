"""The saved view a study leaves in MLflow's UI: its trials grouped into the study's cells, with kNN top-1 and
q_B as columns and charts of kNN against the swept quantity and against q_B.

MLflow's UI (3.x) keeps a named view of the runs page as an experiment tag, ``mlflow.sharedViewState.<id>``,
whose value is a JSON envelope ``{"name", "createdAt", "updatedAt", "state"}``; ``state`` is the page's
serialized search facets and UI state, compressed as ``deflate;`` + base64(zlib). The runs page applies it when
the URL carries ``viewStateShareKey=<id>``, and lists it under "Views". The format here is the one MLflow 3.17's
own "Save as new view" writes (read back from a view saved by clicking, then checked in a real browser by
``.ci/check_mlflow_ui.py``); this module only builds the tag, :class:`dcl_core.study.tracking.StudyTracker`
sets it. No MLflow call here, so the UI's format churn stays in this one file.
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from dataclasses import dataclass
from typing import Any

from dcl_core import metrics as M
from dcl_core.study.columns import x_column
from dcl_core.study.spec import StudySpec, trial_tags
from search_spaces import keys_of

VIEW_TAG_PREFIX = "mlflow.sharedViewState."
VIEW_ID = "dcl_compare"  # one view per study experiment, rewritten by every run of the study
_SECTION = "dcl_compare_section"


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


def read_tag(value: str) -> tuple[str, dict[str, Any]]:
    """(name, state) of a view tag's value: the inverse of :meth:`SavedView.tag`, for tests and checks."""
    envelope = json.loads(value)
    packed = envelope["state"]
    if packed.startswith("deflate;"):
        packed = zlib.decompress(base64.b64decode(packed[len("deflate;"):])).decode()
    return envelope["name"], json.loads(packed)


def group_tags(spec: StudySpec) -> list[str]:
    """The trial tags that name a study's cell: each grid key's (the swept quantity first), then ``loss``. The
    seed and searched keys are left out: a cell's trials differ in them."""
    searched = keys_of(spec.search) if spec.search else set()
    tags = [t for t, key in trial_tags(spec).items() if t not in ("loss", "seed") and key not in searched]
    tags.sort(key=lambda t: t != x_column(spec.x_key))
    return [*tags, "loss"]


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


def compare_view(spec: StudySpec) -> SavedView:
    """The study's view: trials grouped by cell (mean over seeds), kNN / q_B / loss as columns, and charts of
    kNN vs the swept quantity (when it is a config key, i.e. a run param), kNN vs q_B (the NPC regime) and
    q_B per epoch. Every run is shown (MLflow's default charts only the first 10)."""
    groups = group_tags(spec)
    charts = []
    if "." in spec.x_key:  # a config key is a run param; a derived column (num_negatives) is only a tag
        charts.append(_scatter("dcl_knn_vs_x", (spec.x_key, "PARAM"), (M.KNN_TOP1, "METRIC")))
    charts += [_scatter("dcl_knn_vs_q", (M.Q_MEAN, "METRIC"), (M.KNN_TOP1, "METRIC")), _line("dcl_q_curve", M.Q_MEAN)]
    state = {
        # search facets: the trials only (the summary run, named after the study, holds a hundred summary metrics,
        # each of which would get a chart section; a study name is a plain identifier, so no quote to escape)
        "searchFilter": f"attributes.run_name != '{spec.name}'", "orderByKey": "attributes.start_time",
        "orderByAsc": False, "startTime": "ALL",
        "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
        # UI state
        "selectedColumns": [_metric_col(M.KNN_TOP1), _metric_col(M.Q_MEAN), _metric_col(M.TRAIN_LOSS)],
        "columnOrder": [], "columnWidths": {}, "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": charts,
        # the study's section first, kept there (isAccordionReordered, below: MLflow otherwise sorts sections by
        # name and adds one per metric prefix); the metric prefixes' sections start folded
        "compareRunSections": [{"uuid": _SECTION, "name": f"cells: kNN top-1 and q_B ({spec.name})", "display": True,
                                "isReordered": False, "deleted": False, "isGenerated": False},
                               *({"uuid": f"dcl_{n}", "name": n, "display": False, "isReordered": False,
                                  "deleted": False, "isGenerated": True} for n in ("eval", "time", "train"))],
        "viewMaximized": False, "runListHidden": False, "isAccordionReordered": True,  # keep the sections' order
        # a grid's charts draw each cell's mean; a search's draw every trial (each sampled its own τ, lr)
        "useGroupedValuesInCharts": spec.search is None, "hideEmptyCharts": True,
        "groupBy": {"aggregateFunction": "average",
                    "groupByKeys": [{"mode": "tag", "groupByData": g} for g in groups]},
        "groupsExpanded": {},
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }
    return SavedView(VIEW_ID, f"cells: kNN by {' × '.join(groups)}", state)
