"""Every option of a study script, declared once: :class:`StudyArgs`, one field an option, its flag, type, default,
help and bounds in the field's metadata (:func:`~dcl_core.study.plan.option_fields.option`), as
:mod:`dcl_core.config.schema` declares the config keys; the options that say how the study runs are its ``run``, a
:class:`~dcl_core.study.plan.run_options.StudyOptions` whose fields declare them the same way.

From them come the command line's parser (:mod:`dcl_core.study.cli.options`, over :func:`option_fields`), the
record a study keeps of the options that built its spec (:meth:`StudyArgs.record`, ``study_options.json``'s
``command``, beside the run options it recorded: each option once), that record's validated replay
(:func:`args_from_record`: a folder someone else wrote is input like a command line) and the frozen
:class:`StudyRequest` a study is prepared from (:func:`dcl_core.study.plan.study_plan.prepare_plan`). Adding an option
is one field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dcl_core.config import ConfigError
from dcl_core.files import real_path
from dcl_core.study.analysis.sequential import GROUP_LOOKS
from dcl_core.study.plan.design import check_caps, from_record
from dcl_core.study.plan.option_fields import QUESTION, ROUNDS, WHAT, WHERE
from dcl_core.study.plan.option_fields import option as _opt
from dcl_core.study.plan.questions import MAX_CLAIM, OWN_STATISTICS
from dcl_core.study.plan.record import RecordedStudy, check_continues_here, read_recorded
from dcl_core.study.plan.run_options import QUIET, StudyOptions
from dcl_core.study.plan.storage import OPTIONS_FILE, script_sha256, summary_dir

MAX_SEEDS = 1000
MAX_SAMPLES = 10_000  # Optuna trials per loss
PRESET_HELP = {
    "smoke": "tests (~1 min)", "cpu": "answers the question on 2 CPU cores (default)",
    "cpu_long": "a longer CPU protocol that reaches the NPC regime (q_B <= 0.6, under an hour)",
    "paper": "the paper's protocol for a GPU cluster",
}
GPU_PRESET = "paper"  # every study's GPU protocol: one GPU per worker unless --gpus-per-worker says otherwise
SMOKE_OUTPUT_DIR = "outputs/smoke"  # --smoke's folder, beside outputs/ of the real study (the quick start's next)


@dataclass(frozen=True)
class StudyArgs:
    """One study invocation's options, in the order ``--help`` lists them. A study script's ``build_spec`` reads
    what decides the spec (``preset``, ``search``, ``losses``, ``seeds``, ...); ``run`` says how and where it runs,
    the rest in which mode."""

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
    # how it runs: where results go, resources, resume; its fields are study options too, declared there
    run: StudyOptions = field(default_factory=StudyOptions)
    # the sequential design of --until-resolved, once planned: recorded, never given
    design: Mapping[str, int | float | None] | None = _opt(None, None, None, record=True, check=from_record)

    def record(self, script: str, path: Path | None = None) -> dict[str, Any]:
        """The ``command`` a study's options record: its script (the name it runs under, and the file that ran with
        its SHA-256, by which ``answer`` tells a copy from the checkout's own) and the recorded options' values."""
        values = {f.name: _jsonable(getattr(self, f.name))
                  for f in dataclasses.fields(self) if f.metadata.get("record")}
        where = {} if path is None else {"script_path": str(path), "script_sha256": script_sha256(path)}
        return {"script": script, **where, **values}


def option_fields() -> Iterator[dataclasses.Field]:
    """Every study option's field in the order ``--help`` lists them: :class:`StudyArgs`'s own, with its ``run``'s
    (:class:`StudyOptions`'s) where it holds them."""
    for f in dataclasses.fields(StudyArgs):
        yield from dataclasses.fields(StudyOptions) if f.name == "run" else (f,)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return dict(value) if isinstance(value, Mapping) else value


def check_bounds(args: StudyArgs) -> None:
    """ConfigError for the first number outside its declared bounds (``--seeds must be in [1, 1000], got 0``)."""
    for f in dataclasses.fields(args):
        value, bounds = getattr(args, f.name), f.metadata.get("bounds")
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
        if not m.get("record") or f.name not in recorded:
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
    """One invocation of a study, as parsed from its command line: its options (:class:`StudyArgs`) and the command
    line given (None: ``sys.argv``), for the resume line."""

    args: StudyArgs
    argv: tuple[str, ...] | None = None

    @property
    def options(self) -> StudyOptions:
        """How the study runs: its options' ``run``."""
        return self.args.run

    @property
    def quiet(self) -> bool:
        """Whether the study's console is quiet (``-q``)."""
        return self.options.verbosity == QUIET

    def args_to_run(self, script: str, script_path: Path | None = None) -> tuple[StudyArgs, RecordedStudy]:
        """The request's arguments as the study runs them, checked, and what the study recorded, read once
        (empty for a new study): a ``--resume`` or ``--reanalyze`` continues with every seed the study has, under
        its recorded design. Refused here, before anything is built, fetched or started
        (:func:`~dcl_core.study.plan.record.check_continues_here`): a study another script ran (``script``, defined
        in ``script_path``), and a real ``--resume`` of a folder moved or copied from where it ran."""
        self.check()
        args, options = self.args, self.options
        if not (options.resume or args.reanalyze):
            return args, RecordedStudy()
        out = real_path(options.output_dir)
        recorded = read_recorded(out, args.name)
        check_continues_here(recorded, args.record(script, script_path), options.output_dir, args.name,
                             "--reanalyze" if args.reanalyze else "--resume", moved=options.resume and not args.dry_run)
        where = str(summary_dir(out, args.name) / OPTIONS_FILE)
        command = recorded.command
        checked = args_from_record({k: command[k] for k in ("seeds", "design") if k in command}, StudyArgs(), where)
        has, ran = checked.seeds, recorded.seeds
        if has is not None and ran is not None and has != ran:
            raise ConfigError(f"{where}'s command.seeds ({has}) disagrees with the {ran} seed(s) per cell its trials "
                              "were started with (seed_rounds): the file is damaged; --overwrite starts the study "
                              "afresh")
        # --until-resolved's resume line repeats its first --seeds; the rounds since have added more
        more = args.until_resolved and has is not None and args.seeds is not None and has > args.seeds
        seeds = has if args.seeds is None or more else args.seeds
        return replace(args, seeds=seeds, design=command.get("design")), recorded

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
