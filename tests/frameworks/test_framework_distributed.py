"""MoCo / SiMo / NNCLR under a real 2-process gloo group equal the single-process full-batch framework.

One spawn runs every (framework, loss): each rank holds half of a fixed batch, runs forward, backward and
``after_step`` and saves (loss, parameter gradients, framework state); the tests compare with one process on
the whole batch. The encoder has no BatchNorm, so splitting the batch changes nothing but the ranks.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from framework_helpers import TinyEncoder, make_loss, make_views

from dcl_core.frameworks import NNCLR, MoCo, SiMo
from dcl_core.training.checkpoint import framework_state

WORLD = 2
N = 8  # full batch; each rank holds 4 images
TIMEOUT_S = 120.0
CASES = [(fw, loss) for fw in ("moco", "simo", "nnclr") for loss in ("infonce", "dclw")]


def build(framework: str, loss: str):
    torch.manual_seed(0)  # same weights and initial queue on every rank
    model = TinyEncoder(bn=False)
    kwargs = {"momentum": 0.5} if framework != "nnclr" else {}
    if framework == "moco":
        return MoCo(model, make_loss(loss), dim=8, queue_size=12, **kwargs), model
    if framework == "simo":
        return SiMo(model, make_loss(loss), gather_distributed=True, **kwargs), model
    return NNCLR(model, make_loss(loss), dim=8, queue_size=12, gather_distributed=True), model


def run(framework: str, loss: str, rows: slice):
    fw, model = build(framework, loss)
    fw.train()
    v1, v2 = make_views(N, seed=3)
    out = fw(v1[rows], v2[rows])
    out.loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    fw.after_step()
    state = {k: v.clone() for k, v in framework_state(fw).items()}
    return out.loss.item(), grads, state


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        n = N // WORLD
        rows = slice(rank * n, (rank + 1) * n)
        torch.save({case: run(*case, rows) for case in CASES}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Under pytest-xdist, one worker runs the module fixture rank_results once.
# slow: the module fixture runs 2 gloo processes per framework (~70 s)
pytestmark = [pytest.mark.xdist_group("framework_distributed"), pytest.mark.slow]


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out_dir = tmp_path_factory.mktemp("ddp_frameworks")
    for attempt in range(3):  # retry with a new port if the chosen one got taken
        ctx = mp.spawn(_worker, args=(_free_port(), str(out_dir)), nprocs=WORLD, join=False)
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    pytest.fail(f"distributed workers did not finish within {TIMEOUT_S} s")
            break
        except mp.ProcessRaisedException as exc:
            message = str(exc).lower()
            if not ("address already in use" in message or f"errno {errno.EADDRINUSE}" in message) or attempt == 2:
                raise
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
                    p.join(5)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_two_ranks_equal_the_full_batch(rank_results, case):
    full_loss, full_grads, full_state = run(*case, slice(0, N))
    per_rank = [rank_results[r][case] for r in range(WORLD)]
    # Anchors split evenly: the mean of the rank losses is the full-batch loss (DCLW: E_i over the global batch).
    assert sum(loss for loss, _, _ in per_rank) / WORLD == pytest.approx(full_loss, rel=1e-5, abs=1e-6)
    # DDP averages parameter gradients over ranks; that average is the full-batch gradient.
    for i, g in enumerate(full_grads):
        mean = sum(grads[i] for _, grads, _ in per_rank) / WORLD
        torch.testing.assert_close(mean, g, rtol=1e-4, atol=1e-6)
    # Queues / support sets were fed the keys of all ranks in rank order: identical everywhere, and equal to the
    # single-process queue after the same global batch. Momentum encoders are identical too.
    for _, _, state in per_rank:
        assert set(state) == set(full_state)
        for key, value in full_state.items():
            torch.testing.assert_close(state[key], value, rtol=1e-5, atol=1e-6, msg=key)
