"""What a study checks before Ray starts, each in bounded time and with one line on failure: the cluster address
answers, every trial fits this machine (device, batch vs data, decoded images vs memory), ``--set`` does not fight
the study's own grid, and where the data is (on this machine or the cluster's nodes)."""

from __future__ import annotations

import logging
import socket

from dcl_core.config import ConfigError, apply_overrides, check_device
from dcl_core.study.plan.run_options import StudyOptions
from dcl_core.study.plan.spec import StudySpec, grid_points


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """ConfigError (one line, within ``timeout``) unless something listens at a ``HOST:PORT`` (or ``ray://``)
    cluster address: ``ray.init`` would retry a dead one for minutes. ``auto`` and job-server URLs are Ray's."""
    target = address.removeprefix("ray://")
    if not target or target == "auto" or "://" in target:
        return
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address}: expected HOST:PORT (e.g. 127.0.0.1:6379), ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as err:
        raise ConfigError(f"no Ray cluster answers at {address} ({err.strerror or err}); start one with `ray start "
                          "--head`, or drop --address to run locally") from None


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
    from dcl_core.data import DataError, check_dataset, resolve_data_root  # no torch: only the trials load it

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
