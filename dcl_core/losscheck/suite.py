"""Every property of the check of a loss in order (:func:`steps`, which rows apply decided by the loss's form) and
their run in this process (:func:`run_checks`); :mod:`~dcl_core.losscheck.isolation` runs the same steps apart."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dcl_core.config import loss_params
from dcl_core.losscheck.core import LossFactory
from dcl_core.losscheck.ddp import check_ddp
from dcl_core.losscheck.layout import (
    FRAMEWORK_SHAPES,
    check_excluded_inert,
    check_framework,
    check_layout,
    has_similarities,
    without_similarities,
)
from dcl_core.losscheck.properties import (
    check_contract,
    check_finite_bf16,
    check_finite_fp32,
    check_gradient,
    check_permutation,
)
from dcl_core.losscheck.reference import Reference, check_reference
from dcl_core.losscheck.rows import TAUS, Check, contract_failed, first_line, not_applicable
from dcl_core.losses.base import ContrastiveLoss


@dataclass(frozen=True)
class Step:
    """One row to measure: its property's name, its setting and the measurement."""

    name: str
    setting: str
    run: Callable[[], Check]


def steps(make: LossFactory, name: str, params: str = "{}", reference: Reference | None = None,
          ddp: bool = True, taus: tuple[float, ...] = TAUS) -> Iterator[Step]:
    """The rows of the check of loss ``name`` (built by ``make``), in the order they run."""
    yield Step("contract", "LossOutput", lambda: check_contract(make))
    for tau in taus:
        yield Step("finite fp32", f"tau={tau:g}", functools.partial(check_finite_fp32, make, tau))
    for tau in taus:
        yield Step("finite bf16", f"tau={tau:g}", functools.partial(check_finite_bf16, make, tau))
    yield Step("permutation", "both views alike", lambda: check_permutation(make))
    try:
        probe: ContrastiveLoss | None = make(0.2, False)  # the loss's form decides which rows apply
    except Exception:  # built once already (the contract): the rows below then fail with its error
        probe = None
    if probe is not None and probe.detached:
        held = probe.detached
        yield Step("gradient", "every tau", lambda: not_applicable(
            "gradient", "every tau", f"holds {held} constant: check its gradient with --reference"))
    else:
        for tau in taus:
            yield Step("gradient", f"tau={tau:g}", functools.partial(check_gradient, make, tau))
    if probe is not None and not has_similarities(probe):
        for moot in ("layout", "excluded", "frameworks"):
            yield Step(moot, "every tau", functools.partial(without_similarities, moot))
    else:
        for tau in taus:
            yield Step("layout", f"tau={tau:g}", functools.partial(check_layout, make, tau))
        for tau in taus:
            yield Step("excluded", f"tau={tau:g}", functools.partial(check_excluded_inert, make, tau))
        for framework in FRAMEWORK_SHAPES:
            yield Step("frameworks", framework, functools.partial(check_framework, make, framework))
    if reference is not None:
        kwargs = loss_params(params)
        for tau in taus:
            yield Step("reference", f"tau={tau:g}", functools.partial(check_reference, make, reference, kwargs, tau))
    if ddp:
        yield Step("ddp", "2 gloo processes", lambda: check_ddp(make, name, params))


def measure(step: Step) -> Check:
    """The step's row; a step that raises fails, with the error's line."""
    try:
        return step.run()
    except Exception as err:
        return Check(step.name, step.setting, False, detail=first_line(err)[:200])


def run_checks(make: LossFactory, name: str, params: str = "{}", reference: Reference | None = None,
               ddp: bool = True, taus: tuple[float, ...] = TAUS) -> list[Check]:
    """Every property on loss ``name``, in this process: a property that raises fails and the others still run
    (``python -m dcl_core.losses check`` runs them in a process of their own, :mod:`~dcl_core.losscheck.isolation`)."""
    checks: list[Check] = []
    for step in steps(make, name, params, reference, ddp, taus):
        checks.append(measure(step))
        if not checks[0].ok:  # the other properties read what the contract promises: each would fail alike
            return contract_failed(checks)
    return checks
