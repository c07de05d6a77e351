"""Where a run executes: its rank, world size and device (joining or starting the process group under torchrun or a
Ray Train worker), values averaged over or broadcast from the ranks, and how many CPU threads it may use."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dcl_core.config import Config, ConfigError

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """This process's place in training: its rank, the world size, its device and who tears down the group."""

    rank: int
    world_size: int
    device: torch.device
    owns_process_group: bool


MAX_WORLD = 1 << 16  # processes in one run: far beyond any cluster this project plans for


def launch_world() -> int:
    """The number of processes the launcher's environment gives this run (``WORLD_SIZE``, 1 without torchrun);
    ConfigError (one line) for ``WORLD_SIZE``, ``RANK`` or ``LOCAL_RANK`` that is not a whole number in range, or
    several processes without the rendezvous torchrun sets (``MASTER_ADDR``, ``MASTER_PORT``): torch's own answers
    were a traceback (a ValueError, a ZeroDivisionError) or, for ``WORLD_SIZE=-1``, none."""
    def whole(name: str, default: int, low: int, high: int) -> int:
        text = os.environ.get(name)
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise ConfigError(f"${name} must be a whole number in [{low}, {high}], got {text[:40]!r} (torchrun sets "
                              "it; unset it to train in one process)")
        return value

    world = whole("WORLD_SIZE", 1, 1, MAX_WORLD)
    whole("RANK", 0, 0, world - 1)
    whole("LOCAL_RANK", 0, 0, world - 1)
    if world > 1 and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
        raise ConfigError(f"$WORLD_SIZE={world} asks for {world} processes, and $MASTER_ADDR or $MASTER_PORT is not "
                          f"set: start them with torchrun --nproc-per-node {world} (which sets all four), or unset "
                          "WORLD_SIZE to train in one process")
    return world


def setup_runtime(cfg: Config) -> Runtime:
    """Join (or start, under torchrun) the process group and pick the device."""
    owns = False
    if not (dist.is_available() and dist.is_initialized()) and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        use_cuda = cfg.device != "cpu" and torch.cuda.is_available()
        if os.environ.get("RANK", "0") == "0":  # a peer that never starts leaves every rank waiting here
            log.info("waiting for the %s processes of $WORLD_SIZE to join at %s:%s (torchrun sets these; unset "
                     "WORLD_SIZE to train in one process)", os.environ["WORLD_SIZE"], os.environ.get("MASTER_ADDR"),
                     os.environ.get("MASTER_PORT"))
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        owns = True
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda requested but CUDA is not available")
    if cfg.device in ("auto", "cuda") and torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    return Runtime(rank, world, device, owns)


def average_over_ranks(values: dict[str, float], runtime: Runtime) -> dict[str, float]:
    """Mean of each metric over ranks (identical on every rank afterwards)."""
    if runtime.world_size == 1 or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=runtime.device)
    dist.all_reduce(t)
    return dict(zip(keys, (t / runtime.world_size).tolist(), strict=True))


def broadcast_from_rank0(values: dict[str, float], keys: Sequence[str], runtime: Runtime) -> dict[str, float]:
    """Rank 0's values of ``keys`` on every rank."""
    if runtime.world_size == 1 or not keys:
        return values
    t = torch.tensor([values.get(k, float("nan")) for k in keys], dtype=torch.float64, device=runtime.device)
    dist.broadcast(t, src=0)
    return dict(zip(keys, t.tolist(), strict=True))


def free_cpu_threads(processes: int = 1, cpus: int | None = None, busy: float | None = None) -> int:
    """Intra-op threads for each of ``processes`` on this machine: the CPUs not busy right now (measured over a
    fraction of a second, :func:`busy_cpus`), shared out, at least 1. Threads beyond the free CPUs cost far more
    than they bring: on a busy 2-core machine 2 threads trained a ResNet-18 ×0.25 at 27 images/s where 1 thread
    gave 178 (measured on 2026-11-24)."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if busy is None:
        busy = busy_cpus()
    threads = max(1, math.floor((cpus - busy + 0.5) / max(1, processes)))
    log.info("torch threads: %d (%d CPUs, %.1f busy, %d process(es); --threads to choose)", threads, cpus, busy,
             processes)
    return threads


def busy_cpus(window: float = 0.5) -> float:
    """How many CPUs other work keeps busy now: /proc/stat's non-idle share over ``window`` seconds times the CPU
    count (the 1-minute load average lags: it still counts a job that ended a minute ago). Falls back to the load
    average where /proc/stat is missing."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields)  # idle + iowait, total

    try:
        idle0, total0 = sample()
        time.sleep(window)
        idle1, total1 = sample()
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except OSError:
            return 0.0
    total = max(total1 - total0, 1)
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / total)


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocation that failed (the CPU allocator's, CUDA's, or Python's MemoryError)."""
    text = str(err)
    return isinstance(err, MemoryError | torch.OutOfMemoryError) or "can't allocate memory" in text or \
        "out of memory" in text.lower()


def first_line(err: BaseException) -> str:
    """The first line of ``err``'s message, at most 200 characters."""
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else type(err).__name__)[:200]
