"""MoCo-v2: FIFO queue, momentum update, similarities against references, loss identities, training, resume."""

from __future__ import annotations

import collections
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
    train_losses,
)

from dcl_core.config import apply_overrides, preset
from dcl_core.frameworks import FRAMEWORKS, MoCo
from dcl_core.frameworks.common import enqueue, momentum_update
from dcl_core.losses import DCLLoss, InfoNCELoss, PairSimilarities, two_view_similarities
from dcl_core.training import train
from dcl_core.training.checkpoint import load_checkpoint

needs_cifar = pytest.mark.skipif(not cifar_available(), reason="embedded CIFAR-10 not present")


def test_registered():
    assert FRAMEWORKS["moco"] is MoCo


# ---------------------------------------------------------------------------------------------- queue


def test_enqueue_fifo_wraps_around_by_hand():
    queue = torch.zeros(5, 1)
    ptr = torch.zeros((), dtype=torch.long)
    enqueue(queue, ptr, torch.tensor([[1.0], [2.0], [3.0]]))
    assert queue.squeeze(1).tolist() == [1, 2, 3, 0, 0] and int(ptr) == 3
    enqueue(queue, ptr, torch.tensor([[4.0], [5.0], [6.0]]))  # wraps: rows 3, 4, 0
    assert queue.squeeze(1).tolist() == [6, 2, 3, 4, 5] and int(ptr) == 1  # row 1 (value 2) is now oldest
    enqueue(queue, ptr, torch.arange(7.0, 14.0)[:, None])  # more than K at once: the newest K survive
    assert int(ptr) == (1 + 7) % 5
    assert queue.roll(-int(ptr), dims=0).squeeze(1).tolist() == [9, 10, 11, 12, 13]


def test_enqueue_matches_a_deque_for_any_batch_sequence():
    g = torch.Generator().manual_seed(0)
    size = 7
    queue = torch.full((size, 2), float("nan"))
    ptr = torch.zeros((), dtype=torch.long)
    ref: collections.deque = collections.deque(maxlen=size)
    counter = 0
    for _ in range(30):
        n = int(torch.randint(1, 11, (), generator=g))
        keys = torch.arange(counter, counter + n, dtype=torch.float32)[:, None].repeat(1, 2)  # (n, 2)
        counter += n
        enqueue(queue, ptr, keys)
        ref.extend(keys[:, 0].tolist())
        assert int(ptr) == counter % size
        if counter >= size:  # oldest entry at ptr, newest just before it
            assert queue.roll(-int(ptr), dims=0)[:, 0].tolist() == list(ref)


def test_queue_is_random_unit_vectors_and_a_checkpointed_buffer():
    torch.manual_seed(0)
    fw = MoCo(TinyEncoder(), SpyLoss(), dim=8, queue_size=12)
    assert fw.queue.shape == (12, 8)
    torch.testing.assert_close(fw.queue.norm(dim=1), torch.ones(12))
    state = fw.state_dict()
    assert {"queue", "queue_ptr"} <= set(state) and any(k.startswith("key_encoder.") for k in state)
    assert all(not p.requires_grad for p in fw.key_encoder.parameters())


@pytest.mark.parametrize("symmetric", [True, False])
def test_enqueued_keys_are_the_key_encoders_normalized_view2_outputs(symmetric):
    torch.manual_seed(0)
    model = TinyEncoder()
    fw = MoCo(model, SpyLoss(), dim=8, queue_size=10, momentum=0.5, symmetric=symmetric)
    fw.train()
    v1, v2 = make_views(4)
    out = fw(v1, v2)
    with torch.no_grad():  # same weights, same batch, train-mode BN: the same queries and keys again
        if symmetric:
            queries = model(torch.cat([v1, v2]))[1][:4]  # (4, 8): the view-1 half
            expected = fw.key_encoder(torch.cat([v1, v2]))[1][4:]  # (4, 8): the view-2 half
        else:
            queries = model(v1)[1]  # (4, 8)
            expected = fw.key_encoder(v2)[1]  # (4, 8)
        queries, expected = F.normalize(queries, dim=1), F.normalize(expected, dim=1)
    # The view-1 anchors (first rows) had these keys as positives.
    torch.testing.assert_close(fw.loss.sims.pos[:4], (queries * expected).sum(dim=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    out.loss.backward()
    opt.step()
    fw.after_step()  # momentum-updates the key encoder first; enqueues the keys computed before that
    torch.testing.assert_close(fw.queue[:4], expected)
    assert int(fw.queue_ptr) == 4
    torch.testing.assert_close(fw.queue[4:].norm(dim=1), torch.ones(6))  # the rest: still the random init


# ---------------------------------------------------------------------------------------------- momentum


def _sgd_step(fw: MoCo, model: torch.nn.Module, lr: float = 0.5) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    out = fw(*make_views(6, seed=1))
    opt.zero_grad()
    out.loss.backward()
    opt.step()


def test_momentum_update_hand_computed_beta_0_9():
    torch.manual_seed(0)
    model = TinyEncoder()
    fw = MoCo(model, SpyLoss(), dim=8, queue_size=16, momentum=0.9)
    theta_k0 = [p.detach().clone() for p in fw.key_encoder.parameters()]
    for p, q in zip(theta_k0, model.parameters(), strict=True):
        assert torch.equal(p, q)  # θk = θq at initialisation
    _sgd_step(fw, model)
    theta_q1 = [p.detach().clone() for p in model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(theta_k0, theta_q1, strict=True))
    fw.after_step()
    for pk, k0, q1 in zip(fw.key_encoder.parameters(), theta_k0, theta_q1, strict=True):
        torch.testing.assert_close(pk, 0.9 * k0 + 0.1 * q1, rtol=1e-6, atol=1e-6)
    assert all(p.grad is None for p in fw.key_encoder.parameters())  # keys carry no gradient


def test_momentum_zero_copies_the_query_encoder_exactly():
    torch.manual_seed(0)
    model = TinyEncoder()
    fw = MoCo(model, SpyLoss(), dim=8, queue_size=16, momentum=0.0)
    for _ in range(2):
        _sgd_step(fw, model)
        fw.after_step()
        for pk, pq in zip(fw.key_encoder.parameters(), model.parameters(), strict=True):
            assert torch.equal(pk, pq)


def test_momentum_update_checks_the_architectures_match():
    with pytest.raises(ValueError, match="parameters"):
        momentum_update(torch.nn.Linear(2, 2), torch.nn.Sequential(), 0.9)


# ---------------------------------------------------------------------------------------------- similarities


@torch.no_grad()
def _loop_reference(model, fw, queries) -> tuple[torch.Tensor, torch.Tensor]:
    """MoCo Eq. 1 image by image: <q, k+> and <q, queue_j> for every (query view, key view) pair."""
    pos, neg = [], []
    for qv, kv in queries:
        for i in range(qv.shape[0]):
            q = F.normalize(model(qv[i : i + 1])[1][0], dim=0)
            k = F.normalize(fw.key_encoder(kv[i : i + 1])[1][0], dim=0)
            pos.append(float(q @ k))
            neg.append([float(q @ key) for key in fw.queue])
    return torch.tensor(pos), torch.tensor(neg)


@pytest.mark.parametrize("symmetric", [True, False])
def test_similarities_match_a_loop_reference(symmetric):
    torch.manual_seed(0)
    model = TinyEncoder(bn=False)  # per-sample outputs: the reference can run image by image
    fw = MoCo(model, SpyLoss(), dim=8, queue_size=6, momentum=0.99, symmetric=symmetric)
    v1, v2 = make_views(3)
    fw(v1, v2)
    sims = fw.loss.sims
    pos, neg = _loop_reference(model, fw, [(v1, v2), (v2, v1)] if symmetric else [(v1, v2)])
    torch.testing.assert_close(sims.pos, pos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sims.neg, neg, rtol=0, atol=1e-6)
    assert sims.pos_batch.shape == sims.pos.shape and not sims.pos_batch.requires_grad


def test_gradient_flows_to_queries_only():
    torch.manual_seed(0)
    model = TinyEncoder()
    fw = MoCo(model, DCLLoss(temperature=0.2), dim=8, queue_size=16)
    fw(*make_views(5)).loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert all(p.grad is None for p in fw.key_encoder.parameters())
    assert not fw.queue.requires_grad


def _batch_queue_moco(loss):
    """β = 0 (key encoder = query encoder), asymmetric, and a queue holding exactly this batch's view-2 keys."""
    torch.manual_seed(0)
    model = TinyEncoder(bn=False)
    n = 5
    fw = MoCo(model, loss, dim=8, queue_size=n, momentum=0.0, symmetric=False)
    v1, v2 = make_views(n)
    with torch.no_grad():
        fw.queue.copy_(F.normalize(model(v2)[1], dim=1))  # (n, 8): row i is image i's positive key
    return fw, model, v1, v2, n


def test_batch_queue_gives_simclr_form_similarities():
    fw, model, v1, v2, n = _batch_queue_moco(SpyLoss())
    fw(v1, v2)
    sims = fw.loss.sims
    off_diag = ~torch.eye(n, dtype=torch.bool)
    # SimCLR's negatives copied to (2n, 2n − 2), column order kept: rows 0..n-1 are the view-1 anchors.
    ref = two_view_similarities(model(v1)[1], model(v2)[1]).compact()
    torch.testing.assert_close(sims.pos, ref.pos[:n])
    torch.testing.assert_close(sims.neg.diagonal(), sims.pos)  # the queue holds each anchor's own positive
    # The other images' view-2 keys are exactly SimCLR's cross-view negatives (its last n-1 columns).
    torch.testing.assert_close(sims.neg[off_diag].view(n, n - 1), ref.neg[:n, n - 1 :])


def test_moco_dcl_with_the_positive_queued_is_infonce_over_the_other_keys():
    # DCL drops the positive from the denominator; the queue puts it back as a "negative": what is left is
    # InfoNCE whose negatives are the other images' keys (one-sided SimCLR with view-2 negatives only).
    fw, model, v1, v2, n = _batch_queue_moco(DCLLoss(temperature=0.3))
    dcl = fw(v1, v2).loss
    ref = two_view_similarities(model(v1)[1], model(v2)[1]).compact()  # (2n, 2n − 2) negatives, copied
    one_sided = PairSimilarities(pos=ref.pos[:n], neg=ref.neg[:n, n - 1 :], pos_batch=ref.pos_batch)
    torch.testing.assert_close(dcl, InfoNCELoss(temperature=0.3).from_similarities(one_sided).loss)


@pytest.mark.parametrize("name", PAIR_LOSSES)
def test_loss_is_the_named_loss_applied_to_the_frameworks_similarities(name):
    torch.manual_seed(0)
    spy = SpyLoss()
    fw = MoCo(TinyEncoder(), spy, dim=8, queue_size=16)
    fw.eval()
    views = make_views(6)
    fw(*views)
    fw.loss = make_loss(name)
    out = fw(*views)  # eval mode: same sims again
    torch.testing.assert_close(out.loss, make_loss(name).from_similarities(spy.sims).loss)


# ---------------------------------------------------------------------------------------------- training


@needs_cifar
@pytest.mark.parametrize("name", PAIR_LOSSES)
def test_trains_with_every_pair_loss(name):
    pool = cifar_pool()
    torch.manual_seed(0)
    model = TinyEncoder(in_dim=pool[0].numel(), feat_dim=64, proj_dim=32)
    fw = MoCo(model, make_loss(name), dim=32, queue_size=64, momentum=0.9)
    losses = train_losses(fw, model, pool, steps=30)
    # The queue holds real keys from step 3 on; compare the early loss with the end of training.
    early, late = sum(losses[3:8]) / 5, sum(losses[-5:]) / 5
    assert late < early, (name, losses)


@pytest.mark.slow  # trains the smoke preset 4 epochs in all (about a CPU-minute): the fast tier's costliest test
@needs_cifar
def test_cli_style_run_and_exact_resume(tmp_path):
    def cfg(sub, epochs=2):
        return apply_overrides(
            preset("smoke"),
            {
                "output_dir": str(tmp_path / sub),
                "threads": 2,
                "framework.name": "moco",
                "framework.queue_size": 48,  # not a multiple of the batch (32): the pointer wraps mid-batch
                "loss.name": "dcl",
                "optim.epochs": epochs,
            },
        )

    full = train(cfg("full"))
    assert math.isfinite(full.final["train/loss"]) and 0 <= full.final["eval/knn_top1"] <= 100

    def stop(epoch, metrics, checkpoint):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg("resumed"), callbacks=[stop])
    assert load_checkpoint(tmp_path / "resumed" / "checkpoint.pt")["epoch"] == 1
    resumed = train(cfg("resumed"), resume=True)
    assert resumed.history[-1]["train/loss"] == full.history[-1]["train/loss"]

    a = load_checkpoint(tmp_path / "full" / "checkpoint.pt")
    b = load_checkpoint(tmp_path / "resumed" / "checkpoint.pt")
    assert set(a["framework"]) == set(b["framework"]) and {"queue", "queue_ptr"} <= set(a["framework"])
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key in a["framework"]:
        assert torch.equal(a["framework"][key], b["framework"][key]), key
    assert int(a["framework"]["queue_ptr"]) == (2 * 5 * 32) % 48  # 2 epochs x 5 steps x 32 keys
