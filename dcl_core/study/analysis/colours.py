"""One fixed colour per series value (a loss, or ``framework+method``), shared by the study's plot and its MLflow
trial runs (``mlflow.runColor``): DCL's line in the PNG and DCL's points in MLflow's charts look alike, in every
study, whichever series comes first. Pure (no matplotlib), so the tracker imports it cheaply.

A loss has a fixed hue, declared in its spec (DCL and InfoNCE keep matplotlib's first two cycle colours); a
framework prefix shades it (SimCLR: the hue itself; MoCo darker, SiMo lighter, NNCLR darkest), so
``moco+dcl`` reads as DCL. A name not listed gets a colour from its hash: fixed, though two such names may share one.
"""

from __future__ import annotations

import zlib

from dcl_core.config import LOSS_SPECS

# Each built-in loss's colour is in its spec (its own file); EqCo's α = K baseline has one of its own.
LOSS_COLOURS: dict[str, str] = {name: spec.colour for name, spec in LOSS_SPECS.items()} | {
    "eqco(α=K)": "#bcbd22",  # olive: EqCo with α = K, InfoNCE over the same K negatives, the EqCo studies' baseline
}
# Framework prefix -> (mix with, fraction): black darkens, white lightens; SimCLR is the loss's own hue.
FRAMEWORK_SHADES: dict[str, tuple[str, float]] = {
    "simclr": ("#000000", 0.0),
    "moco": ("#000000", 0.35),
    "simo": ("#ffffff", 0.45),
    "nnclr": ("#000000", 0.6),
}
SUMMARY_COLOUR = "#333333"  # the study's summary run: no series, and not one's colour by chance (a hash)
# For names not listed: tab10's two unused hues and tab20's light ones.
_SPARE = ("#7f7f7f", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2",
          "#dbdb8d", "#9edae5")


def _stable(name: str, n: int) -> int:
    """An index below ``n`` fixed by ``name`` across processes (``hash()`` of a str is salted per process)."""
    return zlib.crc32(name.encode()) % n


def _mix(colour: str, other: str, fraction: float) -> str:
    a = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    b = [int(other[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * fraction):02x}" for x, y in zip(a, b, strict=True))


def method_colour(method: str) -> str:
    """A loss or method label's colour: listed exactly, else by the loss it names (``eqco(α=256)`` is EqCo's),
    else from its hash."""
    if method in LOSS_COLOURS:
        return LOSS_COLOURS[method]
    loss = method.split("(", 1)[0]
    return LOSS_COLOURS.get(loss) or _SPARE[_stable(method, len(_SPARE))]


def series_colour(name: str) -> str:
    """The colour of a series value, ``"#rrggbb"``: ``dcl``, ``moco+dcl``, ``simclr+eqco(α=K)``."""
    prefix, _, method = str(name).rpartition("+")
    colour = method_colour(method)
    if not prefix:
        return colour
    shades = [s for s in FRAMEWORK_SHADES.values() if s[1]]  # an unlisted framework is never unshaded
    shade = FRAMEWORK_SHADES.get(prefix) or shades[_stable(prefix, len(shades))]
    return _mix(colour, *shade)
