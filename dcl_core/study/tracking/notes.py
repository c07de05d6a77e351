"""Run descriptions: the markdown MLflow's UI shows for a run (its ``mlflow.note.content`` tag). Text from data
is made literal (:func:`literal_markdown`), so a loss name or a journal line cannot inject HTML or a link, and a
replay can tell a description a tracker wrote from a planted one (:func:`is_literal_markdown`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import quote

from dcl_core.study.tracking.journal import LOCAL_ID

NOTE_TAG = "mlflow.note.content"  # a run's description in MLflow's UI (markdown)


def literal_markdown(text: str) -> str:
    """``text`` as literal markdown: the characters MLflow's renderer (showdown) would read as emphasis, code or
    HTML are escaped, and so is a link's ``](`` (``[click](javascript:…)`` from a loss name or a note stays
    text). Brackets alone are not: an interval ``[0.4, 3.8]`` is no link, and the runs table's Description cell
    shows the text raw, where a backslash would be noise."""
    return re.sub(r"([\\`*_])", r"\\\1", text).replace("<", "&lt;").replace("](", "]\\(")


def is_literal_markdown(text: str) -> bool:
    """Whether ``text`` is what :func:`literal_markdown` makes of some text (every description a tracker writes
    is; a planted ``<img onerror=…>`` is not)."""
    plain = re.sub(r"\\([\\`*_])", r"\1", text.replace("]\\(", "](").replace("&lt;", "<"))
    return literal_markdown(plain) == text


def summary_note(verdicts: list[str], words: str = "", plot: str | None = None, run_id: str | None = None) -> str:
    """The summary run's description: ``Verdict: <words>`` first (the runs table's Description column shows a
    line's first 40-odd characters), the verdict lines (what the study prints last), then its plot, embedded from
    the run's own artifacts (``get-artifact``, relative to the UI, as MLflow's artifact view fetches it)."""
    parts = [literal_markdown(f"Verdict: {words}")] if words else []
    parts += [literal_markdown(line) for line in verdicts]
    if plot and run_id and not run_id.startswith(LOCAL_ID):
        parts.append(f"![{literal_markdown(plot)}](get-artifact?path={quote(plot)}&run_uuid={run_id})")
    if parts:
        parts.append("The cells, the paper's numbers and the NPC regime: table.txt among the artifacts.")
    return "\n\n".join(parts)


def verdict_lines(tags: Mapping[str, str]) -> list[str]:
    """The verdict lines among a summary run's tags (``verdict_<i>_line``, as the answer makes them), in order."""
    found = [(int(m.group(1)), v) for k, v in tags.items() if (m := re.fullmatch(r"verdict_(\d+)_line", k))]
    return [v for _, v in sorted(found)]
