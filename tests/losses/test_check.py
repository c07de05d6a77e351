"""``python -m dcl_core.losses check``: every built-in loss passes it with room to spare, and each mistake a
researcher makes writing a loss from docs/own-loss.md (tests/losses/planted_losses.py) fails it without a
reference, on the property meant to catch it; a reference is compared where a clamp or a max branch shows.

The rows run in this process here (:func:`run_checks`); the command runs them in a process of its own, which the
slow tests at the end exercise: a loss that exits or hangs fails, never passes."""

from __future__ import annotations

import functools
import importlib.util
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import reference as ref
import torch
from planted_losses import debiased_reference, positive_weighted_reference

from dcl_core.config import LOSS_NAMES
from dcl_core.losscheck.core import loss_factory
from dcl_core.losscheck.rows import TAUS, Check, format_checks, measured, summary, worst
from dcl_core.losscheck.suite import run_checks
from dcl_core.losses.__main__ import main

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PLANTED = HERE / "planted_losses.py"
EXAMPLE = REPO / "docs" / "examples" / "my_losses.py"
EXAMPLE_REFERENCE = REPO / "docs" / "examples" / "my_losses_reference.py"
PROPERTIES = {"contract", "finite fp32", "finite bf16", "permutation", "gradient", "layout", "excluded", "frameworks"}


def planted(name: str) -> str:
    return f"{PLANTED}:{name}"


def check(name: str, params: str = "{}", reference=None, ddp: bool = False) -> list[Check]:
    return run_checks(loss_factory(name, params), name, params, reference=reference, ddp=ddp)


def failed(checks: list[Check]) -> set[str]:
    return {c.name for c in checks if not c.ok}


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_every_built_in_loss_passes_with_a_tenth_of_each_tolerance_to_spare(name):
    checks = check(name)
    assert failed(checks) == set(), [c for c in checks if not c.ok]
    assert {c.name for c in checks} == PROPERTIES
    for c in checks:
        assert not c.applies or math.isnan(c.tolerance) or c.error <= c.tolerance / 10, c


def test_a_loss_without_similarities_or_with_a_stop_gradient_says_n_a_and_is_not_counted_as_holding():
    dclw = check("dclw")
    gradient = [c for c in dclw if c.name == "gradient"]
    assert len(gradient) == 1 and not gradient[0].applies and "--reference" in gradient[0].detail
    align = check("align_uniform")
    moot = {c.name for c in align if not c.applies}
    assert moot == {"layout", "excluded", "frameworks"}
    line = summary("align_uniform", align)
    assert line.startswith(f"align_uniform: {len(align) - 3} of {len(align) - 3} checks hold")
    assert "n/a" in line and "the equation itself is unchecked: give --reference" in line


BUILT_IN_REFERENCES = {  # each built-in loss at its defaults, as the plain loops of tests/losses/reference.py
    "infonce": ref.infonce,
    "dcl": ref.dcl,
    "dclw": functools.partial(ref.dclw, sigma=0.5),
    "dclw_exp": lambda z1, z2, tau: ref.dclw_exp(z1, z2, tau, sigma=0.5, delta=3.0),
    "eqco": ref.eqco,
    "align_uniform": lambda z1, z2, tau: ref.align_uniform(z1, z2),
}


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_every_built_in_loss_equals_its_plain_loop_at_every_tau_and_kind_of_input(name):
    checks = check(name, reference=BUILT_IN_REFERENCES[name])
    rows = [c for c in checks if c.name == "reference"]
    assert [c.setting.rpartition(" ")[2] for c in rows] == [f"tau={t:g}" for t in TAUS]
    assert failed(checks) == set(), [c for c in checks if not c.ok]
    assert all(c.error <= c.tolerance / 10 for c in rows), rows


@pytest.mark.parametrize(("loss", "params", "reference"), [
    ("PositiveWeighted", '{"positive_weight": 0.5}', positive_weighted_reference),
    ("Debiased", "{}", debiased_reference),  # a max branch (the floor) and a clamp: Chuang et al. 2020
    ("Debiased", '{"tau_plus": 0.05}', debiased_reference),
])
def test_a_sound_user_loss_passes_with_its_params_and_its_reference(loss, params, reference):
    checks = check(planted(loss), params, reference=reference)
    assert failed(checks) == set(), [c for c in checks if not c.ok]
    assert sum(c.name == "reference" for c in checks) == len(TAUS)


def test_the_documented_example_passes_with_its_documented_reference():
    from dcl_core.losses.user import load_function

    reference = load_function(f"{EXAMPLE_REFERENCE}:positive_weighted")
    checks = check(f"{EXAMPLE}:PositiveWeighted", '{"positive_weight": 0.5}', reference=reference)
    assert failed(checks) == set(), [c for c in checks if not c.ok]
    assert {c.name for c in checks} == PROPERTIES | {"reference"}


# Each mistake, and the properties that catch it (no reference given). The first four pass the checker as it was
# before the layout, excluded, frameworks and float64 gradient rows: 11 of 11 checks.
MISTAKES = [
    ("DCLSelfAndPositive", {"layout", "excluded", "frameworks"}),  # logsumexp(sims.neg): self and positive counted
    ("DebiasedSelfAndPositive", {"layout", "excluded", "frameworks"}),
    ("DebiasedCountFromWidth", {"layout", "frameworks"}),  # K = sims.neg.shape[1] = 2N, not 2N − 2
    ("DebiasedDroppedFactor", {"gradient"}),  # its value right, its gradient (1 − τ⁺)× on one term
    ("NaiveExp", {"finite fp32", "finite bf16"}),  # exp, then log
    ("NaNWithoutGrad", {"finite fp32", "gradient"}),  # NaN under no_grad only
    ("ReturnsTensor", {"contract", "others"}),
    ("HalfPrecision", {"finite bf16", "gradient"}),  # bf16 under autocast; float32 on float64 inputs
    ("OrderDependent", {"permutation"}),
    ("WrongGradient", {"gradient"}),  # a hand-written backward that halves it
]


@pytest.mark.parametrize(("loss", "broken"), MISTAKES)
def test_a_planted_mistake_fails_the_property_meant_to_catch_it(loss, broken):
    assert failed(check(planted(loss))) == broken


def test_the_dropped_factor_fails_the_gradient_by_three_orders_of_magnitude_above_its_tolerance():
    """The margin docs/own-loss.md states: the built-ins measure under 1e-9, the dropped factor over 1e-3."""
    rows = [c for c in check(planted("DebiasedDroppedFactor")) if c.name == "gradient"]
    assert all(c.error > 1e3 * c.tolerance for c in rows), rows
    sound = [c for c in check("infonce") + check(planted("Debiased")) if c.name == "gradient"]
    assert all(c.error < 1e-3 * c.tolerance for c in sound), sound


def test_a_wrong_floor_passes_every_property_and_fails_the_reference_where_the_floor_is_active():
    """What a pass without --reference does not cover: an equation that is another one, consistently."""
    assert failed(check(planted("DebiasedWrongFloor"))) == set()
    rows = [c for c in check(planted("DebiasedWrongFloor"), reference=debiased_reference) if c.name == "reference"]
    wrong = [c for c in rows if not c.ok]
    assert wrong and all("random" not in c.detail for c in wrong), rows  # the spread inputs alone would pass it


def nan_gradient_reference(z1, z2, temperature, positive_weight=1.0):
    """The right value, with a NaN in its gradient (√ at 0)."""
    value = positive_weighted_reference(z1, z2, temperature, positive_weight)
    return value + torch.sqrt(0 * z1.sum())


def test_nan_fails_wherever_it_appears():
    assert math.isnan(worst([0.0, math.nan])) and worst([0.0, 1e-9]) == 1e-9
    row = measured("reference", "tau=0.2", math.nan, 1e-8)
    assert not row.ok and "nan" in row.detail
    checks = check(planted("PositiveWeighted"), '{"positive_weight": 0.5}', reference=nan_gradient_reference)
    assert failed(checks) == {"reference"}
    assert "nan" in format_checks("x", checks)


def test_a_reference_that_disagrees_fails_the_reference_check():
    # the loss at weight 0.5 against the reference at its default weight 1 (plain InfoNCE)
    checks = check(planted("PositiveWeighted"), '{"positive_weight": 0.5}',
                   reference=lambda z1, z2, temperature, **_: positive_weighted_reference(z1, z2, temperature))
    assert failed(checks) == {"reference"}


def test_the_summary_line_says_what_was_checked_against_what():
    checks = check(planted("Debiased"), reference=debiased_reference)
    line = summary("Debiased", checks, "ref.py:debiased")
    assert line.startswith(f"Debiased: {len(checks)} of {len(checks)} checks hold; its value and gradient equal "
                           "ref.py:debiased's at 4 temperatures on 5 kinds of input"), line
    bad = check(planted("DebiasedCountFromWidth"))
    assert summary("x", bad).startswith(f"x: 6 of {len(bad)} checks failed (layout, frameworks)")


needs_lightly = pytest.mark.skipif(importlib.util.find_spec("lightly") is None,
                                   reason="lightly comes with the bench extra")


@needs_lightly
@pytest.mark.parametrize(("loss", "reference"), [("lightly.loss:DCLLoss", ref.dcl),
                                                 ("lightly.loss:NTXentLoss", ref.infonce)])
def test_lightly_losses_pass_through_the_adapter_and_equal_this_project_s_equations(loss, reference):
    checks = check(loss, reference=reference)
    assert failed(checks) == set(), [c for c in checks if not c.ok]
    assert {c.name for c in checks if not c.applies} == {"layout", "excluded", "frameworks"}


@pytest.mark.parametrize(("argv", "message"), [
    (["check", "nope"], "loss.name must be one of"),
    (["check", "dcl", "--reference", "no/such.txt:f"], "--reference"),
    (["check", planted("PositiveWeighted"), "--params", "[1]"], "loss.params must be a JSON object"),
    (["check", "dclw", "--params", '{"sigma": 2}'], "--params: the built-in loss dclw is checked at its defaults"),
])
def test_a_malformed_name_is_refused_in_one_line_before_any_process_starts(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


# The command: the rows in a process of their own, each within a time bound.

def run_command(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dcl_core.losses", "check", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)


@pytest.mark.slow  # the command's process and its child import torch (~5 s each)
@pytest.mark.parametrize(("loss", "row", "needle"), [
    (f"{HERE / 'planted_exit_at_import.py'}:Loss", "loading the loss", "exit status 0"),
    (planted("ExitsInInit"), "loading the loss", "exit status 0"),
    (planted("ExitsInLoss"), "LossOutput", "exit status 0"),
    (planted("Hangs"), "LossOutput", "no result within 5 s"),
])
def test_a_loss_that_exits_or_hangs_fails_the_contract_and_exits_1(loss, row, needle):
    proc = run_command(loss, "--no-ddp", "--timeout", "5")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    failing = next(line for line in lines if line.startswith("contract"))
    assert row in failing and "FAIL" in failing and needle in failing, proc.stdout
    assert lines[-1].endswith("checks failed (contract, others): see the rows marked FAIL"), proc.stdout


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


@pytest.mark.slow  # the command's process and its child import torch (~5 s each)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_sigterm_ends_the_check_with_its_child_in_one_line():
    """Issue reproduction: SIGTERM ended the command where it stood, and its child (the user's loss, in a session
    of its own) ran on, orphaned, with its temporary folder."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "dcl_core.losses", "check", planted("Hangs"), "--no-ddp",
                             "--timeout", "60"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (children := _children(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert children, "the check started no child"
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err == "interrupted (SIGTERM)\n" and out == "", (proc.returncode, err)
    time.sleep(0.5)
    for child in children:
        assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2], \
            f"child {child} outlived the check"


@pytest.mark.slow  # the command's processes, 2 gloo ranks among them
def test_the_command_prints_the_table_and_its_summary_and_exits_0_or_1():
    proc = run_command(planted("PositiveWeighted"), "--params", '{"positive_weight": 2}')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout and "ddp " in proc.stdout
    assert "checks hold; the equation itself is unchecked: give --reference" in proc.stdout.splitlines()[-1]
    proc = run_command(planted("DebiasedCountFromWidth"), "--no-ddp")
    assert proc.returncode == 1 and "layout" in proc.stdout and "FAIL" in proc.stdout


@pytest.mark.slow  # the command's process and its child
@pytest.mark.parametrize(("argv", "message"), [
    (["no_such_module_xyz:Loss"], "importing no_such_module_xyz failed: ModuleNotFoundError"),
    ([planted("Missing")], "has no Missing"),
    ([planted("positive_weighted_reference")], "must be a subclass of dcl_core.losses.ContrastiveLoss"),
    ([planted("PositiveWeighted"), "--params", '{"weight": 1}'], "does not take"),
    (["dcl", "--reference", "no_such_module_xyz:f"], "--reference=no_such_module_xyz:f: importing"),
])
def test_a_loss_that_cannot_be_loaded_is_one_line_and_exit_2(argv, message):
    proc = run_command(*argv, "--no-ddp")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert proc.stdout == ""


@pytest.mark.slow  # spawns 2 gloo processes a loss
@pytest.mark.parametrize(("loss", "params", "ok"), [
    ("dcl", "{}", True),
    ("align_uniform", "{}", True),  # its own forward: the whole loss on every rank
    (planted("PositiveWeighted"), '{"positive_weight": 0.5}', True),
    ("lightly.loss:DCLLoss", "{}", True),  # lightly gathers with its own gather_distributed
    (planted("LocalNegatives"), "{}", False),
    # a rank that ends by a signal after both saved their results (gloo's teardown under load): the results stand
    (planted("AbortsAtTeardown"), "{}", True),
])
def test_ddp_two_gloo_processes_equal_one_on_the_full_batch(loss, params, ok):
    ddp = next(c for c in check(loss, params, ddp=True) if c.name == "ddp")
    assert ddp.ok is ok, ddp


@pytest.mark.slow  # spawns 2 gloo processes
def test_a_rank_that_ends_before_its_result_fails_the_ddp_row_and_says_how():
    ddp = next(c for c in check(planted("AbortsInDDP"), ddp=True) if c.name == "ddp")
    assert not ddp.ok and "SIGABRT" in ddp.detail, ddp


def documented_checks() -> list[str]:
    """Every `python -m dcl_core.losses check ...` line of docs/own-loss.md's code blocks."""
    text = (REPO / "docs" / "own-loss.md").read_text()
    blocks = re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)
    return [line.strip() for block in blocks for line in block.splitlines()
            if line.strip().startswith("python -m dcl_core.losses check")]


def test_the_page_shows_the_checks_it_describes():
    commands = documented_checks()
    assert any("--reference docs/examples/my_losses_reference.py:positive_weighted" in c for c in commands)
    assert any("lightly.loss:DCLLoss" in c for c in commands)


@pytest.mark.slow  # each documented command as written: its processes import torch, and 2 gloo ranks
@pytest.mark.parametrize("command", documented_checks())
def test_each_documented_check_runs_as_written_and_holds(command):
    if "lightly" in command and importlib.util.find_spec("lightly") is None:
        pytest.skip("lightly comes with the bench extra")
    argv = shlex.split(command)
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=REPO, text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.splitlines()[-1]
    assert " checks hold" in last and "FAIL" not in proc.stdout, proc.stdout
    if "--reference" in command:
        assert "its value and gradient equal docs/examples/my_losses_reference.py:positive_weighted's" in last


def test_the_page_states_each_tolerance_and_bound_the_code_uses():
    from dcl_core.losscheck.ddp import TOL_DDP
    from dcl_core.losscheck.isolation import STEP_TIMEOUT_S
    from dcl_core.losscheck.properties import FD_DIRECTIONS, FD_STEP, GRADIENT_FLOOR, TOL_BF16, TOL_EXACT, TOL_GRADIENT
    from dcl_core.losscheck.reference import REFERENCE_FLOOR, TOL_REFERENCE
    from dcl_core.losses.__main__ import build_parser

    def sci(x: float) -> str:  # as the page writes 1e-5
        return f"{x:.0e}".replace("e-0", "e-")

    text = (REPO / "docs" / "own-loss.md").read_text()
    rows = dict(re.findall(r"^\| (\w[\w ]*?) \| .*? \| ([^|]*) \|$", text, re.M))
    assert {k: rows[k] for k in ("finite bf16", "permutation", "gradient", "layout", "excluded", "frameworks",
                                 "reference", "ddp")} == {
        "finite bf16": f"{sci(TOL_BF16)} relative", "permutation": sci(TOL_EXACT), "gradient": sci(TOL_GRADIENT),
        "layout": sci(TOL_EXACT), "excluded": sci(TOL_EXACT), "frameworks": sci(TOL_EXACT),
        "reference": sci(TOL_REFERENCE), "ddp": sci(TOL_DDP)}
    assert f"step {sci(FD_STEP)}·τ, Richardson-extrapolated) along {FD_DIRECTIONS} random directions" in text
    assert f"+ {GRADIENT_FLOOR:g}/τ" in text and f"+ {sci(REFERENCE_FLOOR)}/τ" in text
    assert f"({STEP_TIMEOUT_S:g} s a property)" in text
    assert build_parser().parse_args(["check", "dcl"]).timeout == STEP_TIMEOUT_S


def test_shuffled_rows_hold_the_same_negatives_in_another_order():
    from dcl_core.losscheck.layout import shuffled
    from dcl_core.losses import two_view_similarities

    sims = two_view_similarities(*ref.random_pair(5, 4, seed=3)).compact()
    mixed = shuffled(sims)
    assert not torch.equal(mixed.neg, sims.neg)
    torch.testing.assert_close(mixed.neg.sort(dim=1).values, sims.neg.sort(dim=1).values, rtol=0, atol=0)
