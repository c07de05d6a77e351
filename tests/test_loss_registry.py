"""The built-in losses' registry (dcl_core/config/loss_registry.py): each loss declares itself in its own file, the
registry reads that declaration without importing torch, and everything else reads the registry.

The central test adds docs/losses.md's example loss, as written there, to a copy of the package and checks every
place a loss must reach: the config's name and option (with its range), ``--help``, the trainer's builder, the
colours, ``LOSSES`` and the checker. Nothing else of the copy is edited.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dcl_core.config import LOSS_NAMES, ConfigError, apply_overrides, field_specs, preset
from dcl_core.config.loss_registry import BUILTIN_LOSSES, LossSpecError, option_fields, read_loss_specs

ROOT = Path(__file__).resolve().parents[1]


def test_each_built_in_loss_s_class_carries_the_spec_read_from_its_source():
    assert {e.spec.name for e in BUILTIN_LOSSES} == set(LOSS_NAMES) == {
        "infonce", "dcl", "dclw", "dclw_exp", "eqco", "align_uniform"}
    for entry in BUILTIN_LOSSES:
        cls = getattr(importlib.import_module(entry.module), entry.cls)
        assert cls.spec == entry.spec
    assert tuple(sorted(LOSS_NAMES)) == LOSS_NAMES


def test_each_loss_s_parameters_are_config_keys_with_its_type_default_and_range():
    specs = field_specs()
    for name, (param, owners) in option_fields(BUILTIN_LOSSES).items():
        tp, f = specs[f"loss.{name}"]
        assert f.default == param.default and f.metadata["range"] == param.bounds and f.metadata["losses"] == owners
        assert tp in (param.kind, param.kind | None)
    # sigma is DCLW's and DCLW-exp's, one option with both helps
    assert field_specs()["loss.sigma"][1].metadata["help"] == ("DCLW: vMF weight scale sigma (Eq. 7); dclw_exp: "
                                                              "exponent scale (A.8)")
    with pytest.raises(ConfigError, match=r"^loss\.delta must be > 0, got 0\.0$"):
        apply_overrides(preset("cpu"), {"loss.name": "dclw_exp", "loss.delta": 0})


def test_a_loss_s_own_option_set_with_another_loss_is_refused_where_its_spec_says_so():
    cfg = preset("cpu")
    with pytest.raises(ConfigError, match=r"^loss\.alpha is EqCo's and has no effect with loss\.name=dcl: "):
        apply_overrides(cfg, {"loss.name": "dcl", "loss.alpha": 3})
    with pytest.raises(ConfigError, match=r"^loss\.num_negatives \(K sub-sampling\) is only defined for loss\.name"):
        apply_overrides(cfg, {"loss.name": "infonce", "loss.num_negatives": 4})
    apply_overrides(cfg, {"loss.name": "dcl", "loss.sigma": 0.7})  # sigma declares no refusal: a study's base sets it
    with pytest.raises(ConfigError, match=r"^loss\.name=align_uniform cannot be used with framework\.name=moco: it "
                                          r"scores whole embeddings, .*; use framework\.name=simclr$"):
        apply_overrides(cfg, {"loss.name": "align_uniform", "framework.name": "moco"})


def _write(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.parametrize(("body", "message"), [
    ('class L:\n    spec = LossSpec(name=NAME, colour="#000000")\n', r"l\.py:2: a loss's spec may hold only literals"),
    ('class L:\n    spec = LossSpec(name="l", colour="red")\n', r"colour 'red' must be #rrggbb"),
    ('class L:\n    spec = LossSpec(name="L-1", colour="#000000")\n',
     r"loss name 'L-1' must be a lower-case identifier"),
    ('class L:\n    spec = LossSpec(name="l", colour="#000000", params=(LossParam("m", float, 0.1, "h"),))\n',
     r"parameter m needs type float or int and bounds=Range"),
    ('class L:\n    spec = LossSpec(name="l", colour="#000000", params=(LossParam("m", int, 0.5, "h", '
     'bounds=Range(ge=0)),))\n', r"parameter m's default 0\.5 is not a int"),
    ('class L:\n    spec = LossSpec(name="l", colour="#000000", params=(LossParam("temperature", float, 0.1, "h", '
     'bounds=Range(gt=0)),))\n', r"parameter 'temperature' is not a name a loss can declare"),
    ('class L:\n    spec = LossSpec(name="l", colour="#000000", frames=())\n', r"unexpected keyword argument 'frames'"),
    ('class L:\n    spec = make_spec()\n', r"a loss's spec may hold only literals"),
])
def test_a_spec_that_is_not_literal_or_not_consistent_is_refused_naming_its_file(tmp_path, body, message):
    _write(tmp_path, "l.py", body)
    with pytest.raises(LossSpecError, match=message):
        read_loss_specs(tmp_path)


def test_a_name_taken_twice_and_a_shared_option_declared_differently_are_refused(tmp_path):
    _write(tmp_path, "a.py", 'class A:\n    spec = LossSpec(name="a", colour="#000000", params=(LossParam("w", float, '
                             '1.0, "a: w", bounds=Range(gt=0)),))\n')
    _write(tmp_path, "b.py", 'class B:\n    spec = LossSpec(name="b", colour="#000000", params=(LossParam("w", float, '
                             '2.0, "b: w", bounds=Range(gt=0)),))\n')
    with pytest.raises(LossSpecError, match=r"loss\.w is declared differently by a and b"):
        option_fields(read_loss_specs(tmp_path))
    _write(tmp_path, "b.py", 'class B:\n    spec = LossSpec(name="a", colour="#000000")\n')
    with pytest.raises(LossSpecError, match=r"b\.py: loss name 'a' is already A's"):
        read_loss_specs(tmp_path)
    _write(tmp_path, "b.py", 'class B:\n    spec = None\n\nclass Helper:\n    pass\n')  # no spec: not a loss
    assert [e.spec.name for e in read_loss_specs(tmp_path)] == ["a"]


def _docs_example() -> str:
    text = (ROOT / "docs" / "losses.md").read_text()
    section = text.split("## Adding a built-in loss", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


_PROBE = """
import sys
import dcl_core
from pathlib import Path
assert Path(dcl_core.__file__).is_relative_to(sys.argv[1]), dcl_core.__file__
from dcl_core.config import LOSS_NAMES, ConfigError, apply_overrides, derive, preset
from dcl_core.study.analysis.colours import series_colour
from dcl_core.training.builders import build_loss
from dcl_core.losscheck.core import loss_factory
from dcl_core.losses import LOSSES
import torch

assert "margin_dcl" in LOSS_NAMES and "margin_dcl" in LOSSES
cfg = apply_overrides(preset("smoke"), {"loss.name": "margin_dcl", "loss.margin": 0.3, "loss.temperature": 0.2})
loss = build_loss(cfg, derive(cfg))
assert type(loss).__name__ == "MarginDCLLoss" and loss.margin == 0.3 and loss.temperature == 0.2, loss
try:
    apply_overrides(cfg, {"loss.margin": 2})
    raise SystemExit("loss.margin=2 was accepted")
except ConfigError as err:
    assert str(err) == "loss.margin must be <= 1, got 2.0", err
assert series_colour("margin_dcl") == "#17becf" and series_colour("moco+margin_dcl") != "#17becf"
z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
assert torch.isfinite(loss_factory("margin_dcl")(0.1, False)(z1, z2).loss)
print("reached everything")
"""


def _copy_with_the_example(tmp_path: Path) -> Path:
    copy = tmp_path / "pkg"
    shutil.copytree(ROOT / "dcl_core", copy / "dcl_core", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "dcl_core" / "losses" / "margin_dcl.py").write_text(_docs_example())
    return copy


def test_the_documented_new_loss_is_one_file_that_reaches_config_builder_colours_and_checker(tmp_path):
    copy = _copy_with_the_example(tmp_path)
    env = {"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    probe = subprocess.run([sys.executable, "-c", _PROBE, str(copy)], env=env, capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)  # not this checkout's folder, which would come first
    assert probe.returncode == 0 and "reached everything" in probe.stdout, probe.stderr[-3000:]
    helped = subprocess.run([sys.executable, "-m", "dcl_core.train", "--help"], env=env, capture_output=True,
                            text=True, timeout=300, cwd=tmp_path)
    assert "--loss.margin FLOAT" in helped.stdout and "margin_dcl: margin m on the positive" in helped.stdout
    choices = re.search(r"\n  --loss\.name STR(.*?)--loss\.temperature", helped.stdout, re.S).group(1)
    assert "/margin_dcl" in "".join(choices.split())  # among loss.name's choices


@pytest.mark.slow
def test_the_checker_passes_the_documented_new_loss(tmp_path):
    copy = _copy_with_the_example(tmp_path)
    env = {"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    check = subprocess.run([sys.executable, "-m", "dcl_core.losses", "check", "margin_dcl"], env=env,
                           capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    assert "fail" not in check.stdout.split("\n", 1)[1].lower()
