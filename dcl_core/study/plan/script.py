"""A study script as the plan knows it: its question (the docstring), its name, its presets and the function that
builds its spec from the parsed options. :meth:`Script.build` is the one place a study's spec is made: the script's
science with its question, its sequential design, ``--set``'s checks and the data root its trials read, fetched
there once with ``--download``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from dcl_core.config import ConfigError, parse_overrides
from dcl_core.study.plan import design as rounds
from dcl_core.study.plan.args import StudyArgs
from dcl_core.study.plan.questions import with_own_question
from dcl_core.study.plan.spec import (
    StudySpec,
    check_set_not_swept,
    grid_seeds,
    validate_spec,
    with_base,
    with_effects_of_interest,
)


class SpecBuilder(Protocol):
    """Builds a study's :class:`StudySpec` from its parsed :class:`StudyArgs` (each study's ``build_spec``)."""

    def __call__(self, args: StudyArgs, /) -> StudySpec:
        """The spec of the study these arguments ask for."""


@dataclass(frozen=True)
class Script:
    """A study script: its question (the docstring), its name, its presets and its spec builder."""

    doc: str
    name: str
    build_spec: SpecBuilder
    presets: tuple[str, ...] = ("smoke", "cpu", "paper")
    defaults: Mapping[str, Any] = field(default_factory=dict)
    extra: tuple[str, ...] = ()  # the options only this script takes (StudyArgs fields declared ``only``)
    path: Path | None = None  # the file that defines it (recorded, so that `answer` re-analyses with the same)

    def build(self, args: StudyArgs, data_root: str | None = None, *, fetch: bool = False) -> StudySpec:
        """The spec ``args`` describe, validated: the script's spec with its question as description, the
        recorded or planned sequential design and, when given, the data root the trials read. ``fetch``: with
        ``--download`` (and not re-analysing), the torchvision release is fetched here, once (trials only read it),
        and is the data root; a dry run only names where it would go, and its checks take the data as still to be
        downloaded (``data.download``)."""
        spec = self.build_spec(args)
        if spec.name != args.name:  # its record, a resume and `answer` are found under --name: one place
            raise ConfigError(f"{self.name}'s build_spec named its study {spec.name!r}, not {args.name!r} (--name, "
                              "default the script's name): a study is recorded, resumed and answered under "
                              "--name, so build_spec passes name=args.name to StudySpec")
        if not spec.description:  # the docstring's first paragraph: the question and the paper's table
            spec = replace(spec, description=" ".join(self.doc.strip().split("\n\n")[0].split()))
        design = rounds.from_record(args.design)
        rounds.check_within(design, len(grid_seeds(spec) or ()) or None)
        spec = with_own_question(spec, args.compare, args.statistic, args.at, args.claim)
        spec = with_effects_of_interest(replace(spec, design=design), args.effect_of_interest)
        validate_spec(spec)
        check_set_not_swept(spec, parse_overrides(list(args.set)))
        base: dict[str, Any] = {"data.root": data_root} if data_root is not None else {}
        if fetch and args.download and not args.reanalyze:  # only after every check above: a download takes minutes
            from dcl_core.data import fetch_dataset, resolve_data_root  # torchvision (seconds): not for --help

            data = spec.base.data
            base["data.root"] = str(resolve_data_root(data.dataset, args.data_root, download=True) if args.dry_run
                                    else fetch_dataset(data.dataset, args.data_root))
            if args.dry_run:
                base["data.download"] = True
        return with_base(spec, base) if base else spec

    def command(self, args: StudyArgs) -> dict[str, Any]:
        """The record of the command that builds the spec of ``args`` (``study_options.json``'s ``command``)."""
        return args.record(self.name, self.path)


def defined_in(build_spec: SpecBuilder) -> Path | None:
    """The file of the module that defines ``build_spec``: the study script that called it."""
    module = sys.modules.get(getattr(build_spec, "__module__", ""))
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if isinstance(file, str) and Path(file).is_file() else None
