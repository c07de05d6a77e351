"""What a study records next to its summary (``study_options.json``) and how a ``--resume`` is held to it: the
spec's fingerprint (base config, grids, search, seeds), the seed rounds run so far, the sequential design
``--until-resolved`` recorded (checked against those rounds: each ended at one of its looks), and the one change a
resume takes (more seeds of a grid study). No Ray: re-analysis reads the same record.

The record decides a study's verdict (its design, its rounds, the seeds and options its answer is rebuilt from), and
the output folder may be shared, so the study signs it as a whole with this user's key
(:mod:`~dcl_core.study.plan.signing`) and every reader checks it as a whole (:func:`read_options`): a record
changed since the study wrote it, even consistently, is refused in one line naming the file, and so is one whose
signature was removed from where this user's study wrote it. A record no key of this user's signed (from before
records were signed, copied from another user or machine, or written where no key could be kept) is read as
before, each value checked.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcl_core.config import ConfigError, to_flat_dict
from dcl_core.files import real_path
from dcl_core.study.analysis.sequential import (
    EARLIER_PAPER_SIDE_ERROR,
    MAX_SEEDS_PROJECTED,
    POCOCK_SHAPE,
    Design,
    GroupSequential,
    Sequential,
)
from dcl_core.study.plan import signing
from dcl_core.study.plan.spec import StudySpec, grid_seeds, unseeded
from dcl_core.study.plan.storage import (
    OPTIONS_FILE,
    atomic_write_text,
    default_tracking_uri,
    read_options_file,
    script_origin,
    summary_dir,
)

log = logging.getLogger(__name__)

# A group-sequential record's boundary: its key, the design's field, and the value of records from before it
RECORDED_BOUNDARY = {"shape": ("shape", POCOCK_SHAPE), "paper_side": ("paper_error", EARLIER_PAPER_SIDE_ERROR)}


def spec_fingerprint(spec: StudySpec) -> dict[str, Any]:
    """What a resumed study must still run: the base config, the grids and the search space (and, for a grid
    study, its seeds and the grids without them, so that a resume may add seeds and change nothing else)."""
    seeds = grid_seeds(spec)
    sources = {"loss_sources": {s.name: s.digest for s in spec.loss_sources},
               "loss_source_files": {s.name: {"file": s.file, "root": s.root, "files": dict(s.files)}
                                     for s in spec.loss_sources}} if spec.loss_sources else {}
    return {"base": to_flat_dict(spec.base), "grids": repr(spec.grids), "search": repr(spec.search),
            "num_samples": spec.num_samples, "seeds": list(seeds) if seeds else None, "unseeded": unseeded(spec),
            **sources}


@dataclass(frozen=True)
class StudyChange:
    """One way a study's recorded fingerprint differs from its spec now: a base config ``key`` (``old`` → ``new``),
    or a ``part`` (``grids``, ``search``, ``num_samples``)."""

    part: str  # "base", "grids", "search" or "num_samples"
    key: str = ""
    old: Any = None
    new: Any = None


def study_changes(before: dict[str, Any], now: dict[str, Any], exempt: Collection[str] = ()) -> list[StudyChange]:
    """How ``now`` (:func:`spec_fingerprint`) differs from the recorded ``before``, in the order a check reports
    them: each base key that differs (a key ``before`` lacks, or one in ``exempt``, never does), then each of
    grids, search and num_samples that ``before`` records and that differs."""
    changes = []
    for key, value in now["base"].items():
        old = before.get("base", {}).get(key, value)
        if key not in exempt and old != value:
            changes.append(StudyChange("base", key, old, value))
    for part in ("grids", "search", "num_samples"):
        if part in before and before[part] != now[part]:
            changes.append(StudyChange(part, old=before[part], new=now[part]))
    return changes


def check_same_sources(before: dict[str, Any], now: dict[str, Any]) -> None:
    """A user loss whose sources changed since the study ran would mix two losses under one name: refused, naming
    the files that changed. ``before`` and ``now`` are fingerprints (:func:`spec_fingerprint`); a record from
    before the sources were hashed as a folder holds the hash of the loss's own file, which is compared with it."""
    digests, manifests = before.get("loss_sources") or {}, before.get("loss_source_files") or {}
    if not (isinstance(digests, dict) and isinstance(manifests, dict)):
        raise ConfigError("--resume: the record's loss_sources is damaged; run the study again with --overwrite")
    for name, digest in (now.get("loss_sources") or {}).items():
        old, manifest = digests.get(name), now["loss_source_files"][name]
        if old is None or old == digest:
            continue
        files: dict[str, str] = manifest["files"]
        own = Path(manifest["file"]).relative_to(manifest["root"]).as_posix()
        recorded = manifests.get(name)
        if recorded is None and files.get(own) == old:  # an older record: the loss's own file, unchanged
            continue
        if isinstance(recorded, dict) and isinstance(recorded.get("files"), dict):
            was = recorded["files"]
            changed = sorted(f for f in set(was) | set(files) if was.get(f) != files.get(f))
        else:
            changed = [own]
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise ConfigError(f"--resume must run the study it continues: the source of {name} changed since it ran "
                          f"({shown} in {manifest['root']}); restore it, or run the changed loss as a new study "
                          "(--name or another --output-dir)")


def check_same_study(spec: StudySpec, before: dict[str, Any]) -> tuple[int, ...]:
    """A resumed Tuner keeps the space it was started with: a changed ``--set``/``--losses``/``--seeds`` would be
    silently ignored, so it is refused; the one change allowed is more seeds of a grid study, which are returned
    (``()`` when there are none to add)."""
    now = spec_fingerprint(spec)
    check_same_sources(before, now)
    added: tuple[int, ...] = ()
    for change in study_changes(before, now):
        if change.part == "base":
            raise ConfigError(f"--resume must run the study it continues: {change.key} was {change.old!r}, now "
                              f"{change.new!r} (a changed --set, --preset or --data-root)")
        if change.part != "grids":
            raise ConfigError(f"--resume must run the study it continues: its {change.part} changed (a changed "
                              "--search, --num-samples or --preset)")
        old_seeds, new_seeds = before.get("seeds"), now["seeds"]
        if not (old_seeds and new_seeds and before.get("unseeded") == now["unseeded"]):
            raise ConfigError("--resume must run the study it continues: its grids changed (a changed --losses, "
                              "--search or --preset; more --seeds is the one change a resume takes)")
        if new_seeds[:len(old_seeds)] != old_seeds or len(new_seeds) < len(old_seeds):
            raise ConfigError(f"--resume can add seeds, not drop them: the study has {len(old_seeds)} seeds per "
                              f"cell, --seeds {len(new_seeds)} would leave some out")
        added = tuple(new_seeds[len(old_seeds):])
    return added


def recorded_rounds(before: dict[str, Any], seeds: list[int]) -> list[list[int]]:
    """The seed rounds a study recorded (one round of ``seeds`` for a study recorded before rounds existed)."""
    rounds = before.get("seed_rounds")
    if isinstance(rounds, list) and all(isinstance(r, list) and r and all(isinstance(s, int) for s in r)
                                        for r in rounds):
        return [list(r) for r in rounds]
    return [list(seeds)] if seeds else []


def from_record(value: Any) -> Design | None:
    """The design a study recorded (its command's ``design``), or None; ConfigError if it is not one. A record
    with ``looks`` is a :class:`GroupSequential` design (without ``shape`` and ``paper_side``: one recorded before
    the Wang-Tsiatis boundary, which keeps Pocock's and 4% on the paper's side); one without (first, max_seeds,
    step) the Pocock design of studies recorded before it."""
    if value is None:
        return None
    shown = str(value)[:120]
    group = isinstance(value, dict) and "looks" in value
    keys = {"first", "max_seeds", "looks", "step", *RECORDED_BOUNDARY} if group else {"first", "max_seeds", "step"}

    def whole(k: str, v: Any) -> bool:
        if k in RECORDED_BOUNDARY:
            return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        return (isinstance(v, int) and not isinstance(v, bool)) or (k == "step" and group and v is None)

    ok = (isinstance(value, dict) and set(value) <= keys and all(whole(k, v) for k, v in value.items())
          and (value.get("max_seeds") or 0) <= MAX_SEEDS_PROJECTED and (value.get("looks") or 0) <= MAX_SEEDS_PROJECTED)
    if not ok:  # what the command line allows (its bounds), or the design's simulation could take all memory
        raise ConfigError(f"the study's recorded sequential design {shown} is damaged (first, max_seeds, looks and "
                          f"step must be whole numbers, max_seeds at most {MAX_SEEDS_PROJECTED}); --overwrite starts "
                          "the study afresh")
    try:
        if group:
            fields = dict(value)
            boundary = {name: fields.pop(key, earlier) for key, (name, earlier) in RECORDED_BOUNDARY.items()}
            return GroupSequential(fields.pop("first"), fields.pop("max_seeds"), fields.pop("looks"), **fields,
                                   **boundary)
        return Sequential(**value)
    except (TypeError, ValueError, KeyError) as err:
        raise ConfigError(f"the study's recorded sequential design {shown} is damaged ({err}); --overwrite "
                          "starts the study afresh") from None


def to_record(design: Design | None) -> dict[str, int | float | None] | None:
    """The sequential design as a JSON-ready dict, or None without one."""
    if design is None:
        return None
    if isinstance(design, GroupSequential):
        return {"first": design.first, "max_seeds": design.max_seeds, "looks": design.n_looks, "step": design.step,
                "shape": design.shape, "paper_side": design.paper_error}
    return {"first": design.first, "max_seeds": design.max_seeds, "step": design.step}


def span(seeds: Sequence[int]) -> str:
    """Seeds as a range label: ``0-4``, or the one seed."""
    return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])


class ChangedRecordError(ConfigError):
    """A study's record changed since the study signed it: never read (one line, exit code 2)."""


def _purpose(path: Path) -> str:
    """What a record's signature is for: this study's record (another study's cannot stand in for it)."""
    return f"study record {path.parent.name}"


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Write the study's record at ``path`` (``summary/<study>/study_options.json``) atomically, signed with this
    user's key (:mod:`~dcl_core.study.plan.signing`) and remembered as signed there; unsigned where no key can be
    kept."""
    data = signing.signed_json(record, _purpose(path))
    atomic_write_text(path, json.dumps(data, indent=1))
    if signing.SIGNATURE in data:
        signing.remember(path)


def check_signed(path: Path, record: dict[str, Any]) -> None:
    """ChangedRecordError (one line naming the file) when the record at ``path`` was changed since this user's
    study signed it, or its signature removed from where it signed it. A record nothing vouches for (no key of this
    user's signed it, or no key can be kept here) is read as before, its values checked by its readers."""
    trust = signing.json_trust(record, _purpose(path))
    if trust == signing.CHANGED or (trust == signing.UNSIGNED and signing.remembered(path)):
        raise ChangedRecordError(
            f"{path} was changed since the study wrote it (its signature no longer matches): a study's record "
            "decides its verdict, so a changed one is not read; put back the file the study wrote, or --overwrite "
            "starts the study afresh")
    if trust != signing.SIGNED:
        log.debug("%s is not signed by this user's key (%s): read as before, its values checked", path, trust)


def read_options(path: Path) -> dict[str, Any]:
    """A study's recorded options, or ConfigError (one line) when the file is not what the study wrote: damaged,
    or changed since the study signed it (:func:`check_signed`)."""
    damaged = (f"cannot resume: {path} is damaged ({{}}); --overwrite starts the study afresh, or restore the "
               "file")
    if path.is_symlink() or not path.is_file():
        raise ConfigError(damaged.format("not a regular file"))
    try:
        before = read_options_file(path)  # within its bound, a regular file only
    except ConfigError as err:
        raise ConfigError(damaged.format(err)) from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ConfigError(damaged.format(f"not JSON: {str(err).splitlines()[0][:80]}")) from None
    spec = before.get("spec", {}) if isinstance(before, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("base", {}), dict):
        raise ConfigError(damaged.format("not the options of a study"))
    check_signed(path, before)
    return before


def check_same_script(before: Any, now: Any, study: str, output_dir: Path, doing: str) -> None:
    """ConfigError (one line) where the study's recorded ``command`` (``before``) names another study script than
    the one running (``now``): ``doing`` (``--resume``, ``--reanalyze``) would otherwise rebuild the study with this
    script and write its answer over the other's. A record naming no script passes."""
    ran, running = script_origin(before), script_origin(now)
    if ran and running and ran != running:
        raise ConfigError(f"{doing}: study {study} in {output_dir} was run by {ran}, not {running}; run it with that "
                          "script, or give this one another --name")


def check_continues_here(recorded: RecordedStudy, running: Mapping[str, Any], output_dir: Path, study: str,
                         doing: str, *, moved: bool) -> None:
    """ConfigError (one line) where ``doing`` (``--resume``, ``--reanalyze``) cannot continue the ``recorded`` study
    from here: another study script ran it than the one ``running`` names (:func:`check_same_script`), or, with
    ``moved`` (a real ``--resume``), its folder was moved or copied from where it ran (:func:`check_not_moved`)."""
    check_same_script(recorded.command, running, study, output_dir, doing)
    if moved:
        check_not_moved(recorded, real_path(output_dir), study)


def check_not_moved(recorded: RecordedStudy, output_dir: Path, study: str) -> None:
    """ConfigError (one line, saying what does work) when ``--resume`` is asked of a study whose folder was moved or
    copied here from where it ran with the folder's own MLflow store or Tune storage: those keep that folder's
    absolute paths (an MLflow experiment's artifact location cannot be changed), so the study continues only where
    it ran (a study whose store is a server and whose storage lies elsewhere, ``s3://``, resumes from any folder).
    Here, its answer can be recomputed (into a new MLflow store in the folder) and its encoders exported.
    ``recorded``: what the folder's record says (:func:`read_recorded`); nothing is said when it records no options
    (the resume itself then says what is wrong)."""
    ran_in = recorded.output_dir
    if not isinstance(ran_in, str) or Path(ran_in) == output_dir:
        return
    old = Path(ran_in)
    own_store, own_storage = default_tracking_uri(old), str(old / "ray_results")
    if recorded.tracking_uri != own_store and recorded.storage != own_storage:
        return  # its MLflow server (or store) and Tune storage lie elsewhere: the folder's own paths do not matter
    ran_in = ran_in if ran_in.isprintable() and len(ran_in) <= 500 else "another folder"  # a planted file's text
    raise ConfigError(
        f"--resume: study {study} ran in {ran_in} and this folder is a move or copy of it; Tune's state and the MLflow "
        f"store keep that folder's paths, so the study resumes or extends only there (move the folder back to "
        f"{ran_in}). Here, without training: python -m dcl_core.study answer {output_dir} --name {study} "
        f"--tracking-uri sqlite:///{output_dir}/mlflow-here.db (the answer, into a new store in the folder), and "
        f"python -m dcl_core.study export {output_dir} --name {study} --best (a trained encoder)")


@dataclass(frozen=True)
class RecordedStudy:
    """What a study in an output folder recorded that a ``--resume`` or ``--reanalyze`` continues from, read once
    (:func:`read_recorded`); empty when nothing readable is recorded (the resume itself then says what is wrong).

    Attributes:
        command: the options it last ran with (``--seeds``, the sequential ``design``, …).
        seeds: how many seeds per cell its trials were started with (its ``seed_rounds``), or None.
        looks: seeds per cell after each round (:func:`looks_ran`).
        output_dir, tracking_uri, storage: where it ran, its MLflow store and its Tune storage, as recorded (any
            JSON value: the file may come from anyone), for :func:`check_not_moved`.
    """

    command: dict[str, Any] = field(default_factory=dict)
    seeds: int | None = None
    looks: tuple[int, ...] = ()
    output_dir: Any = None
    tracking_uri: Any = None
    storage: Any = None


def read_recorded(output_dir: Path, study: str) -> RecordedStudy:
    """The record of the study in ``output_dir``, its command's design checked against the rounds it ran
    (ConfigError); ChangedRecordError for a record changed since the study signed it."""
    path = summary_dir(output_dir, study) / OPTIONS_FILE
    if not path.exists() and not path.is_symlink():
        return RecordedStudy()
    try:
        before = read_options(path)
    except ChangedRecordError:  # a record the study signed, changed since: its verdict must not be recomputed
        raise
    except ConfigError:
        return RecordedStudy()
    rounds = before.get("seed_rounds")
    command = before.get("command")
    if not isinstance(command, dict):
        command = {}
    if command.get("design") is not None:  # the design must be the one its rounds ran under
        check_looks_ran(from_record(command["design"]), looks_ran(rounds), path)
    seeds = None
    if isinstance(rounds, list) and all(isinstance(r, list) and all(isinstance(x, int) for x in r) for r in rounds):
        seeds = len({x for r in rounds for x in r}) or None
    return RecordedStudy(command, seeds, tuple(looks_ran(rounds) or ()), before.get("output_dir"),
                         before.get("tracking_uri"), before.get("storage"))


def looks_ran(seed_rounds: Any) -> list[int] | None:
    """Seeds per cell after each recorded round (``[[0, 1], [2], [3]]``: 2, 3, 4), None when ``seed_rounds`` is not
    a list of rounds of whole-number seeds."""
    if not (isinstance(seed_rounds, list) and seed_rounds and all(
            isinstance(r, list) and r and all(isinstance(s, int) and not isinstance(s, bool) for s in r)
            for r in seed_rounds)):
        return None
    seen: set[int] = set()
    out = []
    for r in seed_rounds:
        seen.update(r)
        out.append(len(seen))
    return out


def check_looks_ran(design: Design | None, looks: Sequence[int] | None, where: Path | str) -> None:
    """ConfigError (one line) unless every round a study ran under ``design`` ended at one of its looks, the first
    round at its first. Each round's summary printed and logged verdicts at the design's level, so each round is a
    look; a design whose looks are not the rounds (a ``first`` or ``max_seeds`` written over in the record) would
    give each verdict another boundary than the one its looks spent, e.g. turn "not resolved" into "rules out the
    paper's size"."""
    if design is None:
        return
    planned = design.looks
    shown = ", ".join(map(str, planned)) if len(planned) <= 8 else f"{planned[0]}, {planned[1]}, …, {planned[-1]}"
    if not looks:
        raise ConfigError(f"{where} records a sequential design (looks at {shown} seeds per cell) but not the seed "
                          "rounds it ran (seed_rounds): the file is damaged; --overwrite starts the study afresh")
    off = [n for n in looks if n not in planned]
    if off:
        raise ConfigError(f"{where}'s command.design (looks at {shown} seeds per cell) is not the design its seed "
                          f"rounds ran under (seed_rounds: {', '.join(map(str, looks))} seeds per cell; every round "
                          f"ends at a look, the first at the first): {off[0]} seeds per cell is not a look, so the "
                          "file is damaged; --overwrite starts the study afresh")
