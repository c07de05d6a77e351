"""NNCLR: nearest-neighbour lookup, the similarities it builds, support-set FIFO updates, training."""

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

from dcl_core.config import apply_overrides, preset
from dcl_core.frameworks import FRAMEWORKS, NNCLR
from dcl_core.frameworks.nnclr import nearest_neighbours
from dcl_core.losses import InfoNCELoss
from dcl_core.training import train
from dcl_core.training.checkpoint import load_checkpoint

needs_cifar = pytest.mark.skipif(not cifar_available(), reason="embedded CIFAR-10 not present")


def test_registered():
    assert FRAMEWORKS["nnclr"] is NNCLR


def test_nearest_neighbours_match_brute_force():
    g = torch.Generator().manual_seed(0)
    z = F.normalize(torch.randn(20, 6, generator=g), dim=1)
    support = F.normalize(torch.randn(50, 6, generator=g), dim=1)
    got = nearest_neighbours(z, support)
    for i in range(20):
        cos = [float(F.cosine_similarity(z[i], s, dim=0)) for s in support]
        best = max(range(50), key=cos.__getitem__)
        assert torch.equal(got[i], support[best])
    assert not got.requires_grad
    # A support row equal to the query is its own nearest neighbour.
    torch.testing.assert_close(nearest_neighbours(support[7:9], support), support[7:9])


@torch.no_grad()
def _loop_reference(model, support, v1, v2, symmetric) -> tuple[torch.Tensor, torch.Tensor]:
    """NNCLR Eq. 2 image by image: pos = <NN(z1_i), z2_i>, neg = [<NN(z1_i), z2_j> for j != i] (+ swapped)."""
    z1 = [F.normalize(model(v1[i : i + 1])[1][0], dim=0) for i in range(v1.shape[0])]
    z2 = [F.normalize(model(v2[i : i + 1])[1][0], dim=0) for i in range(v2.shape[0])]

    def nn(z):
        return support[max(range(support.shape[0]), key=lambda j: float(z @ support[j]))]

    pos, neg = [], []
    for za, zb in [(z1, z2), (z2, z1)] if symmetric else [(z1, z2)]:
        for i in range(len(za)):
            anchor = nn(za[i])
            pos.append(float(anchor @ zb[i]))
            neg.append([float(anchor @ zb[j]) for j in range(len(zb)) if j != i])
    return torch.tensor(pos), torch.tensor(neg)


@pytest.mark.parametrize("symmetric", [True, False])
def test_similarities_match_a_loop_reference(symmetric):
    torch.manual_seed(0)
    model = TinyEncoder(bn=False)
    fw = NNCLR(model, SpyLoss(), dim=8, queue_size=32, symmetric=symmetric)
    v1, v2 = make_views(6)
    fw(v1, v2)
    sims = fw.loss.sims
    pos, neg = _loop_reference(model, fw.support, v1, v2, symmetric)
    assert sims.neg.shape == ((12 if symmetric else 6), 5)
    torch.testing.assert_close(sims.pos, pos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sims.neg, neg, rtol=0, atol=1e-6)


def test_infonce_is_nnclr_eq2_as_cross_entropy():
    # NNCLR's loss is cross-entropy over logits NN(z1) z2^T / τ with the diagonal as target (+ swapped).
    torch.manual_seed(0)
    model = TinyEncoder(bn=False)
    fw = NNCLR(model, InfoNCELoss(temperature=0.1), dim=8, queue_size=32)
    v1, v2 = make_views(6)
    loss = fw(v1, v2).loss
    with torch.no_grad():
        z1, z2 = F.normalize(model(v1)[1], dim=1), F.normalize(model(v2)[1], dim=1)
        logits12 = nearest_neighbours(z1, fw.support) @ z2.T / 0.1  # (n, n)
        logits21 = nearest_neighbours(z2, fw.support) @ z1.T / 0.1  # (n, n)
        target = torch.arange(6)
        ref = (F.cross_entropy(logits12, target) + F.cross_entropy(logits21, target)) / 2
    torch.testing.assert_close(loss.detach(), ref)


def test_support_set_fifo_update_with_view1_projections():
    torch.manual_seed(0)
    model = TinyEncoder()
    fw = NNCLR(model, make_loss("dcl"), dim=8, queue_size=10)
    fw.train()
    initial = fw.support.clone()
    batches = [make_views(4, seed=s) for s in range(3)]
    expected = []
    for v1, v2 in batches:
        out = fw(v1, v2)
        with torch.no_grad():
            expected.append(F.normalize(model(torch.cat([v1, v2]))[1][:4], dim=1))  # (4, 8) view-1 half
        out.loss.backward()  # the support set and NN(.) carry no gradient
        assert not fw.support.requires_grad
        fw.after_step()
    # 12 projections into 10 rows: batch 3 wraps around; rows 2-3 keep batch 1's last two (now the oldest).
    assert int(fw.support_ptr) == 12 % 10
    torch.testing.assert_close(fw.support[0:2], expected[2][2:4])
    torch.testing.assert_close(fw.support[2:4], expected[0][2:4])  # the oldest surviving entries
    torch.testing.assert_close(fw.support[4:8], expected[1])
    torch.testing.assert_close(fw.support[8:10], expected[2][0:2])
    assert not torch.equal(fw.support, initial)
    fw.eval()
    fw(*batches[0])
    fw.after_step()  # evaluation forwards do not feed the support set
    assert int(fw.support_ptr) == 2


@needs_cifar
@pytest.mark.parametrize("name", PAIR_LOSSES)
def test_trains_with_every_pair_loss(name):
    pool = cifar_pool()
    torch.manual_seed(0)
    model = TinyEncoder(in_dim=pool[0].numel(), feat_dim=64, proj_dim=32)
    fw = NNCLR(model, make_loss(name), dim=32, queue_size=64)
    losses = train_losses(fw, model, pool, steps=30)
    early, late = sum(losses[3:8]) / 5, sum(losses[-5:]) / 5  # support set full of real projections from step 3
    assert late < early, (name, losses)


@needs_cifar
def test_trainer_run_with_dcl(tmp_path):
    overrides = {"framework.name": "nnclr", "framework.queue_size": 64, "loss.name": "dcl", "optim.epochs": 1}
    result = train(apply_overrides(preset("smoke"), smoke_overrides(tmp_path, **overrides)))
    assert math.isfinite(result.final["train/loss"])
    state = load_checkpoint(result.output_dir / "checkpoint.pt")["framework"]
    assert set(state) == {"support", "support_ptr"} and int(state["support_ptr"]) == (5 * 32) % 64
