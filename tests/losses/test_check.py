"""``python -m dcl_core.losses check``: every built-in loss passes it, and a planted loss that breaks one property
fails that property (tests/losses/planted_losses.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcl_core.config import LOSS_NAMES
from dcl_core.losses.__main__ import main
from dcl_core.losses.check import run_checks

PLANTED = Path(__file__).with_name("planted_losses.py")


def planted(name: str) -> str:
    return f"{PLANTED}:{name}"


def failed(checks) -> set[str]:
    return {c.name for c in checks if not c.ok}


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_every_built_in_loss_passes(name):
    checks = run_checks(name, ddp=False)
    assert failed(checks) == set(), [c for c in checks if not c.ok]
    assert {c.name for c in checks} == {"contract", "finite fp32", "finite bf16", "permutation", "gradient"}


def test_a_sound_user_loss_passes_with_its_params_and_its_reference():
    from planted_losses import positive_weighted_reference

    checks = run_checks(planted("PositiveWeighted"), '{"positive_weight": 0.5}',
                        reference=positive_weighted_reference, ddp=False)
    assert failed(checks) == set(), [c for c in checks if not c.ok]
    reference = next(c for c in checks if c.name == "reference")
    assert reference.error < 1e-5


def test_the_documented_example_passes_as_docs_own_loss_says():
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "my_losses.py"
    checks = run_checks(f"{example}:PositiveWeighted", '{"positive_weight": 0.5}', ddp=False)
    assert failed(checks) == set(), [c for c in checks if not c.ok]


@pytest.mark.parametrize(("loss", "broken"), [
    ("ReturnsTensor", {"contract", "others"}),
    ("NaiveExp", {"finite fp32", "finite bf16"}),
    ("HalfPrecision", {"finite bf16"}),
    ("OrderDependent", {"permutation"}),
    ("WrongGradient", {"gradient"}),
])
def test_a_planted_broken_loss_fails_the_property_it_breaks(loss, broken):
    assert failed(run_checks(planted(loss), ddp=False)) == broken


def test_a_reference_that_disagrees_fails_the_reference_check():
    from planted_losses import positive_weighted_reference

    # the loss at weight 0.5 against the reference at its default weight 1 (plain InfoNCE)
    checks = run_checks(planted("PositiveWeighted"), '{"positive_weight": 0.5}',
                        reference=lambda z1, z2, temperature, **_: positive_weighted_reference(z1, z2, temperature),
                        ddp=False)
    assert failed(checks) == {"reference"}


def test_the_finite_difference_check_does_not_apply_to_a_loss_with_a_stop_gradient():
    gradient = next(c for c in run_checks("dclw", ddp=False) if c.name == "gradient")
    assert gradient.ok and "n/a" in gradient.setting and "--reference" in gradient.detail


def test_exit_codes_and_the_table(capsys):
    assert main(["check", planted("PositiveWeighted"), "--params", '{"positive_weight": 2}', "--no-ddp"]) == 0
    out = capsys.readouterr().out
    assert "11 of 11 checks passed" in out and "FAIL" not in out
    assert main(["check", planted("OrderDependent"), "--no-ddp"]) == 1
    out = capsys.readouterr().out
    assert "permutation  both views alike" in out and "FAIL" in out and "1 failed" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["check", "no_such_module_xyz:Loss"], "importing no_such_module_xyz failed: ModuleNotFoundError"),
    (["check", f"{PLANTED}:Missing"], "has no Missing"),
    (["check", f"{PLANTED}:positive_weighted_reference"], "must be a subclass of dcl_core.losses.ContrastiveLoss"),
    (["check", "nope"], "loss.name must be one of"),
    (["check", planted("PositiveWeighted"), "--params", '{"weight": 1}'], "does not take"),
    (["check", "dcl", "--reference", "no_such_module_xyz:f"], "--reference=no_such_module_xyz:f: importing"),
])
def test_a_loss_that_cannot_be_loaded_is_one_line_and_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


@pytest.mark.slow  # spawns 2 gloo processes a loss
@pytest.mark.parametrize(("loss", "params", "ok"), [
    ("dcl", "{}", True),
    ("align_uniform", "{}", True),  # its own forward: the whole loss on every rank
    (planted("PositiveWeighted"), '{"positive_weight": 0.5}', True),
    (planted("LocalNegatives"), "{}", False),
])
def test_ddp_two_gloo_processes_equal_one_on_the_full_batch(loss, params, ok):
    ddp = next(c for c in run_checks(loss, params) if c.name == "ddp")
    assert ddp.ok is ok, ddp
