"""The ``ddp`` property: in 2 gloo processes, each holding half the batch, with ``gather_distributed``, the mean of
the ranks' losses is the one-process loss of the full batch, and each rank's gradient is 2× the full batch's on its
rows (DDP's averaging then gives the full-batch gradient)."""

from __future__ import annotations

import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dcl_core.losscheck.core import LossFactory, N, batch, loss_factory, relative, value_and_grads
from dcl_core.losscheck.properties import TOL_EXACT
from dcl_core.losscheck.rows import Check, measured, worst

WORLD = 2
DDP_TIMEOUT_S = 120.0
TOL_DDP = 10 * TOL_EXACT  # fp32 sums over a gathered batch, in another order


def _rows(rank: int) -> slice:
    return slice(rank * N // WORLD, (rank + 1) * N // WORLD)


def _ddp_rank(rank: int, name: str, params: str, out_dir: str) -> None:
    """One rank of :func:`check_ddp`: its half of the batch through the gathering loss, saved for the parent. The
    ranks meet through a file in the check's own folder, not a TCP port: a free port picked beforehand can be taken
    by another process (a test beside it, Ray, MLflow) before the store binds it."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{Path(out_dir) / 'rendezvous'}", rank=rank,
                            world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        z1, z2 = batch()
        out, g1, g2 = value_and_grads(loss_factory(name, params)(0.2, True), z1[_rows(rank)], z2[_rows(rank)])
        partial = Path(out_dir) / f"rank{rank}.partial"
        torch.save((out.loss.detach(), g1, g2), partial)
        partial.replace(Path(out_dir) / f"rank{rank}.pt")
        # Neither rank closes its connections before both saved: gloo's transport thread aborts a process whose
        # peer hung up while it still computed (std::terminate on "Connection closed by peer": SIGABRT).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _join(ctx: mp.ProcessContext) -> str:
    """Wait for both ranks (at most :data:`DDP_TIMEOUT_S`): ``""`` when both ended with status 0, else why not.
    Ranks still running at the end are terminated."""
    deadline = time.monotonic() + DDP_TIMEOUT_S
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                return f"no result within {DDP_TIMEOUT_S:g} s"
    except mp.ProcessRaisedException as err:
        last = [line for line in str(err).splitlines() if line.strip()][-1]
        return f"a rank failed: {last}"[:200]
    except mp.ProcessExitedException as err:  # a rank that ended its process (os._exit, a signal)
        return f"a rank ended: {err}"[:200]
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
                p.join(5)
    return ""


def check_ddp(make: LossFactory, name: str, params: str) -> Check:
    """2 gloo processes with half the batch each, gathering, against one process on the full batch."""
    setting = "2 gloo processes = 1 on the full batch"
    if not (dist.is_available() and dist.is_gloo_available()):
        return Check("ddp", setting, False, detail="torch.distributed with gloo is not available")
    out, g1, g2 = value_and_grads(make(0.2, False), *batch())
    with tempfile.TemporaryDirectory(prefix="dcl-ddp-check-") as tmp:
        ctx = mp.spawn(_ddp_rank, args=(name, params, tmp), nprocs=WORLD,  # type: ignore[no-untyped-call]
                       join=False)
        failed = _join(ctx)
        missing = [r for r in range(WORLD) if not (Path(tmp) / f"rank{r}.pt").is_file()]
        if missing:  # a rank that failed, or whose process ended (with any status) before it saved its result
            return Check("ddp", setting, False, detail=failed or f"rank {missing[0]} ended without a result")
        # Both ranks saved their results after the loss's forward and backward and before they left the barrier:
        # a failure after that (the process group's teardown) is not the loss's, and the results stand.
        ranks = [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    loss = sum(r[0] for r in ranks) / WORLD
    grads = torch.cat([torch.cat([r[1], r[2]]) for r in ranks])
    expected = torch.cat([torch.cat([WORLD * g1[_rows(r)], WORLD * g2[_rows(r)]]) for r in range(WORLD)])
    error = worst([relative(loss, out.loss, TOL_EXACT), relative(grads, expected, TOL_EXACT)])
    return measured("ddp", setting, error, TOL_DDP, "the ranks' loss or gradients differ from one process's")
