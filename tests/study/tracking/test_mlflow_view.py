"""The study's saved MLflow view and the trial tags it relies on (pure: no MLflow call; the real UI is
``test_mlflow_ui.py``'s)."""

from dcl_core import metric_names as M
from dcl_core.config import preset
from dcl_core.study import StudySpec
from dcl_core.study.analysis.colours import series_colour
from dcl_core.study.analysis.columns import cell_label
from dcl_core.study.plan.spec import trial_tags
from dcl_core.study.tracking.mlflow_view import (
    CELL_TAG,
    DEFAULT_COLUMNS,
    DESCRIPTION_COLUMN,
    FIGURE_KEY,
    NAME_COLUMN,
    RUN_COLOR_TAG,
    RUNS_VIEW_ID,
    VIEW_TAG_PREFIX,
    compare_view,
    group_tags,
    read_tag,
    runs_view,
    runs_view_query,
    trial_look,
    view_query,
)
from search_spaces import TAU, Grid


def tau_spec(**kw) -> StudySpec:
    return StudySpec(name="tau", base=preset("smoke"), grid={"loss.name": Grid(("infonce", "dcl")),
                                                            "loss.temperature": Grid((0.07, 0.5)),
                                                            "seed": Grid((0, 1))},
                     x_key="loss.temperature", x_label="tau", **kw)


def test_the_view_groups_by_one_compact_cell_tag_and_charts_every_trial():
    state = compare_view(tau_spec()).state
    assert state["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": CELL_TAG}]
    # charts draw trials, in their runs' colours (a group's colour is the browser's to pick)
    assert state["useGroupedValuesInCharts"] is False
    # first the study's figure (an image the summary logs on a run of its own), then the trials' charts
    image, first = state["compareRunCharts"][:2]
    assert image["type"] == "IMAGE" and image["imageKeys"] == [FIGURE_KEY]
    assert first["type"] == "SCATTER" and first["xaxis"] == {"key": "loss.temperature", "type": "PARAM"}
    assert first["yaxis"]["key"] == M.KNN_TOP1
    # the verdict column, and a name column wide enough for "Group: dcl τ=0.07" (MLflow sizes only listed columns)
    assert DESCRIPTION_COLUMN in state["selectedColumns"]
    assert NAME_COLUMN in state["columnOrder"] and state["columnWidths"][NAME_COLUMN] >= 240
    assert state["groupsExpanded"] == {}  # "Additional runs" (the summary) folded: its metrics stay out of charts
    assert compare_view(tau_spec()).name == "cells: kNN by temperature × loss"


def test_a_search_groups_by_the_cell_without_its_searched_keys():
    spec = StudySpec(name="s", base=preset("smoke"), grid={"loss.name": Grid(("infonce", "dcl")),
                                                          "optim.batch_size": Grid((16, 32))},
                     x_key="optim.batch_size", x_label="batch", search=TAU)
    tags = trial_tags(spec)
    assert "temperature" in tags and tags.cell == ("batch_size", "loss") == tuple(group_tags(spec))
    assert compare_view(spec).state["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "cell"}]


def test_a_trial_runs_cell_and_colour():
    tags = trial_tags(tau_spec())
    assert tags.cell == ("temperature", "loss") and tags.series == ("loss",)
    values = {"loss": "dcl", "seed": "1", "temperature": "0.07"}
    assert trial_look(values, tags.cell, "dcl") == {CELL_TAG: "dcl τ=0.07", RUN_COLOR_TAG: series_colour("dcl")}
    assert trial_look(values, (), "infonce") == {RUN_COLOR_TAG: "#ff7f0e"}  # no cell tags: no cell tag


def test_a_cell_label_names_the_loss_and_framework_by_value_the_rest_by_symbol():
    assert cell_label({"num_negatives": "16", "framework": "simclr", "alpha": "256.0", "loss": "eqco"}) == (
        "simclr eqco K=16 α=256.0")
    assert cell_label({"batch_size": 16, "loss": "dcl"}) == "dcl batch=16"
    assert cell_label({"temperature": 1.0, "loss": "infonce"}) == "infonce τ=1"
    assert cell_label({"momentum": 0.99}) == "momentum=0.99"  # not a column: its own name


def test_the_runs_view_is_mlflows_table_with_the_verdict_and_knn_beside_the_run_name():
    # What the printed runs: URL opens: MLflow's own table (3.17 hides Description by default, so a study's row
    # showed no verdict), plus the Description and kNN columns, first after the run name.
    view = runs_view()
    state = view.state
    knn = f"metrics.`{M.KNN_TOP1}`"
    assert view.id == RUNS_VIEW_ID == "dcl_runs" and view.name == "study: verdict and kNN"
    assert state["selectedColumns"] == [*DEFAULT_COLUMNS, DESCRIPTION_COLUMN, knn]  # MLflow's defaults kept
    assert state["columnOrder"] == [NAME_COLUMN, DESCRIPTION_COLUMN, knn]
    # widths count only for the columns in columnOrder: the Description cell's 50 characters and "..." whole
    assert set(state["columnWidths"]) <= set(state["columnOrder"])
    assert state["columnWidths"][DESCRIPTION_COLUMN] >= 360 and state["columnWidths"][knn] >= 120
    # nothing filtered or grouped: the summary run is the study's row, its trials nested (folded) beneath it
    assert state["searchFilter"] == "" and state["groupBy"] is None and state["lifecycleFilter"] == "Active"
    assert "runsExpanded" not in state  # not part of a shared view: MLflow would drop it anyway
    assert "compareRunCharts" not in state  # the table; a chart view would get MLflow's own charts


def test_the_runs_view_round_trips_through_its_tag_and_has_its_own_url():
    key, value = runs_view().tag(now_ms=1)
    assert key == VIEW_TAG_PREFIX + "dcl_runs"
    assert read_tag(value) == ("study: verdict and kNN", runs_view().state)
    assert runs_view_query() == "viewStateShareKey=dcl_runs"  # no compareRunsMode: MLflow opens the table
    assert view_query() == "viewStateShareKey=dcl_compare&compareRunsMode=CHART"  # the compare URL's, unchanged
    assert runs_view().tag()[0] != compare_view(tau_spec()).tag()[0]  # two views, side by side
