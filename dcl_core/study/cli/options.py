"""A study script's command line, from :class:`~dcl_core.study.plan.args.StudyArgs` (every option declared once,
there): the parser (:func:`build_parser`) and the frozen request of what it parsed (:func:`request_of`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dcl_core import cli_common
from dcl_core.config import ConfigError, absolute_reference
from dcl_core.study.plan.args import (
    GPU_PRESET,
    PRESET_HELP,
    SMOKE_OUTPUT_DIR,
    StudyArgs,
    StudyRequest,
    args_from_record,
    option_fields,
)
from dcl_core.study.plan.option_fields import GROUPS
from dcl_core.study.plan.run_options import PROGRESS, VERBOSITY_FLAGS, StudyOptions

__all__ = ["GPU_PRESET", "StudyArgs", "StudyRequest", "args_from_record", "args_of", "build_parser", "request_of"]


def build_parser(doc: str, default_name: str, presets: tuple[str, ...] = ("smoke", "cpu", "paper"),
                 extra: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """The argument parser every study script shares, its description the study's docstring: one argument a
    study option's field with a flag (:func:`option_fields`), in its group (a field declared ``only`` when
    ``extra`` names it); ``-v`` and ``-q`` set the verbosity."""
    p = cli_common.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                  allow_abbrev=False)
    groups: dict[str | None, Any] = {None: p} | {g: p.add_argument_group(g) for g in GROUPS}
    for f in option_fields():
        m = f.metadata
        g = groups[m["group"]]
        if f.name == "verbosity":
            for short, flag, _, help in VERBOSITY_FLAGS:
                g.add_argument(short, flag, action="store_true", help=help)
        elif m["flag"] is None or (m["only"] and f.name not in extra):
            continue
        elif f.name == "preset":  # --smoke or --preset: one or the other (the last one given won)
            one = g.add_mutually_exclusive_group()
            one.add_argument("--preset", choices=presets, default=f.default,
                             help="; ".join(f"{n}: {PRESET_HELP.get(n, 'see the docstring')}" for n in presets))
            one.add_argument("--smoke", dest="preset", action="store_const", const="smoke",
                             help="same as --preset smoke")
        elif f.name == "name":
            g.add_argument("--name", default=default_name, help=f"study / MLflow experiment name (default: "
                                                               f"{default_name})")
        elif f.name == "output_dir":
            cli_common.add_store_options(g, "study folder: Ray results, MLflow store, summary",
                                  default_text=f"{f.default}/; {SMOKE_OUTPUT_DIR}/ with --smoke, so that a smoke "
                                  "study and the real one live side by side")
        elif f.name == "set":
            cli_common.add_set_option(g, m["help"])
        elif f.name == "gpus_per_worker":  # not given: the preset's
            g.add_argument(m["flag"], **_argument(f) | {"default": None})
        else:
            flags = (m["short"], m["flag"]) if m["short"] else (m["flag"],)
            g.add_argument(*flags, **_argument(f))
    return p


def _argument(f: dataclasses.Field) -> dict[str, Any]:
    """``add_argument``'s keywords for a field: its type from its annotation, its default, help and choices."""
    m = f.metadata
    kw: dict[str, Any] = {"help": m["help"]}
    if f.type == "bool":
        return kw | {"action": "store_true"}
    if isinstance(f.default, tuple):
        return kw | {"action": "append", "default": [], "metavar": m["metavar"]}
    kw |= {"default": f.default}
    if m["metavar"]:
        kw["metavar"] = m["metavar"]
    if m["choices"]:
        kw["choices"] = m["choices"]
    kind = str(f.type).split(" | ")[0]
    if kind in ("int", "float"):
        kw["type"] = int if kind == "int" else float
    return kw


def args_of(ns: argparse.Namespace) -> StudyArgs:
    """The :class:`StudyArgs` of parsed options, its ``run`` resolved where the command line left it to the preset
    (``--output-dir``, ``--gpus-per-worker``); a user loss's file in ``--losses`` made absolute, as the study
    records it (its trials, and a later ``answer`` from another folder, find the same file). ConfigError for an
    empty ``--output-dir`` or bad resources."""
    def given(cls: type) -> dict[str, Any]:
        return {f.name: tuple(v) if isinstance(v := getattr(ns, f.name), list) else v
                for f in dataclasses.fields(cls) if hasattr(ns, f.name)}

    values, run = given(StudyArgs), given(StudyOptions)
    preset = values.get("preset", StudyArgs.preset)
    if run.get("output_dir", "") is None:  # not given: the preset's folder
        run["output_dir"] = SMOKE_OUTPUT_DIR if preset == "smoke" else StudyOptions.output_dir
    if not str(run.get("output_dir", "outputs")).strip():  # Path("") is the current folder
        raise ConfigError("--output-dir is empty; name a folder (default: outputs)")
    if "output_dir" in run:
        run["output_dir"] = Path(run["output_dir"])
    for flag, given_value in (("--data-root", values.get("data_root")), ("--storage", run.get("storage")),
                              ("--losses", values.get("losses"))):
        if given_value is not None and not given_value.strip():  # '' would mean the default, silently
            raise ConfigError(f"{flag} is empty; name one, or leave {flag} out for the default")
    if run.get("gpus_per_worker", 0.0) is None:
        run["gpus_per_worker"] = float(preset == GPU_PRESET)
    run["verbosity"] = next((v for _, flag, v, _ in VERBOSITY_FLAGS[::-1] if getattr(ns, flag[2:], False)), PROGRESS)
    if values.get("losses"):
        values["losses"] = ",".join(absolute_reference(x.strip()) for x in values["losses"].split(","))
    return StudyArgs(**values, run=StudyOptions(**run))


def request_of(ns: argparse.Namespace, argv: Sequence[str] | None = None) -> StudyRequest:
    """The frozen request of parsed options (ConfigError for an empty ``--output-dir`` or bad resources)."""
    return StudyRequest(args_of(ns), None if argv is None else tuple(argv))
