"""What every benchmark section shares: a result row, A/B interleaving, and the Markdown/JSON report.

A comparison is measured in one run with its two sides interleaved (A B A B …) so that a noisy machine slows
both alike; each side's median is reported and the ratio of the medians is what docs/performance.md quotes.
"""

from __future__ import annotations

import importlib
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

from dcl_core.files import write_text

# The most of a run's metrics.jsonl a benchmark reads: one ~1 KB line an epoch, so 4,000 epochs
# (dcl_core.files.read_bounded: a larger file, a link, a FIFO or a device is refused unread).
MAX_METRICS_BYTES = 4 * 2**20


@dataclass
class Row:
    """One line of the benchmark table.

    Attributes:
        section: the comparison family (``losses``, ``augmentation``, ``trainer``, …).
        name: what was measured, with its sizes (``InfoNCE fwd+bwd, N=512``).
        ours: our median (``unit``).
        baseline: the other side's median (same unit), ``None`` for a plain measurement.
        ratio: the number the goal is stated in (e.g. ours/baseline time), ``None`` if there is none.
        goal: the goal in words (``<= 1.0x lightly``), empty if the row only informs.
        met: whether ``ratio`` meets the goal, ``None`` if there is no goal.
        unit: of ``ours``/``baseline`` (``ms``, ``images/s``, ``%``, ``s``).
        note: anything a reader needs to interpret the row (baseline's name, what was excluded).
    """

    section: str
    name: str
    ours: float
    baseline: float | None = None
    ratio: float | None = None
    goal: str = ""
    met: bool | None = None
    unit: str = ""
    note: str = ""


def interleaved(a: Callable[[], object], b: Callable[[], object], reps: int, warmup: int = 1) -> tuple[float, float]:
    """Median wall seconds of ``a()`` and of ``b()`` over ``reps`` interleaved calls (A B A B …), after
    ``warmup`` untimed calls of each."""
    for _ in range(warmup):
        a()
        b()
    times_a, times_b = [], []
    for _ in range(reps):
        for fn, times in ((a, times_a), (b, times_b)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times_a), statistics.median(times_b)


def median_time(fn: Callable[[], object], reps: int, warmup: int = 1) -> float:
    """Median wall seconds of ``fn()`` over ``reps`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return ""
    return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"


def markdown_table(rows: Sequence[Row]) -> str:
    """The rows as a GitHub Markdown table (one line per row, goal and whether it is met last)."""
    lines = [
        "| section | measurement | ours | baseline | ratio | goal | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        unit = f" {r.unit}" if r.unit else ""
        met = {True: "yes", False: "**no**", None: ""}[r.met]
        name = f"{r.name} ({r.note})" if r.note else r.name
        baseline = f"{_fmt(r.baseline)}{unit}" if r.baseline is not None else ""
        ratio = f"{_fmt(r.ratio)}" if r.ratio is not None else ""
        lines.append(f"| {r.section} | {name} | {_fmt(r.ours)}{unit} | {baseline} | {ratio} | {r.goal} | {met} |")
    return "\n".join(lines)


def write_json(rows: Sequence[Row], path: Path, meta: dict[str, object]) -> None:
    """``{"meta": …, "rows": [Row as dict, …]}`` to ``path`` (parents created; atomically, a link there replaced,
    never written through: :func:`dcl_core.files.write_text`)."""
    write_text(path, json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)``, restoring the previous count afterwards."""
    import torch  # here, not at the top: run.py's --help and the report helpers need no torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def speedup_row(section: str, name: str, ours_s: float, baseline_s: float, goal: str, at_least: float | None,
                note: str = "") -> Row:
    """A row comparing two median times in ms, ``ratio = baseline / ours`` (> 1: ours is faster); ``met`` is
    ``ratio >= at_least`` (``None`` without a goal)."""
    ratio = baseline_s / ours_s
    met = None if at_least is None else ratio >= at_least
    return Row(section, name, ours_s * 1e3, baseline_s * 1e3, ratio, goal, met, "ms", note)


def bench_extra(module: str, section: str, requirement: str) -> ModuleType:
    """Import a baseline that only the ``bench`` extra installs (lightly, kornia), or raise a RuntimeError
    saying how to install it (the section then becomes an error row)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:  # a bench extra, not a dcl_core dependency
        raise RuntimeError(
            f"the {section} benchmark compares against {module.split('.')[0]}, which is not installed: "
            f"pip install -e '.[bench]' (or pip install '{requirement}')"
        ) from err
