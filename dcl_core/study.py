"""Run a study: Ray Tune over the core trainer, grids or Optuna searches, MLflow runs, a summary.

A study is a :class:`StudySpec` (base config, grid, optional search space). :func:`run_study` starts (or attaches
to) Ray, runs one Tune experiment per search group, logs one MLflow run per trial from the driver, then writes
the results table, the paper-shaped summary and the plot and logs them as the study's summary run.

The trainable runs one configuration of :func:`dcl_core.training.train`: in-process for one worker, or as a
Ray Train ``TorchTrainer`` with N DDP workers (gloo on CPU, NCCL on GPU) reached from the Tune trial through
``TuneReportCallback``, as Ray 2.5x+ Train V2 expects.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dcl_core.config import CONFIG_KEYS, Config, ConfigError, apply_overrides, derive, from_flat_dict, to_flat_dict
from dcl_core.reporting import Row, format_table, plot, plot_q_hists, robustness, write_table
from search_spaces import Grid, Space, keys_of, to_optuna, to_tune

log = logging.getLogger(__name__)

METRIC = "eval/knn_top1"
CRASH_ENV = "DCL_CRASH_ONCE_AT_EPOCH"  # fault injection for tests: every trial crashes once at this epoch


@dataclass(frozen=True)
class Resources:
    """What one trial uses: ``num_workers`` DDP workers, each with these CPUs/GPUs."""

    num_workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0

    def trial_resources(self) -> dict[str, float]:
        if self.num_workers <= 1:
            return {"cpu": self.cpus_per_worker, "gpu": self.gpus_per_worker}
        return {"cpu": 0.01}  # the trial only drives a TorchTrainer; its workers hold the resources


@dataclass(frozen=True)
class StudySpec:
    """What to run.

    Attributes:
        name: study (and MLflow experiment) name.
        base: the configuration every trial starts from.
        grid: keys run exhaustively (``Grid``) or fixed. A sequence of such spaces runs each as its own
            Tune experiment (e.g. SimCLR's and SiMo's K live in different keys). With a search, one Optuna
            search per grid point.
        search: an Optuna space (``None`` = pure grid).
        num_samples: trials per Optuna search.
        x_key / x_label: the swept quantity for tables and plots: a config key (``loss.temperature``) or a
            results-table column (``num_negatives``, the derived K).
        series: results-table columns whose values name one line of the table/plot (``framework`` +
            ``method`` gives e.g. ``simo+eqco(α=256)``).
        gap: add the DCL − InfoNCE row (Table 1 style) to the table and summary.
    """

    name: str
    base: Config
    grid: Space | Sequence[Space]
    x_key: str
    x_label: str
    search: Space | None = None
    num_samples: int = 1
    log_x: bool = False
    gap: bool = False
    title: str = ""
    series: tuple[str, ...] = ("loss",)

    @property
    def grids(self) -> list[Space]:
        return [self.grid] if isinstance(self.grid, dict) else list(self.grid)


@dataclass
class StudyOutcome:
    rows: list[Row]
    table: str
    summary: dict[str, dict[str, float]]
    files: list[Path] = field(default_factory=list)
    experiment: str = ""
    tracking_uri: str = ""


# ------------------------------------------------------------------------------------------------------------
# Validation (before Ray starts)


def grid_points(grid: Space) -> list[dict[str, Any]]:
    """Every combination of the grid's ``Grid`` values (constants included in each)."""
    points: list[dict[str, Any]] = [{}]
    for key, value in grid.items():
        values = value.values if isinstance(value, Grid) else (value,)
        points = [{**p, key: v} for p in points for v in values]
    return points


def validate_spec(spec: StudySpec) -> None:
    """Apply every grid point, and at each point both ends of every range its search can sample, to the base
    config; ConfigError (one line) if any trial the study could run is invalid."""
    for key in set().union(*map(keys_of, spec.grids)) | (keys_of(spec.search) if spec.search else set()):
        if key not in CONFIG_KEYS:
            raise ConfigError(f"study {spec.name}: unknown config key {key!r} in its space")
    points = [apply_overrides(spec.base, point) for grid in spec.grids for point in grid_points(grid)]
    if spec.search:
        for cfg in points:
            _validate_search(cfg, spec.search, sampled=keys_of(spec.search))


def _validate_search(cfg: Config, space: Space, sampled: set[str]) -> None:
    """Every extreme value ``space`` can give a trial starting from ``cfg``. A conditional branch is checked
    where a trial can enter it: its key is fixed to a matching value, or sampled (then for each match)."""
    from search_spaces import Choice, Conditional, LogUniform

    for key, dist in space.items():
        if isinstance(dist, LogUniform):
            for value in (dist.low, dist.high):
                apply_overrides(cfg, {key: value})
        elif isinstance(dist, Choice | Grid):
            for value in dist.values:
                apply_overrides(cfg, {key: value})
        elif isinstance(dist, Conditional):
            if dist.key in sampled:
                for value in dist.equals:
                    _validate_search(apply_overrides(cfg, {dist.key: value}), dist.params, sampled)
            elif to_flat_dict(cfg)[dist.key] in dist.equals:
                _validate_search(cfg, dist.params, sampled)


# ------------------------------------------------------------------------------------------------------------
# The trainable


def _maybe_crash(trial_dir: Path, epoch: int) -> None:
    at = os.environ.get(CRASH_ENV)
    marker = trial_dir / ".crashed_once"
    if at and epoch == int(at) and not marker.exists():
        marker.write_text("injected")
        raise RuntimeError(f"injected crash at epoch {epoch} ({CRASH_ENV})")


def _run_config(config: dict[str, Any], output_dir: Path, threads: int) -> Config:
    flat = {k: v for k, v in config.items() if k in CONFIG_KEYS}
    flat["output_dir"] = str(output_dir)
    flat["threads"] = threads
    return from_flat_dict(flat)


def trainable(config: dict[str, Any], resources: Resources = Resources(), train_storage: str | None = None) -> None:
    """One study trial: one configuration of the core trainer, reporting every epoch to Tune.

    ``train_storage`` (a path or URI every node reaches, e.g. under the study's Ray storage) holds a DDP
    trial's Ray Train run; Train V2 needs shared storage once workers sit on several nodes.
    """
    from dcl_core import tracking
    from dcl_core.training import NonFiniteLossError, train

    trial_id, trial_dir, work_dir = tracking.trial_context()
    threads = max(1, math.floor(resources.cpus_per_worker))
    if resources.num_workers <= 1:
        cfg = _run_config(config, work_dir / "run", threads)
        resume = tracking.restore_latest_checkpoint(Path(cfg.output_dir))
        last = _LastMetrics(crash_marker=trial_dir)
        try:
            train(cfg, callbacks=[tracking.TuneReporter(), last], resume=resume)
        except NonFiniteLossError as err:
            tracking.report_diverged(last.metrics, str(err))
        return

    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    per_worker: dict[str, float] = {"CPU": resources.cpus_per_worker}
    if resources.gpus_per_worker:
        per_worker["GPU"] = resources.gpus_per_worker
    trainer = TorchTrainer(
        _worker_loop,
        train_loop_config={"config": config, "work_dir": str(work_dir), "threads": threads},
        scaling_config=ScalingConfig(
            num_workers=resources.num_workers,
            use_gpu=resources.gpus_per_worker > 0,
            resources_per_worker=per_worker,
        ),
        # Named per trial so a restarted trial's TorchTrainer resumes from its own checkpoints (Train V2).
        run_config=RunConfig(
            name=f"train-{trial_id}", storage_path=train_storage or str(trial_dir.parent / "_train"),
            callbacks=[TuneReportCallback()],
            # Train V2 keeps every checkpoint by default (Tune's num_to_keep does not reach it); resuming needs
            # only the latest.
            checkpoint_config=CheckpointConfig(num_to_keep=1),
        ),
    )
    trainer.fit()


def _worker_loop(loop_config: dict[str, Any]) -> None:
    """Runs on every Ray Train worker; the process group (gloo/NCCL) is already initialized."""
    import torch.distributed as dist

    from dcl_core import tracking
    from dcl_core.training import NonFiniteLossError, train

    rank = dist.get_rank() if dist.is_initialized() else 0
    # Scratch space (the trial's working directory, created on whichever node the worker runs): rank 0 writes
    # checkpoints, which reach the Train run's storage through the report; other ranks only need a place to
    # receive one when resuming.
    work_dir = Path(loop_config["work_dir"])
    out = work_dir / "run" if rank == 0 else work_dir / "run" / f"rank{rank}"
    cfg = _run_config(loop_config["config"], out, loop_config["threads"])
    resume = tracking.restore_latest_checkpoint(out, in_train_worker=True)
    last = _LastMetrics()
    try:
        train(cfg, callbacks=[tracking.TrainReporter(), last], resume=resume)
    except NonFiniteLossError as err:  # raised on every rank at once (the trainer agrees on it first)
        tracking.report_diverged(last.metrics, str(err), in_train_worker=True)


class _LastMetrics:
    """Epoch callback keeping the last metrics (a diverged trial's final report carries them), and the hook
    of the crash-injection test (:data:`CRASH_ENV`) when given the trial directory to mark."""

    def __init__(self, crash_marker: Path | None = None) -> None:
        self.metrics: dict[str, float] = {}
        self.crash_marker = crash_marker

    def __call__(self, epoch: int, metrics: dict[str, float], checkpoint: Path | None) -> None:
        self.metrics = dict(metrics)
        if self.crash_marker is not None:
            _maybe_crash(self.crash_marker, epoch)


# ------------------------------------------------------------------------------------------------------------
# Ray


def init_ray(address: str | None, num_cpus: int | None, num_gpus: int | None = None) -> None:
    """Local loopback Ray with only the given CPUs, or attach to a cluster (``--address`` / ``ray job submit``)."""
    import ray

    # Every epoch reports a checkpoint, which forces an experiment snapshot; that is intended here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    if ray.is_initialized():
        return
    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address or None, log_to_driver=True)
        return
    # address="local": always a fresh private instance. With address=None Ray would attach to whatever cluster
    # was last started on this machine (/tmp/ray/ray_current_cluster) and then refuse num_cpus.
    ray.init(
        address="local", num_cpus=num_cpus or os.cpu_count() or 1, num_gpus=num_gpus, include_dashboard=False,
        _node_ip_address="127.0.0.1", log_to_driver=True,
    )


_SHORT = {"loss.name": "", "framework.name": "", "loss.temperature": "t", "optim.batch_size": "b", "seed": "s",
          "loss.num_negatives": "K", "framework.num_negatives": "K", "framework.queue_size": "Q", "loss.alpha": "a",
          "loss.sigma": "sig", "optim.epochs": "ep", "optim.base_lr": "lr"}


def _trial_name(trial: Any, keys: tuple[str, ...] = ("loss.name", "loss.temperature", "optim.batch_size",
                                                      "seed")) -> str:
    """``dcl_t0.1_b32_s0_<id>``: the values of the keys the study varies (and the trial id)."""
    c = trial.config
    parts = [f"{_SHORT.get(k, k.rsplit('.', 1)[-1])}{c.get(k):g}" if isinstance(c.get(k), float)
             else f"{_SHORT.get(k, k.rsplit('.', 1)[-1])}{c.get(k)}" for k in keys]
    return "_".join(parts) + f"_{trial.trial_id}"


def _varied_keys(spec: StudySpec) -> tuple[str, ...]:
    keys = ["loss.name"]
    for grid in spec.grids:
        keys += [k for k, v in grid.items() if isinstance(v, Grid) or k == "framework.name"]
    keys += sorted(keys_of(spec.search)) if spec.search else []
    return tuple(dict.fromkeys(keys))


def storage_join(storage: str, name: str) -> str:
    """``storage/name`` for a local path or a URI (``s3://``, ``gs://``, ``file://``), keeping a URI's query
    (``s3://b/p?region=x`` -> ``s3://b/p/name?region=x``); pathlib would fold ``s3://`` into a folder ``s3:``."""
    from urllib.parse import urlsplit, urlunsplit

    if "://" not in storage:
        return f"{storage.rstrip('/')}/{name}"
    parts = urlsplit(storage)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{name}"))


def _absolute_storage(storage: str) -> str:
    """A URI as given; a local path made absolute (Tune runs each trial in its own working directory)."""
    return storage if "://" in storage else str(Path(storage).expanduser().resolve())


def _storage_exists(uri: str) -> bool:
    import pyarrow.fs

    fs, path = pyarrow.fs.FileSystem.from_uri(uri)
    return fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound


def _storage_delete(uri: str) -> None:
    import pyarrow.fs

    fs, path = pyarrow.fs.FileSystem.from_uri(uri)
    fs.delete_dir(path)


@dataclass(frozen=True)
class _Experiment:
    """One Tune experiment of a study: a sub-grid, the grid point an Optuna search is pinned to (``{}`` for a
    grid experiment, which runs the whole sub-grid), and its name."""

    grid: Space
    point: dict[str, Any]
    name: str


def _experiments(spec: StudySpec) -> list[_Experiment]:
    """Grid mode: one experiment per sub-grid. Search mode: one Optuna search per grid point. With several
    sub-grids, each name carries the constants that tell its sub-grid apart (e.g. ``simclr`` / ``simo``)."""
    grids = spec.grids
    labels = []
    for i, g in enumerate(grids):
        constants = {k: v for k, v in g.items() if not isinstance(v, Grid)}
        distinct = {k: v for k, v in constants.items() if any(o.get(k) != v for o in grids if o is not g)}
        labels.append(distinct or ({"part": i} if len(grids) > 1 else {}))
    out = []
    for g, label in zip(grids, labels, strict=True):
        points = [{}] if spec.search is None else [
            {k: v for k, v in p.items() if isinstance(g.get(k), Grid)} for p in grid_points(g)]
        for point in points:
            suffix = "-".join(str(v) for v in {**label, **point}.values())
            out.append(_Experiment(g, point, f"{spec.name}-{suffix}" if suffix else spec.name))
    names = [e.name for e in out]
    if len(set(names)) != len(names):  # two Tuners in one directory would restore each other's trials
        raise ConfigError(f"study {spec.name}: experiments share a name ({', '.join(names)}); make sub-grids differ")
    return out


def run_study(
    spec: StudySpec,
    output_dir: Path,
    *,
    resources: Resources = Resources(),
    tracking_uri: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    storage: str | None = None,
    max_concurrent: int | None = None,
    asha: bool = False,
    max_failures: int = 2,
    seed: int = 0,
    address: str | None = None,
    num_cpus: int | None = None,
    save_checkpoint_artifact: bool = False,
) -> StudyOutcome:
    """Run (or resume) the study and return its table and summary. Validates everything before Ray starts."""
    from dcl_core import tracking

    validate_spec(spec)
    if asha and spec.search is None:
        raise ConfigError("--asha stops trials early, which would cut cells of a grid sweep short; use it with "
                          "--search optuna")
    if asha and spec.base.eval.knn_every != 1:
        # ASHA compares trials at intermediate epochs: they need a fresh kNN accuracy every epoch.
        log.info("ASHA: measuring kNN every epoch (eval.knn_every %d -> 1)", spec.base.eval.knn_every)
        spec = with_base(spec, {"eval.knn_every": 1})
    output_dir = output_dir.expanduser().resolve()
    storage_path = _absolute_storage(storage) if storage else str(output_dir / "ray_results")
    tracking_uri = tracking_uri or tracking.default_tracking_uri(output_dir)
    experiments = _experiments(spec)
    exp_uris = [storage_join(storage_path, e.name) for e in experiments]
    existing = [u for u in exp_uris if _storage_exists(u)]
    if existing and not (resume or overwrite):
        raise ConfigError(f"study output exists at {existing[0]}; pass --resume to continue it or --overwrite")
    if resume and not existing:
        raise ConfigError(f"nothing to resume at {exp_uris[0]}")
    options = {"tracking_uri": tracking_uri, "storage": storage_path, "asha": asha, "workers": resources.num_workers,
               "save_checkpoints": save_checkpoint_artifact}
    options_file = summary_dir(output_dir, spec.name) / "study_options.json"
    if resume:
        _check_resume_options(options_file, options)
    output_dir.mkdir(parents=True, exist_ok=True)
    if overwrite and not resume:
        for uri in existing:
            _storage_delete(uri)
        tracking.delete_runs(tracking_uri, spec.name)  # the old trials' runs would mix with the new ones
    options_file.parent.mkdir(parents=True, exist_ok=True)
    options_file.write_text(json.dumps(options, indent=1))

    init_ray(address, num_cpus)
    if resources.num_workers > 1 and max_concurrent is None:
        import ray

        max_concurrent = ddp_concurrency(resources, ray.cluster_resources())
        log.info("DDP trials: at most %d at a time (%d workers each; --max-concurrent to change)", max_concurrent,
                 resources.num_workers)
    tracking.ensure_experiment(tracking_uri, spec.name, artifact_root=output_dir / "mlartifacts")
    tags = {"study": spec.name, "git_commit": tracking.git_commit()}

    rows: list[Row] = []
    for experiment in experiments:
        results = _run_group(spec, experiment, storage_path, resources, tracking_uri, tags, resume, max_concurrent,
                             asha, max_failures, seed, save_checkpoint_artifact)
        rows.extend(_rows(results))
    return _summarize(spec, rows, output_dir, tracking_uri, tags)


def _check_resume_options(path: Path, options: dict[str, Any]) -> None:
    """A resumed Tune experiment keeps the callbacks and scheduler it was pickled with, so a resume must not
    change where results go or how trials are stopped; ConfigError naming the first difference."""
    if not path.exists():
        return
    before = json.loads(path.read_text())
    for key, value in options.items():
        if key in before and before[key] != value:
            raise ConfigError(f"--resume must use the options the study started with: {key} was "
                              f"{before[key]!r}, now {value!r}")


def ddp_concurrency(resources: Resources, cluster: dict[str, float]) -> int:
    """How many DDP trials fit ``cluster`` (``ray.cluster_resources()``) at once, at least 1. A DDP trial
    reserves almost nothing itself (its TorchTrainer's workers hold the resources), so without this cap Tune
    would start every trial, each TorchTrainer would wait for workers, and an Optuna search would suggest all
    its trials blind."""
    fits = cluster.get("CPU", 0.0) // (resources.num_workers * resources.cpus_per_worker)
    if resources.gpus_per_worker:
        fits = min(fits, cluster.get("GPU", 0.0) // (resources.num_workers * resources.gpus_per_worker))
    return max(1, int(fits))


def _run_group(spec, experiment, storage_path, resources, tracking_uri, tags, resume, max_concurrent, asha,
               max_failures, seed, save_artifact):
    from ray import tune

    from dcl_core import tracking

    grid, point = experiment.grid, experiment.point
    exp_uri = storage_join(storage_path, experiment.name)
    base_flat = to_flat_dict(spec.base)
    searched = keys_of(spec.search) if spec.search else set()
    if spec.search is None:
        param_space = {**base_flat, **to_tune(grid)}
        search_alg = None
        num_samples = 1
    else:
        from optuna.samplers import TPESampler
        from ray.tune.search.optuna import OptunaSearch

        constants = {k: v for k, v in {**base_flat, **grid_points(grid)[0], **point}.items()
                     if k not in searched}
        param_space = {}
        # TPE models the trials after its random start-up ones; with the small CPU budgets that start-up
        # phase (Optuna's default: 10) would be the whole search.
        sampler = TPESampler(seed=seed, n_startup_trials=max(2, min(10, spec.num_samples // 2)))
        search_alg = OptunaSearch(space=to_optuna(spec.search, constants), metric=METRIC, mode="max",
                                  sampler=sampler)
        num_samples = spec.num_samples
    scheduler = None
    if asha:
        from ray.tune.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(time_attr="training_iteration", max_t=spec.base.optim.epochs,
                                  grace_period=max(1, spec.base.optim.epochs // 4), reduction_factor=2)
    callback = tracking.StudyMLflowCallback(
        tracking_uri, spec.name, tags, tag_keys={"loss": "loss.name", "seed": "seed"}, save_artifact=save_artifact,
        storage=storage_path,
    )
    fn = tune.with_resources(
        tune.with_parameters(trainable, resources=resources, train_storage=storage_join(exp_uri, "_train")),
        resources.trial_resources(),
    )
    # A study of several experiments may have been killed before its later ones started: those start afresh.
    if resume and tune.Tuner.can_restore(exp_uri):
        tuner = tune.Tuner.restore(exp_uri, trainable=fn, resume_unfinished=True, resume_errored=True)
    else:
        tuner = tune.Tuner(
            fn,
            param_space=param_space,
            tune_config=tune.TuneConfig(
                metric=METRIC, mode="max", search_alg=search_alg, scheduler=scheduler, num_samples=num_samples,
                max_concurrent_trials=max_concurrent,
                trial_name_creator=functools.partial(_trial_name, keys=_varied_keys(spec)),
                trial_dirname_creator=functools.partial(_trial_name, keys=_varied_keys(spec)),
            ),
            run_config=tune.RunConfig(
                name=experiment.name, storage_path=storage_path,
                failure_config=tune.FailureConfig(max_failures=max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                callbacks=[callback], verbose=1,
            ),
        )
    return tuner.fit()


def summary_dir(output_dir: Path, study: str) -> Path:
    """Where a study's table, plots and Parquet go: one folder per study, so studies sharing an output
    directory (and its MLflow store) never overwrite each other's summaries."""
    return output_dir / "summary" / study


def _derived(c: dict[str, Any]) -> tuple[int | None, float | None]:
    """(K, α actually used) of a trial's configuration, from the one place that derives them."""
    try:
        d = derive(from_flat_dict({k: v for k, v in c.items() if k in CONFIG_KEYS}))
    except (ConfigError, TypeError, ValueError):
        return None, None
    return d.num_negatives, d.eqco_alpha


def _method(c: dict[str, Any]) -> str | None:
    """The loss as a table label; EqCo names its α (``eqco(α=K)`` is InfoNCE over the same K negatives)."""
    loss = c.get("loss.name")
    if loss != "eqco":
        return loss
    alpha = c.get("loss.alpha")
    return f"eqco(α={'K' if alpha is None else format(alpha, 'g')})"


def _rows(results: Any) -> list[Row]:
    rows = []
    for result in results:
        c, m = result.config or {}, result.metrics or {}
        k, alpha_used = _derived(c)
        status = "error" if result.error else ("diverged" if m.get("diverged") else "ok")
        best = math.nan
        df = result.metrics_dataframe
        if df is not None and METRIC in df:
            best = float(df[METRIC].max())
        knn = m.get(METRIC)
        rows.append({
            "trial_id": m.get("trial_id") or "",
            "status": status,
            "loss": c.get("loss.name"),
            "framework": c.get("framework.name"),
            "method": _method(c),
            "temperature": c.get("loss.temperature"),
            "batch_size": c.get("optim.batch_size"),
            "base_lr": c.get("optim.base_lr"),
            "sigma": c.get("loss.sigma"),
            "alpha": c.get("loss.alpha"),
            "alpha_used": alpha_used,
            "num_negatives": k,
            "queue_size": c.get("framework.queue_size"),
            "seed": c.get("seed"),
            "epoch_budget": c.get("optim.epochs"),
            "epochs": m.get("epoch"),
            "knn_top1": None if knn is None or (isinstance(knn, float) and math.isnan(knn)) else knn,
            "best_knn_top1": None if math.isnan(best) else best,
            "train_loss": m.get("train/loss"),
            "q_mean": m.get("train/q_mean"),
            "q_cv": m.get("train/q_cv"),
            "mi_bound": m.get("train/mi_bound"),
            "grad_norm_mean": m.get("train/grad_norm_mean"),
            "grad_norm_cv": m.get("train/grad_norm_cv"),
            "q_hist": m.get("train/q_hist"),
            "images_per_s": m.get("train/images_per_s"),
            "error": str(result.error).splitlines()[0][:300] if result.error else None,
            "config": c,  # not a table column: the search report reads the sampled values from it
        })
    return rows


_X_COLUMN = {"loss.temperature": "temperature", "optim.batch_size": "batch_size", "optim.base_lr": "base_lr",
             "loss.sigma": "sigma", "loss.alpha": "alpha", "optim.epochs": "epoch_budget",
             "framework.queue_size": "queue_size", "loss.num_negatives": "num_negatives",
             "framework.num_negatives": "num_negatives"}


def _summarize(spec: StudySpec, rows: list[Row], output_dir: Path, tracking_uri: str,
               tags: dict[str, str]) -> StudyOutcome:
    from dcl_core import tracking

    x = _X_COLUMN.get(spec.x_key, spec.x_key)
    for r in rows:
        r["series"] = "+".join(str(r.get(c)) for c in spec.series)
    out_dir = summary_dir(output_dir, spec.name)
    parquet, csv = write_table(rows, out_dir)
    shown = rows
    if spec.search:
        from dcl_core.search_report import best_per_cell, format_trials

        searched = {_X_COLUMN.get(k, k) for k in keys_of(spec.search)}
        if x in searched:  # every trial has its own x: list the trials instead of a cell table
            table = format_trials(rows, spec.search)
        else:  # cells of a grid key (e.g. batch size): each cell's tuned (best) trial
            shown = best_per_cell(rows, x)
            table = format_table(shown, x, spec.x_label, gap=spec.gap, series="series")
    else:
        table = format_table(rows, x, spec.x_label, gap=spec.gap, series="series")
    png = plot(shown, x, spec.x_label, out_dir / f"{spec.name}.png", spec.title or spec.name, log_x=spec.log_x,
               series="series")
    files = [parquet, csv, png, out_dir / "table.txt"]
    q_png = plot_q_hists(rows, x, spec.x_label, out_dir / "npc_q_hist.png", series="series")
    if q_png is not None:
        files.append(q_png)
    if spec.search:
        from dcl_core.search_report import format_best, write_search_plots

        table += "\n\n" + format_best(rows, spec.search)
        files += write_search_plots(rows, spec.search, out_dir)
    (out_dir / "table.txt").write_text(table + "\n")
    rob = robustness(shown, x, series="series")
    metrics = {f"{name}/{k}": v for name, stats in rob.items() for k, v in stats.items()}
    if spec.gap:
        from dcl_core.reporting import all_gaps

        for prefix, g in all_gaps(shown, x, series="series").items():
            metrics |= {f"gap_dcl_minus_infonce/{prefix + '_' if prefix else ''}{x}_{k}": v for k, v in g.items()}
    metrics["trials"] = len(rows)
    metrics["trials_failed"] = sum(r["status"] != "ok" for r in rows)
    tracking.log_summary_run(tracking_uri, spec.name, f"{spec.name}-summary", metrics, files, tags)
    return StudyOutcome(rows, table, rob, [parquet, csv, png, *files[3:]], spec.name, tracking_uri)


def with_base(spec: StudySpec, overrides: dict[str, Any]) -> StudySpec:
    """The same study with overrides applied to its base config (validated)."""
    return replace(spec, base=apply_overrides(spec.base, overrides))


def summary_lines(outcome: StudyOutcome, output_dir: Path) -> Sequence[str]:
    return [
        outcome.table,
        "",
        f"results: {outcome.files[0]} (+ .csv)",
        f"plot:    {outcome.files[2]}",
        f"MLflow:  experiment {outcome.experiment!r} at {outcome.tracking_uri}",
        f"         browse: mlflow ui --backend-store-uri {outcome.tracking_uri} --host 127.0.0.1",
    ]
