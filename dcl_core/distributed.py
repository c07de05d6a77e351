"""The ``torch.distributed`` helpers losses and frameworks share: the process group's size and the two all-gathers.

Without a process group every helper is the identity (rank 0 of 1), so the same code runs in a single process.

- :func:`gather_with_grad`: negatives of a loss, which must receive gradient on the rank that produced them
  (SimCLR's and NNCLR's other-view projections).
- :func:`gather_no_grad`: keys and statistics that never receive gradient (momentum keys, queue entries,
  ``pos_batch``).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel


def distributed_world() -> tuple[int, int]:
    """(rank, world_size) of the default process group, or (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (or the module itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def gather_with_grad(x: Tensor) -> Tensor:
    """Concatenate ``x`` from all ranks along dim 0, letting gradients flow back to every rank's slice.

    ``torch.distributed.nn.functional.all_gather`` sums the incoming gradients over ranks in its backward
    (reduce-scatter), so a rank's local features receive gradient from every rank's anchors.
    """
    _, world = distributed_world()
    if world == 1:
        return x
    # Imported here, where a process group exists: torch builds without distributed support cannot import it.
    from torch.distributed.nn.functional import all_gather

    with warnings.catch_warnings():
        # torch 2.14 deprecates this public autograd all_gather in favour of a private (underscore) module; it
        # still works, and a private API would churn more.
        warnings.filterwarnings("ignore", message=".*all_gather is deprecated", category=FutureWarning)
        parts = all_gather(x)
    out = torch.cat(parts, dim=0)  # (world * n, D)
    if out.requires_grad:
        # all_gather's backward sends each slice of the incoming gradient as raw memory; a transposed gradient
        # (e.g. from einsum/matmul against these keys) would arrive scrambled on the other ranks.
        out.register_hook(lambda grad: grad.contiguous())
    return out


@torch.no_grad()
def gather_no_grad(x: Tensor) -> Tensor:
    """``x`` from every rank concatenated along dim 0 (rank order), without gradient; ``x`` itself if single."""
    _, world = distributed_world()
    if world == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=0)  # (world * n, ...)
