"""A study script's command line, from :class:`~dcl_core.study.plan.args.StudyArgs` (every option declared once,
there): the parser (:func:`build_parser`) and the frozen request of what it parsed (:func:`request_of`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from dcl_core import cli_common
from dcl_core.config import absolute_reference
from dcl_core.study.plan.args import (
    GPU_PRESET,
    PRESET_HELP,
    SMOKE_OUTPUT_DIR,
    StudyArgs,
    StudyRequest,
    args_from_record,
    options_of,
)

__all__ = ["GPU_PRESET", "StudyArgs", "StudyRequest", "args_from_record", "args_of", "build_parser", "options_of",
           "request_of"]


def build_parser(doc: str, default_name: str, presets: tuple[str, ...] = ("smoke", "cpu", "paper"),
                 extra: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """The argument parser every study script shares, its description the study's docstring: one argument a
    :class:`StudyArgs` field with a flag, in its group (a field declared ``only`` when ``extra`` names it)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    groups: dict[str | None, Any] = {None: p}
    for f in dataclasses.fields(StudyArgs):
        m = f.metadata
        if m["flag"] is None or (m["only"] and f.name not in extra):
            continue
        if m["group"] not in groups:
            groups[m["group"]] = p.add_argument_group(m["group"])
        g = groups[m["group"]]
        if f.name == "preset":
            g.add_argument("--preset", choices=presets, default=f.default,
                           help="; ".join(f"{n}: {PRESET_HELP.get(n, 'see the docstring')}" for n in presets))
            g.add_argument("--smoke", dest="preset", action="store_const", const="smoke", help="same as --preset smoke")
        elif f.name == "name":
            g.add_argument("--name", default=default_name, help=f"study / MLflow experiment name (default: "
                                                               f"{default_name})")
        elif f.name == "output_dir":
            cli_common.add_store_options(g, "study folder: Ray results, MLflow store, summary",
                                  default_text=f"{f.default}/; {SMOKE_OUTPUT_DIR}/ with --smoke, so that a smoke "
                                  "study and the real one live side by side")
        elif f.name == "set":
            cli_common.add_set_option(g, m["help"])
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
    kind = f.type.split(" | ")[0]
    if kind in ("int", "float"):
        kw["type"] = int if kind == "int" else float
    return kw


def args_of(ns: argparse.Namespace) -> StudyArgs:
    """The :class:`StudyArgs` of parsed options; a user loss's file in ``--losses`` made absolute, as the study
    records it (its trials, and a later ``answer`` from another folder, find the same file)."""
    given: dict[str, Any] = {f.name: getattr(ns, f.name) for f in dataclasses.fields(StudyArgs) if hasattr(ns, f.name)}
    if given.get("output_dir", "") is None:  # not given: the preset's folder
        given["output_dir"] = SMOKE_OUTPUT_DIR if given.get("preset") == "smoke" else StudyArgs.output_dir
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
    if values.get("losses"):
        values["losses"] = ",".join(absolute_reference(x.strip()) for x in values["losses"].split(","))
    return StudyArgs(**values)


def request_of(ns: argparse.Namespace, argv: Sequence[str] | None = None) -> StudyRequest:
    """The frozen request of parsed options (ConfigError for an empty ``--output-dir`` or bad resources)."""
    args = args_of(ns)
    return StudyRequest(args, options_of(args), None if argv is None else tuple(argv))
