"""gather_distributed=True under a real 2-process gloo group equals the single-process full-batch loss.

One spawn runs every loss: each rank holds half of a fixed batch, computes each loss with and without the
gather, backpropagates, and saves (loss, diagnostics, local gradients) to a file the test then compares
with the single-process losses on the full batch.
"""

from __future__ import annotations

import errno
import math
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.multiprocessing as mp

import dcl_core.distributed as distributed_module
import dcl_core.losses.align_uniform as align_module
import dcl_core.losses.base as base_module
from dcl_core.losses import LOSSES

WORLD = 2
N, D = 8, 16  # full batch; each rank holds N / WORLD = 4 pairs
TIMEOUT_S = 120.0

# name -> (loss class key, constructor kwargs). EqCo without subsampling (num_negatives=0).
CONFIGS: dict[str, tuple[str, dict]] = {
    "infonce": ("infonce", {"temperature": 0.2}),
    "dcl": ("dcl", {"temperature": 0.2}),
    "dclw": ("dclw", {"temperature": 0.2, "sigma": 0.5}),
    "dclw_exp": ("dclw_exp", {"temperature": 0.2, "sigma": 0.5, "delta": 3.0}),
    "eqco": ("eqco", {"temperature": 0.2}),
    "eqco_alpha": ("eqco", {"temperature": 0.2, "alpha": 5.0}),
    "align_uniform": ("align_uniform", {"temperature": 0.2}),
}


def fixed_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2024)
    return torch.randn(N, D, generator=g), torch.randn(N, D, generator=g)


def run_loss(name: str, z1: torch.Tensor, z2: torch.Tensor, gather: bool):
    key, kwargs = CONFIGS[name]
    a = z1.detach().clone().requires_grad_(True)
    b = z2.detach().clone().requires_grad_(True)
    out = LOSSES[key](gather_distributed=gather, **kwargs)(a, b)
    out.loss.backward()
    diagnostics = {k: v.item() for k, v in out.diagnostics.items()}
    return out.loss.item(), diagnostics, a.grad.clone(), b.grad.clone()


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo", init_method="env://", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60)
    )
    try:
        z1, z2 = fixed_batch()
        n = N // WORLD
        local = slice(rank * n, (rank + 1) * n)
        results = {}
        for name in CONFIGS:
            for gather in (True, False):
                results[name, gather] = run_loss(name, z1[local], z2[local], gather)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_workers(out_dir: Path) -> None:
    """Start the 2 ranks, wait with a deadline; retry with a new port if the chosen one got taken."""
    for attempt in range(3):
        ctx = mp.spawn(_worker, args=(free_port(), str(out_dir)), nprocs=WORLD, join=False)
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    pytest.fail(f"distributed workers did not finish within {TIMEOUT_S} s")
            return
        except mp.ProcessRaisedException as exc:
            message = str(exc).lower()
            port_taken = "address already in use" in message or f"errno {errno.EADDRINUSE}" in message
            if not port_taken or attempt == 2:
                raise
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
                    p.join(5)


# Under pytest-xdist, one worker runs the module fixture rank_results once.
# slow: the module fixture runs 2 gloo processes (~13 s)
pytestmark = [pytest.mark.xdist_group("distributed"), pytest.mark.slow]


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out_dir = tmp_path_factory.mktemp("ddp")
    spawn_workers(out_dir)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gathered_loss_equals_full_batch(rank_results, name):
    z1, z2 = fixed_batch()
    full_loss, full_diag, _, _ = run_loss(name, z1, z2, gather=False)  # one process, all N pairs
    per_rank = [rank_results[r][name, True] for r in range(WORLD)]
    # Anchors are split over the ranks (equal counts), so the mean of the per-rank losses is the full loss
    # (for DCLW only if E_i[·] is over the global batch; align_uniform computes the whole loss on every rank).
    assert sum(loss for loss, *_ in per_rank) / WORLD == pytest.approx(full_loss, rel=1e-5, abs=1e-5)
    for key in ("q_mean", "pos_sim", "neg_sim", "mi_bound", "align", "uniform"):
        if key in full_diag:
            mean = sum(diag[key] for _, diag, *_ in per_rank) / WORLD
            assert mean == pytest.approx(full_diag[key], rel=1e-5, abs=1e-5), key


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gathered_gradients_equal_full_batch(rank_results, name):
    """Rank r's local z receives ∂(Σ_s L_s)/∂z_r: all_gather's backward sums (reduce-scatters) over ranks the
    gradient that every rank's loss sends to rank r's slice. Σ_s L_s = WORLD × L_full, so the local gradient
    is WORLD × the full-batch gradient of that slice; DDP then averages parameter gradients over the ranks
    (÷ WORLD), which gives exactly the single-process full-batch gradient."""
    z1, z2 = fixed_batch()
    _, _, full_g1, full_g2 = run_loss(name, z1, z2, gather=False)
    n = N // WORLD
    for r in range(WORLD):
        _, _, g1, g2 = rank_results[r][name, True]
        rows = slice(r * n, (r + 1) * n)
        torch.testing.assert_close(g1, WORLD * full_g1[rows], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(g2, WORLD * full_g2[rows], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_without_gather_each_rank_sees_only_its_local_batch(rank_results, name):
    z1, z2 = fixed_batch()
    full_loss = run_loss(name, z1, z2, gather=False)[0]
    n = N // WORLD
    local_losses = []
    for r in range(WORLD):
        rows = slice(r * n, (r + 1) * n)
        expected, _, e1, e2 = run_loss(name, z1[rows], z2[rows], gather=False)
        loss, _, g1, g2 = rank_results[r][name, False]
        assert loss == pytest.approx(expected, rel=1e-6, abs=1e-6)
        torch.testing.assert_close(g1, e1, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g2, e2, rtol=1e-5, atol=1e-6)
        local_losses.append(loss)
    # ... which is a different objective: the gather matters.
    assert sum(local_losses) / WORLD != pytest.approx(full_loss, rel=1e-3, abs=1e-3)


def test_mi_bound_counts_global_negatives(rank_results):
    """Under the gather every anchor has K = 2·N_global − 2 negatives, so mi_bound = log(1 + K) − L_rank."""
    for r in range(WORLD):
        loss, diag, *_ = rank_results[r]["infonce", True]
        assert diag["mi_bound"] == pytest.approx(math.log(2 * N - 1) - loss, abs=1e-5)
        loss, diag, *_ = rank_results[r]["infonce", False]
        assert diag["mi_bound"] == pytest.approx(math.log(2 * (N // WORLD) - 1) - loss, abs=1e-5)


# --- single process
_CONTIGUOUS: list[bool] = []  # layout of every gradient seen by _RecordingAllGather.backward


class _RecordingAllGather(torch.autograd.Function):
    """Stand-in for a 2-rank all_gather on rank 0 that records the layout of the incoming gradients."""

    @staticmethod
    def forward(ctx, x, other):
        return x.clone(), other.clone()

    @staticmethod
    def backward(ctx, g_self, g_other):
        _CONTIGUOUS.extend([g_self.is_contiguous(), g_other.is_contiguous()])
        return g_self, None


@pytest.mark.parametrize("name", ["infonce", "dcl", "dclw", "dclw_exp", "eqco", "align_uniform"])
def test_gradients_entering_all_gather_are_contiguous(monkeypatch, name):
    """torch.distributed.nn.functional.all_gather's gloo backward receives each rank's gradient into
    ``torch.empty_like(grad_output)``, which keeps a transposed stride layout, and gloo writes the bytes in
    contiguous order: a non-contiguous gradient comes back scrambled. So the gradient that the loss sends to
    the gathered keys must be contiguous (this is the single-process root cause of the 2-process failure)."""
    g = torch.Generator().manual_seed(0)
    fake = lambda x: _RecordingAllGather.apply(x, torch.randn(x.shape, generator=g))  # noqa: E731
    monkeypatch.setattr(dist_fn, "all_gather", fake)
    # A 2-rank world wherever the losses ask for it: the gather itself, SimCLR's construction, align_uniform.
    for module in (distributed_module, base_module, align_module):
        monkeypatch.setattr(module, "distributed_world", lambda: (0, 2))
    _CONTIGUOUS.clear()
    key, kwargs = CONFIGS[name]
    z1, z2 = fixed_batch()
    a, b = z1[:4].clone().requires_grad_(True), z2[:4].clone().requires_grad_(True)
    LOSSES[key](gather_distributed=True, **kwargs)(a, b).loss.backward()
    assert _CONTIGUOUS, "the loss did not go through all_gather"
    assert all(_CONTIGUOUS), "a non-contiguous gradient reaches all_gather's backward"
