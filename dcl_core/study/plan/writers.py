"""A study's tables and figures, written: the per-trial results table (Parquet + CSV via pyarrow), any other rows,
and a figure as PNG (and PDF), each atomically through :func:`dcl_core.files.write_with` (a fresh temporary
name, then renamed: never half a file, never through a link planted at the name).

What is written is built by :mod:`dcl_core.study.analysis`, which writes nothing: its figures come back unsaved.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from dcl_core.files import write_with
from dcl_core.study.analysis.columns import COLUMN_NAMES, FLOAT_COLUMNS, Row
from dcl_core.study.analysis.figures import Rect, pyplot


def write_table(rows: Sequence[Row], out_dir: Path, stem: str = "results") -> tuple[Path, Path]:
    """Write the per-trial table as Parquet and CSV; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = {c: [r.get(c) for r in rows] for c in COLUMN_NAMES}
    for c in FLOAT_COLUMNS:
        columns[c] = [None if v is None else float(v) for v in columns[c]]
    return _write(pa.table(columns), out_dir, stem)


def write_rows(rows: Sequence[Row], out_dir: Path, stem: str) -> tuple[Path, Path]:
    """Any list of flat dicts as Parquet + CSV (columns from the first row)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return _write(pa.Table.from_pylist(list(rows)), out_dir, stem)


def _write(table: pa.Table, out_dir: Path, stem: str) -> tuple[Path, Path]:
    """Parquet and CSV, each written to a fresh temporary name and renamed (:func:`dcl_core.files.write_with`):
    never half a file (full disk, crash), never through a link planted at either name."""
    parquet = write_with(out_dir / f"{stem}.parquet", lambda f: pq.write_table(table, f))
    csv = write_with(out_dir / f"{stem}.csv", lambda f: pacsv.write_csv(table, f))
    return parquet, csv


def save_figure(fig: Any, path: Path, rect: Rect | None = None, with_pdf: bool = False) -> Path:
    """Lay out ``fig`` (within ``rect``, figure fractions), write it to ``path`` in the format its suffix names
    (folders made; atomically, a link there replaced, never written through: :func:`dcl_core.files.write_with`)
    and close it; returns ``path``. ``with_pdf``: the same figure also as a vector PDF beside it, for a paper."""
    try:
        for target in (path, path.with_suffix(".pdf")) if with_pdf else (path,):
            fig.tight_layout(**({"rect": rect} if rect else {}))
            _savefig(fig, target)
    finally:
        pyplot().close(fig)
    return path


def _savefig(fig: Any, path: Path) -> None:
    write_with(path, lambda f: fig.savefig(f, format=path.suffix.lstrip(".") or "png"))
