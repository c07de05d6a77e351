"""Feature extraction from a frozen backbone, for the kNN monitor and the linear probe."""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dcl_core.config import InputError

logger = logging.getLogger(__name__)


def _module_device(module: nn.Module) -> torch.device:
    """Return the device of the first parameter (or buffer) of ``module``; CPU if it has neither."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def _autocast_context(device: torch.device, amp: bool) -> contextlib.AbstractContextManager:
    """Mixed-precision autocast on CUDA (bf16 when supported, else fp16); a no-op on any other device."""
    if amp and device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.autocast(device_type="cuda", dtype=dtype)
    return contextlib.nullcontext()


# What one image costs in an inference forward pass, in float32 maps: its input and the largest output of any module.
# The peak RSS measured on CPU (a fresh process, its peak reset before the pass; ResNet-18/50, widths 1/8 to 1, both
# stems, 128-512 px, batches 1-16) was up to 2.7 times the input plus three largest outputs (a residual block holds
# its input, its branch and their sum; the previous batch's input is still referenced while the next is made;
# oneDNN's convolutions add reordered copies; the allocator keeps freed blocks), and varied by half run to run:
# this counts 4 times that. tests/eval/test_features.py measures it again against this.
INPUT_COPIES = 4
LARGEST_OUTPUT_COPIES = 12
# A cgroup v1 memory limit at or above this is "no limit" (v1 writes 2**63 rounded down to a page)
_NO_CGROUP_LIMIT = 2**62


def available_memory(device: torch.device) -> int | None:
    """Bytes free for a forward pass on ``device``: CUDA's free memory; on the CPU the least of the OS's available
    memory (Linux's ``MemAvailable``), the room left under this process's cgroup's memory limit (a container's
    ``--memory``) and under its own limits (``ulimit -v``, ``ulimit -d``); ``None`` where none is known."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    known = [room for room in (_meminfo_available(), _cgroup_room(), _rlimit_room()) if room is not None]
    return min(known) if known else None


def _meminfo_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (the whole machine's)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """Bytes left under the tightest memory limit of this process's cgroup and its ancestors (cgroup v2's
    ``memory.max``, v1's ``memory.limit_in_bytes``); None without one."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return None
    roots = []  # (the hierarchy's mount, this process's folder in it, the limit's file, the usage's file)
    for hierarchy, controllers, path in lines:
        if hierarchy == "0" and not controllers:
            roots += [(Path("/sys/fs/cgroup") / sub, path, "memory.max", "memory.current") for sub in ("", "unified")]
        elif "memory" in controllers.split(","):
            roots.append((Path("/sys/fs/cgroup/memory"), path, "memory.limit_in_bytes", "memory.usage_in_bytes"))
    rooms = []
    for mount, path, limit_name, usage_name in roots:
        folder = mount / path.lstrip("/")
        for level in (folder, *folder.parents):  # a limit on any ancestor applies too
            if not level.is_relative_to(mount):
                break
            room = _cgroup_level_room(level / limit_name, level / usage_name)
            if room is not None:
                rooms.append(room)
    return min(rooms) if rooms else None


def _cgroup_level_room(limit_file: Path, usage_file: Path) -> int | None:
    """``limit - usage`` of one cgroup's memory files; None when it has no limit (or no such files)."""
    try:
        limit_text = limit_file.read_text().strip()
        usage = int(usage_file.read_text().strip())
    except (OSError, ValueError):
        return None
    if not limit_text.isdigit() or int(limit_text) >= _NO_CGROUP_LIMIT:  # v2's "max"; v1's page-rounded 2**63
        return None
    return max(0, int(limit_text) - usage)


def _rlimit_room() -> int | None:
    """Bytes left under this process's address-space and data limits (``ulimit -v``, ``ulimit -d``), None without
    one: an allocation past them fails (a traceback) where the machine has memory to spare."""
    try:
        import resource  # POSIX only
    except ImportError:
        return None
    status = _proc_status()
    rooms = []
    for limit, used in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY and used in status:
            rooms.append(max(0, soft - status[used]))
    return min(rooms) if rooms else None


def _proc_status() -> dict[str, int]:
    """The byte counts of ``/proc/self/status`` (``VmSize``, ``VmData``, ``VmRSS``, ``VmHWM``, ...)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                parts = value.split()
                if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                    out[name] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def forward_bytes_per_image(backbone: nn.Module, image_shape: tuple[int, ...]) -> int | None:
    """An upper bound of the memory one image costs in an inference forward pass of ``backbone`` (float32): its
    input :data:`INPUT_COPIES` times and the largest output of any of its modules :data:`LARGEST_OUTPUT_COPIES`
    times (measured). Traced on PyTorch's meta device (shapes only: no memory, no arithmetic); ``None`` if the trace
    fails."""
    largest = 0

    def record(_module: nn.Module, _inputs: object, output: object) -> None:
        nonlocal largest
        if isinstance(output, torch.Tensor) and output.ndim > 0:
            largest = max(largest, output[0].numel())  # one image's share

    try:
        meta = copy.deepcopy(backbone).to("meta").eval()
        for module in meta.modules():
            module.register_forward_hook(record)
        with torch.no_grad():
            meta(torch.empty((1, *image_shape), device="meta"))
    except Exception as err:  # an op without a meta kernel: no estimate, no cap
        logger.debug("no memory estimate for the evaluation's forward pass: %s", err)
        return None
    return 4 * (INPUT_COPIES * math.prod(image_shape) + LARGEST_OUTPUT_COPIES * largest)  # float32


def fitting_batch_size(backbone: nn.Module, image_shape: tuple[int, ...], batch_size: int, device: torch.device,
                       available: int | None = None) -> int:
    """``batch_size``, or the largest smaller batch whose forward pass takes at most half the memory free on
    ``device`` (``available`` bytes if given): features do not depend on the batch in ``eval()`` mode.

    Raises:
        InputError: not even one image fits (one line, before any compute).
    """
    per_image = forward_bytes_per_image(backbone, image_shape)
    available = available_memory(device) if available is None else available
    if per_image is None or available is None:
        return batch_size
    fits = (available // 2) // per_image
    if fits < 1:
        raise InputError(
            f"one {'x'.join(map(str, image_shape[1:]))} image takes {per_image / 1024**3:.1f} GB in the evaluation's "
            f"forward pass, more than half the {available / 1024**3:.1f} GB free on {device}; use a smaller "
            "data.image_size")
    if fits < batch_size:
        logger.info("evaluation batch %d -> %d: a %s px image takes %.0f MB in the forward pass, %.1f GB free on %s",
                    batch_size, fits, "x".join(map(str, image_shape[1:])), per_image / 1024**2, available / 1024**3,
                    device)
        return int(fits)
    return batch_size


@torch.no_grad()
def extract_features(
    backbone: nn.Module,
    images: torch.Tensor,
    transform: Callable[[torch.Tensor], torch.Tensor],
    batch_size: int = 512,
    device: torch.device | str | None = None,
    normalize: bool = True,
    amp: bool = True,
) -> torch.Tensor:
    """Run a backbone over a (possibly large) uint8 image tensor in batches and collect its features.

    The backbone runs in ``eval()`` mode (BatchNorm uses its running statistics, which are not updated);
    the train/eval mode of every submodule is restored afterwards, even if an exception is raised.
    The backbone is not moved: it must already live on ``device``.

    Args:
        backbone: Maps a float image batch ``(B, 3, H, W)`` to features ``(B, F)``.
        images: ``uint8`` images ``(N, 3, H, W)``, typically on CPU; batches are copied to ``device``.
        transform: Maps a ``uint8`` batch on ``device`` to the float, normalised backbone input.
        batch_size: Number of images per forward pass.
        device: Device the batches are sent to; defaults to the device of the backbone's parameters.
        normalize: L2-normalise each feature row.
        amp: Use ``torch.autocast`` (bf16, or fp16 without bf16 support) when ``device`` is CUDA.
            Ignored on other devices, where the backbone always runs in float32.

    Returns:
        float32 features ``(N, F)`` on CPU; rows have unit L2 norm when ``normalize`` is True.

    Raises:
        ValueError: If ``images`` is not a non-empty 4-D tensor or ``batch_size < 1``.
    """
    if images.ndim != 4 or images.shape[0] == 0:
        raise ValueError(f"images must be a non-empty (N, C, H, W) tensor, got shape {tuple(images.shape)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = _module_device(backbone) if device is None else torch.device(device)
    batches = (transform(images[s : s + batch_size].to(device, non_blocking=True))  # (b, 3, H, W) float
               for s in range(0, images.shape[0], batch_size))
    return _collect(backbone, batches, device, normalize, amp, total=images.shape[0])


@torch.no_grad()
def extract_features_from_batches(
    backbone: nn.Module,
    batches: Iterable[torch.Tensor],
    total: int,
    device: torch.device | str | None = None,
    normalize: bool = True,
    amp: bool = True,
) -> torch.Tensor:
    """As :func:`extract_features`, for ``total`` images whose batches were transformed elsewhere (e.g. by
    ``DataLoader`` workers streaming an ImageFolder): float ``(b, 3, H, W)`` backbone inputs, in order."""
    device = _module_device(backbone) if device is None else torch.device(device)
    batches = (b.to(device, non_blocking=True) for b in batches)
    return _collect(backbone, batches, device, normalize, amp, total)


def _collect(
    backbone: nn.Module, batches: Iterable[torch.Tensor], device: torch.device, normalize: bool, amp: bool,
    total: int,
) -> torch.Tensor:
    """Backbone features (total, F) of every batch on CPU, in eval mode (each module's mode restored
    afterwards); the output is allocated once and filled (one copy of ImageNet's features, not two)."""
    previous_modes = {module: module.training for module in backbone.modules()}
    backbone.eval()
    out: torch.Tensor | None = None
    filled = 0
    try:
        for batch in batches:
            with _autocast_context(device, amp):
                feats = backbone(batch)  # (b, F)
            feats = feats.float()
            if normalize:
                feats = F.normalize(feats, dim=1)  # (b, F), unit rows
            if out is None:
                out = torch.empty(total, feats.shape[1], dtype=torch.float32)  # (N, F) on CPU
            out[filled : filled + feats.shape[0]] = feats.cpu()
            filled += feats.shape[0]
    finally:
        for module, mode in previous_modes.items():
            module.training = mode
    if out is None or filled != total:
        raise ValueError(f"expected features of {total} images, got {filled}")
    logger.debug("extracted features %s on %s", tuple(out.shape), device)
    return out
