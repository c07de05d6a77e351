"""Where the trainer's step loses time to the bare loop: one epoch of each under ``torch.profiler``, side by side.

    python benchmarks/step_profile.py [--device cuda] [--tiny]

On an H200 the trainer (``dcl_core.training.train``) ran 28-39% below a bare loop of the same model, loss,
augmentation and optimizer (docs/performance.md), while on the CPU it is within a few percent; its code reads no
device value back per step on a GPU (its NaN check is read every 50 steps). This part measures instead of
reading: the bare loop of ``benchmarks/trainer.py`` for one epoch after a warm-up one, and the trainer's second
epoch of three (its first warms up; the kNN monitor after its last is not profiled), both under the profiler.
Per step, for each side:

- ``wall``: milliseconds of the profiled epoch over its steps (the trainer's epoch includes its end-of-epoch
  metrics and checkpoint, as its overhead row counts them);
- ``device``: milliseconds the device's kernels ran (0 on a CPU); wall minus device is time the device waited;
- ``reads``: the host's reads of a tensor's value (``aten::_local_scalar_dense``: ``.item()``, ``float()``,
  ``bool()``), of a CPU tensor's too (the augmentation's draws): a read of a GPU tensor waits for the device, and
  shows as a blocking call below;
- ``syncs``: CUDA calls that block the host (stream, event and device synchronisations, ``cudaMemcpy``);
  ``copies``: ``cudaMemcpyAsync`` calls (from pageable host memory they wait too).

The last row names the operators whose self time per step grew most from the bare loop to the trainer (device
time on a GPU, CPU time on a CPU; none where none grew). ``--tiny`` runs it at toy sizes, the CPU rehearsal
(tests/test_benchmark_gpu.py); ``benchmarks/gpu.py`` runs it as its ``profile`` part.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, markdown_table
from benchmarks.trainer import BareLoop, step_config
from dcl_core.config import Config, apply_overrides, derive, to_flat_dict
from dcl_core.training import train
from dcl_core.training.builders import InMemoryData, build_data, build_model, build_optimizer
from dcl_core.training.checkpoint import save_checkpoint
from dcl_core.training.run_setup import amp_dtype

SECTION = "profile"
READ = "aten::_local_scalar_dense"  # what .item(), float() and bool() of a tensor run
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
COPY = "cudaMemcpyAsync"
TOP = 5  # operators named in the last row


@dataclass(frozen=True)
class StepProfile:
    """One side's profiled epoch, per step: wall and device milliseconds, host reads, blocking calls, copies, and
    each operator's self time (device milliseconds on a GPU, CPU milliseconds on a CPU)."""

    wall_ms: float
    device_ms: float
    reads: float
    syncs: float
    copies: float
    self_ms: dict[str, float]


def summarize(events: Iterable[Any], seconds: float, steps: int, on_gpu: bool) -> StepProfile:
    """The per-step figures of one profiled epoch of ``steps`` steps that took ``seconds``; ``events``: the
    profile's ``key_averages()``. A kernel is an event of its own (device type CUDA) and also the self device
    time of the operator that launched it: the device's total sums the kernels, the per-operator times the
    operators'."""
    events = list(events)
    count = {e.key: e.count for e in events}
    kernels_us = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA)
    ops = [e for e in events if e.device_type == DeviceType.CPU]
    own_us = {e.key: e.self_device_time_total if on_gpu else e.self_cpu_time_total for e in ops}
    return StepProfile(seconds * 1e3 / steps, kernels_us / 1e3 / steps, count.get(READ, 0) / steps,
                       sum(count.get(k, 0) for k in SYNCS) / steps, count.get(COPY, 0) / steps,
                       {k: v / 1e3 / steps for k, v in own_us.items() if v > 0})


def _activities(device: torch.device) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device.type == "cuda" else [])]


def profile_bare(cfg: Config, data: InMemoryData, device: torch.device) -> StepProfile:
    """The bare loop's second epoch (its first warms up), profiled."""
    bare = BareLoop(cfg, data, device, amp_dtype(device) if cfg.amp else None)
    bare.epoch()
    with profile(activities=_activities(device)) as prof:
        seconds = bare.epoch()
    return summarize(prof.key_averages(), seconds, len(data) // cfg.optim.batch_size, device.type == "cuda")


class _ProfiledError(Exception):
    """Raised by the epoch callback once the profiled epoch is over: the run ends there."""


def profile_trainer(cfg: Config, steps: int, device: torch.device) -> StepProfile:
    """The trainer's second epoch of three, profiled from the end of its first epoch's callback to the start of
    its second's (the kNN monitor runs after the last epoch only)."""
    prof = profile(activities=_activities(device))
    began: list[float] = []

    def on_epoch(epoch: int, metrics: dict[str, float], checkpoint: Path | None) -> None:
        if not began:
            began.append(time.perf_counter())
            prof.start()
            return
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began.append(time.perf_counter())
        prof.stop()
        raise _ProfiledError

    with tempfile.TemporaryDirectory(prefix="bench_profile_") as out, contextlib.suppress(_ProfiledError):
        train(apply_overrides(cfg, {"output_dir": out, "optim.epochs": 3}),
              callbacks=[on_epoch])
    assert len(began) == 2, "the trainer ended before its second epoch"
    return summarize(prof.key_averages(), began[1] - began[0], steps, device.type == "cuda")


def profile_rows(cfg: Config, device: torch.device) -> Iterator[Row]:
    """The rows comparing one profiled epoch of the trainer with one of the bare loop at ``cfg``'s batch."""
    data = build_data(cfg)
    assert isinstance(data, InMemoryData)
    steps = len(data) // cfg.optim.batch_size
    bare = profile_bare(cfg, data, device)
    ours = profile_trainer(cfg, steps, device)
    batch = cfg.optim.batch_size
    where = f"per step, batch {batch}, one epoch of {steps} steps a side"
    fields: tuple[tuple[str, str, Callable[[StepProfile], float]], ...] = (
        ("wall", "ms", lambda p: p.wall_ms), ("device busy", "ms", lambda p: p.device_ms),
        ("host reads of a tensor value", "", lambda p: p.reads), ("blocking CUDA calls", "", lambda p: p.syncs),
        ("cudaMemcpyAsync calls", "", lambda p: p.copies))
    for name, unit, get in fields:
        a, b = get(ours), get(bare)
        yield Row(SECTION, f"trainer vs bare loop: {name}", a, b, a / b if b else None, unit=unit, note=where)
    grown = sorted(((d, k) for k in ours.self_ms if (d := ours.self_ms[k] - bare.self_ms.get(k, 0.0)) > 0),
                   reverse=True)[:TOP]
    kind = "device" if device.type == "cuda" else "CPU"
    yield Row(SECTION, f"trainer's extra {kind} time by operator", sum(d for d, _ in grown), unit="ms",
              note="; ".join(f"{k} +{d:.3g}" for d, k in grown))
    yield checkpoint_row(cfg, device, bare.wall_ms)


def checkpoint_row(cfg: Config, device: torch.device, step_ms: float, reps: int = 3) -> Row:
    """What the checkpoint the trainer writes after every epoch costs: a state of the run's size (the model and the
    optimizer's momentum, on ``device``, with the flat config) written by ``save_checkpoint`` as the trainer's
    ``_save`` writes it (its tensors copied to the host together, then a temporary file, fsync'd, renamed),
    against ``torch.save`` of the state as it is into memory (on a GPU: each tensor copied to pageable memory in
    turn, and the pickling). Medians of ``reps``; ``step_ms``: a step of the bare loop, to say what the checkpoint
    costs in steps."""
    model = build_model(cfg).to(device, memory_format=torch.channels_last)  # type: ignore[call-overload]
    optimizer = build_optimizer(cfg, derive(cfg, 1), model)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # the momentum buffers exist, as after any trained epoch
    state = {"epoch": 1, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "config": to_flat_dict(cfg), "history": []}
    written, serialised, size = [], [], 0
    with tempfile.TemporaryDirectory(prefix="bench_checkpoint_") as out:
        for _ in range(reps):
            t0 = time.perf_counter()
            size = save_checkpoint(state, Path(out) / "checkpoint.pt").stat().st_size
            written.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            torch.save(state, io.BytesIO())
            serialised.append(time.perf_counter() - t0)
    ours, mem = statistics.median(written), statistics.median(serialised)
    return Row(SECTION, "the trainer's checkpoint, written after every epoch", ours * 1e3, mem * 1e3,
               ours / mem if mem else None, unit="ms",
               note=f"{size / 1e6:.0f} MB, fsync'd; baseline: torch.save of the state as it is into memory; "
                    f"= {ours * 1e3 / step_ms:.1f} steps of the bare loop; median of {reps}")


def profile_config(tiny: bool) -> Config:
    """The overhead rows' config at batch 512 (batch 8 over 80 images with ``tiny``), for one profiled epoch a side
    (:mod:`benchmarks.step_profile`)."""
    cfg = step_config(8 if tiny else 512, tiny, None, epochs=3)
    return apply_overrides(cfg, {"data.train_per_class": 8}) if tiny else cfg


def main(argv: list[str] | None = None) -> int:
    """Print the profile rows as a table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--tiny", action="store_true", help="toy sizes (the CPU rehearsal)")
    args = p.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    print(markdown_table(list(profile_rows(profile_config(args.tiny), device))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
