"""Checkpoint files: written atomically (a temporary name, then renamed, so a crash never leaves half a file) and
read back as data only.

A checkpoint holds tensors and plain values (dicts, lists, numbers, strings), so it is loaded with
``torch.load(weights_only=True)``: a ``.pt`` file from elsewhere cannot run code when ``python -m dcl_core.evaluate``
or ``--resume`` reads it. Anything that is not a checkpoint this module wrote raises :class:`CheckpointError`.

What a run keeps in one is also decided here: the framework's own state (:func:`framework_state`: momentum
encoder, queues) and which config keys a resume may change (:func:`check_resumable`).
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import warnings
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dcl_core.config import Config, ConfigError, InputError, from_flat_dict, to_flat_dict

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1
# What every checkpoint holds (the trainer's ``_save``), with the type each entry must have.
REQUIRED = {"epoch": int, "model": dict, "optimizer": dict, "scaler": dict, "config": dict, "history": list}
# Where a run writes and how many threads it uses may change between the interrupted and the resumed process
# (Ray gives a restored trial a new directory); everything else must match the checkpoint.
RESUME_FREE_KEYS = frozenset({"output_dir", "threads"})
_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S+)")


class CheckpointError(InputError, ValueError):
    """A file that is not a readable dcl_core checkpoint; ``str(err)`` is one line naming it and why."""

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        super().__init__(f"not a dcl_core checkpoint: {path} ({reason})")


def to_host(state: Any) -> Any:
    """``state`` with every tensor on an accelerator copied to host memory, the copies queued together (into pinned
    memory, ``Tensor.to``'s rule for a non-blocking copy to the host) and waited for once; host tensors, a state
    dict's type and ``_metadata``, lists and tuples are kept as they are (another mapping becomes a dict).

    So a checkpoint a GPU run wrote holds host tensors (a plain ``torch.load`` reads it on a machine without a GPU),
    and ``torch.save`` no longer waits on the device once per tensor. What the checkpoint costs an epoch is its
    serialisation on the host, not these copies (docs/performance.md, "Where the trainer's time goes").
    """
    queued: set[torch.device] = set()

    def copy(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.device.type == "cpu":
                return value
            if value.device.type != "cuda":
                return value.detach().cpu()
            queued.add(value.device)
            return value.detach().to("cpu", non_blocking=True)
        if isinstance(value, dict):  # an OrderedDict stays one (a state dict); any other mapping becomes a dict
            out = (OrderedDict if isinstance(value, OrderedDict) else dict)((k, copy(v)) for k, v in value.items())
            if hasattr(value, "_metadata"):  # a module's state dict: its versions, which loading reads
                out._metadata = value._metadata  # type: ignore[attr-defined]
            return out
        if isinstance(value, list | tuple) and not hasattr(value, "_fields"):  # a named tuple is kept whole
            return type(value)(copy(v) for v in value)
        return value

    host = copy(state)
    for device in queued:
        torch.cuda.synchronize(device)
    return host


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``state`` atomically to ``path`` (same-directory temp file + ``os.replace``), its tensors on the host
    (:func:`to_host`: a checkpoint a GPU run wrote loads on a CPU without ``map_location``).

    The file gets the permissions of any other file the process creates (0666 less the umask, as the run's
    ``metrics.jsonl``), not ``mkstemp``'s 0600.

    Raises:
        OSError: the file could not be written (disk full, quota, permissions); no temporary file is left.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    try:
        # O_EXCL: never follows or reuses an existing name; mode 0o666 is filtered by the umask.
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            torch.save({"format": FORMAT_VERSION, **to_host(state)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        cause = _os_error(err)
        if cause is not None and cause is not err:
            raise cause from None  # torch.save reports a failed write as RuntimeError("unexpected pos ...")
        raise
    return path


def _os_error(err: BaseException | None) -> OSError | None:
    """The OSError behind ``err``, if any: torch.save raises a RuntimeError while handling the write's."""
    while err is not None and not isinstance(err, OSError):
        err = err.__cause__ or err.__context__
    return err


# ResNet-50 with its optimizer state, a momentum encoder and a 65,536-key queue is under 0.5 GiB.
MAX_CHECKPOINT_BYTES = 16 * 2**30


def load_checkpoint(
    path: str | os.PathLike, map_location: str | torch.device = "cpu", mmap: bool = False
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`, as data only (``weights_only=True``).

    Args:
        path: the checkpoint file.
        map_location: where its tensors go.
        mmap: map the tensors instead of reading them (cheap, for looking at ``config`` and ``epoch`` only).

    Raises:
        CheckpointError: a missing path, a directory, a damaged or foreign file, or one that holds objects other
            than tensors and plain values (which are refused, never built).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(path, "no such file")
    if path.is_dir():
        raise CheckpointError(path, "a directory")
    info = path.stat()  # a pipe would block the read forever, /dev/zero would never end: look before reading
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointError(path, "not a regular file (a pipe, a device or a socket)")
    if info.st_size > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(path, f"{info.st_size / 2**30:.1f} GiB, larger than any checkpoint of this project "
                                    f"(at most {MAX_CHECKPOINT_BYTES / 2**30:g} GiB)")
    try:
        if not zipfile.is_zipfile(path):  # torch.save has written zip archives since torch 1.6
            raise CheckpointError(path, "damaged, or not written by torch.save")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. torch's note on an unusual pickle protocol
            state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except CheckpointError:
        raise
    except OSError as err:
        raise CheckpointError(path, f"cannot read it: {err.strerror or err}") from None
    except Exception as err:  # an untrusted file may fail in any of torch's readers
        raise CheckpointError(path, _load_failure(err)) from None
    _check_contents(path, state)
    check_model_fits(_stored_model(path, state["config"]), state, path)
    if not mmap:  # a look at the config and epoch reads no weight
        _check_finite(path, state["model"])
    return state


def _check_finite(path: Path, weights: dict[str, Any]) -> None:
    """CheckpointError naming the first weight holding NaN or an infinity: training stops at a non-finite loss
    before it saves, so such a file was changed since, and its accuracy or exported encoder would mean nothing."""
    for name, t in weights.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(path, f"its weight {name} holds NaN or infinite values, which training never "
                                        "saves")


def _stored_model(path: Path, config: dict[str, Any]) -> Config:
    """The default config with the ``model.*`` entries of a checkpoint's stored config (what the model built from it
    is); a key this version does not know is left out (it builds nothing), a bad value is a CheckpointError."""
    known = {k for k in to_flat_dict(Config()) if k.startswith("model.")}
    try:
        return from_flat_dict({k: v for k, v in config.items() if k in known})
    except ConfigError as err:
        raise CheckpointError(path, f"its config: {err}") from None


def held_bytes(weights: dict[str, Any]) -> int:
    """Bytes of tensor data a checkpoint's ``model`` entry holds: each storage once (a crafted file can make a
    tensor of any size over one shared or zero-stride storage, but not data it does not hold)."""
    storages = {}
    for t in weights.values():
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            storages[(storage.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def check_model_fits(cfg: Config, state: dict[str, Any], path: str | os.PathLike) -> None:
    """CheckpointError unless the model ``cfg`` describes (built by
    :func:`~dcl_core.training.builders.build_model`) needs no more bytes than the weights the checkpoint
    ``state`` holds, checked before anything is built: a 1.5 MB file whose config says ``model.arch=resnet50,
    model.width=16`` would otherwise allocate 22 GiB of parameters (an OOM kill) only to find that its weights do
    not fit. The checkpoint's own size bounds what it may ask for (:data:`MAX_CHECKPOINT_BYTES`)."""
    from dcl_core.training.builders import model_state_bytes  # the models (torchvision): once a file is read

    needed, held = model_state_bytes(cfg), held_bytes(state["model"])
    if needed > held:
        m = cfg.model
        raise CheckpointError(path, f"its config asks for a {m.arch} at width {m.width:g} with a projection head "
                                    f"of {m.proj_hidden_dim} hidden and {m.proj_dim} output units, "
                                    f"{_size(needed)} of weights, but it holds {_size(held)}: refused before "
                                    "building the model")


def _size(num_bytes: int) -> str:
    """``22.4 GiB``, ``1.5 MiB``, ``312 bytes``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} bytes"


def _load_failure(err: Exception) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in a few words."""
    refused = _REFUSED_GLOBAL.search(str(err))
    if refused:
        return f"it would call {refused.group(1)}, which a weights-only load refuses"
    if "weights only" in str(err).lower():
        return "it holds objects other than tensors and plain values, which a weights-only load refuses"
    first = str(err).strip().split(". ")[0].splitlines()[0] if str(err).strip() else type(err).__name__
    return f"damaged: {first}"


def _check_contents(path: Path, state: Any) -> None:
    """CheckpointError unless ``state`` is a dict in this module's format with every entry the trainer writes."""
    if not isinstance(state, dict):
        raise CheckpointError(path, f"holds a {type(state).__name__}, not a dict")
    if state.get("format") != FORMAT_VERSION:
        raise CheckpointError(path, f"format {state.get('format')!r}, expected {FORMAT_VERSION}")
    for key, kind in REQUIRED.items():
        if not isinstance(state.get(key), kind):
            raise CheckpointError(path, f"{key!r} is missing or not a {kind.__name__}")
    if state["epoch"] < 0:
        raise CheckpointError(path, f"its epoch is {state['epoch']}, not a count of epochs trained")


def check_resumable(cfg: Config, state: dict[str, Any], path: Path) -> None:
    """ConfigError unless the checkpoint ``state`` (read from ``path``) was written by a run of ``cfg``:
    every key but :data:`RESUME_FREE_KEYS` must match."""
    # A key the checkpoint predates (e.g. framework.queue_size) had its default value then.
    saved = to_flat_dict(Config()) | state["config"]
    now = to_flat_dict(cfg)
    changed = [k for k in sorted(now) if k not in RESUME_FREE_KEYS and saved.get(k) != now[k]]
    if changed:
        diffs = ", ".join(f"{k} (checkpoint {saved.get(k)!r}, now {now[k]!r})" for k in changed)
        raise ConfigError(f"cannot resume {path}: config differs in {diffs}")


def framework_state(framework: nn.Module) -> dict[str, torch.Tensor]:
    """The framework's own state: its ``state_dict()`` minus the trained model (momentum encoder, queues).

    Frameworks hold the trained encoder as ``framework.model`` (saved separately as the checkpoint's
    ``model``); SimCLR has no other state, so this is empty for it.
    """
    return {k: v for k, v in framework.state_dict().items() if not k.startswith("model.")}


def load_framework_state(framework: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Restore :func:`framework_state`; every non-model entry must be present and known (exact resume)."""
    result = framework.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.startswith("model.")]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"checkpoint framework state does not match: missing {missing}, unexpected {result.unexpected_keys}"
        )
