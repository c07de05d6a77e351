"""A study's stored results table is read within stated bounds, checked from the file's metadata before its data is
decoded (issue 46, item 4: a 25 KB ``results.parquet`` whose dictionary-encoded ``error`` text decoded to 2 GB).
Real files: crafted with pyarrow as an attacker would, a real FIFO, a real device node, a real link."""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dcl_core.config import ConfigError
from dcl_core.study.analysis.stored_table import MAX_COLUMNS, MAX_ROWS, MAX_TABLE_BYTES
from dcl_core.study.analysis.tables import read_table
from dcl_core.study.plan.writers import write_table

REPO = Path(__file__).resolve().parents[3]
ROW = {"trial_id": "ab_00000", "status": "ok", "loss": "dcl", "temperature": 0.1, "seed": 0, "knn_top1": 10.0}


def _bomb(path: Path, rows: int, error_bytes: int) -> Path:
    """A results table whose ``error`` column repeats one ``error_bytes`` text on every row, dictionary-encoded: the
    file holds the text once, a reader that decodes it holds it ``rows`` times."""
    columns = {k: pa.array([v] * rows) for k, v in ROW.items()}
    columns["error"] = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["x" * error_bytes]))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def test_a_study_s_own_table_reads_back_as_written(tmp_path: Path) -> None:
    rows = [ROW | {"trial_id": f"ab_{i:05d}", "seed": i, "error": "RuntimeError: " + "é" * 280} for i in range(50)]
    parquet, _ = write_table(rows, tmp_path)
    back = read_table(parquet)
    assert [{k: r[k] for k in (*ROW, "error")} for r in back] == rows


def test_text_that_decodes_past_the_bound_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    path = _bomb(tmp_path / "results.parquet", rows=MAX_ROWS, error_bytes=3000)  # 300 MB decoded
    assert path.stat().st_size < 2**20
    with pytest.raises(ConfigError, match=rf"{path} decodes to 30\d,\d{{3}},\d{{3}} bytes, more than a study's results "
                                          rf"table holds \(at most {MAX_TABLE_BYTES:,}\): not read"):
        read_table(path)


def test_more_rows_or_columns_than_a_study_writes_are_refused_from_the_footer(tmp_path: Path) -> None:
    many = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"seed": pa.array(range(MAX_ROWS + 1))}), many)
    with pytest.raises(ConfigError, match=rf"holds {MAX_ROWS + 1:,} rows, more than a study writes"):
        read_table(many)
    wide = tmp_path / "columns.parquet"
    pq.write_table(pa.table({f"c{i}": [0.0] for i in range(MAX_COLUMNS + 1)}), wide)
    with pytest.raises(ConfigError, match=rf"holds {MAX_COLUMNS + 1} columns"):
        read_table(wide)


def test_nested_columns_and_prefix_shared_text_are_refused(tmp_path: Path) -> None:
    """A list column's values are not bounded by the rows; DELTA_BYTE_ARRAY stores each text as the previous one's
    prefix plus a suffix, so 100,000 rows of one 20 KB text take a few bytes each."""
    nested = tmp_path / "nested.parquet"
    pq.write_table(pa.table({"seed": [0], "q_hist": [[0.5] * 3]}), nested)
    with pytest.raises(ConfigError, match="column 'q_hist' is nested"):
        read_table(nested)
    delta = tmp_path / "delta.parquet"
    pq.write_table(pa.table({"error": ["x" * 20_000] * 1000}), delta, use_dictionary=False,
                   column_encoding={"error": "DELTA_BYTE_ARRAY"})
    assert delta.stat().st_size < 200_000
    with pytest.raises(ConfigError, match="column 'error' is stored as DELTA_BYTE_ARRAY, which a study never writes"):
        read_table(delta)


_READ_NODES = """
import sys
from pathlib import Path
from dcl_core.config import ConfigError
from dcl_core.study.analysis.tables import read_table

for name in sys.argv[1:]:
    try:
        read_table(Path(name))
    except ConfigError as err:
        print(err)
"""


@pytest.mark.slow  # a command in a subprocess (the fork server's start: ~30 s)
def test_a_fifo_a_device_and_a_link_are_refused_without_reading_them(tmp_path: Path) -> None:
    """Each at a study's ``results.parquet``: a FIFO blocked the reader forever, a device would be read to its end."""
    import pyrun

    real, _ = write_table([ROW], tmp_path / "real")
    names = []
    for kind in ("fifo", "device", "link"):
        path = tmp_path / kind / "results.parquet"
        path.parent.mkdir()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "device":
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
        else:
            path.symlink_to(real)
        names.append(str(path))
    proc = pyrun.run([sys.executable, "-c", _READ_NODES, *names], capture_output=True, text=True, timeout=60,
                     cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [f"{names[0]} is a FIFO, not a regular file: not read",
                                        f"{names[1]} is a character device, not a regular file: not read",
                                        f"{names[2]} is a symbolic link, not a regular file: not read"]


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, resource.getrlimit(resource.RLIMIT_AS)[1]))


@pytest.mark.slow  # python -m dcl_core.study answer in a subprocess (MLflow's import)
def test_answer_refuses_the_issue_s_table_in_one_line(tmp_path: Path) -> None:
    """The issue's file: 100,000 rows whose one 20 KB error text decodes to 2 GB (an address-space limit keeps a
    reader that decodes it from taking the machine's memory)."""
    out = tmp_path / "out"
    summary = out / "summary" / "temperature_sweep"
    path = _bomb(summary / "results.parquet", rows=MAX_ROWS, error_bytes=20_000)
    (summary / "study_options.json").write_text(json.dumps({"command": {"script": "temperature_sweep",
                                                                         "preset": "smoke"}}))
    proc = subprocess.run([sys.executable, "-m", "dcl_core.study", "answer", str(out), "--tracking-uri",
                           f"sqlite:///{out / 'here.db'}", "-q"], capture_output=True, text=True, timeout=300,
                          cwd=REPO, preexec_fn=_limited)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {path} decodes to 2,00") and line.endswith(
        f" bytes, more than a study's results table holds (at most {MAX_TABLE_BYTES:,}): not read")
