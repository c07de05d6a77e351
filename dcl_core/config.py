"""The single source of truth for a run: one typed, frozen dataclass tree.

Every knob is a field here, addressed by a dotted key (``loss.temperature``). The CLI, Ray's ``param_space``
and the Optuna spaces in ``search_spaces/`` all produce exactly these keys, and :func:`apply_overrides` is the
only way to change them: unknown keys, wrong types and out-of-range values raise :class:`ConfigError` before
any compute starts. Derived quantities (the scaled learning rate, EqCo's K, per-rank batch) are computed in one
place, :func:`derive`, and nothing mutates a config during a run.

Each field carries ``help`` (shown by ``python -m dcl_core.train --help``) and, where the papers fix a value,
``paper`` (the DCL / EqCo protocol value).

Example:
    >>> cfg = apply_overrides(preset("cpu"), {"loss.name": "dcl", "loss.temperature": 0.1})
    >>> derive(cfg).lr  # base_lr * batch / 256
    0.03
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

# The one list of each kind of name. This module stays torch-free (the CLIs and the study driver import it to
# check a config before torch loads), so the torch modules import these tuples: dcl_core.data's DATASETS and
# augmentation POLICIES and dcl_core.models' ARCHS/STEMS are these tuples, and the LOSSES and FRAMEWORKS
# registries (and the ResNet specs) check their keys against them on import.
LOSS_NAMES = ("infonce", "dcl", "dclw", "dclw_exp", "eqco", "align_uniform")
FRAMEWORK_NAMES = ("simclr", "moco", "simo", "nnclr")
DATASET_NAMES = ("cifar10", "cifar100", "stl10", "imagefolder")
ARCH_NAMES = ("resnet18", "resnet50")
STEM_NAMES = ("cifar", "imagenet")
AUGMENTATIONS = ("simclr", "byol")
DATA_LOADERS = ("memory", "stream")
DEVICES = ("auto", "cpu", "cuda")


class InputError(Exception):
    """Input a command line refuses before any compute: it exits with code 2 and ``error: <str(err)>`` on one line
    (:func:`dcl_core.cli.run_command`). Bad config values, missing data and unreadable checkpoints are all this."""


class RunFailedError(RuntimeError):
    """A run that started and failed in a way no retry fixes (a NaN loss, an unwritable output folder): exit code
    1 and one line."""


class ConfigError(InputError, ValueError):
    """A bad configuration value. ``str(err)`` is one line meant for the user."""


@dataclass(frozen=True)
class Range:
    """The values a numeric field accepts, checked by :func:`validate` and shown by ``--help`` as ``range ...``.

    ``gt``/``ge`` and ``lt``/``le`` bound the quantity's domain (a momentum lies in [0, 1), a temperature is
    > 0); ``cap`` is a practical upper limit where the domain has none (τ <= 100: the losses divide by τ and
    must stay finite, and no study needs more). A float field must also be finite. Messages name the violated
    bound (``loss.temperature must be > 0``, ``... must be <= 100``), or the interval when the domain is
    bounded on both sides (``framework.momentum must be in [0, 1)``); ``why`` is appended to them.
    """

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    cap: float | None = None
    why: str = ""

    def _lower(self) -> tuple[str, str]:
        """``("(", "0")``: the interval's opening bracket and lower bound."""
        if self.gt is not None:
            return "(", _num(self.gt)
        return ("[", _num(self.ge)) if self.ge is not None else ("(", "-inf")

    def _upper(self) -> tuple[str, str]:
        """``("100", "]")``: the upper bound and closing bracket (the cap's when the domain has none)."""
        if self.lt is not None:
            return _num(self.lt), ")"
        if self.le is not None:
            return _num(self.le), "]"
        return (_num(self.cap), "]") if self.cap is not None else ("inf", ")")

    def __str__(self) -> str:
        (bracket, low), (high, close) = self._lower(), self._upper()
        return f"{bracket}{low}, {high}{close}"

    def problem(self, value: float) -> str | None:
        """What ``value`` must be instead (``"> 0"``, ``"in [0, 1)"``), or None if it is in range."""
        two_sided = (self.gt is not None or self.ge is not None) and (self.lt is not None or self.le is not None)
        domain = "in " + str(self) if two_sided else None
        if isinstance(value, float) and not math.isfinite(value):
            return f"in {self}"
        if (self.gt is not None and not value > self.gt) or (self.ge is not None and not value >= self.ge):
            return domain or (f"> {_num(self.gt)}" if self.gt is not None else f">= {_num(self.ge)}")
        if (self.lt is not None and not value < self.lt) or (self.le is not None and not value <= self.le):
            return domain or (f"< {_num(self.lt)}" if self.lt is not None else f"<= {_num(self.le)}")
        if self.cap is not None and value > self.cap:
            return f"<= {_num(self.cap)}"
        return None


def _num(x: float | None) -> str:
    """``0``, ``0.5``, ``1e+06``: a bound as written in messages and ``--help``."""
    return f"{x:g}" if isinstance(x, float) else str(x)


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
    name: str = _f("dcl", "contrastive objective", "dcl", LOSS_NAMES)
    # 0.07 on CIFAR/STL (Sec. 4.1); 0.1 for ImageNet; Table 18 sweeps 0.07..1.0.
    temperature: float = _f(
        0.1, "softmax temperature tau of the training loss", 0.07, bounds=_TEMPERATURE
    )
    # dclw_sigma_sweep runs sigma = 1000 as the DCL limit.
    sigma: float = _f(
        0.5,
        "DCLW: vMF weight scale sigma (Eq. 7); dclw_exp: exponent scale (A.8)",
        0.5,
        bounds=Range(gt=0, cap=1e6),
    )
    delta: float = _f(
        3.0, "dclw_exp: weight scale delta in w = delta*exp(-sigma<z1,z2>) (A.8)", 3.0, bounds=Range(gt=0, cap=1e6)
    )
    # EqCo: None means alpha = K, i.e. zero margin (plain InfoNCE). SiMo uses 256; EqCo MoCo runs 65536.
    alpha: float | None = _f(
        None, "EqCo alpha: margin m = tau*log(alpha/K) (EqCo Eq. 5); none = K", 256.0, bounds=_POSITIVE
    )
    num_negatives: int = _f(
        0,
        "EqCo: K negatives sampled per anchor (0 = all: 2N-2 for simclr, N-1 for nnclr); not moco/simo",
        0,
        bounds=_COUNT,
    )
    gather_distributed: bool = _f(True, "under DDP, use all ranks' samples as negatives (global batch)")
    uniformity_t: float = _f(
        2.0, "align_uniform: uniformity kernel scale t (Wang & Isola)", 2.0, bounds=Range(gt=0, cap=100)
    )
    uniformity_weight: float = _f(
        1.0, "align_uniform: weight of the uniformity term", 1.0, bounds=Range(ge=0, cap=1e6)
    )


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
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    framework: FrameworkConfig = field(default_factory=FrameworkConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = _f(0, "random seed (data subset, init, views, shuffling)", bounds=Range(ge=0, cap=2**32 - 1))
    device: str = _f("auto", "auto: CUDA if available, else CPU", None, DEVICES)
    amp: bool = _f(True, "mixed precision (fp16 autocast + GradScaler) when on CUDA; ignored on CPU")
    threads: int = _f(0, "torch CPU threads (0 = auto: the CPUs not busy now, from /proc/stat over half a second; "
                      "a study sets each trial's from its CPU reservation)", bounds=Range(ge=0, cap=1024))
    output_dir: str = _f("runs/latest", "where checkpoints and metrics.jsonl go (made absolute)")


# ----------------------------------------------------------------------------------------------------------
# Presets: smoke (tests, seconds), cpu (answers a question on 2 cores in minutes), paper (GPU protocol).

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "data.train_per_class": 16,
        "data.test_per_class": 8,
        "model.width": 0.125,
        "model.proj_hidden_dim": 64,
        "optim.epochs": 2,
        "optim.batch_size": 32,
        "eval.knn_k": 20,
        "eval.linear_preset": "smoke",
    },
    # ~3 min on 2 idle cores (`benchmarks/run.py --sections levers,roofline` measures its step); kNN top-1 rises
    # from ~33% after one epoch to ~45% after 15 for DCL and InfoNCE alike (chance: 10%).
    "cpu": {
        "data.train_per_class": 500,
        "data.test_per_class": 100,
        "model.width": 0.25,
        "model.proj_hidden_dim": 128,
        "optim.epochs": 15,
        "optim.batch_size": 128,
        "optim.base_lr": 0.06,
        "optim.warmup_epochs": 1.0,
        "eval.linear_preset": "cpu",
    },
    # DCL Sec. 4.1 / Table 1: ResNet-18, CIFAR stem, 200 epochs, batch 256, base lr 0.03 * bs/256, tau 0.07,
    # kNN evaluation; A.4 augmentations (jitter strength 1.0); A.4 linear protocol.
    "paper": {
        "model.width": 1.0,
        "model.proj_hidden_dim": 512,
        "optim.epochs": 200,
        "optim.batch_size": 256,
        "optim.base_lr": 0.03,
        "loss.temperature": 0.07,
        "data.jitter_strength": 1.0,
        "eval.linear_preset": "paper",
    },
    # The ImageNet-style protocol (DCL Tables 3, 5, 6; EqCo Figs. 3-4): ResNet-50, 224 px ImageFolder root
    # (ImageNet-100 or -1K, pass --data-root), batch 256, 200 epochs, base lr 0.3, tau 0.1.
    "paper_imagenet": {
        "data.dataset": "imagefolder",
        "data.loader": "stream",
        "data.image_size": 224,
        "data.jitter_strength": 1.0,
        "model.arch": "resnet50",
        "model.stem": "imagenet",
        "model.proj_hidden_dim": 2048,
        "optim.epochs": 200,
        "optim.batch_size": 256,
        "optim.base_lr": 0.3,
        "loss.temperature": 0.1,
        "eval.knn_every": 10,
        "eval.linear_preset": "paper",
    },
}


def preset(name: str) -> Config:
    """The config of a named preset (``smoke``, ``cpu``, ``paper``, ``paper_imagenet``)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return apply_overrides(Config(), PRESETS[name])


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
        if dataclasses.is_dataclass(tp):
            out.update(field_specs(tp, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = (tp, f)
    return out


CONFIG_KEYS: tuple[str, ...] = tuple(field_specs())


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Check (and losslessly convert) ``value`` for a field of type ``tp``; raise ConfigError otherwise."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        if is_none and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, inner[0], value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key} must be true/false, got {value!r}")
    if tp is int:
        # numpy / Optuna integers are fine; floats with a fractional part and bools are not.
        if isinstance(value, bool):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"{key} must be an integer, got {value!r}") from None
        if hasattr(value, "__index__"):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key} must be a number, got {value!r}") from None
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported field type {tp}")  # pragma: no cover - a bug in this module


def apply_overrides(cfg: Config, overrides: dict[str, Any]) -> Config:
    """Return a new config with dotted-key ``overrides`` applied and the result validated.

    Raises:
        ConfigError: unknown key, wrong type, or a value out of range (one line).
    """
    specs = field_specs()
    grouped: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in specs:
            close = [k for k in specs if k.split(".")[-1] == key.split(".")[-1]]
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"unknown config key {key!r}{hint}")
        tp, _ = specs[key]
        coerced = _coerce(key, tp, value)
        if "." in key:
            section, name = key.split(".", 1)
            grouped.setdefault(section, {})[name] = coerced
        else:
            top[key] = coerced
    for section, values in grouped.items():
        top[section] = dataclasses.replace(getattr(cfg, section), **values)
    new = dataclasses.replace(cfg, **top)
    validate(new)
    return new


def parse_overrides(items: list[str]) -> dict[str, str]:
    """``["loss.temperature=0.2", ...]`` (the command lines' ``--set`` values) as ``{key: value}`` strings,
    for :func:`apply_overrides` to check and convert.

    Raises:
        ConfigError: an item without ``=``; a key given twice (which value was meant is not ours to guess).
    """
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        key = key.strip()
        if key in out and out[key] != value.strip():
            raise ConfigError(f"--set {key} is given twice ({out[key]!r} and {value.strip()!r}); give it once")
        out[key] = value.strip()
    return out


def to_flat_dict(cfg: Config) -> dict[str, Any]:
    """``{"loss.temperature": 0.1, ...}`` for every leaf: MLflow params, checkpoints, provenance."""
    out: dict[str, Any] = {}
    for key in CONFIG_KEYS:
        obj: Any = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        out[key] = obj
    return out


def from_flat_dict(flat: dict[str, Any]) -> Config:
    """Inverse of :func:`to_flat_dict` (validates)."""
    return apply_overrides(Config(), flat)


# ----------------------------------------------------------------------------------------------------------
# Validation and derived values


def validate(cfg: Config) -> None:
    """Choice, range and combination checks; raises :class:`ConfigError` with one line naming the key.

    Each field's choices and :class:`Range` live in its metadata (:func:`_check_fields`); what no single field
    can say is checked here: the loss's own keys (:func:`_check_loss`), framework/loss pairs and K against the
    batch (:func:`_check_framework`), the schedule and the data loader (:func:`_check_schedule_and_data`).

    Framework/loss pairs that are rejected, and why:

    - ``framework.name`` moco/simo/nnclr with ``loss.name=align_uniform``: alignment + uniformity scores whole
      embeddings (Wang & Isola), not the anchor/positive/negative similarities these frameworks build, so it
      has no ``from_similarities`` form; it runs with simclr only.
    - ``loss.num_negatives`` (EqCo's per-anchor sampling of in-batch negatives) with moco: there K *is* the
      queue (``framework.queue_size``); with simo: SiMo samples its keys itself (``framework.num_negatives``),
      and sampling twice would make K ambiguous.
    - ``framework.num_negatives`` with anything but simo (it is SiMo's K).
    - ``loss.alpha`` with any loss but eqco. Scaling the negatives' sum by α/K matters only while the positive
      is in the denominator: in DCL/DCLW it adds the constant log(α/K) to the loss and changes no gradient
      (and InfoNCE would silently ignore it), so a study that sets α on another loss is a mistake.

    Every other pair is meaningful: InfoNCE, DCL, DCLW, DCLW-exp and EqCo all take ``PairSimilarities``.
    EqCo's α only changes gradients because the positive stays in the denominator (its margin τ·log(α/K)
    rescales the negatives against the positive, EqCo Eq. 12-13); EqCo is InfoNCE-form, so it keeps that
    property under every framework, with K = :attr:`Derived.num_negatives` of that framework.
    """
    _check_fields(cfg)
    _check_loss(cfg)
    _check_framework(cfg)
    _check_schedule_and_data(cfg)


def _check_fields(cfg: Config) -> None:
    """Every field against the choices and :class:`Range` in its metadata; floats must be finite."""
    for key, (_, f) in field_specs().items():
        value = _get(cfg, key)
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise ConfigError(f"{key} must be one of {', '.join(map(str, choices))}; got {value!r}")
        if value is None or isinstance(value, (bool, str)):
            continue
        bounds: Range = f.metadata.get("range") or Range()  # every numeric field declares one (tested)
        problem = bounds.problem(value)
        if problem is not None:
            why = f" ({bounds.why})" if bounds.why else ""
            raise ConfigError(f"{key} must be {problem}{why}, got {value}")


def _check_loss(cfg: Config) -> None:
    """Keys that belong to one loss (EqCo's K sub-sampling and α) set with another."""
    if cfg.loss.num_negatives and cfg.loss.name != "eqco":
        raise ConfigError("loss.num_negatives (K sub-sampling) is only defined for loss.name=eqco")
    if cfg.loss.alpha is not None and cfg.loss.name != "eqco":
        raise ConfigError(
            f"loss.alpha is EqCo's and has no effect with loss.name={cfg.loss.name}: scaling the negatives by "
            "alpha/K only changes gradients while the positive is in the denominator; use loss.name=eqco"
        )


def _check_schedule_and_data(cfg: Config) -> None:
    """The warm-up inside the schedule, and a loader that can read the dataset's format."""
    if cfg.optim.warmup_epochs > cfg.optim.epochs:
        raise ConfigError(
            f"optim.warmup_epochs={cfg.optim.warmup_epochs} exceeds optim.epochs={cfg.optim.epochs}"
        )
    if cfg.data.loader == "stream" and cfg.data.dataset == "stl10":
        raise ConfigError("data.loader=stream reads ImageFolder layouts; STL-10 comes in torchvision's binary "
                          "format, which data.loader=memory decodes")


def _check_framework(cfg: Config) -> None:
    """Framework/loss pairs and K against the batch (see :func:`validate`)."""
    fc, lc, big_n = cfg.framework, cfg.loss, cfg.optim.batch_size
    if fc.name != "simclr" and lc.name == "align_uniform":
        raise ConfigError(
            f"loss.name=align_uniform cannot be used with framework.name={fc.name}: it scores whole embeddings, "
            "not the anchor/positive/negative similarities the framework builds; use framework.name=simclr"
        )
    if fc.num_negatives and fc.name != "simo":
        raise ConfigError(
            f"framework.num_negatives (SiMo's K keys per query) is only defined for framework.name=simo, "
            f"not {fc.name}"
        )
    if lc.num_negatives and fc.name == "moco":
        raise ConfigError(
            "loss.num_negatives (EqCo's in-batch K sampling) does not apply to framework.name=moco: "
            "its K is the queue, set framework.queue_size"
        )
    if lc.num_negatives and fc.name == "simo":
        raise ConfigError(
            "loss.num_negatives does not apply to framework.name=simo: SiMo samples its K keys per query, "
            "set framework.num_negatives"
        )
    if fc.name == "simo" and fc.num_negatives > big_n - 1:
        raise ConfigError(
            f"framework.num_negatives={fc.num_negatives} exceeds the N-1={big_n - 1} other images' keys "
            "a batch of optim.batch_size offers"
        )
    if fc.name == "nnclr" and lc.num_negatives > big_n - 1:
        raise ConfigError(
            f"loss.num_negatives={lc.num_negatives} exceeds the N-1={big_n - 1} negatives nnclr forms "
            "from a batch of optim.batch_size"
        )
    if fc.name == "simclr" and lc.num_negatives > 2 * big_n - 2:
        raise ConfigError(
            f"loss.num_negatives={lc.num_negatives} exceeds the 2N-2={2 * big_n - 2} "
            "negatives a batch of optim.batch_size offers"
        )


def check_device(device: str) -> None:
    """ConfigError (one line, before any compute) if ``device=cuda`` is asked for on a machine without CUDA."""
    if device == "cuda":
        import torch  # only here: this module stays torch-free so configs are checked before torch loads

        if not torch.cuda.is_available():
            raise ConfigError("device=cuda but this machine has no usable CUDA device; use device=auto or cpu")


def _get(cfg: Config, key: str) -> Any:
    obj: Any = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Derived:
    """Values computed from a config, in one place (nothing else re-derives them)."""

    lr: float  # peak lr = base_lr * global batch / 256 (linear scaling rule; DCL Sec. 4.1, EqCo Sec. 2.2)
    per_rank_batch: int  # global batch / world size
    num_negatives: int  # K: negatives per anchor seen by the loss, per framework (see derive)
    eqco_alpha: float  # alpha actually used (alpha = K when unset: zero margin)


def derive(cfg: Config, world_size: int = 1) -> Derived:
    """Compute derived values; ``world_size`` is the number of DDP ranks sharing the global batch.

    K, the number of negatives per anchor (the K of EqCo's margin τ·log(α/K); α = None means α = K), with N the
    batch the negatives come from (global with ``loss.gather_distributed``, else per rank):

    - simclr: ``loss.num_negatives`` or all 2N−2 other views;
    - moco: ``framework.queue_size`` (every query is scored against the whole queue);
    - simo: ``framework.num_negatives`` or all N−1 other images' keys;
    - nnclr: ``loss.num_negatives`` or all N−1 other images (NNCLR contrasts against the other view only).
    """
    if cfg.optim.batch_size % world_size:
        raise ConfigError(
            f"optim.batch_size={cfg.optim.batch_size} is not divisible by the {world_size} DDP workers"
        )
    big_n = cfg.optim.batch_size if cfg.loss.gather_distributed else cfg.optim.batch_size // world_size
    name = cfg.framework.name
    if name == "moco":
        k, available = cfg.framework.queue_size, cfg.framework.queue_size
    elif name == "simo":
        available = big_n - 1
        k = cfg.framework.num_negatives or available
    elif name == "nnclr":
        available = big_n - 1
        k = cfg.loss.num_negatives or available
    else:
        available = 2 * big_n - 2
        k = cfg.loss.num_negatives or available
    if available < 1 or k > available:
        raise ConfigError(
            f"{name} with a per-rank batch of {cfg.optim.batch_size // world_size} (gather_distributed="
            f"{cfg.loss.gather_distributed}) offers {available} negatives per anchor, fewer than K={k}"
        )
    alpha = float(k) if cfg.loss.alpha is None else cfg.loss.alpha
    return Derived(
        lr=cfg.optim.base_lr * cfg.optim.batch_size / 256,
        per_rank_batch=cfg.optim.batch_size // world_size,
        num_negatives=k,
        eqco_alpha=alpha,
    )
