"""SiMo (EqCo Sec. 3): in-batch momentum keys, K-sampling, EqCo/InfoNCE equivalence, momentum, training."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from framework_helpers import (
    PAIR_LOSSES,
    SpyLoss,
    TinyEncoder,
    cifar_available,
    cifar_pool,
    make_loss,
    make_views,
    smoke_overrides,
    train_losses,
)

from dcl_core.config import apply_overrides, derive, preset
from dcl_core.frameworks import FRAMEWORKS, SiMo
from dcl_core.losses import EqCoLoss, InfoNCELoss
from dcl_core.training import train
from dcl_core.training.checkpoint import load_checkpoint

needs_cifar = pytest.mark.skipif(not cifar_available(), reason="embedded CIFAR-10 not present")


def test_registered_and_stateless_apart_from_the_key_encoder():
    fw = SiMo(TinyEncoder(), SpyLoss())
    assert FRAMEWORKS["simo"] is SiMo
    own = {k for k in fw.state_dict() if not k.startswith("model.")}
    assert own and all(k.startswith("key_encoder.") for k in own)  # no queue


@torch.no_grad()
def _loop_reference(model, key_encoder, queries) -> tuple[torch.Tensor, torch.Tensor]:
    """Image by image: pos = <q_i, k_i>, neg = [<q_i, k_j> for j != i], keys from the other view."""
    pos, neg = [], []
    for qv, kv in queries:
        n = qv.shape[0]
        q = [F.normalize(model(qv[i : i + 1])[1][0], dim=0) for i in range(n)]
        k = [F.normalize(key_encoder(kv[j : j + 1])[1][0], dim=0) for j in range(n)]
        for i in range(n):
            pos.append(float(q[i] @ k[i]))
            neg.append([float(q[i] @ k[j]) for j in range(n) if j != i])
    return torch.tensor(pos), torch.tensor(neg)


@pytest.mark.parametrize("symmetric", [True, False])
def test_similarities_match_a_loop_reference(symmetric):
    torch.manual_seed(0)
    model = TinyEncoder(bn=False)
    fw = SiMo(model, SpyLoss(), momentum=0.9, symmetric=symmetric)
    # Move the key encoder away from θq so a swapped query/key encoder would show.
    with torch.no_grad():
        for p in fw.key_encoder.parameters():
            p.add_(0.1 * torch.randn_like(p))
    v1, v2 = make_views(5)
    fw(v1, v2)
    sims = fw.loss.sims
    pos, neg = _loop_reference(model, fw.key_encoder, [(v1, v2), (v2, v1)] if symmetric else [(v1, v2)])
    assert sims.neg.shape == ((10 if symmetric else 5), 4)  # N - 1 = 4 other images per query
    torch.testing.assert_close(sims.pos, pos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sims.neg, neg, rtol=0, atol=1e-6)


def test_k_sampling_draws_k_distinct_other_keys_per_query():
    torch.manual_seed(0)
    model = TinyEncoder(bn=False)
    full, sampled = SpyLoss(), SpyLoss()
    views = make_views(9)
    SiMo(model, full)(*views)
    SiMo(model, sampled, num_negatives=3)(*views)
    assert sampled.sims.neg.shape == (18, 3)
    torch.testing.assert_close(sampled.sims.pos, full.sims.pos)
    for row_k, row_all in zip(sampled.sims.neg, full.sims.neg, strict=True):
        # Every sampled column is one of that query's 8 negatives, and no column is drawn twice.
        match = (row_k[:, None] - row_all[None, :]).abs() < 1e-7  # (3, 8)
        assert match.any(dim=1).all() and match.float().argmax(dim=1).unique().numel() == 3
    with pytest.raises(ValueError, match="exceeds"):
        SiMo(model, SpyLoss(), num_negatives=9)(*views)


def test_eqco_with_alpha_equal_k_is_infonce_on_the_same_similarities():
    torch.manual_seed(0)
    spy = SpyLoss(temperature=0.2)
    fw = SiMo(TinyEncoder(), spy)
    fw.eval()
    views = make_views(8)
    infonce = fw(*views).loss
    k = spy.sims.neg.shape[1]
    assert k == 7
    fw.loss = EqCoLoss(temperature=0.2, alpha=float(k))
    torch.testing.assert_close(fw(*views).loss, infonce)
    fw.loss = EqCoLoss(temperature=0.2, alpha=None)  # α = None means α = K
    torch.testing.assert_close(fw(*views).loss, infonce)
    # α ≠ K: the margin τ·log(α/K) shifts the negatives, exactly EqCo Eq. 12 on SiMo's similarities.
    fw.loss = EqCoLoss(temperature=0.2, alpha=256.0)
    shifted = spy.sims.neg + 0.2 * torch.log(torch.tensor(256.0 / k))
    ref = InfoNCELoss(temperature=0.2).from_similarities(type(spy.sims)(spy.sims.pos, shifted, spy.sims.pos_batch))
    torch.testing.assert_close(fw(*views).loss, ref.loss)


def test_momentum_update_and_gradients():
    torch.manual_seed(0)
    model = TinyEncoder()
    fw = SiMo(model, make_loss("dcl"), momentum=0.9)
    theta_k0 = [p.detach().clone() for p in fw.key_encoder.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    fw(*make_views(6)).loss.backward()
    assert all(p.grad is None for p in fw.key_encoder.parameters())
    opt.step()
    fw.after_step()
    for pk, k0, q1 in zip(fw.key_encoder.parameters(), theta_k0, model.parameters(), strict=True):
        torch.testing.assert_close(pk, 0.9 * k0 + 0.1 * q1.detach(), rtol=1e-6, atol=1e-6)


@needs_cifar
@pytest.mark.parametrize("name", PAIR_LOSSES)
def test_trains_with_every_pair_loss(name):
    pool = cifar_pool()
    torch.manual_seed(0)
    model = TinyEncoder(in_dim=pool[0].numel(), feat_dim=64, proj_dim=32)
    fw = SiMo(model, make_loss(name), momentum=0.9, num_negatives=16)  # K = 16 of the 31 other images (EqCo Table 2)
    losses = train_losses(fw, model, pool, steps=30)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5, (name, losses)


@needs_cifar
def test_trainer_run_with_eqco(tmp_path):
    overrides = {"framework.name": "simo", "framework.num_negatives": 8, "loss.name": "eqco", "loss.alpha": 256.0}
    cfg = apply_overrides(preset("smoke"), smoke_overrides(tmp_path, **overrides, **{"optim.epochs": 1}))
    assert derive(cfg).num_negatives == 8
    result = train(cfg)
    assert math.isfinite(result.final["train/loss"]) and math.isfinite(result.final["train/mi_bound"])
    state = load_checkpoint(result.output_dir / "checkpoint.pt")["framework"]
    assert state and all(k.startswith("key_encoder.") for k in state)
