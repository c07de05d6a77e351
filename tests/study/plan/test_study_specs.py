"""Every study script, at every preset and search mode, builds a spec whose every trial is a valid config
(checked before Ray would start), and its CLI rejects what the study does not support with exit code 2."""

import importlib.util
import re
import sys
from pathlib import Path

import pyrun
import pytest

from dcl_core import metric_names as M
from dcl_core.config import CONFIG_KEYS, ConfigError, apply_overrides, to_flat_dict
from dcl_core.study.analysis.measures import BEST_MARGIN
from dcl_core.study.analysis.paper import PAPER
from dcl_core.study.cli.options import args_of, build_parser
from dcl_core.study.execution.results import trial_row
from dcl_core.study.plan.spec import grid_points, trial_tags, tune_experiments, validate_spec
from dcl_core.study.tracking.mlflow_view import compare_view, read_tag
from search_spaces import keys_of

REPO = Path(__file__).resolve().parents[3]
# the papers' studies (the generic sweep's spec needs --key/--values: tests/study/plan/test_own_question.py)
STUDIES = sorted(p.stem for p in (REPO / "studies").glob("*.py") if p.stem not in ("eqco_mi_toy", "sweep"))


def load(name):
    spec = importlib.util.spec_from_file_location(f"study_{name}", REPO / "studies" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def args_for(name, *argv):
    return args_of(build_parser("", name, tuple(load(name).PRESETS)).parse_args(list(argv)))


def presets_of(names):
    return [(n, p) for n in names for p in load(n).PRESETS]


def series_names(spec):
    """The table lines a spec's grid produces, named as the results table names them."""
    names = set()
    for grid in spec.grids:
        for point in grid_points(grid):
            row = trial_row(to_flat_dict(apply_overrides(spec.base, point)), {})
            names.add("+".join(str(row.get(c)) for c in spec.series))
    return names


def test_every_study_is_covered():
    assert set(STUDIES) >= {"temperature_sweep", "batch_size_sweep", "eqco_negatives_sweep", "queue_size_sweep",
                            "dclw_sigma_sweep", "tau_lr_search", "few_epochs", "lr_in_regime"}


@pytest.mark.parametrize(("name", "preset"), presets_of(STUDIES))
def test_questions_and_pairs_name_series_the_grid_produces(name, preset):
    # A question about a series the study never runs would print "not measurable" forever.
    if name == "tau_lr_search":
        return
    spec = load(name).build_spec(args_for(name, "--preset", preset))
    names = series_names(spec)
    assert spec.questions and spec.paper in PAPER
    for q in spec.questions:
        assert q.better in names and (q.base in names or q.statistic is BEST_MARGIN), (q, names)
    for better, base, *_ in spec.pairs or ():
        assert better in names and base in names


ONE_MODE = {("tau_lr_search", "grid"): "Optuna search", ("lr_in_regime", "optuna"): "a grid over base lr"}


@pytest.mark.parametrize(("name", "preset"), presets_of(STUDIES))
@pytest.mark.parametrize("search", ["grid", "optuna"])
def test_presets_build_valid_specs(name, preset, search):
    module = load(name)
    args = args_for(name, "--preset", preset, "--search", search)
    if (name, search) in ONE_MODE:
        with pytest.raises(ConfigError, match=ONE_MODE[name, search]):
            module.build_spec(args)
        return
    spec = module.build_spec(args)
    validate_spec(spec)
    assert (spec.search is not None) == (search == "optuna")
    names = [e.name for e in tune_experiments(spec)]  # raises if two Tune experiments would share a directory
    assert len(set(names)) == len(names) and all(n.startswith(spec.name) for n in names)
    for grid in spec.grids:
        for point in grid_points(grid):
            apply_overrides(spec.base, point)


def test_eqco_study_pairs_each_k_with_and_without_eqco():
    spec = load("eqco_negatives_sweep").build_spec(args_for("eqco_negatives_sweep"))
    simclr, simo = spec.grids
    points = grid_points(simclr)
    assert {(p["loss.num_negatives"], p["loss.alpha"]) for p in points} == {
        (k, a) for k in (4, 16, 63) for a in (None, 256.0)
    }
    assert {p["framework.num_negatives"] for p in grid_points(simo)} == {4, 16, 63}
    # The paper preset caps SiMo's K at the N-1 = 255 other keys of a 256-image batch.
    paper = load("eqco_negatives_sweep").build_spec(args_for("eqco_negatives_sweep", "--preset", "paper"))
    assert max(p["framework.num_negatives"] for p in grid_points(paper.grids[1])) == 255


@pytest.mark.slow  # runs a study script as a subprocess (~15 CPU-s each)
@pytest.mark.parametrize(("name", "argv", "needle"), [
    ("eqco_negatives_sweep", ["--losses", "dcl"], "fixes the loss"),
    ("dclw_sigma_sweep", ["--losses", "dcl"], "dclw only"),
    ("tau_lr_search", ["--search", "grid"], "Optuna search"),
    ("queue_size_sweep", ["--losses", "align_uniform"], "align_uniform"),
    # issue reproductions: every trial run twice (two MLflow runs each); a second value silently winning
    ("temperature_sweep", ["--losses", "infonce,dcl,dcl"], "--losses names dcl twice"),
    ("temperature_sweep", ["--set", "optim.epochs=2", "--set", "optim.epochs=3"], "--set optim.epochs is given twice"),
    # a user loss ending its process as it is built ended the study with status 0 and no line
    ("temperature_sweep", ["--losses", f"dcl,{REPO}/tests/losses/planted_losses.py:ExitsInInit"],
     "ended the check's process (exit status 0)"),
])
def test_unsupported_options_exit_2_with_one_line(tmp_path, name, argv, needle):
    proc = pyrun.run([sys.executable, str(REPO / "studies" / f"{name}.py"), "--smoke", "--output-dir",
                           str(tmp_path), *argv], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr


def test_search_bounds_are_checked_where_a_trial_can_reach_them():
    from dcl_core.config import preset
    from dcl_core.study import StudySpec
    from search_spaces import ALPHA, Choice, Conditional, Grid, LogUniform

    base = preset("smoke")
    bad_sigma = {"dclw.sigma": Conditional("loss.name", ("dclw",), {"loss.sigma": LogUniform(-1.0, 4.0)})}

    def spec(losses, search):
        return StudySpec(name="s", base=base, grid={"loss.name": Grid(losses)}, x_key="loss.temperature",
                         x_label="tau", search=search)

    # EqCo's alpha is checked with loss.name=eqco (the base's dcl would reject any alpha).
    validate_spec(spec(("dcl", "eqco"), ALPHA))
    # A bad range behind a condition no grid point meets is never sampled ...
    validate_spec(spec(("dcl", "infonce"), bad_sigma))
    # ... but is an error as soon as one point (or a sampled condition) can enter it.
    with pytest.raises(ConfigError, match=r"loss\.sigma must be > 0"):
        validate_spec(spec(("dcl", "dclw"), bad_sigma))
    with pytest.raises(ConfigError, match=r"loss\.sigma must be > 0"):
        validate_spec(spec(("dcl",), {"loss.name": Choice(("dcl", "dclw")), **bad_sigma}))


def test_a_search_over_several_sub_grids_names_each_experiment_by_its_sub_grid():
    spec = load("eqco_negatives_sweep").build_spec(args_for("eqco_negatives_sweep", "--search", "optuna"))
    names = [e.name for e in tune_experiments(spec)]
    # One Optuna search per (framework, K): the framework tells SimCLR's K=4 from SiMo's K=4.
    assert names == [f"eqco_negatives_sweep+{fw}-{k}" for fw in ("simclr", "simo") for k in (4, 16, 63)]
    assert [e.point for e in tune_experiments(spec)][:2] == [{"loss.num_negatives": 4}, {"loss.num_negatives": 16}]


@pytest.mark.parametrize("name", STUDIES)
def test_no_experiment_folder_of_a_study_can_be_another_studys(name):
    """Issue reproduction: the Optuna temperature study kept its searches in ``temperature_sweep-dcl``, which is
    also study ``--name temperature_sweep-dcl``'s folder (whose --overwrite deleted it). TuneExperiment folders are the
    study's name or the name + "+" + a suffix, and "+" is not allowed in a study name."""
    from dcl_core.study.plan.spec import check_name

    for search in ("grid", "optuna"):
        try:
            spec = load(name).build_spec(args_for(name, "--search", search))
        except ConfigError:  # a study without that mode
            continue
        for e in tune_experiments(spec):
            assert e.name == spec.name or e.name.startswith(spec.name + "+")
            if e.name != spec.name:
                with pytest.raises(ConfigError):
                    check_name(e.name)  # no study can be named like it


def test_storage_join_keeps_uris_intact():
    from dcl_core.study import storage_join

    assert storage_join("/abs/ray/", "exp") == "/abs/ray/exp"
    assert storage_join("s3://bucket/studies", "exp") == "s3://bucket/studies/exp"
    assert storage_join("s3://bucket/studies/?region=x", "exp") == "s3://bucket/studies/exp?region=x"
    assert storage_join("file:///tmp/r", "exp") == "file:///tmp/r/exp"


def test_asha_is_refused_for_grids_and_resume_keeps_the_original_options(tmp_path):
    from dcl_core.study import StudyOptions, prepare

    spec = load("temperature_sweep").build_spec(args_for("temperature_sweep", "--smoke"))
    with pytest.raises(ConfigError, match="use it with --search optuna"):
        prepare(spec, StudyOptions(tmp_path, asha=True))  # refused before Ray starts
    before = {"tracking_uri": "sqlite:////a.db", "asha": False, "max_failures": 5}
    StudyOptions(tmp_path, tracking_uri="sqlite:////a.db", max_failures=1).check_resume(before)  # may change
    with pytest.raises(ConfigError, match=re.escape("tracking_uri was 'sqlite:////a.db', now 'http://x:5000'")):
        StudyOptions(tmp_path, tracking_uri="http://x:5000").check_resume(before)
    with pytest.raises(ConfigError, match=re.escape("asha was False, now True")):
        StudyOptions(tmp_path, tracking_uri="sqlite:////a.db", asha=True).check_resume(before)


def test_ddp_trials_run_as_many_at_a_time_as_the_cluster_holds():
    from dcl_core.study import Resources
    from dcl_core.study.execution.tuning import ddp_concurrency

    # This machine: 2 CPUs, 2 workers x 0.9 CPU -> one trial at a time.
    assert ddp_concurrency(Resources(2, 0.9), {"CPU": 2.0}) == 1
    assert ddp_concurrency(Resources(2, 1.0), {"CPU": 8.0}) == 4
    # GPUs bind first on a GPU pool: 64 CPUs, 8 GPUs, 4-GPU trials -> 2.
    assert ddp_concurrency(Resources(4, 4.0, 1.0), {"CPU": 64.0, "GPU": 8.0}) == 2
    # An autoscaling cluster whose workers have not started yet still runs one trial (it waits, not 0).
    assert ddp_concurrency(Resources(4, 4.0, 1.0), {"CPU": 0.0}) == 1


@pytest.mark.parametrize(("name", "preset"), presets_of(STUDIES))
@pytest.mark.parametrize("search", ["grid", "optuna"])
def test_the_saved_mlflow_view_groups_by_tags_every_trial_carries(name, preset, search):
    # The view groups runs by tags: one the trials lack would put every run in MLflow's "Unassigned" group.
    if (name, search) in ONE_MODE:
        return
    spec = load(name).build_spec(args_for(name, "--preset", preset, "--search", search))
    view = compare_view(spec)
    tags = trial_tags(spec)
    # the view groups by the "cell" tag every trial run gets, made of the tags naming its cell
    assert view.state["groupBy"]["groupByKeys"] == [{"mode": "tag", "groupByData": "cell"}]
    groups = list(tags.cell)
    searched = keys_of(spec.search) if spec.search else set()
    assert set(groups) <= set(tags) and groups[-1] == "loss" and "seed" not in groups
    assert not {tags[g] for g in groups} & searched  # a searched key differs between a cell's trials
    assert tags.series == spec.series  # a run's colour is its series' in the study's plot
    image, *plotted = view.state["compareRunCharts"]
    assert image["type"] == "IMAGE" and image["imageKeys"] == ["study_figure"]  # the study's figure first
    for chart in plotted:
        axes = [chart["xaxis"], chart["yaxis"]] if chart["type"] == "SCATTER" else [
            {"key": chart["metricKey"], "type": "METRIC"}]
        for axis in axes:
            assert axis["key"] in (CONFIG_KEYS if axis["type"] == "PARAM" else {M.KNN_TOP1, M.Q_MEAN}), axis
    assert view.state["useGroupedValuesInCharts"] is False  # trials in their runs' colours
    _, value = view.tag(now_ms=0)
    assert read_tag(value) == (view.name, view.state) and len(value) < 20_000  # MLflow's experiment tag limit


@pytest.mark.parametrize(("argv", "needle"), [
    # issue reproductions: "--losses names  twice" (the empty name); --num-samples with a grid, ignored silently
    (["--losses", ",,,"], "--losses ',,,' names an empty loss"),
    (["--losses", "dcl,,infonce"], "--losses 'dcl,,infonce' names an empty loss"),
    (["--num-samples", "5"], "^--num-samples is the number of trials of --search optuna"),
])
def test_an_empty_loss_or_samples_for_a_grid_are_refused(argv, needle):
    study = load("temperature_sweep")
    with pytest.raises(ConfigError, match=needle):
        study.build_spec(args_for("temperature_sweep", "--smoke", *argv))
    study.build_spec(args_for("temperature_sweep", "--smoke", "--search", "optuna", "--num-samples", "5"))
