"""What a study checks before Ray starts, each in bounded time and with one line on failure: the cluster address
(``auto`` as Ray resolves it) answers, every trial fits this machine (device, batch vs data, decoded images vs
memory), ``--set`` does not fight the study's own grid, and where the data is (on this machine or the cluster's
nodes)."""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path

from dcl_core.config import ConfigError, apply_overrides, check_device, derive
from dcl_core.files import read_bounded
from dcl_core.study.plan.run_options import StudyOptions
from dcl_core.study.plan.spec import StudySpec, grid_points

RECORDED_ADDRESS = re.compile(r"[\w.\-\[\]:%]{1,255}", re.ASCII)  # what an address file may hold to be read as one


def check_ray_address(address: str, timeout: float = 5.0, environ: Mapping[str, str] = os.environ,
                      proc: Path = Path("/proc")) -> None:
    """ConfigError (one line, within ``timeout``) unless something listens at a ``HOST:PORT`` (or ``ray://``)
    cluster address: ``ray.init`` would retry a dead one for minutes. ``auto`` is checked as :func:`auto_address`
    resolves it (``environ``: the environment; ``proc``: where this machine lists its processes); a job-server URL
    is Ray's."""
    target, source = address.removeprefix("ray://"), ""
    if target == "auto":
        found = auto_address(environ, local_gcs_addresses(proc))
        if found is None:
            return
        target, source = found[0].removeprefix("ray://"), f" ({found[0]}: {found[1]})"
    if not target or "://" in target:
        return
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address}{source}: expected HOST:PORT (e.g. 127.0.0.1:6379), ray://HOST:PORT "
                          "or auto; drop --address to run on this machine")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as err:
        raise ConfigError(f"no Ray cluster answers at {address}{source} ({err.strerror or err}); start one with "
                          "`ray start --head`, or drop --address to run locally") from None


def auto_address(environ: Mapping[str, str], running: frozenset[str] | None) -> tuple[str, str] | None:
    """What ``ray.init(address="auto")`` attaches to, by Ray 2.60's rule, and where it comes from: ``$RAY_ADDRESS``;
    else the one Ray running on this machine (``running``: the GCS addresses of its raylets); else the cluster the
    last ``ray start --head`` recorded in Ray's address file (also with several running). None where it is a Ray
    running here, or where this machine's processes cannot be listed (``running`` None: Ray resolves it). A
    ConfigError where there is nothing to attach to. The file outlives a head stopped without ``ray stop`` (killed,
    crashed, docs/cluster.md's ``kill $HEAD_PID``): ``ray.init`` then waits for it for minutes."""
    env = environ.get("RAY_ADDRESS", "")
    if env and env != "auto":
        return env, "$RAY_ADDRESS, which Ray takes over --address auto"
    if running is None:
        return None
    file = ray_address_file(environ)
    # /tmp/ray is anyone's to write: a regular file only (a FIFO would block), bounded, printed only if plain
    recorded = read_bounded(file, 1024).decode(errors="replace").strip() if os.path.lexists(file) else ""
    if recorded and len(running) != 1:
        if not RECORDED_ADDRESS.fullmatch(recorded):
            raise ConfigError(f"--address auto: {file} does not hold a cluster's HOST:PORT as `ray start --head` "
                              "writes it: remove it, or pass --address HOST:PORT")
        return recorded, (f"the cluster the last `ray start` recorded in {file}" +
                          ("" if running else "; no Ray runs on this machine"))
    if running:
        return None
    raise ConfigError(f"--address auto: no Ray runs on this machine and no `ray start` recorded a cluster ({file} "
                      f"{'is empty' if file.is_file() else 'does not exist'}); start one with `ray start --head`, "
                      "pass --address HOST:PORT, or drop --address to run locally")


def ray_address_file(environ: Mapping[str, str]) -> Path:
    """Where ``ray start --head`` records its cluster's address: Ray's temp folder (``$RAY_TMPDIR``, else
    ``$TMPDIR``, else /tmp, then ``ray/``)."""
    root = environ["RAY_TMPDIR"] if "RAY_TMPDIR" in environ else environ.get("TMPDIR") or "/tmp"
    return Path(root) / "ray" / "ray_current_cluster"


def local_gcs_addresses(proc: Path = Path("/proc")) -> frozenset[str] | None:
    """The GCS addresses of the Ray nodes running on this machine, read from their raylets' command lines (``proc``:
    Linux's process folder); None where there is no such folder (macOS, Windows)."""
    if not proc.is_dir():
        return None
    found: set[str] = set()
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            with cmdline.open("rb") as f:
                args = f.read(1 << 16).split(b"\0")
        except OSError:  # a process that ended, or another user's
            continue
        if b"raylet" not in os.path.basename(args[0]):  # as Ray finds them
            continue
        for part in (p for arg in args for p in arg.split(b" ")):
            if part.startswith(b"--gcs-address=") and part.split(b"=", 1)[1] not in (b"", b"None"):
                found.add(part.split(b"=", 1)[1].decode(errors="replace"))
    return frozenset(found)


def check_trials_fit(spec: StudySpec, workers: int) -> None:
    """ConfigError (one line) before Ray if a trial of the study could not run on this machine: its device does
    not exist, its batch is larger than its pretraining images, or those images, decoded, exceed the machine's memory
    (each checked at every grid point, seeds aside; DataError for the last)."""
    from dcl_core.data import check_fits_in_memory, pretraining_images  # no torch: see dcl_core.data
    from dcl_core.training.schedule import steps_per_epoch

    seen = set()
    for grid in spec.grids:
        for point in grid_points({k: v for k, v in grid.items() if k != "seed"}):
            cfg = apply_overrides(spec.base, point)
            derive(cfg, workers)  # what each trial derives first: its workers split its batch, K negatives exist
            dc = cfg.data
            key = (cfg.device, dc.dataset, dc.train_per_class, cfg.optim.batch_size, dc.image_size, dc.loader)
            if key in seen:
                continue
            seen.add(key)
            check_device(cfg.device)
            n = pretraining_images(dc.dataset, dc.root, dc.download, dc.train_per_class)
            if n is not None:
                steps_per_epoch(n, cfg.optim.batch_size, workers)
                if dc.loader == "memory":  # every trial decodes its images into one uint8 tensor
                    check_fits_in_memory(n * 3 * dc.image_size**2, f"{n} {dc.dataset} images at {dc.image_size} px")


def trial_data_root(spec: StudySpec, options: StudyOptions, dry_run: bool) -> tuple[str | None, list[str]]:
    """(the data root the trials read, what this machine lacks). On a cluster the data lives on its nodes (the
    driver checks the address and the output folder); locally the data, each trial's fit and the GPUs are
    checked now. What only this machine lacks (the data, a GPU) stops a run; a dry run, which may plan a cluster
    run, reports it instead."""
    from dcl_core.data import (  # no torch: only the trials load it
        DataError,
        check_dataset,
        check_outside_splits,
        resolve_data_root,
    )

    data = spec.base.data
    on_cluster = options.cluster is not None
    local_problems: list[str] = []
    if on_cluster and not dry_run:
        check_ray_address(options.cluster or "")
    if on_cluster:  # the data lives on the cluster's nodes, not necessarily on this driver
        root: str | None = data.root or str(resolve_data_root(data.dataset, None, data.download))
        if not options.output_dir.expanduser().is_absolute():
            # Under `ray job submit --working-dir .` a relative folder is inside the job's temporary copy.
            raise ConfigError("on a cluster, pass an absolute --output-dir on storage that outlives the job "
                              "(a relative one lands in the job's temporary working directory)")
        if not options.storage:
            logging.getLogger(__name__).warning(
                "no --storage: Ray results go to %s/ray_results; with trials on several nodes it must be "
                "shared storage (NFS, s3://, gs://)", options.output_dir)
    else:
        try:
            root = str(check_dataset(data.dataset, data.root, data.download))
        except DataError as err:
            if not dry_run:
                raise
            root = None
            local_problems.append(str(err))
        if root is not None:  # the study's folder (and a local --storage) never among the images its trials read
            local_storage = [options.storage] if options.storage and "://" not in options.storage else []
            for written in [str(options.output_dir), *local_storage]:
                check_outside_splits(written, Path(root))
        if not dry_run:  # what a single run checks before compute, for every trial the study can run
            check_trials_fit(spec, options.workers)
        if options.gpus_per_worker > 0 and not _has_cuda():
            message = (f"--gpus-per-worker {options.gpus_per_worker:g} needs GPUs, and the local Ray has none (no "
                       "CUDA device here); submit to a GPU cluster (--address or ray job submit), or train on this "
                       "machine's CPUs with --gpus-per-worker 0 (the paper preset's default is 1)")
            if not dry_run:
                raise ConfigError(message)
            local_problems.append(message)
    return root, local_problems


def _has_cuda() -> bool:
    import torch  # seconds, and only for a study that asks for GPUs

    return torch.cuda.is_available()
