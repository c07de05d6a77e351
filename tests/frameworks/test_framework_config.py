"""framework.* config keys: ranges, rejected framework/loss pairs, K per framework, builders, checkpoint state."""

from __future__ import annotations

import math

import pytest
import torch
from framework_helpers import SpyLoss, TinyEncoder, make_views

from dcl_core.config import CONFIG_KEYS, FRAMEWORK_NAMES, Config, ConfigError, apply_overrides, derive, preset
from dcl_core.config.negatives import NEGATIVES
from dcl_core.frameworks import FRAMEWORKS, NNCLR, MoCo, SimCLR, SiMo
from dcl_core.losses import EqCoLoss
from dcl_core.training.builders import build_framework, build_loss
from dcl_core.training.checkpoint import framework_state, load_framework_state


def cfg(**overrides) -> Config:
    return apply_overrides(Config(), {"optim.batch_size": 32, **overrides})


def test_defaults_and_names():
    fc = Config().framework
    assert (fc.name, fc.momentum, fc.queue_size, fc.num_negatives) == ("simclr", 0.999, 4096, 0)
    assert set(FRAMEWORK_NAMES) == set(FRAMEWORKS) == {"simclr", "moco", "simo", "nnclr"}


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"framework.name": "byol"}, "framework.name must be one of"),
        ({"framework.momentum": 1.0}, r"framework.momentum must be in \[0, 1\)"),
        ({"framework.momentum": -0.1}, r"framework.momentum must be in \[0, 1\)"),
        ({"framework.momentum": "nan"}, r"framework.momentum must be in \[0, 1\)"),
        ({"framework.queue_size": 0}, "framework.queue_size must be >= 1"),
        ({"framework.name": "simo", "framework.num_negatives": -1}, "framework.num_negatives must be >= 0"),
        # Pairs without meaning.
        ({"framework.name": "moco", "loss.name": "align_uniform"}, "align_uniform cannot be used with .*moco"),
        ({"framework.name": "simo", "loss.name": "align_uniform"}, "align_uniform cannot be used with .*simo"),
        ({"framework.name": "nnclr", "loss.name": "align_uniform"}, "align_uniform cannot be used with .*nnclr"),
        (
            {"framework.name": "moco", "loss.name": "eqco", "loss.num_negatives": 16},
            "does not apply to framework.name=moco: its K is the queue",
        ),
        (
            {"framework.name": "simo", "loss.name": "eqco", "loss.num_negatives": 16},
            "set framework.num_negatives",
        ),
        ({"framework.name": "moco", "framework.num_negatives": 16}, "framework.num_negatives sets K for simo"),
        ({"framework.num_negatives": 16}, "does not apply to framework.name=simclr: .*sets K for simo"),
        ({"framework.name": "simo", "framework.num_negatives": 32}, "exceeds the N-1=31"),
        ({"framework.name": "nnclr", "loss.name": "eqco", "loss.num_negatives": 32}, "exceeds the N-1=31"),
        ({"loss.name": "eqco", "loss.num_negatives": 63}, "exceeds the 2N-2=62"),
        ({"loss.name": "dcl", "loss.num_negatives": 8, "framework.name": "moco"}, "only defined for loss.name=eqco"),
        # EqCo's alpha is meaningless once the positive leaves the denominator (and ignored by the others).
        ({"loss.name": "dcl", "loss.alpha": 256.0}, "no effect with loss.name=dcl"),
        ({"framework.name": "moco", "loss.name": "dclw", "loss.alpha": 256.0}, "no effect with loss.name=dclw"),
        ({"framework.name": "simo", "loss.name": "infonce", "loss.alpha": 256.0}, "use loss.name=eqco"),
    ],
)
def test_bad_values_and_pairs_raise_one_line(overrides, match):
    with pytest.raises(ConfigError, match=match) as err:
        cfg(**overrides)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("framework", ["moco", "simo", "nnclr"])
@pytest.mark.parametrize("loss", ["infonce", "dcl", "dclw", "dclw_exp", "eqco"])
def test_every_pair_loss_combines_with_every_framework(framework, loss):
    cfg(**{"framework.name": framework, "loss.name": loss})


def test_momentum_zero_is_allowed():
    assert cfg(**{"framework.name": "moco", "framework.momentum": 0.0}).framework.momentum == 0.0


@pytest.mark.parametrize(
    ("overrides", "k"),
    [
        ({}, 62),  # SimCLR: 2N - 2
        ({"loss.name": "eqco", "loss.num_negatives": 10}, 10),
        ({"framework.name": "moco", "framework.queue_size": 1000}, 1000),
        ({"framework.name": "simo"}, 31),  # N - 1 other images' keys
        ({"framework.name": "simo", "framework.num_negatives": 16}, 16),
        ({"framework.name": "nnclr"}, 31),  # NNCLR contrasts against the other view only
        ({"framework.name": "nnclr", "loss.name": "eqco", "loss.num_negatives": 8}, 8),
    ],
)
def test_derived_k_per_framework_and_eqco_alpha_defaults_to_it(overrides, k):
    derived = derive(cfg(**{"loss.name": "eqco", **overrides}))
    assert derived.num_negatives == k
    assert derived.eqco_alpha == float(k)  # α = None means α = K: zero margin
    assert derive(cfg(**{"loss.name": "eqco", "loss.alpha": 256.0, **overrides})).eqco_alpha == 256.0


def test_the_config_declares_each_framework_s_negatives():
    # The config derives and checks K from its own table (torch-free); the registry holds the same frameworks.
    assert tuple(NEGATIVES) == tuple(FRAMEWORKS) == FRAMEWORK_NAMES
    assert {n.k_key for n in NEGATIVES.values()} <= set(CONFIG_KEYS)
    # for N = 8 images and a queue of Q = 16 keys: 2N-2, Q, N-1, N-1
    assert [n.offered(8, 16) for n in NEGATIVES.values()] == [14, 16, 7, 7]


def test_derived_k_follows_the_per_rank_batch_without_gathering():
    c = cfg(**{"framework.name": "simo", "loss.gather_distributed": False})
    assert derive(c, world_size=2).num_negatives == 15  # 16 per rank
    assert derive(cfg(**{"framework.name": "moco"}), world_size=4).num_negatives == 4096
    big_k = cfg(**{"framework.name": "simo", "framework.num_negatives": 20, "loss.gather_distributed": False})
    assert derive(big_k).num_negatives == 20
    with pytest.raises(ConfigError, match="fewer than K=20"):
        derive(big_k, world_size=2)


def test_builders_pass_explicit_values():
    model = TinyEncoder(proj_dim=16)
    base = {"model.proj_dim": 16, "framework.momentum": 0.9, "framework.queue_size": 100}
    assert isinstance(build_framework(cfg(**base), model, SpyLoss()), SimCLR)

    moco = build_framework(cfg(**base, **{"framework.name": "moco"}), model, SpyLoss())
    assert isinstance(moco, MoCo) and moco.queue.shape == (100, 16) and moco.momentum == 0.9 and moco.symmetric

    c = cfg(**base, **{"framework.name": "simo", "framework.num_negatives": 7, "loss.name": "eqco"})
    simo = build_framework(c, model, build_loss(c, derive(c)))
    assert isinstance(simo, SiMo) and simo.num_negatives == 7 and simo.momentum == 0.9
    assert isinstance(simo.loss, EqCoLoss) and simo.loss.num_negatives == 0 and simo.loss.alpha == 7.0

    nnclr = build_framework(cfg(**base, **{"framework.name": "nnclr"}), model, SpyLoss())
    assert isinstance(nnclr, NNCLR) and nnclr.support.shape == (100, 16)


def test_cli_spelling_from_the_issue():
    c = apply_overrides(preset("smoke"), {"framework.name": "moco", "loss.name": "dcl"})
    assert derive(c).num_negatives == 4096


def test_framework_state_round_trip_excludes_the_model():
    torch.manual_seed(0)
    assert framework_state(SimCLR(TinyEncoder(), SpyLoss())) == {}
    a = MoCo(TinyEncoder(), SpyLoss(), dim=8, queue_size=12)
    a.train()
    a(*make_views(4))
    a.after_step()
    state = framework_state(a)
    assert not any(k.startswith("model.") for k in state) and {"queue", "queue_ptr"} <= set(state)
    b = MoCo(TinyEncoder(), SpyLoss(), dim=8, queue_size=12)
    load_framework_state(b, state)
    for key, value in framework_state(b).items():
        assert torch.equal(value, state[key]), key
    with pytest.raises(ValueError, match="missing"):
        load_framework_state(b, {})  # a checkpoint without the queue cannot resume exactly
    with pytest.raises(ValueError, match="unexpected"):
        load_framework_state(SimCLR(TinyEncoder(), SpyLoss()), state)
    assert math.isfinite(b(*make_views(4)).loss.item())
