"""Where the images come from and how the two views are made.

- :mod:`~dcl_core.data.locate`: where a dataset's root and splits are, and :func:`check_dataset`, the pre-flight
  check the CLIs run before any compute.
- :mod:`~dcl_core.data.folders`: an ImageFolder's files as torchvision lists them (no link loop walked), for
  both loaders and the pack (:mod:`~dcl_core.data.packed`).
- :mod:`~dcl_core.data.datasets` (``data.loader=memory``): a split of CIFAR-10/100, STL-10 or a small ImageFolder
  decoded once into an in-memory ``uint8`` tensor (:mod:`~dcl_core.data.decode` decodes image files).
- :mod:`~dcl_core.data.augment`: the seeded, batched, on-device SimCLR / BYOL views of such a tensor
  (:class:`ViewAugmentation`, built from the kernels of :mod:`~dcl_core.data.image_ops`) and the evaluation
  transform (:class:`EvalTransform`).
- :mod:`~dcl_core.data.streaming` (``data.loader=stream``): an ImageFolder too large for memory (ImageNet) read by
  DataLoader workers, with per-sample torchvision views of the same policies; import it from there.

``DATASETS`` is the config's list of ``data.dataset`` choices (:data:`dcl_core.config.DATASET_NAMES`). The names
below load their module on first use: locating and checking a dataset needs no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dcl_core.data.augment import (
        CIFAR_MEAN,
        CIFAR_STD,
        IMAGENET_MEAN,
        IMAGENET_STD,
        EvalTransform,
        ViewAugmentation,
        normalization_for,
    )
    from dcl_core.data.datasets import ImageTensors, class_balanced_subset, fetch_dataset, load_dataset
    from dcl_core.data.errors import DataError, UnreadableImageError
    from dcl_core.data.image_bytes import check_fits_in_memory
    from dcl_core.data.locate import (
        DATA_ROOT_ENV,
        DATASETS,
        EMBEDDED_CIFAR10,
        check_dataset,
        check_outside_splits,
        pretraining_images,
        resolve_data_root,
        split_location,
    )

_MODULES = {
    **dict.fromkeys(("CIFAR_MEAN", "CIFAR_STD", "IMAGENET_MEAN", "IMAGENET_STD", "EvalTransform",
                     "ViewAugmentation", "normalization_for"), "augment"),
    **dict.fromkeys(("ImageTensors", "class_balanced_subset", "fetch_dataset", "load_dataset"), "datasets"),
    **dict.fromkeys(("DataError", "UnreadableImageError"), "errors"),
    "check_fits_in_memory": "image_bytes",
    **dict.fromkeys(("DATA_ROOT_ENV", "DATASETS", "EMBEDDED_CIFAR10", "check_dataset", "check_outside_splits",
                     "pretraining_images", "resolve_data_root", "split_location"), "locate"),
}

__all__ = [
    "CIFAR_MEAN",
    "CIFAR_STD",
    "DATASETS",
    "DATA_ROOT_ENV",
    "EMBEDDED_CIFAR10",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DataError",
    "EvalTransform",
    "ImageTensors",
    "UnreadableImageError",
    "ViewAugmentation",
    "check_dataset",
    "check_fits_in_memory",
    "check_outside_splits",
    "class_balanced_subset",
    "fetch_dataset",
    "load_dataset",
    "normalization_for",
    "pretraining_images",
    "resolve_data_root",
    "split_location",
]


def __getattr__(name: str) -> Any:
    # Lazy, as dcl_core.training: the study driver checks a study's data (locate, errors, image_bytes) without
    # torch and torchvision, which only the views and the decoded tensors (augment, datasets) need.
    if name in _MODULES:
        return getattr(importlib.import_module(f"dcl_core.data.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
