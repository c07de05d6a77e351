"""Where a study's files live: Ray storage URIs (local paths, ``file://``, ``s3://``, ``gs://``) and the
summary folder, through pyarrow's filesystems so every scheme Ray accepts works the same way."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pyarrow.fs


def storage_join(storage: str, name: str) -> str:
    """``storage/name`` for a local path or a URI (``s3://``, ``gs://``, ``file://``), keeping a URI's query
    (``s3://b/p?region=x`` -> ``s3://b/p/name?region=x``); pathlib would fold ``s3://`` into a folder ``s3:``."""
    if "://" not in storage:
        return f"{storage.rstrip('/')}/{name}"
    parts = urlsplit(storage)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{name}"))


def absolute_storage(storage: str) -> str:
    """A URI as given; a local path made absolute (Tune runs each trial in its own working directory)."""
    return storage if "://" in storage else str(Path(storage).expanduser().resolve())


def storage_exists(uri: str) -> bool:
    fs, path = pyarrow.fs.FileSystem.from_uri(uri)
    return fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound


def storage_delete(uri: str) -> None:
    fs, path = pyarrow.fs.FileSystem.from_uri(uri)
    fs.delete_dir(path)


def default_tracking_uri(output_dir: Path) -> str:
    """A local SQLite MLflow store under the study output directory (absolute: Tune changes each trial's
    working directory)."""
    return f"sqlite:///{(output_dir / 'mlflow.db').resolve()}"


def summary_dir(output_dir: Path, study: str) -> Path:
    """Where a study's table, plots and Parquet go: one folder per study, so studies sharing an output
    directory (and its MLflow store) never overwrite each other's summaries."""
    return output_dir / "summary" / study
