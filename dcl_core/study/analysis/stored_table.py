"""A stored results table (Parquet) read back within stated bounds, checked from its metadata before any data is
decoded: a study folder may come from anyone, and a 25 KB file whose dictionary-encoded ``error`` text repeats one
long string on every row decodes to gigabytes.

What a study writes (:func:`~dcl_core.study.plan.writers.write_table`): at most :data:`MAX_ROWS` rows of flat
columns (numbers and short texts: a name of at most 80 characters, an error's first 300 characters), well under
:data:`MAX_TABLE_BYTES` decoded. Refused in one line (:class:`~dcl_core.config.ConfigError`): anything but a regular
file (a link, a FIFO, a device), a file over :data:`MAX_TABLE_BYTES`, more rows or columns than that, nested
columns, an encoding that shares text between rows (``DELTA_BYTE_ARRAY``: any size in a few bytes), more than
:data:`MAX_TABLE_BYTES` of pages, and text whose dictionary decodes to more than :data:`MAX_TABLE_BYTES`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dcl_core.config import ConfigError
from dcl_core.files import read_bounded

MAX_ROWS = 100_000  # results rows a study writes: a 1,000-seed grid of 11 τ × 2 losses is 22,000
MAX_COLUMNS = 200  # a study writes 27 (dcl_core.study.analysis.columns)
# Bytes of a table, in the file and decoded: 100,000 rows of 27 columns with a 300-character (<= 1,200-byte) error
# each are under 150 MB
MAX_TABLE_BYTES = 256 * 2**20
# Encodings whose values may be larger decoded than stored only by a bounded factor (a dictionary's indices are
# counted below); DELTA_BYTE_ARRAY stores each text as a prefix shared with the one before, so not.
_ALLOWED_ENCODINGS = frozenset({"PLAIN", "PLAIN_DICTIONARY", "RLE_DICTIONARY", "RLE", "BIT_PACKED",
                                "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "BYTE_STREAM_SPLIT"})


def read_stored_table(path: Path) -> list[dict[str, Any]]:
    """The rows of the Parquet table at ``path``, each a dict of its columns, read within the module's bounds;
    ConfigError (one line naming the file and the bound) otherwise, before the data is decoded."""
    data = read_bounded(path, MAX_TABLE_BYTES)  # a regular file only, its size checked before reading
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        _check_metadata(path, parquet)
        text = [f.name for f in parquet.schema_arrow if _is_text(f.type)]
        # text read as dictionaries: each distinct value held once, its size over the rows counted before decoding
        table = pq.ParquetFile(pa.BufferReader(data), read_dictionary=text).read()
    except ConfigError:
        raise
    except Exception as exc:  # pyarrow's errors for a file that is not Parquet, or a damaged one
        raise ConfigError(f"{path} is not a results table: {str(exc).strip().splitlines()[0][:200]}") from None
    decoded = sum(_decoded_bytes(column) for column in table.columns)
    if decoded > MAX_TABLE_BYTES:
        raise ConfigError(f"{path} decodes to {decoded:,} bytes, more than a study's results table holds (at most "
                          f"{MAX_TABLE_BYTES:,}): not read")
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def _check_metadata(path: Path, parquet: pq.ParquetFile) -> None:
    """ConfigError unless the file's metadata (read from its footer; no data decoded) is within the bounds."""
    meta = parquet.metadata
    if meta.num_rows > MAX_ROWS:
        raise ConfigError(f"{path} holds {meta.num_rows:,} rows, more than a study writes (at most {MAX_ROWS:,}): "
                          "not read")
    if meta.num_columns > MAX_COLUMNS:
        raise ConfigError(f"{path} holds {meta.num_columns:,} columns, more than a study writes (at most "
                          f"{MAX_COLUMNS}): not read")
    nested = [f.name for f in parquet.schema_arrow if pa.types.is_nested(f.type)]
    if nested:
        raise ConfigError(f"{path}: column {nested[0][:80]!r} is nested (lists or structs), which a study's results "
                          "table never is: not read")
    pages = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            pages += chunk.total_uncompressed_size
            odd = set(chunk.encodings) - _ALLOWED_ENCODINGS
            if odd:
                raise ConfigError(f"{path}: column {chunk.path_in_schema[:80]!r} is stored as {sorted(odd)[0]}, "
                                  "which a study never writes (its text could decode to any size): not read")
    if pages > MAX_TABLE_BYTES:
        raise ConfigError(f"{path} holds {pages:,} bytes of pages uncompressed, more than a study's results table "
                          f"(at most {MAX_TABLE_BYTES:,}): not read")


def _decoded_bytes(column: pa.ChunkedArray) -> int:
    """Bytes ``column`` takes once decoded: a dictionary's values counted once per row that uses them (without
    decoding them), any other column as it is held."""
    total = 0
    for chunk in column.chunks:
        if pa.types.is_dictionary(chunk.type):  # only text columns are read as dictionaries
            used = pc.sum(pc.take(pc.binary_length(chunk.dictionary), chunk.indices)).as_py() or 0
            total += int(used) + chunk.indices.nbytes
        else:
            total += chunk.nbytes
    return total


def _is_text(kind: pa.DataType) -> bool:
    """Whether a column of ``kind`` holds text or bytes (what a dictionary can repeat)."""
    return bool(pa.types.is_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_string(kind)
                or pa.types.is_large_binary(kind))
