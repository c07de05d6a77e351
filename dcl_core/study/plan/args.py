"""Every option of a study script, declared once: :class:`StudyArgs`, one field an option, its flag, type, default,
help and bounds in the field's metadata, as :mod:`dcl_core.config.schema` declares the config keys.

From it come the command line's parser (:mod:`dcl_core.study.cli.options`), the record a study keeps of the options
that built its spec (:meth:`StudyArgs.record`, ``study_options.json``'s ``command``), that record's validated
replay (:func:`args_from_record`: a folder someone else wrote is input like a command line), the
:class:`~dcl_core.study.plan.spec.StudyOptions` of how the study runs (:func:`options_of`) and the frozen
:class:`StudyRequest` a study is prepared from (:func:`dcl_core.study.plan.study_plan.prepare_plan`). Adding an option
is one field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dcl_core.config import ConfigError
from dcl_core.study.analysis.sequential import GROUP_LOOKS
from dcl_core.study.plan.design import check_caps, from_record
from dcl_core.study.plan.questions import MAX_CLAIM, OWN_STATISTICS
from dcl_core.study.plan.spec import PROGRESS, QUIET, VERBOSE, StudyOptions
from dcl_core.study.plan.storage import script_sha256

MAX_SEEDS = 1000
MAX_SAMPLES = 10_000  # Optuna trials per loss
MAX_TEXT = 4096  # a recorded path, name or KEY=VALUE
PRESET_HELP = {
    "smoke": "tests (~1 min)", "cpu": "answers the question on 2 CPU cores (default)",
    "cpu_long": "a longer CPU protocol that reaches the NPC regime (q_B <= 0.6, under an hour)",
    "paper": "the paper's protocol for a GPU cluster",
}
GPU_PRESET = "paper"  # every study's GPU protocol: one GPU per worker unless --gpus-per-worker says otherwise
SMOKE_OUTPUT_DIR = "outputs/smoke"  # --smoke's folder, beside outputs/ of the real study (the quick start's next)
WHAT, ROUNDS, WHERE, RESOURCES = "what to run", "seeds until resolved", "where results go", "resources"
QUESTION = "your own question (docs/own-loss.md): replaces the paper's"
RUN = StudyOptions()  # how a study runs: the defaults of its options of the same name, declared there


def _opt(default: Any, flag: str | None, group: str | None, help: str = "", *, record: bool = False,
         bounds: tuple[float, float | None] | None = None, limit: int = MAX_TEXT, items: int | None = None,
         choices: tuple[str, ...] | None = None, metavar: str | None = None, short: str | None = None,
         check: Callable[[Any], Any] | None = None, only: bool = False) -> Any:
    """A field of :class:`StudyArgs`: its command-line ``flag`` (None: not on the command line) in ``group``;
    ``only``: on the command line of the scripts that ask for it only (:func:`build_parser`'s ``extra``);
    ``record``: kept in the study's record and replayed from it; ``bounds``: a number's (low, high or None);
    ``limit`` and ``items``: a recorded text's length and a recorded list's length; ``check``: the recorded
    value's own validation (ConfigError)."""
    meta = {"flag": flag, "group": group, "help": help, "record": record, "bounds": bounds, "limit": limit,
            "items": items, "choices": choices, "metavar": metavar, "short": short, "check": check, "only": only}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class StudyArgs:
    """One study invocation's options, in the order ``--help`` lists them. A study script's ``build_spec`` reads
    what decides the spec (``preset``, ``search``, ``losses``, ``seeds``, ...); the rest says how and where it
    runs (:func:`options_of`) and in which mode."""

    preset: str = _opt("cpu", "--preset", WHAT, record=True, limit=40)  # choices and help: the script's presets
    # the generic sweep's axis (studies/sweep.py)
    key: str | None = _opt(None, "--key", WHAT, "the config key to sweep, e.g. optim.batch_size (a number)",
                           record=True, limit=80, only=True)
    values: str | None = _opt(None, "--values", WHAT, "its values, comma-separated, e.g. 16,32,64", record=True,
                              limit=400, only=True)
    search: str = _opt("grid", "--search", WHAT, "grid: the paper's exact sweep; optuna: TPE search (seeded) per loss",
                       record=True, limit=40, choices=("grid", "optuna"))
    num_samples: int | None = _opt(None, "--num-samples", WHAT, "trials per Optuna search (default: preset's)",
                                   record=True, bounds=(1, MAX_SAMPLES))
    asha: bool = _opt(RUN.asha, "--asha", WHAT, "early-stop poor Optuna trials with ASHA", record=True)
    losses: str | None = _opt(None, "--losses", WHAT, "comma-separated losses (default: preset's)", record=True)
    seeds: int | None = _opt(None, "--seeds", WHAT, "number of seeds per cell (default: preset's)", record=True,
                             bounds=(1, MAX_SEEDS))
    data_root: str | None = _opt(None, "--data-root", WHAT,
                                 "dataset root (default: embedded CIFAR-10 / $DCL_DATA_ROOT)", record=True)
    download: bool = _opt(False, "--download", WHAT,
                          "fetch CIFAR-10/100 or STL-10 with torchvision once, before the study starts (needs "
                          "internet), into --data-root or ~/.cache/dcl_core/<dataset>, and train on it; on a cluster, "
                          "put the data on its nodes instead")
    effect_of_interest: tuple[str, ...] = _opt(
        (), "--effect-of-interest", WHAT,
        "δ for a question, in its statistic's units, e.g. std_difference=1.0 (repeatable; KEY: the statistic or "
        "<statistic>_<i>): the verdict also says whether the data rule out an effect that large (default: the "
        "paper's like-for-like value)", record=True, limit=200, items=64, metavar="KEY=VALUE")
    compare: str | None = _opt(
        None, "--compare", QUESTION, "ask the study's statistic of series BETTER against BASE, e.g. "
        "my_losses.py:MyLoss,dcl (BETTER: the one claimed higher, flatter, ...)", record=True, metavar="BETTER,BASE")
    statistic: str | None = _opt(None, "--statistic", QUESTION,
                                 "ask this statistic instead of the study's (gap_at needs --at)", record=True,
                                 limit=40, choices=OWN_STATISTICS)
    at: str | None = _opt(None, "--at", QUESTION, "the x of --statistic gap_at, one the study runs", record=True,
                          limit=80, metavar="X")
    claim: str | None = _opt(None, "--claim", QUESTION,
                             "the claim in your words, as the verdict names it (default: made from the statistic "
                             "and the pair)", record=True, limit=MAX_CLAIM, metavar="TEXT")
    dry_run: bool = _opt(False, "--dry-run", WHAT,
                         "print the trials, their resources, total epochs and images, and an estimated cost (CPU "
                         "minutes on this machine, GPU-hours), then exit: no Ray, nothing written")
    reanalyze: bool = _opt(False, "--reanalyze", WHAT,
                           "train nothing: recompute the answer of this study's finished run in OUTPUT_DIR from its "
                           "stored results (the same options it ran with), rewrite its summary files and its MLflow "
                           "summary run (python -m dcl_core.study answer OUTPUT_DIR does it for every study there)")
    set: tuple[str, ...] = _opt((), "--set", WHAT, "override a base config key for every trial, e.g. --set "
                                "optim.epochs=50", record=True, metavar="KEY=VALUE")
    until_resolved: bool = _opt(
        False, "--until-resolved", ROUNDS,
        "add seeds to every cell in rounds until every question is settled (its interval excludes 0, or its "
        f"futility bound the effect of interest) or a cap is hit; {GROUP_LOOKS} looks, each at the group-sequential "
        "design's bounds, so that all looks together resolve no more than 5%% of null studies and rule out a true "
        "effect of interest in no more than 5%% (needs --max-seeds and/or --max-minutes)")
    max_seeds: int | None = _opt(None, "--max-seeds", ROUNDS,
                                 "the last look: at most this many seeds per cell (default with --max-minutes: as "
                                 "many as the cost estimate fits in it)")
    max_minutes: float | None = _opt(None, "--max-minutes", ROUNDS,
                                     "start no round that would end after this many minutes of this run (at the last "
                                     "round's pace); stopping early only removes looks")
    seeds_per_round: int | None = _opt(None, "--seeds-per-round", ROUNDS,
                                       f"a look every N seeds instead of {GROUP_LOOKS} looks equally spaced from the "
                                       "first to the last")
    name: str = _opt("", "--name", WHERE, record=True)  # default and help: the script's name
    # with --tracking-uri: dcl_core.cli_common's store options
    output_dir: str = _opt(str(RUN.output_dir), "--output-dir", WHERE)
    tracking_uri: str | None = _opt(RUN.tracking_uri, None, WHERE)
    storage: str | None = _opt(RUN.storage, "--storage", WHERE,
                               "Ray storage path or URI (default: OUTPUT_DIR/ray_results)")
    resume: bool = _opt(RUN.resume, "--resume", WHERE,
                        "continue an interrupted study from its storage; with a larger --seeds, extend a finished "
                        "study by the new seeds only")
    overwrite: bool = _opt(RUN.overwrite, "--overwrite", WHERE, "delete an existing study of the same name first")
    save_checkpoints: bool = _opt(RUN.save_checkpoints, "--save-checkpoints", WHERE,
                                  "log each trial's final checkpoint to MLflow")
    workers: int = _opt(RUN.workers, "--workers", RESOURCES, "DDP workers per trial (TorchTrainer when > 1)")
    cpus_per_worker: float = _opt(RUN.cpus_per_worker, "--cpus-per-worker", RESOURCES,
                                  "CPUs per worker; also its torch threads")
    gpus_per_worker: float | None = _opt(None, "--gpus-per-worker", RESOURCES,
                                         "GPUs per worker (default: 1 with --preset paper, the papers' GPU protocol; "
                                         "else 0)")
    max_concurrent: int | None = _opt(RUN.max_concurrent, "--max-concurrent", RESOURCES, "cap on concurrent trials")
    max_failures: int = _opt(RUN.max_failures, "--max-failures", RESOURCES, "retries of a crashed trial")
    address: str | None = _opt(RUN.address, "--address", RESOURCES,
                               "Ray cluster address (default: local, or $RAY_ADDRESS)")
    num_cpus: int | None = _opt(RUN.num_cpus, "--num-cpus", RESOURCES, "CPUs for a local Ray (default: all)")
    verbose: bool = _opt(False, "--verbose", None,
                         "Ray Tune's status tables and the trials' own logs (default: a progress line and one line "
                         "per finished trial)", short="-v")
    quiet: bool = _opt(False, "--quiet", None, "print only the answer (table and verdicts)", short="-q")
    # the sequential design of --until-resolved, once planned: recorded, never given
    design: Mapping[str, int | float | None] | None = _opt(None, None, None, record=True, check=from_record)

    def record(self, script: str, path: Path | None = None) -> dict[str, Any]:
        """The ``command`` a study's options record: its script (the name it runs under, and the file that ran with
        its SHA-256, by which ``answer`` tells a copy from the checkout's own) and the recorded options' values."""
        values = {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self) if f.metadata["record"]}
        where = {} if path is None else {"script_path": str(path), "script_sha256": script_sha256(path)}
        return {"script": script, **where, **values}

    @property
    def verbosity(self) -> int:
        """QUIET (``-q``), VERBOSE (``-v``) or PROGRESS."""
        return QUIET if self.quiet else VERBOSE if self.verbose else PROGRESS


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return dict(value) if isinstance(value, Mapping) else value


def check_bounds(args: StudyArgs) -> None:
    """ConfigError for the first number outside its declared bounds (``--seeds must be in [1, 1000], got 0``)."""
    for f in dataclasses.fields(args):
        value, bounds = getattr(args, f.name), f.metadata["bounds"]
        if bounds is None or value is None:
            continue
        low, high = bounds
        if value < low or (high is not None and value > high):
            where = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise ConfigError(f"{f.metadata['flag']} must be {where}, got {value}")


def args_from_record(recorded: Mapping[str, Any], base: StudyArgs, where: str) -> StudyArgs:
    """``base`` with the values a study recorded (its ``study_options.json``'s ``command``), each checked by its
    declaration (type, bounds, choices, length): ConfigError naming the first bad value, before anything runs."""

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{where}'s command.{key} {why}: the file is damaged or not a study's; --overwrite "
                           "starts the study afresh")

    given: dict[str, Any] = {}
    for f in dataclasses.fields(StudyArgs):
        m = f.metadata
        if not m["record"] or f.name not in recorded:
            continue
        value = recorded[f.name]
        if m["check"] is not None:
            m["check"](value)  # its own bounds: ConfigError
        elif f.type == "bool":
            if not isinstance(value, bool):
                raise bad(f.name, "must be true or false")
        elif isinstance(f.default, tuple):
            value = value or []
            if not isinstance(value, list) or (m["items"] is not None and len(value) > m["items"]) or not all(
                    isinstance(v, str) and len(v) <= m["limit"] for v in value):
                raise bad(f.name, "must be a list of KEY=VALUE texts")
            value = tuple(value)
        elif m["bounds"] is not None:
            low, high = m["bounds"]
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not low <= value <= high):
                raise bad(f.name, f"must be a whole number in [{low}, {high}], got {str(value)[:40]!r}")
        else:
            if value is not None and (not isinstance(value, str) or len(value) > m["limit"]):
                raise bad(f.name, f"must be text of at most {m['limit']} characters")
            if value is not None and m["choices"] and value not in m["choices"]:
                raise bad(f.name, f"must be {' or '.join(m['choices'])}, got {value!r}")
            if value is None and f.default is not None:  # a required text left out: the base's
                continue
        given[f.name] = value
    return replace(base, **given)


@dataclass(frozen=True)
class StudyRequest:
    """One invocation of a study, as parsed from its command line: its options (:class:`StudyArgs`), how it runs
    (:class:`~dcl_core.study.plan.spec.StudyOptions`, derived from them) and the command line given (None:
    ``sys.argv``), for the resume line."""

    args: StudyArgs
    options: StudyOptions
    argv: tuple[str, ...] | None = None

    @property
    def quiet(self) -> bool:
        """Whether the study's console is quiet (``-q``)."""
        return self.options.verbosity == QUIET

    def check(self) -> None:
        """One-line errors for options that no single value check catches, before anything runs."""
        a, o = self.args, self.options
        check_bounds(a)
        if a.reanalyze and (o.resume or o.overwrite or a.dry_run):
            raise ConfigError("--reanalyze trains nothing and writes only the answer: drop --resume, --overwrite "
                              "and --dry-run")
        check_caps(a.until_resolved, a.max_seeds, a.max_minutes, a.seeds_per_round, reanalyze=a.reanalyze,
                   search=a.search)
        if a.download and o.cluster is not None:
            raise ConfigError("--download fetches the dataset to this machine, not to a cluster's nodes: put it on "
                              "them (or on storage they share) and pass --data-root")


def options_of(args: StudyArgs) -> StudyOptions:
    """The :class:`StudyOptions` of the options: each of its fields from the option of the same name
    (ConfigError for an empty ``--output-dir`` or bad resources)."""
    if not str(args.output_dir).strip():  # Path("") is the current folder
        raise ConfigError("--output-dir is empty; name a folder (default: outputs)")
    same = {f.name for f in dataclasses.fields(StudyOptions)} & {f.name for f in dataclasses.fields(StudyArgs)}
    gpus = args.gpus_per_worker if args.gpus_per_worker is not None else float(args.preset == GPU_PRESET)
    return StudyOptions(**{k: getattr(args, k) for k in same} | {
        "output_dir": Path(args.output_dir), "verbosity": args.verbosity, "gpus_per_worker": gpus})


