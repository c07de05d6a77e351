"""Run a study: validate, start (or attach to) Ray, run one Tune experiment per search group with MLflow
logging from the driver, then summarize. Resume (``Tuner.restore``), overwrite and DDP concurrency live here.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import ray
from optuna.samplers import TPESampler
from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.optuna import OptunaSearch

from dcl_core import metric_names as M
from dcl_core.config import ConfigError, loss_label, to_flat_dict
from dcl_core.study import tracking
from dcl_core.study.analysis.columns import Row, short_name
from dcl_core.study.execution import (
    console,
    memory_loss,
    ray_env,
    ray_session,
    state_signature,
    stop_signals,
    trial_failures,
    tune_state,
)
from dcl_core.study.execution.results import StudyOutcome, summarize, tune_rows
from dcl_core.study.execution.space_translation import to_optuna, to_tune
from dcl_core.study.execution.trainable import trainable
from dcl_core.study.plan.prepared import PreparedStudy
from dcl_core.study.plan.record import (
    check_same_script,
    check_same_study,
    read_options,
    recorded_rounds,
    span,
    spec_fingerprint,
    write_record,
)
from dcl_core.study.plan.run_options import Resources, StudyOptions
from dcl_core.study.plan.spec import (
    StudyInterruptedError,
    StudySpec,
    TuneExperiment,
    grid_points,
    grid_seeds,
    num_grid_points,
    round_experiments,
    trial_tags,
    varied_keys,
)
from dcl_core.study.plan.storage import (
    OPTIONS_FILE,
    OPTUNA_DB,
    check_no_links,
    storage_delete,
    storage_exists,
    storage_join,
    study_entries,
    study_lock,
    summary_dir,
)
from dcl_core.study.tracking import mlflow_view
from search_spaces import keys_of

log = logging.getLogger(__name__)
STARTUP_TIMEOUT = "timed out during startup"  # Ray's error when a new node's raylet does not register in 30 s


def init_ray(address: str | None, num_cpus: int | None, num_gpus: int | None = None,
             quiet: bool = False, py_modules: list[str] | None = None) -> str | None:
    """Local loopback Ray with only the given CPUs, or attach to a cluster (``--address`` / ``ray job submit``).
    The trials' warnings reach the console either way; ``quiet`` leaves out Ray's own start-up messages. Returns
    the session folder of a local instance this call started (``None`` otherwise). Ctrl-C and SIGTERM stop it at
    any moment as they stop the study (:mod:`.stop_signals`). ``py_modules``: what a cluster's nodes import that
    only this driver has (:func:`.ray_env.user_modules`), shipped with Ray's runtime_env; a local instance's
    workers share the driver's machine and need none."""
    levels: dict[str, Any] = {"logging_level": logging.WARNING} if quiet else {}
    # Every epoch reports a checkpoint, which forces an experiment snapshot; that is intended here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    if ray.is_initialized():
        return None
    # Every worker of the study (trials, Ray Train workers, Tune's helpers) quiets its exit first; under `ray job
    # submit` this merges with the job's runtime_env (its working_dir).
    setup: dict[str, Any] = {
        "log_to_driver": True, "runtime_env": {"worker_process_setup_hook": ray_env.HOOK}, **levels,
    }
    # a stop while ray.init is blocked in C (its GCS ended by a signal to the whole process group) ends the study
    # from another thread: what this process's Ray started goes first (its processes have had their SIGTERM)
    with stop_signals.keep_stop_signals(cleanup=functools.partial(ray_session.end_own, grace=1.0)):
        if address or os.environ.get("RAY_ADDRESS"):
            if py_modules:
                setup["runtime_env"]["py_modules"] = py_modules
            try:
                ray.init(address=address or None, **setup)
            except (ConnectionError, ray.exceptions.AuthenticationError) as err:
                raise ConfigError(_attach_refused(address or os.environ.get("RAY_ADDRESS", ""), err)) from None
            return None
        # address="local": always a fresh private instance. With address=None Ray would attach to whatever cluster
        # was last started on this machine (/tmp/ray/ray_current_cluster) and then refuse num_cpus.
        local = {"address": "local", "num_cpus": num_cpus or os.cpu_count() or 1, "num_gpus": num_gpus,
                 "include_dashboard": False, "_node_ip_address": "127.0.0.1", **setup}
        # the agents ray.shutdown leaves; an exit that ends Ray (a stopped or failed study) prints no line of Ray's
        ray_session.end_own_at_exit(trial_failures.shutdown_quietly if quiet else ray.shutdown)
        try:
            context = ray.init(**local)
        except Exception as e:  # Ray raises a bare Exception for it
            if STARTUP_TIMEOUT not in str(e):
                raise
            # Ray gives a new node's raylet a fixed 30 s to register with its GCS; a machine busy with other
            # work can miss that once. One more try, on a new instance (the first one's processes are stopped).
            log.warning("the local Ray instance did not start within Ray's 30 s (a busy machine?); trying once "
                        "more")
            ray.shutdown()
            ray_session.end_own()  # the failed start's GCS and raylet
            context = ray.init(**local)
        ray_env.protect_token_file()  # the token a new local instance may just have written
    # ray.init's RayContext (typed as its base class) holds address_info, as Ray's ray.init documentation shows
    return str(context.address_info["session_dir"])  # type: ignore[attr-defined]


def _attach_refused(address: str, err: BaseException) -> str:
    """One line for a cluster that answered but would not take this driver: its token (the usual cause: the cluster
    asks for one and this shell has none, or another) or whatever Ray said."""
    causes: list[BaseException] = []
    while err is not None and len(causes) < 8:  # Ray chains them: ConnectionError < RuntimeError (< its cause)
        causes.append(err)
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    # Ray keeps the GCS client's AuthenticationError only as text inside the RuntimeError it chains
    said = " ".join(str(c) for c in causes)
    if any(isinstance(c, ray.exceptions.AuthenticationError) for c in causes) or "InvalidAuthToken" in said \
            or "AuthenticationError" in said:
        return (f"the Ray cluster at {address} refused this driver's token (or its lack of one): give it the "
                "cluster's token, RAY_AUTH_MODE=token with ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN "
                "(docs/cluster.md)")
    first = str(causes[0]).strip().splitlines()
    return f"could not attach to the Ray cluster at {address}: {first[0] if first else type(causes[0]).__name__}"




def ddp_concurrency(resources: Resources, cluster: dict[str, float]) -> int:
    """How many DDP trials fit ``cluster`` (``ray.cluster_resources()``) at once, at least 1. A DDP trial
    reserves almost nothing itself (its TorchTrainer's workers hold the resources), so without this cap Tune
    would start every trial, each TorchTrainer would wait for workers, and an Optuna search would suggest all
    its trials blind."""
    fits = cluster.get("CPU", 0.0) // (resources.num_workers * resources.cpus_per_worker)
    if resources.gpus_per_worker:
        fits = min(fits, cluster.get("GPU", 0.0) // (resources.num_workers * resources.gpus_per_worker))
    return max(1, int(fits))


def run_study(study: PreparedStudy) -> StudyOutcome:
    """Run (or resume) the prepared study (:func:`~dcl_core.study.plan.prepared.prepare`: checked before Ray
    starts) and return its table and summary.

    Raises:
        ConfigError: bad input found under the study's lock (one line), before Ray starts.
        StudyInterruptedError: Ctrl-C stopped it; the finished trials and every checkpoint are kept for --resume.
    """
    spec, options, exps, local = study.spec, study.options, list(study.experiments), study.local
    storage, tracking_uri = study.storage, study.tracking_uri  # still set after the replace() below
    state_signature.require_key()  # its state and record are signed: unsigned, no resume could read them
    if options.verbosity < console.VERBOSE:  # before the first read of Tune's state (a resume's checks)
        tune_state.quiet_tune_restore_advice()
        trial_failures.quiet_tune_failures()  # a failed trial: one line, not Tune's traceback
    # Ray's own lines (its raylet's reports, its C++ log and crash lines) stay off the console (not with -v)
    with study_lock(options.output_dir, spec.name), trial_failures.quiet_ray_lines(options.verbosity < console.VERBOSE):
        existing = [u for u in (storage_join(storage, e.name) for e in exps) if storage_exists(u)]
        rounds = _prepare_output(spec, options, exps, existing)
        exps = round_experiments(exps, rounds)
        check_no_links(options.output_dir, study_entries(spec.name, (e.name for e in exps)))
        if options.resume:
            _check_restorable([u for u in (storage_join(storage, e.name) for e in exps) if storage_exists(u)])

        console.starting(spec.name, sum(_trials_of(spec, e) for e in exps), options.verbosity, options.resume)
        if local:  # what a driver killed by kill -9 or the OOM killer left of this study's own Ray
            ray_session.end_dead_session(options.output_dir, spec.name)
        modules = ray_env.user_modules([s.name for s in spec.loss_sources])
        session = init_ray(options.address, options.num_cpus, quiet=options.verbosity < console.VERBOSE,
                           py_modules=modules)
        if session is not None:
            ray_session.record_session(options.output_dir, spec.name, session)
        if options.verbosity < console.VERBOSE:
            logging.getLogger("mlflow").setLevel(logging.WARNING)  # its store's set-up messages
        if not local:
            _warn_if_cluster_too_small(options.resources, ray.cluster_resources())
        if options.workers > 1 and options.max_concurrent is None:
            options = replace(options, max_concurrent=ddp_concurrency(options.resources, ray.cluster_resources()))
            log.info("DDP trials: at most %d at a time (%d workers each; --max-concurrent to change)",
                     options.max_concurrent, options.workers)
        tracker = tracking.StudyTracker(tracking_uri, spec.name,
                                        artifact_root=options.output_dir / "mlartifacts",
                                        tags={"study": spec.name, "git_commit": tracking.git_commit()},
                                        journal_dir=study.summary_dir,
                                        description=spec.description,
                                        experiment_tags=dict([mlflow_view.compare_view(spec).tag()]))
        tracker.open(overwrite=options.overwrite)  # --overwrite: the old trials' runs would mix with the new ones
        rows: list[Row] = []
        progress = {"total": sum(_trials_of(spec, e) for e in exps), "done": 0, "started": time.time()}
        tune_state.DISK_FULL.clear()
        for experiment in exps:
            results = _run_tune_experiment(spec, experiment, options, tracker, progress)
            progress["done"] += _trials_of(spec, experiment)
            if tune_state.DISK_FULL.is_set():  # stopped as Ctrl-C stops it: every other trial would fail too
                raise tune_state.stopped_for_space(options.output_dir, storage_join(storage, experiment.name))
            _raise_if_interrupted(storage_join(storage, experiment.name))
            rows.extend(tune_rows(results))
        return summarize(spec, rows, options.output_dir, tracker)


def end_ray(verbosity: int) -> None:
    """Leave Ray (stopping the local instance this driver started) once the study's last round has run, before its
    answer is printed: what Ray's log monitor still forwards from actors winding down (Ray Train's placement-group
    cleaners) would otherwise come after the verdict. The driver's exit would end Ray anyway."""
    if ray.is_initialized():
        (trial_failures.shutdown_quietly if verbosity < console.VERBOSE else ray.shutdown)()


def _check_restorable(exp_uris: list[str]) -> None:
    """ConfigError (one line) unless Tune's saved state of each experiment is as the study signed it
    (:func:`.tune_state.check_signed`) and reads back with every trial's config: a damaged ``experiment_state-*.json``
    otherwise restores as a trial with an empty config, which trains the defaults (full CIFAR-10, 200 epochs) with a
    traceback first."""
    for uri in exp_uris:
        if "://" not in uri:  # a FIFO planted there would block Tune's first read forever
            tune_state.check_only_files(Path(uri))
        if not tune.Tuner.can_restore(uri):
            continue
        tune_state.check_signed(uri)
        damaged = f"cannot resume: Tune's saved state in {uri} is damaged ({{}}); --overwrite starts the study afresh"
        try:
            trials = tune.ExperimentAnalysis(uri).trials
        except Exception as err:  # whatever Tune's reader raises on a truncated or foreign file
            local = Path(uri) if "://" not in uri else None
            if local is not None and tune_state.restore_backup(local):  # its save cut short by a full disk
                _check_restorable([uri])
                continue
            raise ConfigError(damaged.format(str(err).strip().splitlines()[0][:120] if str(err).strip()
                                             else type(err).__name__)) from None
        for t in trials:
            missing = [k for k in ("loss.name", "seed", "optim.epochs") if k not in (t.config or {})]
            if missing:
                raise ConfigError(damaged.format(f"trial {t.trial_id} has no {missing[0]}"))


def _raise_if_interrupted(exp_uri: str) -> None:
    """Ctrl-C: Tune stops gracefully, saves its state and returns from ``fit`` as if done, and its results
    then count the interrupted trials as terminated. The saved state tells them apart (PENDING/RUNNING/PAUSED);
    they must not be summarized as finished. A trial Tune gave up on is finished, whatever the saved state says
    (:func:`.trial_failures.unfinished`: Tune may keep a trial whose process died ``RUNNING`` there)."""
    unfinished = trial_failures.unfinished(tune.ExperimentAnalysis(exp_uri).trials)
    if unfinished:
        raise StudyInterruptedError(f"{len(unfinished)} trial(s) of {Path(exp_uri).name} did not finish")


def _warn_if_cluster_too_small(resources: Resources, cluster: dict[str, float]) -> None:
    need = resources.num_workers * resources.cpus_per_worker
    if cluster.get("CPU", 0.0) < need or cluster.get("GPU", 0.0) < resources.num_workers * resources.gpus_per_worker:
        log.warning("the cluster has %s now; one trial needs %g CPUs and %g GPUs: trials wait until the "
                    "autoscaler adds nodes", cluster, need, resources.num_workers * resources.gpus_per_worker)


def _prepare_output(spec: StudySpec, options: StudyOptions, exps: list[TuneExperiment],
                    existing: list[str]) -> list[list[int]] | None:
    """Refuse to mix a new study into an old one's results; check a resume's options; clear for --overwrite;
    record the options. Returns the study's seed rounds (:func:`~dcl_core.study.plan.spec.round_experiments`): the
    recorded ones, plus a round of the seeds a ``--seeds N --resume`` adds; None for a study without a seed grid."""
    if existing and not (options.resume or options.overwrite):
        raise ConfigError(f"study output exists at {existing[0]}; pass --resume to continue it or --overwrite")
    if options.resume and not existing:
        raise ConfigError(f"nothing to resume at {storage_join(str(options.storage), exps[0].name)}")
    seeds = grid_seeds(spec)
    rounds = [list(seeds)] if seeds else None
    options_file = summary_dir(options.output_dir, spec.name) / OPTIONS_FILE
    recorded = options_file.exists() or options_file.is_symlink()
    if options.resume and recorded:
        before = read_options(options_file)
        check_same_script(before.get("command"), options.command, spec.name, options.output_dir, "--resume")
        options.check_resume(before)
        added = check_same_study(spec, before.get("spec", {}))
        if seeds:
            old = before.get("spec", {}).get("seeds") or list(seeds)
            rounds = recorded_rounds(before, old) + ([list(added)] if added else [])
            if added:
                log.info("adding seeds %s to every cell (%d finished seeds kept)", span(added), len(old))
    options.output_dir.mkdir(parents=True, exist_ok=True)
    if options.overwrite:
        earlier: list[list[int]] = []
        with contextlib.suppress(ConfigError):  # a damaged record: --overwrite clears what it can name
            earlier = recorded_rounds(read_options(options_file), []) if recorded else []
        for uri in dict.fromkeys([*existing, *(storage_join(str(options.storage), e.name)
                                               for e in round_experiments(exps, earlier))]):
            if storage_exists(uri):
                storage_delete(uri, root=str(options.storage))
    if spec.search is not None and not options.resume:  # a new search, not one continued from an old Optuna study
        _delete_optuna_studies(options.output_dir, [e.name for e in exps])
    options_file.parent.mkdir(parents=True, exist_ok=True)
    write_record(options_file, {**options.to_json_dict(), "spec": spec_fingerprint(spec), "seed_rounds": rounds})
    return rounds


def _trial_name(trial: Any, keys: tuple[str, ...]) -> str:
    """``dcl_t0.1_b32_s0_<id>``: the values of the keys the study varies (and the trial id)."""
    c = {**trial.config, "loss.name": loss_label(trial.config.get("loss.name", ""))}  # a user loss: its class
    parts = [f"{short_name(k)}{c.get(k):g}" if isinstance(c.get(k), float) else f"{short_name(k)}{c.get(k)}"
             for k in keys]
    return "_".join(parts) + f"_{trial.trial_id}"


def _search(spec: StudySpec, experiment: TuneExperiment, options: StudyOptions) -> tuple[dict, Any, int]:
    """(param_space, search algorithm, samples): the whole sub-grid for a grid experiment; a seeded Optuna TPE
    search pinned to the experiment's grid point otherwise."""
    base_flat = to_flat_dict(spec.base)
    if spec.search is None:
        return {**base_flat, **to_tune(experiment.grid)}, None, 1
    searched = keys_of(spec.search)
    constants = {k: v for k, v in {**base_flat, **grid_points(experiment.grid)[0], **experiment.point}.items()
                 if k not in searched}
    # TPE models the trials after its random start-up ones; with the small CPU budgets that start-up phase
    # (Optuna's default: 10) would be the whole search.
    sampler = TPESampler(seed=options.search_seed, n_startup_trials=max(2, min(10, spec.num_samples // 2)))
    # The Optuna study persists in OUTPUT_DIR/optuna.db under the experiment's name, for optuna-dashboard and
    # optuna.load_study (Tune still checkpoints the searcher itself for --resume).
    search_alg = OptunaSearch(space=to_optuna(spec.search, constants), metric=M.KNN_TOP1, mode="max",
                              sampler=sampler, study_name=experiment.name, storage=optuna_storage(options.output_dir))
    return {}, search_alg, spec.num_samples




def optuna_storage(output_dir: Path) -> Any:
    """The study folder's Optuna RDB storage (SQLite): ``optuna.load_study(study_name=<experiment>,
    storage="sqlite:///<output_dir>/optuna.db")`` reads a search back, ``optuna-dashboard`` shows it."""
    return optuna.storages.RDBStorage(f"sqlite:///{Path(output_dir) / OPTUNA_DB}")


def _delete_optuna_studies(output_dir: Path, names: list[str]) -> None:
    """A new search (not ``--resume``) starts a new Optuna study: an old one of the same name (``--overwrite``, or
    left behind by a deleted study) would otherwise be continued."""
    if not (Path(output_dir) / OPTUNA_DB).exists():
        return
    storage = optuna_storage(output_dir)
    for name in names:
        with contextlib.suppress(KeyError):
            optuna.delete_study(study_name=name, storage=storage)


def _trials_of(spec: StudySpec, experiment: TuneExperiment) -> int:
    return spec.num_samples if spec.search is not None else num_grid_points(experiment.grid)


def _run_tune_experiment(spec: StudySpec, experiment: TuneExperiment, options: StudyOptions,
                    tracker: tracking.StudyTracker, progress: dict[str, Any] | None = None) -> Any:
    """Fit (or restore and finish) one Tune experiment of the study; returns its ``ResultGrid``. A trial lost to
    Ray's memory monitor fails as any other (:mod:`.memory_loss`): the experiment goes on from its saved state."""
    storage = str(options.storage)
    exp_uri = storage_join(storage, experiment.name)

    def fit(memory_losses: dict[str, int], again: bool) -> Any:
        fn = tune.with_resources(
            tune.with_parameters(trainable, resources=options.resources, train_storage=storage_join(exp_uri, "_train"),
                                 max_failures=options.max_failures, memory_losses=memory_losses,
                                 verbose=options.verbosity >= console.VERBOSE),
            options.resources.trial_resources(),
        )
        # A study of several experiments may have been killed before its later ones started: those start afresh.
        if (options.resume or again) and tune.Tuner.can_restore(exp_uri):
            tune_state.check_signed(exp_uri)  # as Tune reads it now (a resume checked it before Ray started)
            # after a memory kill, trials that failed for good stay failed (a --resume retries them once)
            tuner = tune.Tuner.restore(exp_uri, trainable=fn, resume_unfinished=True,
                                       resume_errored=options.resume and not again)
            restored = True
        else:
            tuner = _new_tuner(spec, experiment, options, tracker, progress, fn)
            restored = False
        # restored: quiet as a first run; its loggers are those its first run pickled (Ray's defaults before the
        # study named its own), so Ray's defaults stay on for it
        with _tune_environment(verbose=options.verbosity >= console.VERBOSE, own_loggers=not restored):
            return tuner.fit()

    return memory_loss.fit_despite_memory_losses(fit, exp_uri, options.max_failures)


def _new_tuner(spec: StudySpec, experiment: TuneExperiment, options: StudyOptions, tracker: tracking.StudyTracker,
               progress: dict[str, Any] | None, fn: Any) -> Any:
    """A new Tune experiment of the study, running the trainable ``fn``."""
    storage = str(options.storage)
    param_space, search_alg, num_samples = _search(spec, experiment, options)
    scheduler = None
    if options.asha:
        scheduler = ASHAScheduler(time_attr="training_iteration", max_t=spec.base.optim.epochs,
                                  grace_period=max(1, spec.base.optim.epochs // 4), reduction_factor=2)
    callback = tracking.MLflowTrialCallback(tracker, tag_keys=trial_tags(spec),
                                            save_checkpoint=options.save_checkpoints, storage=storage,
                                            loss_sources=spec.loss_sources, cause_of=trial_failures.trial_cause)
    progress = progress or {"total": _trials_of(spec, experiment), "done": 0, "started": time.time()}
    console_line = console.ConsoleProgress(spec.name, progress["total"], progress["done"], options.verbosity,
                                           progress["started"])
    name = functools.partial(_trial_name, keys=varied_keys(spec))
    tuner = tune.Tuner(
        fn,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            metric=M.KNN_TOP1, mode="max", search_alg=search_alg, scheduler=scheduler, num_samples=num_samples,
            max_concurrent_trials=options.max_concurrent, trial_name_creator=name, trial_dirname_creator=name,
            # A new trial runs in the finished one's process: no new Python importing torch, Ray Train and
            # MLflow per trial (measured: worker start-up was the largest platform overhead). Safe because a trial
            # keeps no state in its process: the trainer seeds everything and sets its threads itself.
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=experiment.name, storage_path=storage,
            failure_config=tune.FailureConfig(max_failures=options.max_failures),
            # Two, not one: Tune deletes the previous checkpoint when it registers a new one, before its next
            # experiment snapshot; a driver killed in between (kill -9, the OOM killer) left a state naming a
            # deleted checkpoint, and the resumed trial failed ("does not exist on storage anymore", seen in CI).
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            # Tune's CSV and JSON loggers (its results, result.json and progress.csv, are read back), without
            # its TensorBoard logger, whose tensorboardX imports torch into the driver while the first trials
            # start (8 s of a smoke study's 70 on 2 cores); MLflow holds the same metrics.
            callbacks=[callback, console_line, state_signature.SignState(), tune_state.StateBackup(),
                       tune_state.DiskFullStop(),
                       trial_failures.TrialFailures(), CSVLoggerCallback(), JsonLoggerCallback()],
            verbose=2 if options.verbosity >= console.VERBOSE else 0,
        ),
    )
    state_signature.sign_tuner(storage_join(storage, experiment.name))  # written by tune.Tuner just now: a pickle
    return tuner


@contextlib.contextmanager
def _tune_environment(verbose: bool, own_loggers: bool) -> Iterator[None]:
    """Tune's switches for one ``fit``, as Ray documents them among its environment variables, restored after it.
    Its console output: its status tables with ``-v``; otherwise none at all (its newer output engine prints a
    configuration box and result paths even at verbosity 0; the classic one, ``RAY_AIR_NEW_OUTPUT=0``, prints
    nothing). With ``own_loggers`` (the tuner's callbacks name its loggers), Tune adds no default ones
    (``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1``)."""
    switches = {"RAY_AIR_NEW_OUTPUT": None if verbose else "0",
                "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1" if own_loggers else None}
    before = {name: os.environ.get(name) for name, value in switches.items() if value is not None}
    os.environ.update({name: value for name, value in switches.items() if value is not None})
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
