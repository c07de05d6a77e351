"""Levers: what could make a CPU training step faster, each against today's trainer setting.

Today's setting (what a CPU study trial runs): fp32, channels_last model and inputs, 1 intra-op thread per trial,
2 trials at a time on 2 cores. A step is the trainer's SimCLR step: both views through the encoder as one batch,
DCL loss (τ = 0.1), backward, SGD (momentum 0.9, weight decay 5e-4). Two presets: ResNet-18 ×0.125, batch 32
(the CPU study preset) and ×0.25, batch 128 (the single-run CPU preset), 32×32 inputs, projection head 128-128.

Levers, each timed interleaved against today's setting at 1 thread in this process:

* NCHW instead of channels_last;
* bfloat16 CPU autocast instead of fp32 (the loss stays fp32: the losses disable autocast themselves);
* ``torch.compile`` (the encoder + head) instead of eager: the compile time (first step minus an eager step)
  is its own row; the steady-state step is compared; a failure to compile is reported in the row's note;
* 1 process × 2 threads instead of 2 processes × 1 thread: both as spawned worker processes, taking turns;
  the row is the pair's total throughput in images/s (an image = one pair of views, as the trainer counts).

Reading a row: ``ours`` is the lever, ``baseline`` today's setting; ``ratio`` > 1 means the lever is faster
(for times: today / lever; for throughput: lever / today). No goals: the rows inform a decision.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext, suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from benchmarks.common import Row, interleaved, median_time, speedup_row, torch_threads

SECTION = "levers"
PRESETS: tuple[tuple[float, int], ...] = ((0.125, 32), (0.25, 128))  # (width, batch): study, single run
HIDDEN = 128
PROJ = 128
TEMPERATURE = 0.1


def preset_name(width: float, batch: int) -> str:
    """The row label of a model preset: encoder width and batch size."""
    return f"ResNet-18 x{width:g} b{batch}"


@dataclass
class TrainStep:
    """One SimCLR training step of a freshly initialized model on fixed random views (see the module doc)."""

    width: float
    batch: int
    channels_last: bool = True
    bf16: bool = False
    compiled: bool = False

    def __post_init__(self) -> None:
        from dcl_core.frameworks.simclr import SimCLR
        from dcl_core.losses import DCLLoss
        from dcl_core.models import ProjectionHead, SSLModel, build_backbone

        torch.manual_seed(0)
        backbone, dim = build_backbone("resnet18", self.width, "cifar")
        self.model = SSLModel(backbone, ProjectionHead(dim, HIDDEN, PROJ))
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        self.model = self.model.to(memory_format=fmt)
        encoder: torch.nn.Module = torch.compile(self.model) if self.compiled else self.model  # type: ignore[assignment]
        self.framework = SimCLR(encoder, DCLLoss(TEMPERATURE))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
        views = torch.randn(2, self.batch, 3, 32, 32)
        self.view1 = views[0].contiguous(memory_format=fmt)
        self.view2 = views[1].contiguous(memory_format=fmt)

    def __call__(self) -> None:
        """One forward pass, backward pass and optimizer step (under bf16 autocast when ``bf16``)."""
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if self.bf16 else nullcontext()
        with amp:
            out = self.framework(self.view1, self.view2)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        self.optimizer.step()


def _reps(quick: bool, width: float) -> int:
    return (3 if width < 0.2 else 2) if quick else (9 if width < 0.2 else 5)


def _layout_and_dtype(width: float, batch: int, quick: bool) -> list[Row]:
    today = TrainStep(width, batch)
    nchw = TrainStep(width, batch, channels_last=False)
    bf16 = TrainStep(width, batch, bf16=True)
    name = preset_name(width, batch)
    reps = _reps(quick, width)
    rows = []
    t_lever, t_today = interleaved(nchw, today, reps=reps)
    rows.append(speedup_row(SECTION, f"{name}: NCHW instead of channels_last, step", t_lever, t_today, "", None,
                            "1 thread, fp32; ratio = today/lever time"))
    t_lever, t_today = interleaved(bf16, today, reps=reps)
    rows.append(speedup_row(SECTION, f"{name}: bf16 autocast instead of fp32, step", t_lever, t_today, "", None,
                            "1 thread, channels_last, loss in fp32; ratio = today/lever time"))
    return rows


def _compile(width: float, batch: int) -> list[Row]:
    from torch._dynamo.utils import counters

    name = preset_name(width, batch)
    today = TrainStep(width, batch)
    eager_step = median_time(today, reps=3)
    hits, misses = (counters["inductor"][k] for k in ("fxgraph_cache_hit", "fxgraph_cache_miss"))
    try:
        compiled = TrainStep(width, batch, compiled=True)
        first = _times(compiled, 1)[0]  # compiles the forward, and the backward inside the first backward
        compiled()  # any recompilation happens here, not in the timed steps
    except Exception as err:  # any compiler failure becomes the row's finding
        reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]
        return [Row(SECTION, f"{name}: torch.compile instead of eager", math.nan, eager_step * 1e3, None, "", None,
                    "ms", f"torch.compile failed on this CPU: {reason}")]
    hits = counters["inductor"]["fxgraph_cache_hit"] - hits
    misses = counters["inductor"]["fxgraph_cache_miss"] - misses
    t_lever, t_today = interleaved(compiled, today, reps=_reps(False, width))
    return [
        Row(SECTION, f"{name}: torch.compile, compile time", first - eager_step, None, None, "", None, "s",
            f"first compiled step minus an eager step; inductor FX graph cache: {hits} hits, {misses} misses"),
        speedup_row(SECTION, f"{name}: torch.compile instead of eager, steady-state step", t_lever, t_today, "", None,
                    "1 thread, fp32, channels_last, encoder+head compiled; ratio = today/lever time"),
    ]


def _times(step: Callable[[], None], n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


# -- 1 process x 2 threads vs 2 processes x 1 thread ---------------------------------------------------------


def _worker(conn: Connection, threads: int) -> None:
    """A spawned process at ``threads`` intra-op threads. Messages: ``(width, batch, 0)`` builds that preset's
    step and runs it once (warm-up), replying ``"ready"``; ``(width, batch, steps)`` times that many steps and
    replies ``(start, end, images)`` (``time.perf_counter``, system-wide monotonic on Linux); ``None`` ends it.
    An error is replied as a string."""
    try:
        torch.set_num_threads(threads)
        built: dict[tuple[float, int], TrainStep] = {}
        while (message := conn.recv()) is not None:
            width, batch, steps = message
            if steps == 0:
                built[width, batch] = step = TrainStep(width, batch)
                step()
                conn.send("ready")
                continue
            step = built[width, batch]
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            conn.send((t0, time.perf_counter(), steps * batch))
    except Exception as err:  # reported to the parent, which raises it
        conn.send(f"{type(err).__name__}: {err}")


class _Group:
    """Worker processes that run the same steps at the same time when told to."""

    def __init__(self, ctx: mp.context.SpawnContext, processes: int, threads: int) -> None:
        self.conns: list[Connection] = []
        self.procs: list[mp.process.BaseProcess] = []
        for _ in range(processes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, threads), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def _ask(self, message: tuple[float, int, int]) -> list[object]:
        for conn in self.conns:
            conn.send(message)
        replies = []
        for conn in self.conns:
            reply = conn.recv()
            if isinstance(reply, str) and reply != "ready":
                raise RuntimeError(f"benchmark worker failed: {reply}")
            replies.append(reply)
        return replies

    def warm(self, width: float, batch: int) -> None:
        self._ask((width, batch, 0))

    def throughput(self, width: float, batch: int, steps: int) -> float:
        """Images/s of all processes together: every image over the span from the first start to the last end."""
        results: list[tuple[float, float, int]] = self._ask((width, batch, steps))  # type: ignore[assignment]
        start, end = min(r[0] for r in results), max(r[1] for r in results)
        return sum(r[2] for r in results) / (end - start)

    def close(self) -> None:
        for conn in self.conns:
            with suppress(OSError):
                conn.send(None)
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()


def _processes(presets: tuple[tuple[float, int], ...], quick: bool) -> list[Row]:
    """Per preset: the pair's throughput, 1 process x 2 threads (lever) vs 2 processes x 1 thread (today)."""
    ctx = mp.get_context("spawn")
    one, pair = _Group(ctx, 1, 2), _Group(ctx, 2, 1)
    rows = []
    try:
        for width, batch in presets:
            one.warm(width, batch)
            pair.warm(width, batch)
            steps = (3 if quick else 6) if width < 0.2 else (1 if quick else 2)
            lever, today = [], []
            for _ in range(2 if quick else 3):  # A B A B …: one side runs while the other waits
                lever.append(one.throughput(width, batch, steps))
                today.append(pair.throughput(width, batch, steps))
            lever_rate, today_rate = statistics.median(lever), statistics.median(today)
            rows.append(Row(
                SECTION, f"{preset_name(width, batch)}: 1 process x 2 threads instead of 2 processes x 1 thread",
                lever_rate, today_rate, lever_rate / today_rate, "", None, "images/s",
                f"total throughput; spawned workers, {steps} steps per process per sample; ratio = lever/today",
            ))
    finally:
        one.close()
        pair.close()
    return rows


def run(quick: bool) -> list[Row]:
    """Per preset: layout, dtype, process/thread split and (full run only) compile against today's setting.
    ``--quick`` measures the CPU study preset only and skips torch.compile."""
    presets = PRESETS[:1] if quick else PRESETS
    rows: list[Row] = []
    with torch_threads(1):
        for width, batch in presets:
            rows += _layout_and_dtype(width, batch, quick)
    rows += _processes(presets, quick)
    if not quick:  # a cold compile takes minutes on 2 cores
        with torch_threads(1):
            for width, batch in presets:
                rows += _compile(width, batch)
    return rows
