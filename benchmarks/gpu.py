"""The GPU check: is the paper's protocol correct and fast on one CUDA device? One bounded command.

    python benchmarks/gpu.py --out OUT [--data-root DIR] [--budget-s 480]
    python benchmarks/gpu.py --tiny --out OUT     # the same code at toy sizes on the CPU (the test suite runs it)

It needs torch and torchvision only (no Ray, Optuna or MLflow: a bare GPU machine), and CIFAR-10 where
``--data-root`` says (a pack from ``python -m dcl_core.pack`` travels as one 57 MB file). Each measurement is
written to ``OUT/gpu.json`` the moment it is taken (a run cut short still reports) and printed as a line; the
Markdown table in docs/performance.md's format goes to ``OUT/gpu.md`` at the end. Both are written atomically and
never through a link planted at their names (:func:`dcl_core.files.write_text`); a FIFO, a device or a folder at
either is refused in one line, exit 2, before any part runs. Parts, in order, each skipped
with a row saying so once the budget is spent:

1. ``autocast``: every contrastive loss at τ 0.005, 0.07, 0.2 and 1.0 under bf16 and fp16 autocast against
   fp32 on the same (rounded) embeddings, spread and nearly saturated: the loss must agree to :data:`AUTOCAST_RTOL`
   (the losses compute their similarities in fp32 whatever the autocast), the gradient as the trainer computes it
   (fp16 through its GradScaler) to the dtype's :data:`UNIT_ROUNDOFF`, and both be finite.
2. ``peak``: the device's dense bf16 rate (a 4096³ matmul) and a ResNet-18 3x3 convolution's forward + backward
   rate, the ceilings the training step is compared with.
3. ``step``: the trainer (``dcl_core.training.train``, in-process) against a bare loop of the same model,
   augmentation, loss and optimizer (``benchmarks/trainer.py``'s A B A B by epoch), at batch 512 (the paper
   protocol's epoch: 50,000 images, two views) and batch 32 (Table 1's smallest): images/s, the trainer's
   overhead, the epoch time projected to the full training set and its share of the convolution rate.
4. ``epoch``: the same comparison over the whole training set at batch 512 (5 epochs a side, the first a
   warm-up): the paper epoch measured, not projected (the trainer's per-epoch metrics and checkpoint weigh on a
   20-step epoch five times what they weigh on the paper's 97 steps).
5. ``draws``: the augmentation's draws sent to the GPU through pinned memory against the pageable copies they
   replaced, the bare loop over the whole training set, alternating epoch by epoch.
6. ``profile``: one epoch of the trainer and one of the bare loop at batch 512 under ``torch.profiler``
   (:mod:`benchmarks.step_profile`): per step, wall and device-busy milliseconds, host reads of a tensor's value,
   blocking CUDA calls, copies, the operators whose time grew most, and what the per-epoch checkpoint costs:
   where the trainer's overhead goes.
7. ``sharing``: 1, 2 and 4 processes training the bare loop at batch 32 on the one GPU at once: the aggregate
   images/s over one process's (can a study's trials fill the GPU?).
8. ``paper``: ``python -m dcl_core.train --preset paper`` for 2 epochs on the full CIFAR-10: a finite loss
   and a kNN top-1 above chance (10%), kNN and linear probe on the GPU.

``--parts step,epoch,profile`` runs only those (by the keys above), in this order.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import MAX_METRICS_BYTES, Row, markdown_table  # noqa: E402 - the repo root is on the path
from benchmarks.step_profile import profile_config, profile_rows  # noqa: E402
from benchmarks.trainer import BareLoop, step_config, trainer_and_bare  # noqa: E402
from dcl_core import metric_names as M  # noqa: E402
from dcl_core.config import Config, ConfigError, apply_overrides, derive, preset  # noqa: E402
from dcl_core.files import check_replaceable, read_bounded, write_text  # noqa: E402
from dcl_core.study.plan.flops import default_flops_of, train_flops_per_image  # noqa: E402
from dcl_core.training.builders import InMemoryData, build_data, build_loss  # noqa: E402
from dcl_core.training.run_setup import amp_dtype, grad_scaler  # noqa: E402

SECTION = "gpu"
TAUS = (0.005, 0.07, 0.2, 1.0)
LOSSES = ("infonce", "dcl", "dclw", "eqco")
AUTOCAST_RTOL = 1e-4  # the loss under autocast vs fp32 on the same embeddings, relative (the losses compute in fp32)
# The gradient in a low-precision embedding vs fp32: that dtype's rounding, nothing more (its unit roundoff).
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
MAX_SKIPPED = 40  # GradScaler halves its scale per skipped step: 2^16 down to 2^-24 at most
SPREADS = (0.5, 0.025)  # embedding noise: positives at cosine ~0.2 (InfoNCE ~5 at τ 0.07) and ~0.96 (~0.002)
EPOCH_GOAL_S = 3.0  # the paper preset's epoch (50,000 images, two views, ResNet-18, batch 512) on one H100
OVERHEAD_GOAL = 0.05  # the trainer over the bare loop
CIFAR_TRAIN = 50_000


class Report:
    """Rows written to ``out/gpu.json`` as each is measured, and printed."""

    def __init__(self, out: Path, meta: dict[str, object]) -> None:
        self.out, self.meta, self.rows = out, meta, []  # type: list[Row]
        out.mkdir(parents=True, exist_ok=True)
        check_replaceable(out / "gpu.md")  # before any part: a FIFO there was refused only after all of them
        self._write()

    def add(self, row: Row) -> None:
        """Keep ``row``, rewrite the JSON, print a line."""
        self.rows.append(row)
        self._write()
        ratio = "" if row.ratio is None else f"  ratio {row.ratio:.3g}"
        met = "" if row.met is None else ("  goal met" if row.met else "  GOAL MISSED")
        print(f"[{row.section}] {row.name}: {row.ours:.4g} {row.unit}{ratio}{met}  {row.note}", flush=True)

    def finish(self) -> str:
        """Write the rows' Markdown table to ``out/gpu.md``; the table."""
        table = markdown_table(self.rows)
        write_text(self.out / "gpu.md", f"{self.meta['device']}, torch {self.meta['torch']}, {self.meta['date']}\n\n"
                                        f"{table}\n")
        return table

    def _write(self) -> None:
        # a fresh temporary name renamed over gpu.json: never half a file, never through a planted link
        write_text(self.out / "gpu.json", json.dumps({"meta": self.meta, "rows": [asdict(r) for r in self.rows]},
                                                     indent=1))


class Budget:
    """Seconds left of the run's budget."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    @property
    def left(self) -> float:
        """Seconds left (negative once spent)."""
        return self.end - time.monotonic()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls after one warm-up, the device synchronised around each."""
    fn()
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------------------ parts


def autocast_rows(device: torch.device, n: int, dim: int) -> Iterator[Row]:
    """Each loss and τ under each low-precision autocast vs fp32 on the same embeddings (rounded to that dtype,
    as a projection head under autocast gives them), on spread and on nearly saturated embeddings: the loss, and
    the gradient as the trainer's step computes it (fp16: through its GradScaler) against the fp32 gradient. The
    fp16 gradient without loss scaling is in the note: its underflow is why the trainer scales. A case whose fp32
    gradient lies wholly below what the dtype holds at the starting loss scale (a loss saturated to ~0, e.g. at
    τ 0.005, with entries ~1e-23) has no gradient to compare: the note counts such cases."""
    gen = torch.Generator().manual_seed(0)
    z1 = torch.nn.functional.normalize(torch.randn(n, dim, generator=gen), dim=1)  # (n, dim)
    noise = torch.randn(n, dim, generator=gen)
    pairs = [(z1, torch.nn.functional.normalize(z1 + eps * noise, dim=1)) for eps in SPREADS]
    for dtype in (torch.bfloat16, torch.float16):
        tol = UNIT_ROUNDOFF[dtype]
        # the smallest gradient entry `dtype` holds at the loss scale the trainer starts from (fp16: 2^-24 / 2^16)
        floor = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps / grad_scaler(device, dtype).get_scale()
        for name in LOSSES:
            loss_worst = grad_worst = unscaled_worst = 0.0
            finite, skipped, beneath = True, 0, 0
            for tau in TAUS:
                cfg = apply_overrides(preset("smoke"), {"loss.name": name, "loss.temperature": tau})
                loss_fn = build_loss(cfg, derive(cfg, 1)).to(device)
                for p1, p2 in pairs:
                    a1, a2 = p1.to(device, dtype), p2.to(device, dtype)  # what a head under autocast hands the loss
                    ref_loss, ref_grad, _ = trainer_gradient(a1.float(), a2.float(), loss_fn, device, None, None)
                    scaler = grad_scaler(device, dtype)  # the trainer's
                    low_loss, low_grad, skips = trainer_gradient(a1, a2, loss_fn, device, dtype, scaler)
                    _, unscaled, _ = trainer_gradient(a1, a2, loss_fn, device, dtype, None)
                    finite &= bool(torch.isfinite(low_loss) and torch.isfinite(low_grad).all())
                    skipped += skips
                    loss_worst = max(loss_worst, _relative(low_loss, ref_loss))
                    if ref_grad.abs().max().item() < floor:  # a fully saturated loss: nothing `dtype` can hold
                        beneath += 1
                        continue
                    grad_worst = max(grad_worst, _relative(low_grad, ref_grad))
                    unscaled_worst = max(unscaled_worst, _relative(unscaled, ref_grad))
            met = finite and loss_worst <= AUTOCAST_RTOL and grad_worst <= tol
            label = str(dtype).removeprefix("torch.")
            yield Row(SECTION, f"autocast {label} vs fp32, {name}, tau {', '.join(map(str, TAUS))}", grad_worst,
                      None, grad_worst / tol, f"loss <= {AUTOCAST_RTOL:g}, gradient <= {tol:.2g}, finite", met,
                      "rel. diff", f"the gradient's worst over the 4 tau, spread and nearly saturated embeddings "
                      f"(N={n}, d={dim}); the loss's {loss_worst:.2g}; unscaled gradient {unscaled_worst:.2g}; "
                      f"steps skipped for an overflow {skipped}; finite: {finite}"
                      + (f"; {beneath} of {2 * len(TAUS)} without a gradient it can hold (fp32's largest entry "
                         f"< {floor:.2g}: a fully saturated loss)" if beneath else ""))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ (0 when both are 0: a fully saturated loss at τ 0.005 has no gradient)."""
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def trainer_gradient(z1: torch.Tensor, z2: torch.Tensor, loss_fn: torch.nn.Module, device: torch.device,
                   dtype: torch.dtype | None,
                   scaler: torch.amp.GradScaler | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The loss of ``(z1, z2)`` under ``dtype`` autocast (None: none) and its gradient in ``z1`` as the trainer's
    step gives it to the optimizer: ``z1`` is cast from an fp32 leaf (a head's fp32 weights, its output in
    ``dtype``), the backward runs through ``scaler``'s scaled loss and is unscaled (None: no scaling). A step
    whose scaled gradient overflows is skipped and retried at the backed-off scale, as GradScaler does; the count
    of skipped steps is the third value."""
    leaf = z1.detach().float().clone().requires_grad_(True)
    optimizer = torch.optim.SGD([leaf], lr=0.0)
    skipped = 0
    for skipped in range(MAX_SKIPPED):  # noqa: B007 - the count of skipped steps is returned
        optimizer.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # EqCo samples its negatives: the same ones every time
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(leaf.to(z1.dtype), z2).loss
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        assert leaf.grad is not None
        grad = leaf.grad.detach().clone()
        if scaler is not None:
            scaler.step(optimizer)  # skipped when the gradient is not finite (lr 0: the leaf stays as it is)
            scaler.update()  # ... and the scale backed off
        if scaler is None or not scaler.is_enabled() or torch.isfinite(grad).all():
            break
    return loss.detach().float(), grad.float(), skipped


def peak_rows(device: torch.device, tiny: bool) -> Iterator[Row]:
    """The dense bf16 matmul rate and a ResNet-18 3x3 convolution's forward + backward rate (TFLOP/s)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    size, reps = (256, 3) if tiny else (4096, 20)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    seconds = _timed(lambda: a @ b, device, reps)
    matmul = 2 * size**3 / seconds / 1e12
    yield Row(SECTION, f"matmul {size}^3 {str(dtype).removeprefix('torch.')}", matmul, unit="TFLOP/s",
              note="dense rate: the device's ceiling for this dtype")
    batch, ch, px = (8, 16, 8) if tiny else (512, 128, 16)  # ResNet-18's layer2 on CIFAR: 128 channels at 16 px
    conv = torch.nn.Conv2d(ch, ch, 3, padding=1, bias=False).to(device, memory_format=torch.channels_last)
    x = torch.randn(batch, ch, px, px, device=device).contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
            y = conv(x)
        y.float().sum().backward()

    seconds = _timed(step, device, reps)
    flops = 3 * 2 * batch * ch * ch * 9 * px * px  # forward, and backward's two convolutions
    yield Row(SECTION, f"conv 3x3 {ch}ch {px}px batch {batch} fwd+bwd", flops / seconds / 1e12, unit="TFLOP/s",
              note="channels_last under the trainer's autocast: the rate a ResNet-18 step can approach")


def step_rows(device: torch.device, batch: int, tiny: bool, data_root: str | None, budget_s: float,
              conv_rate: float | None, full: bool = False) -> Iterator[Row]:
    """The trainer vs the bare loop at ``batch``: images/s, overhead, and the full epoch: projected from an epoch of
    ~20 steps, or with ``full`` measured over the whole training set (5 epochs: 4 measured a side)."""
    epochs = (3 if tiny else 5) if full else 4 if tiny else 8
    cfg = step_config(batch, tiny, data_root, epochs=epochs, full=full)
    data = build_data(cfg)
    assert isinstance(data, InMemoryData)
    images = (len(data) // batch) * batch
    res = trainer_and_bare(cfg, BareLoop(cfg, data, device, amp_dtype(device) if cfg.amp else None), images,
                           budget_s)
    ours = images / statistics.median(res.trainer_s)
    bare = images / statistics.median(res.bare_s)
    overhead = bare / ours - 1.0
    split = (f"the trainer's own train/images_per_s (its steps only) {statistics.median(res.reported):.0f}; "
             f"outside its steps (metrics, checkpoint, log) {1000 * statistics.median(res.outside_s):.0f} ms an epoch")
    what = "the whole training set" if full else f"{images} images"
    yield Row(SECTION, f"trainer vs bare loop, ResNet-18, batch {batch}{', full epochs' * full}", ours, bare,
              overhead, f"overhead <= {OVERHEAD_GOAL:.0%}", overhead <= OVERHEAD_GOAL, "images/s",
              f"median of {len(res.trainer_s)} epochs of {what} per side, A B A B; two views an image; {split}")
    is_paper = batch == 512 and not tiny
    if full:
        epoch_s = statistics.median(res.trainer_s)
        name = f"paper epoch measured (CIFAR-10 train, two views), batch {batch}"
        note = (f"the trainer's epoch of {images} images ({images // batch} steps), median of {len(res.trainer_s)}; "
                f"the bare loop's {statistics.median(res.bare_s):.2f} s")
    else:
        epoch_s = CIFAR_TRAIN / ours
        name = f"paper epoch (CIFAR-10 train, two views), batch {batch}"
        note = "50,000 images / the trainer's images/s"
    if conv_rate:
        achieved = _step_flops(cfg) * ours / batch / 1e12  # TFLOP/s
        note += f"; {achieved:.3g} TFLOP/s achieved = {achieved / conv_rate:.0%} of the conv rate"
    yield Row(SECTION, name, epoch_s, None, epoch_s / EPOCH_GOAL_S if is_paper else None,
              f"<= {EPOCH_GOAL_S:g} s" if is_paper else "", (epoch_s <= EPOCH_GOAL_S) if is_paper else None, "s",
              note)


def draws_rows(device: torch.device, tiny: bool) -> Iterator[Row]:
    """The augmentation's draws sent to the device through pinned memory (``image_ops.to_device``) against the
    pageable copies they replaced (``Tensor.to``, each making the host wait for the device): the bare loop over the
    whole training set at batch 512, the two alternating epoch by epoch after a warm-up epoch."""
    cfg = step_config(8 if tiny else 512, tiny, None, epochs=1, full=True)
    data = build_data(cfg)
    assert isinstance(data, InMemoryData)
    bare = BareLoop(cfg, data, device, amp_dtype(device) if cfg.amp else None)
    bare.epoch()
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(2 if tiny else 4):
        for pinned in (True, False):
            with _draw_copies(pinned):
                seconds[pinned].append(bare.epoch())
    ours, baseline = statistics.median(seconds[True]), statistics.median(seconds[False])
    name = f"augmentation's draws, pinned vs pageable copies: the bare loop's epoch, batch {cfg.optim.batch_size}"
    yield Row(SECTION, name, ours, baseline, ours / baseline, unit="s",
              note=f"the whole training set, median of {len(seconds[True])} epochs each, alternating; "
                   f"ratio < 1: the pinned copies are faster")


@contextlib.contextmanager
def _draw_copies(pinned: bool) -> Iterator[None]:
    """The augmentation's copies as they are (``pinned``) or as they were: ``Tensor.to`` from pageable memory."""
    from dcl_core.data import augment, image_ops

    if pinned:
        yield
        return
    kept = image_ops.to_device

    def pageable(draws: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
        return draws.to(device, dtype)

    augment.to_device = image_ops.to_device = pageable  # type: ignore[assignment]
    try:
        yield
    finally:
        augment.to_device = image_ops.to_device = kept


def _step_flops(cfg: Config) -> float:
    """FLOPs of one training step at the config's batch: both views forward + backward (counted on the meta
    device by the cost estimate's own counter)."""
    return cfg.optim.batch_size * train_flops_per_image(cfg.framework.name, default_flops_of(cfg))


def sharing_rows(device: torch.device, tiny: bool, seconds: float) -> Iterator[Row]:
    """1, 2 and 4 processes training at batch 32 on the device at once: aggregate images/s over one's."""
    rates: dict[int, float] = {}
    for procs in (1, 2) if tiny else (1, 2, 4):
        cmd = [sys.executable, __file__, "--worker", str(seconds), "--device", str(device)] + (["--tiny"] * tiny)
        started = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO) for _ in range(procs)]
        outs = [p.communicate(timeout=seconds * 4 + 120)[0] for p in started]
        rates[procs] = sum(json.loads(o.strip().splitlines()[-1])["images_per_s"] for o in outs)
        yield Row(SECTION, f"{procs} process{'es' * (procs > 1)} sharing the device, batch 32", rates[procs],
                  rates[1], rates[procs] / rates[1], "", None, "images/s",
                  "aggregate of the bare loop in each; ratio over one process alone")


def worker(seconds: float, device: torch.device, tiny: bool) -> None:
    """One sharing process: the bare loop at batch 32 on synthetic images for ``seconds``; prints its images/s."""
    cfg = step_config(32, tiny, None, epochs=1)
    data = build_data(cfg)
    assert isinstance(data, InMemoryData)
    bare = BareLoop(cfg, data, device, amp_dtype(device) if cfg.amp else None)
    bare.epoch()  # warm-up
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        bare.epoch()
        done += (len(data) // 32) * 32
    print(json.dumps({"images_per_s": done / (time.perf_counter() - t0)}))


def paper_run_rows(data_root: str | None, tiny: bool, timeout_s: float) -> Iterator[Row]:
    """``python -m dcl_core.train --preset paper`` for 2 epochs (``--tiny``: the smoke preset): loss and kNN.
    The run's folder is a temporary one (what the GPU machine returns is a few files: the row says it all)."""
    with tempfile.TemporaryDirectory(prefix="gpu_paper_run_") as tmp:
        out = Path(tmp)
        cmd = [sys.executable, "-m", "dcl_core.train", "--preset", "smoke" if tiny else "paper", "--overwrite",
               "--set", "optim.epochs=2", "--set", f"output_dir={out}"]
        if tiny:
            cmd += ["--set", "threads=1"]
        if data_root:
            cmd += ["--set", f"data.root={data_root}"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
        wall = time.perf_counter() - t0
        text = read_bounded(out / "metrics.jsonl", MAX_METRICS_BYTES).decode() if proc.returncode == 0 else ""
        lines = [json.loads(x) for x in text.splitlines() if x.strip()]
        if not lines:
            yield Row(SECTION, "paper run, 2 epochs", math.nan, goal="finite loss, kNN > 10%", met=False, unit="%",
                      note=f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:300]}")
            return
        last = lines[-1]
        loss, knn = float(last[M.TRAIN_LOSS]), float(last.get(M.KNN_TOP1, math.nan))
        yield Row(SECTION, f"{'smoke' if tiny else 'paper'} run, 2 epochs: kNN top-1", knn, 10.0, knn / 10.0,
                  "finite loss, kNN > 10% (chance)", math.isfinite(loss) and knn > 10.0, "%",
                  f"loss {loss:.4f}; wall {wall:.0f} s (data loading and kNN included); "
                  f"epochs {', '.join(format(x.get(M.EPOCH_SECONDS, math.nan), '.1f') for x in lines)} s")


# ------------------------------------------------------------------------------------------------------- main

PARTS = ("autocast", "peak", "step", "epoch", "draws", "profile", "sharing", "paper")  # --parts keys, in the order run


def _part_keys(text: str) -> tuple[str, ...]:
    """``--parts``: comma-separated keys of :data:`PARTS`; an unknown one is refused by the parser (exit 2)."""
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in keys if k not in PARTS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(f"unknown part {', '.join(unknown) or '(none given)'}: "
                                         f"choose from {', '.join(PARTS)}")
    return keys


def _parts(args: argparse.Namespace, device: torch.device, budget: Budget,
           conv_rate: Callable[[], float | None]) -> list[tuple[str, str, float, Callable[[], Iterator[Row]]]]:
    """Every part as (key, name, the seconds it needs, its rows), in the order run; ``conv_rate`` reads the peak
    part's convolution rate once it is measured."""
    tiny, root = args.tiny, args.data_root
    return [
        ("autocast", "autocast", 10, lambda: autocast_rows(device, 64 if tiny else 512, 16 if tiny else 128)),
        ("peak", "peak", 10, lambda: peak_rows(device, tiny)),
        ("step", "step, batch 512", 90, lambda: step_rows(device, 8 if tiny else 512, tiny, None,
                                                         min(60.0, budget.left), conv_rate())),
        *([] if tiny else [("step", "step, batch 32", 60, lambda: step_rows(device, 32, tiny, None,
                                                                            min(40.0, budget.left), conv_rate()))]),
        ("epoch", "full epochs, batch 512", 45, lambda: step_rows(device, 8 if tiny else 512, tiny, None,
                                                                  min(60.0, budget.left), conv_rate(), full=True)),
        ("draws", "pinned draws, batch 512", 45, lambda: draws_rows(device, tiny)),
        ("profile", "profile, batch 512", 45, lambda: profile_rows(profile_config(tiny), device)),
        ("sharing", "sharing", 60, lambda: sharing_rows(device, tiny, 3.0 if tiny else 10.0)),
        ("paper", "paper run", 150, lambda: paper_run_rows(root, tiny, max(60.0, budget.left))),
    ]


def main(argv: list[str] | None = None) -> int:
    """Run the parts in order within the budget; exit 1 if a goal was missed or a part failed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="folder for gpu.json and gpu.md (required)")
    p.add_argument("--data-root", default=None, help="CIFAR-10 (an ImageFolder or a pack); default: the embedded")
    p.add_argument("--budget-s", type=float, default=480.0, help="stop starting parts after this many seconds")
    p.add_argument("--tiny", action="store_true", help="toy sizes (the CPU test of this script)")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--parts", type=_part_keys, default=PARTS,
                   help=f"the parts to run, comma-separated, in the order above (default: all: {','.join(PARTS)})")
    p.add_argument("--worker", type=float, default=None, help=argparse.SUPPRESS)  # a sharing process
    args = p.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.worker is not None:
        worker(args.worker, device, args.tiny)
        return 0
    if args.out is None:
        p.error("--out is required")
    if args.data_root:
        os.environ["DCL_DATA_ROOT"] = str(Path(args.data_root).resolve())  # the subprocesses read it too
    budget = Budget(args.budget_s)
    meta: dict[str, object] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "tiny": args.tiny,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "autocast": str(amp_dtype(device)),
    }
    try:
        report = Report(args.out, meta)
    except (ConfigError, OSError) as err:  # a FIFO, a device or a folder at a report's name; --out not a folder
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"# GPU check on {meta['device']} (torch {meta['torch']}, CUDA {meta['cuda']}), budget {args.budget_s:g} s",
          flush=True)
    conv_rate: float | None = None
    parts = [part for part in _parts(args, device, budget, lambda: conv_rate) if part[0] in args.parts]
    failed = []
    for _, name, needs_s, part in parts:
        if budget.left < needs_s:
            report.add(Row(SECTION, f"{name}: skipped", math.nan, note=f"{budget.left:.0f} s left of the budget"))
            continue
        try:
            for row in part():
                report.add(row)
                if row.name.startswith("conv 3x3"):
                    conv_rate = row.ours
        except Exception as exc:  # a part that fails is a row, and the next part still runs
            failed.append(name)
            report.add(Row(SECTION, f"{name}: failed", math.nan, note=f"{type(exc).__name__}: {exc}"[:400]))
    print(report.finish())
    missed = [r.name for r in report.rows if r.met is False]
    # --tiny checks that every part runs: a goal (an H100's) is judged on a GPU only
    return 1 if failed or (missed and not args.tiny) else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
