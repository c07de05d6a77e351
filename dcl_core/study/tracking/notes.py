"""Run descriptions: the markdown MLflow's UI shows for a run (its ``mlflow.note.content`` tag). Text from data
is made literal (:func:`literal_markdown`), so a loss name or a journal line cannot inject HTML or a link, and a
replay can tell a description a tracker wrote from a planted one (:func:`is_literal_markdown`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
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


def summary_note(verdicts: list[str], words: str = "", plot: str | None = None, run_id: str | None = None,
                 cells: tuple[str, Sequence[Sequence[str]]] = ("", ())) -> str:
    """The summary run's description: ``Verdict: <words>`` first (the runs table's Description column shows a
    description's first 50 characters), the verdict lines (what the study prints last), the cells (``cells``: a
    caption and table rows, the header first) as an aligned table, then its plot, embedded from the run's own
    artifacts (``get-artifact``, relative to the UI, as MLflow's artifact view fetches it)."""
    parts = [literal_markdown(f"Verdict: {words}")] if words else []
    parts += [literal_markdown(line) for line in verdicts]
    caption, rows = cells
    if rows:
        parts.append(literal_markdown(caption) + "\n\n" + code_table(rows))
    if plot and run_id and not run_id.startswith(LOCAL_ID):
        parts.append(f"![{literal_markdown(plot)}](get-artifact?path={quote(plot)}&run_uuid={run_id})")
    if parts:
        parts.append("The paper's numbers and the NPC regime: table.txt among the artifacts." if rows else
                     "The cells, the paper's numbers and the NPC regime: table.txt among the artifacts.")
    return "\n\n".join(parts)


def code_table(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` (the header first) aligned in columns inside a fenced code block, which MLflow's renderer shows
    monospaced and literally (a markdown table's cells ran together there); a backtick from data becomes ``'``, so
    nothing can close the block."""
    cells = [[str(c).replace("`", "'") for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in cells]
    return "\n".join(["```", *(line.rstrip() for line in lines), "```"])


def verdict_lines(tags: Mapping[str, str]) -> list[str]:
    """The verdict lines among a summary run's tags (``verdict_<i>_line``, as the answer makes them), in order."""
    found = [(int(m.group(1)), v) for k, v in tags.items() if (m := re.fullmatch(r"verdict_(\d+)_line", k))]
    return [v for _, v in sorted(found)]
