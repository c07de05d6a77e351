"""What no single field can say: the loss's own keys, framework/loss pairs and K against the batch, the schedule
and the data loader; and the device."""

from __future__ import annotations

from dcl_core.config.loss_registry import LOSS_OPTIONS, LOSS_SPECS
from dcl_core.config.negatives import NEGATIVES
from dcl_core.config.schema import Config, ConfigError, Range, field_specs, value_at
from dcl_core.config.user_loss import REFERENCE_FORMS, loss_params, loss_reference


def validate(cfg: Config) -> None:
    """Choice, range and combination checks; raises :class:`ConfigError` with one line naming the key.

    Each field's choices and :class:`Range` live in its metadata (:func:`_check_fields`); what no single field
    can say is checked here: the loss's own keys (:func:`_check_loss`), framework/loss pairs and K against the
    batch (:func:`_check_framework`), the schedule and the data loader (:func:`_check_schedule_and_data`).

    Framework/loss pairs that are rejected, and why:

    - A loss with the framework its spec leaves out (``LossSpec.frameworks``): ``loss.name=align_uniform`` with
      moco/simo/nnclr, since alignment + uniformity scores whole embeddings (Wang & Isola), not the
      anchor/positive/negative similarities these frameworks build; it runs with simclr only.
    - ``loss.num_negatives`` (EqCo's per-anchor sampling of in-batch negatives) with moco: there K *is* the
      queue (``framework.queue_size``); with simo: SiMo samples its keys itself (``framework.num_negatives``),
      and sampling twice would make K ambiguous.
    - ``framework.num_negatives`` with anything but simo (it is SiMo's K).
    - A loss's own option set with another loss where its spec says so (``LossParam.elsewhere``):
      ``loss.alpha`` and ``loss.num_negatives`` with any loss but eqco. Scaling the negatives' sum by α/K matters
      only while the positive is in the denominator: in DCL/DCLW it adds the constant log(α/K) to the loss and
      changes no gradient (and InfoNCE would silently ignore it), so a study that sets α on another loss is a
      mistake.

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
        value = value_at(cfg, key)
        choices = f.metadata.get("choices")
        if key == "loss.name" and loss_reference(value) is not None:  # the user's own loss: checked when imported
            continue
        if choices is not None and value not in choices:
            also = f", or your own loss as {REFERENCE_FORMS}" if key == "loss.name" else ""
            raise ConfigError(f"{key} must be one of {', '.join(map(str, choices))}{also}; got {value!r}")
        if isinstance(value, str) and not value.strip() and choices is None:  # '' is the current folder, silently
            raise ConfigError(f"{key} is empty; name one, or leave {key} out for its default")
        if value is None or isinstance(value, (bool, str)):
            continue
        bounds: Range = f.metadata.get("range") or Range()  # every numeric field declares one (tested)
        problem = bounds.problem(value)
        if problem is not None:
            why = f" ({bounds.why})" if bounds.why else ""
            raise ConfigError(f"{key} must be {problem}{why}, got {value}")


def _check_loss(cfg: Config) -> None:
    """A built-in loss's own option set with another loss where its spec refuses that (EqCo's K sub-sampling and
    α); a user loss's params."""
    loss_params(cfg.loss.params)  # a JSON object of keyword arguments; only a user loss receives them (as
    # loss.sigma goes to DCLW only): a study comparing a user loss with the built-in ones sets them in its base
    for key, (param, owners) in LOSS_OPTIONS.items():
        if param.elsewhere and cfg.loss.name not in owners and value_at(cfg, f"loss.{key}") != param.default:
            raise ConfigError(param.elsewhere.format(name=cfg.loss.name))


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
    spec = LOSS_SPECS.get(lc.name)  # None: the user's own loss
    if spec is not None and spec.frameworks and fc.name not in spec.frameworks:
        raise ConfigError(
            f"loss.name={lc.name} cannot be used with framework.name={fc.name}: {spec.frameworks_why}; use "
            f"framework.name={' or '.join(spec.frameworks)}"
        )
    negatives = NEGATIVES[fc.name]  # the framework's row: which key sets K, what it offers
    for key in ("loss.num_negatives", "framework.num_negatives"):
        if value_at(cfg, key) and key != negatives.k_key:
            users = ", ".join(name for name, n in NEGATIVES.items() if n.k_key == key)
            raise ConfigError(
                f"{key} does not apply to framework.name={fc.name}: its K is {negatives.what}, set "
                f"{negatives.k_key} ({key} sets K for {users})"
            )
    k, offered = value_at(cfg, negatives.k_key), negatives.offered(big_n, fc.queue_size)
    if k > offered:
        raise ConfigError(
            f"{negatives.k_key}={k} exceeds the {negatives.formula}={offered} negatives ({negatives.what}) "
            f"{fc.name} forms from a batch of optim.batch_size"
        )


def check_device(device: str) -> None:
    """ConfigError (one line, before any compute) if ``device=cuda`` is asked for on a machine without CUDA."""
    if device == "cuda":
        import torch  # only here: this module stays torch-free so configs are checked before torch loads

        if not torch.cuda.is_available():
            raise ConfigError("device=cuda but this machine has no usable CUDA device; use device=auto or cpu")


