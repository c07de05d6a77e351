"""A checkpoint's encoder for another codebase (``python -m dcl_core.export``, ``python -m dcl_core.study export``).

:func:`export` writes the backbone's weights (no projection head, no optimizer) as a plain state dict in a
weights-only torch file, and beside it ``backbone.json``: what it is (architecture, width, stem, data, image size,
epochs, loss, τ, the last kNN top-1; ``loss`` a built-in's name or a user loss's reference as the run recorded it,
``loss_params`` its ``loss.params`` as an object, ``{}`` for a built-in) and whether torchvision's own model loads
it (``torchvision_compatible``: a ResNet-18/50 at width 1). docs/evaluation.md gives the two loading recipes,
torchvision's model at width 1 and :func:`dcl_core.models.build_backbone` at any width;
``tests/training/test_export.py`` runs both as written. Inputs are normalized with the dataset's mean and std, also
in the JSON.

Where the two files go is checked before the checkpoint is read (:func:`check_destination`): each a new path or a
regular file, never a link, a device, a FIFO or the checkpoint itself, the weights never named ``.json`` (their
description would overwrite them), and the description, which ``-o`` does not name, replacing only an earlier
export's (a run's ``config.json`` was overwritten by ``-o config.pt``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from dcl_core.config import ConfigError, RunFailedError, from_flat_dict, loss_params
from dcl_core.files import check_output_file, disk_full, loads_json, no_space, read_bounded, write_with


def description_path(out: Path) -> Path:
    """Where the description of the weights written to ``out`` goes: beside them, ``out`` with ``.json``."""
    return out.with_suffix(".json")


def weights_path(given: str) -> Path:
    """``-o``'s path, as given: ConfigError (one line) when it ends in ``/`` (a folder, which ``Path`` would read as a
    file of that name: ``-o ex4/`` wrote the file ``ex4``), else :func:`check_weights_name`'s."""
    out = Path(given)
    check_weights_name(out)
    if given.endswith(("/", os.sep)):
        raise ConfigError(f"-o {given} names a folder (it ends in /), not a file: name the weights file (e.g. -o "
                          f"{given}encoder.pt)")
    return out


def check_weights_name(out: Path) -> None:
    """ConfigError (one line) when ``-o`` names no file (``''``, ``.``, ``/``, ``..``): the weights need a file's
    name, beside which their description goes (``with_suffix`` raised a traceback on an empty one)."""
    if out.name in ("", ".", ".."):
        raise ConfigError(f"-o {out} names a folder, not a file: name the weights file (e.g. -o encoder.pt)")


def check_destination(checkpoint: Path, out: Path) -> Path:
    """The description's path, once both files' places are checked (before any work): ConfigError (one line) for
    a path that names no file (:func:`check_weights_name`), weights named ``.json`` (the description would overwrite
    them) or a path that is the checkpoint itself; :func:`dcl_core.files.check_output_file` for a link, a folder, a
    device, a FIFO or a socket there, or a folder that takes no file."""
    check_weights_name(out)
    description = description_path(out)
    if out.suffix.lower() == ".json":
        raise ConfigError(f"{out}: the weights cannot go to a .json file, where their description is written "
                          f"(name them e.g. {out.with_suffix('.pt').name}; the description then goes beside them as "
                          f"{out.stem}.json)")
    for path in (out, description):
        check_output_file(path)
        try:
            same = path.exists() and checkpoint.exists() and path.samefile(checkpoint)
        except OSError:
            same = False
        if same:
            raise ConfigError(f"{path} is the checkpoint being exported: name another file")
    if description.exists() and not _is_description(description):  # the file -o names is replaced; not this one
        raise ConfigError(f"{description} exists and is not an earlier export's description, and the description "
                          f"of {out.name} would replace it: name the weights file otherwise")
    return description


DESCRIPTION_KEYS = frozenset({"arch", "feature_dim", "torchvision_compatible", "source"})  # what export writes
MAX_DESCRIPTION_BYTES = 1 << 20


def _is_description(path: Path) -> bool:
    """Whether ``path`` holds the description an earlier export wrote (which a new export beside it replaces): a
    JSON object with :data:`DESCRIPTION_KEYS`. A run's ``config.json`` or anything else is not."""
    try:
        meta = loads_json(read_bounded(path, MAX_DESCRIPTION_BYTES))
    except (ConfigError, ValueError):
        return False
    return isinstance(meta, dict) and meta.keys() >= DESCRIPTION_KEYS


def export(checkpoint: Path, out: Path) -> dict[str, Any]:
    """Write the encoder of ``checkpoint`` to ``out`` and its description to ``out`` with ``.json``; the description.

    Raises:
        CheckpointError: an unreadable or foreign checkpoint.
        ConfigError: the weights do not fit the model the checkpoint's config describes; ``out`` is not a place to
            write them (:func:`check_destination`).
        DiskFullError: the disk filled while writing (no file of the two is left half written or alone).
        RunFailedError: another failed write, in one line.
    """
    description = check_destination(checkpoint, out)
    # torch and the models (seconds): once the options parsed, not for --help
    import torch

    from dcl_core.data import normalization_for
    from dcl_core.training.builders import build_model
    from dcl_core.training.checkpoint import load_checkpoint

    state = load_checkpoint(checkpoint)
    cfg = from_flat_dict(state["config"])
    model = build_model(cfg)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:
        raise ConfigError(f"{checkpoint}: its weights do not fit the model its config describes: "
                          f"{str(err).splitlines()[0]}") from None
    weights = {k: v.detach().clone().contiguous() for k, v in model.backbone.state_dict().items()}
    last = state["history"][-1] if state["history"] else {}
    knn = last.get("eval/knn_top1")
    mean, std = normalization_for(cfg.data.dataset)
    arch, width = cfg.model.arch, cfg.model.width
    meta: dict[str, Any] = {
        "arch": arch, "width": width, "stem": cfg.model.stem,
        "feature_dim": _feature_dim(model.backbone, cfg.data.image_size),
        "torchvision_compatible": arch in ("resnet18", "resnet50") and width == 1.0,
        "dataset": cfg.data.dataset, "image_size": cfg.data.image_size, "mean": list(mean), "std": list(std),
        "epochs": int(state["epoch"]), "framework": cfg.framework.name, "loss": cfg.loss.name,
        "loss_params": loss_params(cfg.loss.params), "temperature": cfg.loss.temperature, "seed": cfg.seed,
        "knn_top1": knn if isinstance(knn, float) and math.isfinite(knn) else None,
        "source": str(checkpoint),
    }
    try:
        write_with(out, lambda f: torch.save(weights, f))
        try:
            write_with(description, lambda f: f.write((json.dumps(meta, indent=1) + "\n").encode()))
        except BaseException:
            out.unlink(missing_ok=True)  # the weights just written: never left without their description
            raise
    except (OSError, RuntimeError) as err:  # torch.save reports a failed write as a RuntimeError
        if no_space(err):
            raise disk_full(out.absolute().parent) from None
        cause = _os_error(err)
        if cause is None:
            raise
        raise RunFailedError(f"cannot write {cause.filename or out}: {cause.strerror or cause}") from None
    return meta


def _os_error(err: BaseException | None) -> OSError | None:
    """The OSError behind ``err``, if any (torch.save raises a RuntimeError while handling its write's)."""
    while err is not None and not isinstance(err, OSError):
        err = err.__cause__ or err.__context__
    return err


def describe(meta: dict[str, Any]) -> str:
    """One line of what an export is and what loads it, e.g. ``resnet18 x1 (cifar stem), 1 epoch of dcl at tau 0.5,
    kNN 12.5%; torchvision's own model loads it (recipes: docs/evaluation.md)``."""
    epochs = f"{meta['epochs']} epoch{'' if meta['epochs'] == 1 else 's'}"
    knn = f", kNN {meta['knn_top1']:.1f}%" if meta.get("knn_top1") is not None else ""
    how = ("torchvision's own model loads it" if meta["torchvision_compatible"]
           else "dcl_core.models.build_backbone loads it, not torchvision's model")
    how += " (recipes: docs/evaluation.md)"
    return (f"{meta['arch']} x{meta['width']:g} ({meta['stem']} stem), {epochs} of {meta['loss']} at tau "
            f"{meta['temperature']:g}{knn}; {how}")


def _feature_dim(backbone: Any, image_size: int) -> int:
    """The backbone's output width: one forward pass of a blank image."""
    import torch  # only once export runs (seconds): not for --help

    backbone.eval()
    with torch.no_grad():
        return int(backbone(torch.zeros(1, 3, image_size, image_size)).shape[-1])
