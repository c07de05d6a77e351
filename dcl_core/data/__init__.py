"""Data loading (in-memory uint8 tensors) and batched on-device augmentation."""

from dcl_core.data.augment import (
    CIFAR_MEAN,
    CIFAR_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    EvalTransform,
    ViewAugmentation,
    normalization_for,
)
from dcl_core.data.datasets import (
    DATA_ROOT_ENV,
    DATASETS,
    EMBEDDED_CIFAR10,
    DataError,
    ImageTensors,
    check_dataset,
    class_balanced_subset,
    load_dataset,
    resolve_data_root,
    split_location,
)

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
    "ViewAugmentation",
    "check_dataset",
    "class_balanced_subset",
    "load_dataset",
    "normalization_for",
    "resolve_data_root",
    "split_location",
]
