"""The built-in losses as their own files declare them, read without importing those files (torch-free).

A built-in loss is one file in ``dcl_core/losses/``: its class carries a :class:`LossSpec` (its name in
``loss.name``, its colour in plots and MLflow, its own typed and bounded parameters, the frameworks it works with)
written with literals only::

    class MarginDCLLoss(ContrastiveLoss):
        spec = LossSpec(
            name="margin_dcl",
            colour="#17becf",
            params=(LossParam("margin", float, 0.1, "margin_dcl: margin on the positive", bounds=Range(ge=0, cap=1)),),
        )

Everything else reads this registry: the config's ``loss.*`` options and their checks, the trainer's builder, the
plot colours, the loss checker and ``dcl_core.losses.LOSSES``. So adding a loss is adding its file (and its test).

Why read the source instead of importing it: the command lines and the study driver check a config before torch
loads (importing torch takes seconds, and a bad option must be refused at once), and a loss's file imports torch.
:func:`read_loss_specs` therefore parses each file and evaluates only the ``spec = LossSpec(...)`` expression,
which may hold nothing but literals, tuples and calls of :class:`LossSpec`, :class:`LossParam` and
:class:`~dcl_core.config.bounds.Range`; ``dcl_core.losses`` checks on import that each class's ``spec`` equals
what was read here.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NamedTuple

from dcl_core.config.bounds import Range

LOSSES_FOLDER = Path(__file__).resolve().parent.parent / "losses"  # dcl_core/losses
SHARED = ("name", "temperature", "gather_distributed", "params")  # loss.* options every loss has
_TYPES: dict[str, type] = {"float": float, "int": int}


@dataclass(frozen=True)
class LossParam:
    """One of a built-in loss's own parameters: the constructor's keyword ``name`` and the option ``loss.<name>``.

    Attributes:
        name: keyword argument and option name (``sigma`` → ``loss.sigma``).
        kind: ``float`` or ``int``.
        default: the option's default; None (float only) means "unset", which the loss resolves itself.
        help: ``--help``'s text, beginning with the loss's name (``dclw: ...``).
        paper: the paper's value, where it fixes one.
        bounds: the values accepted (every numeric option declares one).
        elsewhere: the one-line refusal when the option is set (not its default) with another ``loss.name``;
            ``{name}`` is that loss. Empty: other losses ignore it (a study comparing losses sets it in its base).
        derived: a :class:`~dcl_core.config.derive.Derived` attribute the builder passes instead of the option's
            value (EqCo's α resolved to K when unset).
    """

    name: str
    kind: type
    default: Any
    help: str
    paper: Any = None
    bounds: Range | None = None
    elsewhere: str = ""
    derived: str = ""


@dataclass(frozen=True)
class LossSpec:
    """What a built-in loss declares about itself (see the module's docstring).

    Attributes:
        name: its ``loss.name``.
        colour: ``#rrggbb``, its line in plots and its points in MLflow's charts.
        params: its own parameters, in its constructor's order (after ``temperature``).
        frameworks: the frameworks it works with; empty: every one.
        frameworks_why: why only those (the refusal's reason).
    """

    name: str
    colour: str
    params: tuple[LossParam, ...] = ()
    frameworks: tuple[str, ...] = ()
    frameworks_why: str = ""


class BuiltinLoss(NamedTuple):
    """A loss's spec and where its class is: ``dcl_core.losses.<module>``, class ``cls``."""

    spec: LossSpec
    module: str
    cls: str


class LossSpecError(ImportError):
    """A loss file whose spec cannot be read (not literals, a name taken twice, parameters that disagree)."""


_CALLS: dict[str, Any] = {"LossSpec": LossSpec, "LossParam": LossParam, "Range": Range}


def _literal(node: ast.expr, where: str) -> Any:
    """The value of a spec expression: literals, tuples/lists, ``float``/``int``, and calls of :data:`_CALLS`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS:
        args = [_literal(a, where) for a in node.args]
        kwargs = {k.arg: _literal(k.value, where) for k in node.keywords if k.arg is not None}
        if len(kwargs) != len(node.keywords):
            raise LossSpecError(f"{where}: a loss's spec cannot use **arguments")
        try:
            return _CALLS[node.func.id](*args, **kwargs)
        except TypeError as err:
            raise LossSpecError(f"{where}: {err}") from None
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_literal(e, where) for e in node.elts)
    if isinstance(node, ast.Name) and node.id in _TYPES:
        return _TYPES[node.id]
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise LossSpecError(f"{where}: a loss's spec may hold only literals, tuples and LossSpec/LossParam/Range "
                            f"calls, not {ast.unparse(node)!r}") from None


def _specs_in(path: Path) -> list[BuiltinLoss]:
    """The ``spec = LossSpec(...)`` of each class in ``path`` (most files hold one; helpers hold none)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            target = (item.targets[0] if isinstance(item, ast.Assign) and len(item.targets) == 1
                      else item.target if isinstance(item, ast.AnnAssign) else None)
            value = getattr(item, "value", None)
            none = isinstance(value, ast.Constant) and value.value is None  # a base class's "no spec"
            if isinstance(target, ast.Name) and target.id == "spec" and value is not None and not none:
                spec = _literal(value, f"{path}:{item.lineno}")
                if not isinstance(spec, LossSpec):
                    raise LossSpecError(f"{path}:{item.lineno}: {node.name}.spec must be a LossSpec(...)")
                found.append(BuiltinLoss(spec, f"dcl_core.losses.{path.stem}", node.name))
    return found


def _check(spec: LossSpec, where: str) -> None:
    """A spec's own consistency: a name the config can hold, a colour, typed and bounded parameters."""
    if not spec.name.isidentifier() or not spec.name.islower():
        raise LossSpecError(f"{where}: loss name {spec.name!r} must be a lower-case identifier")
    if len(spec.colour) != 7 or spec.colour[0] != "#" or any(c not in "0123456789abcdef" for c in spec.colour[1:]):
        raise LossSpecError(f"{where}: colour {spec.colour!r} must be #rrggbb (lower case)")
    for p in spec.params:
        if p.name in SHARED or not p.name.isidentifier():
            raise LossSpecError(f"{where}: parameter {p.name!r} is not a name a loss can declare")
        if p.kind not in (float, int) or p.bounds is None:
            raise LossSpecError(f"{where}: parameter {p.name} needs type float or int and bounds=Range(...)")
        typed = isinstance(p.default, p.kind) and not isinstance(p.default, bool)
        ok = (p.default is None and p.kind is float) or typed
        if not ok or (isinstance(p.default, float) and not math.isfinite(p.default)):
            raise LossSpecError(f"{where}: parameter {p.name}'s default {p.default!r} is not a {p.kind.__name__}")


def read_loss_specs(folder: Path = LOSSES_FOLDER) -> tuple[BuiltinLoss, ...]:
    """Every built-in loss declared in ``folder``'s ``*.py`` files, ordered by name.

    Raises:
        LossSpecError: a spec that is not literals, or inconsistent; a name declared twice.
    """
    found: dict[str, BuiltinLoss] = {}
    for path in sorted(folder.glob("*.py")):
        for entry in _specs_in(path):
            _check(entry.spec, str(path))
            if entry.spec.name in found:
                raise LossSpecError(f"{path}: loss name {entry.spec.name!r} is already {found[entry.spec.name].cls}'s")
            found[entry.spec.name] = entry
    return tuple(found[name] for name in sorted(found))


def option_fields(builtins: tuple[BuiltinLoss, ...]) -> dict[str, tuple[LossParam, tuple[str, ...]]]:
    """Each ``loss.<param>`` option the built-in losses declare, with the losses that take it, in order.

    Two losses may share an option (``sigma``: DCLW's vMF scale and DCLW-exp's exponent scale) when they declare
    the same type, default, paper value and bounds; its help is theirs joined by ``; ``.

    Raises:
        LossSpecError: a shared option declared differently.
    """
    out: dict[str, tuple[LossParam, tuple[str, ...]]] = {}
    same = [f.name for f in fields(LossParam) if f.name not in ("help", "elsewhere", "derived")]
    for entry in builtins:
        for p in entry.spec.params:
            if p.name not in out:
                out[p.name] = (p, (entry.spec.name,))
                continue
            first, owners = out[p.name]
            if any(getattr(first, f) != getattr(p, f) for f in same):
                raise LossSpecError(f"loss.{p.name} is declared differently by {owners[0]} and {entry.spec.name}: "
                                    "a shared option needs one type, default, paper value and range")
            merged = LossParam(**{**first.__dict__, "help": f"{first.help}; {p.help}"})
            out[p.name] = (merged, (*owners, entry.spec.name))
    return out


BUILTIN_LOSSES: tuple[BuiltinLoss, ...] = read_loss_specs()
LOSS_SPECS: dict[str, LossSpec] = {entry.spec.name: entry.spec for entry in BUILTIN_LOSSES}
# loss.<param> -> (its declaration, the losses that take it): the config's fields and its checks read this
LOSS_OPTIONS: dict[str, tuple[LossParam, tuple[str, ...]]] = option_fields(BUILTIN_LOSSES)
