"""The config's schema: every section and field with its type, default, help, paper value and range; the
names of each kind of choice; the errors a command line answers with exit 2 or 1. Torch-free."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from dcl_core.config.bounds import Range
from dcl_core.config.loss_registry import LOSS_OPTIONS, LOSS_SPECS

# The one list of each kind of name. This module stays torch-free (the CLIs and the study driver import it to
# check a config before torch loads), so the torch modules import these tuples: dcl_core.data's DATASETS and
# augmentation POLICIES and dcl_core.models' ARCHS/STEMS are these tuples, and the FRAMEWORKS registry (and the
# ResNet specs) check their keys against them on import. The losses' names are read from the losses' own files
# (config/loss_registry.py), and dcl_core.losses' LOSSES is built from the same reading.
LOSS_NAMES = tuple(LOSS_SPECS)
FRAMEWORK_NAMES = ("simclr", "moco", "simo", "nnclr")
DATASET_NAMES = ("cifar10", "cifar100", "stl10", "imagefolder")
ARCH_NAMES = ("resnet18", "resnet50")
STEM_NAMES = ("cifar", "imagenet")
AUGMENTATIONS = ("simclr", "byol")
DATA_LOADERS = ("memory", "stream")
DEVICES = ("auto", "cpu", "cuda")


class InputError(Exception):
    """Input a command line refuses before any compute: it exits with code 2 and ``error: <str(err)>`` on one line
    (:func:`dcl_core.cli_common.run_command`). Bad config values, missing data and unreadable checkpoints are all
    this."""


class RunFailedError(RuntimeError):
    """A run that started and failed in a way no retry fixes (a NaN loss, an unwritable output folder): exit code
    1 and one line."""


class ConfigError(InputError, ValueError):
    """A bad configuration value. ``str(err)`` is one line meant for the user."""


def _f(
    default: Any,
    help: str,
    paper: Any = None,
    choices: tuple[Any, ...] | None = None,
    bounds: Range | None = None,
) -> Any:
    """A dataclass field with CLI help, the paper's value, allowed choices and numeric range in its metadata."""
    meta = {"help": help, "paper": paper, "choices": choices, "range": bounds}
    return field(default=default, metadata=meta)


# Ranges shared by several fields. Caps keep a typo from allocating or running for ever: 2**20 images per batch,
# channels of a projection, keys in a queue are far beyond any paper's (8192, 2048 and 65536 / 98304).
_POSITIVE = Range(gt=0)
_COUNT = Range(ge=0)  # a count where 0 means "all" or "none"
_TEMPERATURE = Range(gt=0, cap=100)  # logits are s/τ: finite for any τ in range (and τ <= 10 is tested)
_MOMENTUM = Range(ge=0, lt=1)
_BIG = 2**20


@dataclass(frozen=True)
class DataConfig:
    """The pretraining dataset, where it is, its subsets, the augmentation and how images are loaded (``data.*``)."""

    dataset: str = _f("cifar10", "pretraining dataset", "cifar10", DATASET_NAMES)
    root: str | None = _f(
        None, "data root; default: $DCL_DATA_ROOT, then the embedded ../shared/datasets/cifar10 (CIFAR-10)"
    )
    download: bool = _f(False, "download with torchvision if missing (needs internet)")
    train_per_class: int = _f(
        0, "class-balanced pretraining subset, images per class (0 = all)", 0, bounds=_COUNT
    )
    test_per_class: int = _f(
        0, "class-balanced test subset for evaluation, images per class (0 = all)", 0, bounds=_COUNT
    )
    # 1024 px: well above ImageNet's 224; a ResNet at 100000 px would need terabytes per batch.
    image_size: int = _f(32, "training crop size in pixels", 32, bounds=Range(ge=8, cap=1024))
    augmentation: str = _f(
        "simclr",
        "view policy: SimCLR (paper A.4) or BYOL's asymmetric one (Table 3)",
        "simclr",
        AUGMENTATIONS,
    )
    # SimCLR's CIFAR recipe uses jitter strength 0.5; the DCL paper (A.4) quotes 0.8/0.8/0.8/0.2, i.e. s = 1.
    jitter_strength: float = _f(
        0.5,
        "colour-jitter strength s: (0.8s, 0.8s, 0.8s, 0.2s)",
        1.0,
        bounds=Range(ge=0, le=2.5, why="the hue shift 0.2s is at most half a turn"),
    )
    crop_min_scale: float = _f(0.08, "RandomResizedCrop lower scale bound", 0.08, bounds=Range(gt=0, le=1))
    # Small images (CIFAR, STL-10) are decoded once; ImageNet is ~190 GB at 224 px and is cropped from full
    # resolution, so it streams (dcl_core/data/streaming.py).
    loader: str = _f(
        "memory",
        "memory: decode once into a uint8 tensor, views made batched on the device; stream: an ImageFolder read "
        "by DataLoader workers, views made per sample from full resolution (ImageNet)",
        None,
        DATA_LOADERS,
    )
    workers: int = _f(8, "DataLoader worker processes per rank (data.loader=stream)", bounds=Range(ge=0, cap=256))


@dataclass(frozen=True)
class ModelConfig:
    """The encoder and its projection head (``model.*``)."""

    arch: str = _f("resnet18", "encoder backbone", "resnet18", ARCH_NAMES)
    # At least 1/64: every stage keeps at least one channel per 64 of the standard width (and 8 in all).
    width: float = _f(
        1.0,
        "channel width multiplier (CPU presets use a narrow network)",
        1.0,
        bounds=Range(ge=1 / 64, cap=16),
    )
    stem: str = _f(
        "cifar", "cifar: 3x3 conv, no max-pool; imagenet: 7x7/2 conv + max-pool", "cifar", STEM_NAMES
    )
    proj_hidden_dim: int = _f(
        512, "projection-head hidden width (2-layer MLP with BN)", 512, bounds=Range(ge=1, cap=_BIG)
    )
    proj_dim: int = _f(128, "projection (latent) dimension", 128, bounds=Range(ge=1, cap=_BIG))
    sync_bn: bool = _f(True, "convert BatchNorm to SyncBatchNorm under multi-GPU DDP (CUDA only)")


@dataclass(frozen=True)
class LossConfig:
    """The contrastive loss: what every loss takes (``loss.*``), and at run time each built-in loss's own parameters.

    The fields below are the ones every loss shares. Each built-in loss declares its own parameters in its file
    (``sigma``, ``alpha``, ...: :mod:`dcl_core.config.loss_registry`), and :func:`_with_loss_params` adds them as
    typed, bounded fields of this class when the module loads, so ``loss.sigma`` is a config key like any other.
    Type checkers see only the shared fields: code that serves every loss reads a loss's own parameter by its
    key (``value_at(cfg, "loss.alpha")``).
    """

    # Or the user's own loss, module:Class or path/to/file.py:Class (config/user_loss.py; validation accepts it).
    name: str = _f("dcl", "contrastive objective, or your own as module:Class or file.py:Class", "dcl", LOSS_NAMES)
    # 0.07 on CIFAR/STL (Sec. 4.1); 0.1 for ImageNet; Table 18 sweeps 0.07..1.0.
    temperature: float = _f(
        0.1, "softmax temperature tau of the training loss", 0.07, bounds=_TEMPERATURE
    )
    gather_distributed: bool = _f(True, "under DDP, use all ranks' samples as negatives (global batch)")
    params: str = _f("{}", "your own loss's keyword arguments (loss.name=module:Class), a JSON object")


def _with_loss_params(shared: type) -> type:
    """``shared`` with each built-in loss's parameters added after ``loss.temperature``, as frozen dataclass fields
    of the same name, module and docstring (so configs pickle, and ``dataclasses.replace`` takes every key)."""
    declared = [(f.name, f.type, field(default=f.default, metadata=f.metadata)) for f in dataclasses.fields(shared)]
    own = [
        (name, p.kind | None if p.default is None else p.kind,
         field(default=p.default, metadata={"help": p.help, "paper": p.paper, "choices": None, "range": p.bounds,
                                            "losses": owners}))
        for name, (p, owners) in LOSS_OPTIONS.items()
    ]
    cls = dataclasses.make_dataclass(shared.__name__, [*declared[:2], *own, *declared[2:]], frozen=True,
                                     namespace={"__doc__": shared.__doc__})
    cls.__module__, cls.__qualname__ = __name__, shared.__qualname__
    return cls


if not typing.TYPE_CHECKING:
    LossConfig = _with_loss_params(LossConfig)


@dataclass(frozen=True)
class FrameworkConfig:
    """How anchors, positives and negatives are formed (``dcl_core/frameworks``); the loss scores them.

    K (negatives per anchor, :attr:`Derived.num_negatives`, EqCo's K) per framework: simclr 2N−2 (or
    ``loss.num_negatives``), moco ``queue_size``, simo ``num_negatives`` or N−1, nnclr N−1 (or
    ``loss.num_negatives``); N is the global batch when ``loss.gather_distributed``, else the per-rank batch.
    """

    name: str = _f("simclr", "how views, keys and negatives are formed", "simclr", FRAMEWORK_NAMES)
    # MoCo-v2 / SiMo (EqCo App. B.1): 0.999.
    momentum: float = _f(
        0.999,
        "moco/simo: key-encoder momentum beta: theta_k <- beta*theta_k + (1-beta)*theta_q",
        0.999,
        bounds=_MOMENTUM,
    )
    # DCL Table 5 sweeps the MoCo-v2 queue 32..65536 (65536 in MoCo-v2); NNCLR's support set is 98304.
    queue_size: int = _f(
        4096, "moco: queue of K negative keys; nnclr: support-set size (FIFO)", 65536, bounds=Range(ge=1, cap=_BIG)
    )
    # SiMo: K = 16..256 negatives per query with alpha = 256 (EqCo Table 2).
    num_negatives: int = _f(0, "simo: K keys of other images sampled per query (0 = all N-1)", 256, bounds=_COUNT)


@dataclass(frozen=True)
class OptimConfig:
    """Epochs, batch size, SGD and the learning-rate schedule (``optim.*``)."""

    epochs: int = _f(200, "pretraining epochs", 200, bounds=Range(ge=1, cap=100_000))
    batch_size: int = _f(
        256,
        "global batch size N (images; 2N views)",
        256,
        bounds=Range(ge=2, cap=_BIG, why="negatives come from the batch"),
    )
    # No cap: a huge lr is how the tests make a run diverge on purpose.
    base_lr: float = _f(0.03, "base learning rate; lr = base_lr * batch_size / 256", 0.03, bounds=_POSITIVE)
    momentum: float = _f(0.9, "SGD momentum", 0.9, bounds=_MOMENTUM)
    weight_decay: float = _f(5e-4, "SGD weight decay", 5e-4, bounds=Range(ge=0, cap=1))
    warmup_epochs: float = _f(
        0.0, "linear warm-up epochs before cosine decay (at most optim.epochs)", 0.0, bounds=Range(ge=0)
    )
    min_lr_ratio: float = _f(0.0, "final lr as a fraction of the peak lr", 0.0, bounds=Range(ge=0, le=1))


@dataclass(frozen=True)
class EvalConfig:
    """The kNN monitor and the linear probe (``eval.*``)."""

    knn_k: int = _f(200, "kNN monitor neighbours", 200, bounds=Range(ge=1, cap=_BIG))
    # The kNN monitor has its own temperature; it is never the training tau (see REFERENCES: leftthomas/SimCLR).
    knn_temperature: float = _f(
        0.1, "kNN monitor temperature (fixed; independent of loss.temperature)", 0.1, bounds=_TEMPERATURE
    )
    knn_every: int = _f(
        1, "run the kNN monitor every n epochs (and always after the last)", 1, bounds=Range(ge=1, cap=100_000)
    )
    linear: bool = _f(False, "train a linear probe on frozen features after pretraining")
    linear_preset: str = _f(
        "cpu", "linear-probe protocol: paper (A.4), cpu or smoke", "paper", ("paper", "cpu", "smoke")
    )
    batch_size: int = _f(512, "feature-extraction batch size", bounds=Range(ge=1, cap=_BIG))


@dataclass(frozen=True)
class Config:
    """One training run's whole configuration: the sections above plus seed, device, precision, threads and output."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    framework: FrameworkConfig = field(default_factory=FrameworkConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = _f(0, "random seed (data subset, init, views, shuffling)", bounds=Range(ge=0, cap=2**32 - 1))
    device: str = _f("auto", "auto: CUDA if available, else CPU", None, DEVICES)
    amp: bool = _f(True, "mixed precision when on CUDA: bf16 autocast where the GPU has bf16, else fp16 + "
                         "GradScaler; ignored on CPU")
    threads: int = _f(0, "torch CPU threads (0 = auto: the CPUs not busy now, from /proc/stat over half a second; "
                      "a study sets each trial's from its CPU reservation)", bounds=Range(ge=0, cap=1024))
    output_dir: str = _f("runs/latest", "where checkpoints and metrics.jsonl go (made absolute)")



# ----------------------------------------------------------------------------------------------------------
# Dotted keys


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _resolved_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_specs(cls: type = Config, prefix: str = "") -> dict[str, tuple[Any, dataclasses.Field]]:
    """Every leaf key as ``{"loss.temperature": (type, Field)}``, in declaration order."""
    out: dict[str, tuple[Any, dataclasses.Field]] = {}
    hints = _resolved_types(cls)
    for name, f in _fields(cls).items():
        tp = hints[name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out.update(field_specs(tp, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = (tp, f)
    return out


CONFIG_KEYS: tuple[str, ...] = tuple(field_specs())


def value_at(cfg: Config, key: str) -> Any:
    """The value of dotted ``key`` in ``cfg`` (``loss.temperature`` -> ``cfg.loss.temperature``)."""
    obj: Any = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


