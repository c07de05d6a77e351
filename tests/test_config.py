"""The config is the single source of truth: dotted keys, strict overrides, presets, derived values."""

import dataclasses

import pytest

from dcl_core.config import (
    CONFIG_KEYS,
    PRESETS,
    Config,
    ConfigError,
    apply_overrides,
    derive,
    from_flat_dict,
    preset,
    to_flat_dict,
)


def test_flat_round_trip_and_frozen():
    cfg = preset("cpu")
    assert from_flat_dict(to_flat_dict(cfg)) == cfg
    assert set(to_flat_dict(cfg)) == set(CONFIG_KEYS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.loss.temperature = 0.5  # type: ignore[misc]


def test_override_changes_only_that_key():
    base = Config()
    new = apply_overrides(base, {"loss.temperature": 0.2, "optim.batch_size": "64"})
    assert new.loss.temperature == 0.2 and new.optim.batch_size == 64
    diff = {k for k, v in to_flat_dict(new).items() if to_flat_dict(base)[k] != v}
    assert diff == {"loss.temperature", "optim.batch_size"}
    assert base.loss.temperature == Config().loss.temperature  # original untouched


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"loss.temprature": 0.1}, "unknown config key"),
        ({"temperature": 0.1}, "did you mean loss.temperature"),
        ({"loss.temperature": "hot"}, "must be a number"),
        ({"optim.batch_size": 3.5}, "must be an integer"),
        ({"optim.batch_size": True}, "must be an integer"),
        ({"data.download": "maybe"}, "true/false"),
        ({"loss.temperature": 0.0}, "loss.temperature must be > 0"),
        ({"loss.temperature": -1.0}, "loss.temperature must be > 0"),
        ({"loss.sigma": 0.0}, "loss.sigma must be > 0"),
        ({"loss.alpha": -4.0}, "loss.alpha must be > 0"),
        ({"optim.batch_size": 1}, "batch_size must be >= 2"),
        ({"loss.name": "simclr2"}, "loss.name must be one of"),
        ({"data.dataset": "mnist"}, "data.dataset must be one of"),
        ({"loss.name": "dcl", "loss.num_negatives": 8}, "only defined for loss.name=eqco"),
        ({"loss.name": "eqco", "loss.num_negatives": 1000, "optim.batch_size": 32}, "exceeds the 2N-2=62"),
        ({"optim.warmup_epochs": 500.0}, "exceeds optim.epochs"),
    ],
)
def test_bad_overrides_raise_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match) as err:
        apply_overrides(Config(), overrides)
    assert "\n" not in str(err.value)


def test_optional_alpha_accepts_none_and_numbers():
    cfg = apply_overrides(Config(), {"loss.name": "eqco", "loss.alpha": "none"})
    assert cfg.loss.alpha is None
    cfg = apply_overrides(cfg, {"loss.alpha": 4096})
    assert cfg.loss.alpha == 4096.0 and isinstance(cfg.loss.alpha, float)


def test_numpy_and_optuna_style_values_are_accepted():
    np = pytest.importorskip("numpy")
    cfg = apply_overrides(Config(), {"loss.temperature": np.float64(0.3), "optim.batch_size": np.int64(64)})
    assert cfg.loss.temperature == 0.3 and cfg.optim.batch_size == 64 and type(cfg.optim.batch_size) is int


def test_presets():
    assert set(PRESETS) == {"smoke", "cpu", "paper", "paper_imagenet"}
    imagenet = preset("paper_imagenet")
    assert (imagenet.model.arch, imagenet.model.stem, imagenet.data.image_size) == ("resnet50", "imagenet", 224)
    assert (imagenet.data.dataset, imagenet.optim.batch_size, imagenet.optim.epochs) == ("imagefolder", 256, 200)
    paper = preset("paper")
    # DCL Sec. 4.1: ResNet-18, 200 epochs, base lr 0.03 * bs/256, tau 0.07 on CIFAR; kNN k=200 t=0.1.
    assert (paper.model.arch, paper.model.width, paper.model.stem) == ("resnet18", 1.0, "cifar")
    assert (paper.optim.epochs, paper.optim.base_lr, paper.loss.temperature) == (200, 0.03, 0.07)
    assert (paper.data.train_per_class, paper.eval.knn_k, paper.eval.knn_temperature) == (0, 200, 0.1)
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("huge")


def test_derived_values_computed_in_one_place():
    cfg = apply_overrides(Config(), {"optim.batch_size": 512, "optim.base_lr": 0.03})
    d = derive(cfg)
    assert d.lr == pytest.approx(0.06)  # 0.03 * 512 / 256
    assert d.num_negatives == 2 * 512 - 2
    assert d.eqco_alpha == d.num_negatives  # alpha unset: alpha = K, i.e. plain InfoNCE
    d2 = derive(cfg, world_size=4)
    assert d2.per_rank_batch == 128 and d2.lr == d.lr and d2.num_negatives == d.num_negatives
    local = derive(apply_overrides(cfg, {"loss.gather_distributed": False}), world_size=4)
    assert local.num_negatives == 2 * 128 - 2
    eq = derive(apply_overrides(cfg, {"loss.name": "eqco", "loss.num_negatives": 16, "loss.alpha": 256.0}))
    assert (eq.num_negatives, eq.eqco_alpha) == (16, 256.0)
    with pytest.raises(ConfigError, match="not divisible"):
        derive(cfg, world_size=3)


def test_knn_temperature_is_independent_of_training_tau():
    cfg = apply_overrides(Config(), {"loss.temperature": 0.5})
    assert cfg.eval.knn_temperature == 0.1
