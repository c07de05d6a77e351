"""The config is the single source of truth: dotted keys, strict overrides, presets, derived values."""

import dataclasses
import typing

import pytest

from dcl_core.config import (
    CONFIG_KEYS,
    PRESETS,
    Config,
    ConfigError,
    Range,
    apply_overrides,
    derive,
    field_specs,
    from_flat_dict,
    preset,
    to_flat_dict,
    validate,
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
        # an empty path is the current folder: dcl_core.train --output-dir '' wrote its run there, silently
        ({"output_dir": ""}, "output_dir is empty; name one, or leave output_dir out for its default"),
        ({"data.root": " "}, "data.root is empty"),
        ({"loss.params": ""}, "loss.params is empty"),
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


# Issue #9, late validation: every value has a range at its field, checked before anything runs.


def _numeric(tp) -> type | None:
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    return args[0] if args[0] in (int, float) else None


def test_every_numeric_field_declares_its_range():
    for key, (tp, f) in field_specs().items():
        assert (f.metadata["range"] is not None) == (_numeric(tp) is not None), key


def test_range_text_and_messages_hand_computed():
    tau = Range(gt=0, cap=100)
    assert str(tau) == "(0, 100]"
    assert [tau.problem(v) for v in (0.1, 100.0, 0.0, -1.0, 100.5, float("nan"), float("-inf"))] == [
        None, None, "> 0", "> 0", "<= 100", "in (0, 100]", "in (0, 100]"
    ]
    momentum = Range(ge=0, lt=1)  # bounded on both sides: the interval is the message
    assert str(momentum) == "[0, 1)"
    assert [momentum.problem(v) for v in (0.0, 0.999, 1.0, -0.1)] == [None, None, "in [0, 1)", "in [0, 1)"]
    assert str(Range(ge=0)) == "[0, inf)" and Range(ge=0).problem(float("inf")) == "in [0, inf)"
    assert str(Range(ge=1 / 64, cap=16)) == "[0.015625, 16]"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("data.jitter_strength", -0.5, "data.jitter_strength must be in [0, 2.5]"),
        ("data.jitter_strength", "nan", "data.jitter_strength must be in [0, 2.5]"),
        ("optim.min_lr_ratio", 1.5, "optim.min_lr_ratio must be in [0, 1], got 1.5"),
        ("model.width", 1e-9, "model.width must be >= 0.015625, got 1e-09"),
        ("loss.temperature", 1e308, "loss.temperature must be <= 100, got 1e+308"),
        ("eval.knn_temperature", "inf", "eval.knn_temperature must be in (0, 100], got inf"),
        ("data.image_size", 100000, "data.image_size must be <= 1024, got 100000"),
        ("data.image_size", 0, "data.image_size must be >= 8, got 0"),
        ("optim.momentum", 1.0, "optim.momentum must be in [0, 1)"),
        ("optim.epochs", 0, "optim.epochs must be >= 1"),
        ("seed", -1, "seed must be >= 0"),
        ("loss.alpha", "inf", "loss.alpha must be in (0, inf), got inf"),
        ("optim.base_lr", "-inf", "optim.base_lr must be in (0, inf)"),
    ],
)
def test_out_of_range_values_raise_one_line_naming_the_key(key, value, message):
    overrides = {key: value, **({"loss.name": "eqco"} if key == "loss.alpha" else {})}
    with pytest.raises(ConfigError) as err:
        apply_overrides(Config(), overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("key", [k for k, (tp, _) in field_specs().items() if _numeric(tp) is float])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_no_float_field_takes_nan_or_inf(key, value):
    overrides = {key: value, **({"loss.name": "eqco"} if key == "loss.alpha" else {})}
    with pytest.raises(ConfigError, match=f"^{key} must be in "):
        apply_overrides(Config(), overrides)


def test_validate_checks_a_config_built_without_apply_overrides():
    # validate iterates the fields' metadata: a config made with dataclasses.replace is checked the same way.
    bad = dataclasses.replace(Config(), data=dataclasses.replace(Config().data, jitter_strength=float("nan")))
    with pytest.raises(ConfigError, match=r"data\.jitter_strength must be in"):
        validate(bad)
    for name in PRESETS:
        validate(preset(name))  # every preset is in range
    validate(Config())


def test_a_key_given_twice_in_loss_params_is_refused_in_one_line():
    """Issue 61, item 11: ``loss.params='{"a": 1, "a": 2}'`` kept the last value silently."""
    with pytest.raises(ConfigError) as err:
        apply_overrides(Config(), {"loss.name": "my_losses:MyLoss", "loss.params": '{"w": 1, "b": 0, "w": 2}'})
    assert str(err.value) == "loss.params: w is given twice ('{\"w\": 1, \"b\": 0, \"w\": 2}'); give each keyword once"


def test_loss_params_with_only_built_in_losses_is_refused(capsys):
    """Issue 61, item 11: ``loss.params`` reaches a user loss only; given while a run or a study names only built-in
    losses, it was ignored silently. Refused in one line (a study with a user loss among built-ins keeps it)."""
    from dcl_core.study.plan.spec import StudySpec, validate_spec
    from dcl_core.train import main as train_main
    from search_spaces import Grid

    assert train_main(["--preset", "smoke", "--loss", "dcl", "--set", 'loss.params={"w": 1}', "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: loss.params is given but loss.name=dcl is a built-in loss, which takes its own keys "
                   "(loss.sigma, loss.alpha, ...), not loss.params: drop loss.params, or name your own loss "
                   "(loss.name=module:Class or path/to/file.py:Class)"], err
    base = apply_overrides(preset("smoke"), {"loss.params": '{"w": 1}'})
    with pytest.raises(ConfigError, match=r"loss\.params is given but loss\.name=dcl, infonce are built-in losses"):
        validate_spec(StudySpec("s", base, {"loss.name": Grid(("dcl", "infonce"))}, "loss.temperature", "tau"))
    validate_spec(StudySpec("s", base, {"loss.name": Grid(("dcl", "my_losses:MyLoss"))}, "loss.temperature", "tau"))
