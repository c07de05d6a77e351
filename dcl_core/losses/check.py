"""The properties the built-in losses are tested for, run on any loss (a built-in name or the user's own
``module:Class`` / ``file.py:Class``): ``python -m dcl_core.losses check my_losses:MyLoss``.

Each property is a row of :class:`Check` with the error it measured and the tolerance it allows:

- ``contract``: ``loss(z1, z2)`` returns a :class:`~dcl_core.losses.base.LossOutput` whose ``loss`` is a finite
  0-d float tensor with a gradient, whose diagnostics are finite detached 0-d tensors and whose ``npc`` (if any)
  is a detached vector: what the trainer reads.
- ``finite fp32``: loss and gradients finite at each τ on random, identical, antipodal, aligned, collapsed, huge
  and tiny embeddings (the built-in losses' adversarial inputs).
- ``finite bf16``: under CPU bf16 autocast (embeddings from a bf16 layer) finite, and within the tolerance of
  the fp32 loss of the same rounded embeddings.
- ``permutation``: the same permutation of both views' rows gives the same loss and the permuted gradients.
- ``gradient``: the autograd gradient against central finite differences along random directions.
- ``reference``: with ``--reference module:function`` (a plain-loop transcription of the equation,
  ``function(z1, z2, temperature, **params) -> 0-d tensor`` on float64 inputs), the value and its autograd
  gradient.
- ``ddp``: in 2 gloo processes, each holding half the batch, with ``gather_distributed``: the mean of the ranks'
  losses is the one-process loss of the full batch, and each rank's gradient is 2× the full batch's on its rows
  (DDP's averaging then gives the full-batch gradient).
"""

from __future__ import annotations

import functools
import math
import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from dcl_core.config import Config, apply_overrides, loss_params
from dcl_core.losses import LOSSES
from dcl_core.losses.base import ContrastiveLoss, LossOutput
from dcl_core.losses.user import build_user_loss

TAUS = (0.005, 0.07, 0.2, 1.0)
INPUT_KINDS = ("random", "identical", "antipodal", "aligned", "collapsed", "huge", "tiny")
N, D = 8, 16  # the batch every property uses; the DDP check splits it over 2 ranks
WORLD = 2
DDP_TIMEOUT_S = 120.0
# Tolerances (relative, with an absolute floor of the same size): the built-in losses meet each by far
TOL_EXACT = 1e-5  # the same arithmetic in another order (permutation, DDP's split)
TOL_BF16 = 1e-3  # fp32 vs bf16 autocast on the same rounded embeddings (the built-ins: 0, similarities in fp32)
TOL_FD = 2e-2  # fp32 central differences, step 1e-2 on unit embeddings
TOL_REFERENCE = 1e-4


@dataclass(frozen=True)
class Check:
    """One property's verdict: ``ok``, the worst error measured and the tolerance (NaN where none applies)."""

    name: str
    setting: str
    ok: bool
    error: float = math.nan
    tolerance: float = math.nan
    detail: str = ""


LossFactory = Callable[[float, bool], ContrastiveLoss]  # (temperature, gather_distributed) -> a loss


def loss_factory(name: str, params: str = "{}") -> LossFactory:
    """A function building loss ``name`` (built-in, or the user's with its ``params`` JSON) at τ, gathering.

    Raises:
        InputError: the name or params as a config refuses them, or a user loss that cannot be loaded or built
            (one line, before any property runs).
    """
    apply_overrides(Config(), {"loss.name": name, "loss.params": params})  # the config's own checks and messages
    if name in LOSSES:
        cls = LOSSES[name]
        return lambda tau, gather: cls(temperature=tau, gather_distributed=gather)
    build_user_loss(name, params, 0.1, False)
    return lambda tau, gather: build_user_loss(name, params, tau, gather)


def _batch(kind: str = "random", seed: int = 123) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(N, D, generator=g)
    other = torch.randn(N, D, generator=g)
    if kind == "identical":
        v = base[:1]
        return v.repeat(N, 1), v.repeat(N, 1)
    if kind == "antipodal":
        return base, -base
    if kind == "aligned":
        return base, base.clone()
    if kind == "collapsed":
        z = base[torch.arange(N) % 2]
        return z, z.clone()
    if kind == "huge":
        return 1e15 * base, 1e15 * other
    if kind == "tiny":
        return 1e-15 * base, 1e-15 * other
    return base, other


def _value_and_grads(loss: ContrastiveLoss, z1: Tensor, z2: Tensor) -> tuple[LossOutput, Tensor, Tensor]:
    a, b = z1.detach().clone().requires_grad_(True), z2.detach().clone().requires_grad_(True)
    out = loss(a, b)
    out.loss.backward()
    assert a.grad is not None and b.grad is not None
    return out, a.grad, b.grad


def _relative(x: Tensor, y: Tensor, floor: float) -> float:
    """The largest |x − y| over (the largest |y| + floor): one number for a whole tensor (0 when they are equal)."""
    return float((x.double() - y.double()).abs().max() / (y.double().abs().max() + floor))


def check_contract(make: LossFactory) -> Check:
    """What the trainer reads: a LossOutput, a finite 0-d loss with a gradient, detached finite diagnostics."""
    z1, z2 = _batch()
    a, b = z1.clone().requires_grad_(True), z2.clone().requires_grad_(True)
    out = make(0.2, False)(a, b)
    problems = []
    if not isinstance(out, LossOutput):
        return Check("contract", "LossOutput", False, detail=f"returned {type(out).__name__}, not LossOutput")
    if not (isinstance(out.loss, Tensor) and out.loss.dim() == 0 and out.loss.is_floating_point()):
        problems.append("loss is not a 0-d float tensor")
    elif not out.loss.requires_grad:
        problems.append("loss has no gradient")
    elif not torch.isfinite(out.loss):
        problems.append(f"loss is {out.loss.item()}")
    for key, value in out.diagnostics.items():
        if not (isinstance(value, Tensor) and value.dim() == 0) or value.requires_grad:
            problems.append(f"diagnostic {key!r} is not a detached 0-d tensor")
        elif not torch.isfinite(value):
            problems.append(f"diagnostic {key!r} is {value.item()}")
    if out.npc is not None and (not isinstance(out.npc, Tensor) or out.npc.dim() != 1 or out.npc.requires_grad):
        problems.append("npc is not a detached vector")
    return Check("contract", "LossOutput", not problems, detail="; ".join(problems))


def check_finite_fp32(make: LossFactory, tau: float) -> Check:
    """Loss, gradients and diagnostics finite at ``tau`` on each of :data:`INPUT_KINDS`."""
    failed = []
    for kind in INPUT_KINDS:
        try:
            out, g1, g2 = _value_and_grads(make(tau, False), *_batch(kind))
        except Exception as err:  # the loss raising on a legitimate batch is a failure of this property
            failed.append(f"{kind}: {type(err).__name__}: {err}"[:120])
            continue
        bad = [what for what, t in (("loss", out.loss), ("grad", torch.cat([g1, g2]))) if not torch.isfinite(t).all()]
        bad += [key for key, v in out.diagnostics.items() if not torch.isfinite(v)]
        if bad:
            failed.append(f"{kind}: {', '.join(bad)}")
    return Check("finite fp32", f"tau={tau:g}", not failed, detail=("not finite: " + "; ".join(failed))[:300]
                 if failed else "")


def check_finite_bf16(make: LossFactory, tau: float) -> Check:
    """Finite under CPU bf16 autocast at ``tau``, and within :data:`TOL_BF16` of fp32 on the same embeddings."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(D, 32)
    x1, x2 = _batch()
    loss = make(tau, False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z1, z2 = layer(x1), layer(x2)
        out = loss(z1, z2)
    out.loss.backward()
    assert layer.weight.grad is not None
    if not (torch.isfinite(out.loss) and torch.isfinite(layer.weight.grad).all()):
        return Check("finite bf16", f"tau={tau:g}", False, detail="loss or gradient not finite under autocast")
    ref = loss(z1.detach().float(), z2.detach().float()).loss.detach()
    error = _relative(out.loss.detach(), ref, TOL_BF16)
    return Check("finite bf16", f"tau={tau:g}", error <= TOL_BF16, error, TOL_BF16,
                 "" if error <= TOL_BF16 else "the loss under autocast differs from fp32 on the same embeddings")


def check_permutation(make: LossFactory) -> Check:
    """The batch permuted alike in both views: the same loss, the permuted gradients."""
    z1, z2 = _batch()
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(0))
    out, g1, g2 = _value_and_grads(make(0.2, False), z1, z2)
    out_p, p1, p2 = _value_and_grads(make(0.2, False), z1[perm], z2[perm])
    error = max(_relative(out_p.loss.detach(), out.loss.detach(), TOL_EXACT),
                _relative(torch.cat([p1, p2]), torch.cat([g1[perm], g2[perm]]), TOL_EXACT))
    return Check("permutation", "both views alike", error <= TOL_EXACT, error, TOL_EXACT)


def check_gradient(make: LossFactory, tau: float = 0.2, directions: int = 3, step: float = 1e-2) -> Check:
    """The autograd gradient along random directions against central differences (n/a with a stop-gradient)."""
    z1, z2 = _batch()
    z1, z2 = torch.nn.functional.normalize(z1, dim=1), torch.nn.functional.normalize(z2, dim=1)
    loss = make(tau, False)
    if loss.detached:
        return Check("gradient", "finite differences: n/a", True,
                     detail=f"holds {loss.detached} constant: check its gradient with --reference")
    _, g1, g2 = _value_and_grads(loss, z1, z2)
    g = torch.Generator().manual_seed(7)
    worst = 0.0
    with torch.no_grad():
        for _ in range(directions):
            v1, v2 = torch.randn(N, D, generator=g), torch.randn(N, D, generator=g)
            norm = torch.cat([v1, v2]).norm()
            v1, v2 = v1 / norm, v2 / norm
            up = loss(z1 + step * v1, z2 + step * v2).loss
            down = loss(z1 - step * v1, z2 - step * v2).loss
            numeric = (up - down) / (2 * step)
            analytic = (g1 * v1).sum() + (g2 * v2).sum()
            scale = max(float(torch.cat([g1, g2]).norm()), TOL_FD)
            worst = max(worst, abs(float(numeric - analytic)) / scale)
    return Check("gradient", f"finite differences, tau={tau:g}", worst <= TOL_FD, worst, TOL_FD)


def check_reference(make: LossFactory, reference: Callable[..., Tensor], params: dict[str, Any],
                    tau: float = 0.2) -> Check:
    """Value and gradient against the user's plain-loop ``reference`` on float64 inputs."""
    z1, z2 = _batch()
    out, g1, g2 = _value_and_grads(make(tau, False), z1.double(), z2.double())
    a, b = z1.double().requires_grad_(True), z2.double().requires_grad_(True)
    value = reference(a, b, tau, **params)
    value.backward()  # type: ignore[no-untyped-call]  # a Tensor's backward is untyped in torch's stubs
    assert a.grad is not None and b.grad is not None
    error = max(_relative(out.loss.detach(), value.detach(), TOL_REFERENCE),
                _relative(torch.cat([g1, g2]), torch.cat([a.grad, b.grad]), TOL_REFERENCE))
    return Check("reference", f"value and gradient, tau={tau:g}", error <= TOL_REFERENCE, error, TOL_REFERENCE)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ddp_rank(rank: int, port: int, name: str, params: str, out_dir: str) -> None:
    """One rank of :func:`check_ddp`: its half of the batch through the gathering loss, saved for the parent."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    try:
        z1, z2 = _batch()
        rows = slice(rank * N // WORLD, (rank + 1) * N // WORLD)
        out, g1, g2 = _value_and_grads(loss_factory(name, params)(0.2, True), z1[rows], z2[rows])
        torch.save((out.loss.detach(), g1, g2), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def check_ddp(make: LossFactory, name: str, params: str) -> Check:
    """2 gloo processes with half the batch each, gathering, against one process on the full batch."""
    if not (dist.is_available() and dist.is_gloo_available()):
        return Check("ddp", "2 gloo processes", False, detail="torch.distributed with gloo is not available")
    out, g1, g2 = _value_and_grads(make(0.2, False), *_batch())
    with tempfile.TemporaryDirectory(prefix="dcl-ddp-check-") as tmp:
        port = _free_port()
        ctx = mp.spawn(_ddp_rank, args=(port, name, params, tmp), nprocs=WORLD, join=False)  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + DDP_TIMEOUT_S
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    return Check("ddp", "2 gloo processes", False, detail=f"no result within {DDP_TIMEOUT_S:g} s")
        except mp.ProcessRaisedException as err:
            last = [line for line in str(err).splitlines() if line.strip()][-1]
            return Check("ddp", "2 gloo processes", False, detail=f"a rank failed: {last}"[:200])
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
                    p.join(5)
        ranks = [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    loss = sum(r[0] for r in ranks) / WORLD
    grads = torch.cat([torch.cat([r[1], r[2]]) for r in ranks])
    expected = torch.cat([torch.cat([WORLD * g1[rows], WORLD * g2[rows]])
                          for rows in (slice(r * N // WORLD, (r + 1) * N // WORLD) for r in range(WORLD))])
    error = max(_relative(loss, out.loss.detach(), TOL_EXACT), _relative(grads, expected, TOL_EXACT))
    return Check("ddp", "2 gloo processes = 1 on the full batch", error <= 10 * TOL_EXACT, error, 10 * TOL_EXACT)


def run_checks(name: str, params: str = "{}", reference: Callable[..., Tensor] | None = None,
               ddp: bool = True, taus: tuple[float, ...] = TAUS) -> list[Check]:
    """Every property on loss ``name`` (see the module's docstring); a property that raises fails, with the
    error's line, and the others still run."""
    make = loss_factory(name, params)
    steps: list[tuple[str, str, Callable[[], Check]]] = [("contract", "LossOutput", lambda: check_contract(make))]
    steps += [("finite fp32", f"tau={t:g}", functools.partial(check_finite_fp32, make, t)) for t in taus]
    steps += [("finite bf16", f"tau={t:g}", functools.partial(check_finite_bf16, make, t)) for t in taus]
    steps += [("permutation", "both views alike", lambda: check_permutation(make)),
              ("gradient", "finite differences", lambda: check_gradient(make))]
    if reference is not None:
        kwargs = loss_params(params)
        steps.append(("reference", "value and gradient", lambda: check_reference(make, reference, kwargs)))
    if ddp:
        steps.append(("ddp", "2 gloo processes", lambda: check_ddp(make, name, params)))
    checks: list[Check] = []
    for check_name, setting, step in steps:
        try:
            checks.append(step())
        except Exception as err:
            line = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            checks.append(Check(check_name, setting, False, detail=line[:200]))
        if not checks[0].ok:  # the other properties read what the contract promises: each would fail alike
            checks.append(Check("others", "not run", False, detail="the contract fails; fix it first"))
            break
    return checks


def format_checks(name: str, checks: list[Check]) -> str:
    """The table ``python -m dcl_core.losses check`` prints: a row a property, then the count that failed."""
    rows = [f"{'property':<12} {'setting':<40} {'result':<6} {'error':>9} {'tolerance':>9}  detail"]
    for c in checks:
        err = "" if math.isnan(c.error) else f"{c.error:.2e}"
        tol = "" if math.isnan(c.tolerance) else f"{c.tolerance:.0e}"
        rows.append(f"{c.name:<12} {c.setting:<40} {'pass' if c.ok else 'FAIL':<6} {err:>9} {tol:>9}  {c.detail}")
    failed = sum(not c.ok for c in checks)
    rows.append(f"{name}: {len(checks) - failed} of {len(checks)} checks passed"
                + (f", {failed} failed" if failed else ""))
    return "\n".join(rows)
