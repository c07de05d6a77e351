"""A study's options are declared once (:class:`StudyArgs`' fields): the parser, the record, its validated replay and
the run's :class:`StudyOptions` all come from that declaration."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dcl_core.config import ConfigError
from dcl_core.study.cli.options import args_of, build_parser
from dcl_core.study.plan.args import MAX_SAMPLES, MAX_SEEDS, StudyArgs, args_from_record, check_bounds, options_of
from dcl_core.study.plan.spec import QUIET, StudyOptions

FIELDS = {f.name: f for f in dataclasses.fields(StudyArgs)}
RECORDED = [name for name, f in FIELDS.items() if f.metadata["record"]]


def test_every_declared_flag_is_parsed_into_its_field():
    parser = build_parser("doc", "temperature_sweep")
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    flagged = {name for name, f in FIELDS.items()
               if (f.metadata["flag"] and not f.metadata["only"]) or name == "tracking_uri"}
    assert dests == flagged  # no parser option without a field, no field with a flag left out
    only = {name for name, f in FIELDS.items() if f.metadata["only"]}  # the generic sweep's key and values
    extra = build_parser("doc", "sweep", extra=tuple(only))
    assert {a.dest for a in extra._actions if a.dest != "help"} == flagged | only
    args = args_of(parser.parse_args(["--seeds", "3", "--set", "optim.epochs=2", "--set", "seed=1", "--asha",
                                      "--max-minutes", "7.5", "-q", "--workers", "2"]))
    assert (args.seeds, args.set, args.asha, args.max_minutes, args.quiet, args.workers) == (
        3, ("optim.epochs=2", "seed=1"), True, 7.5, True, 2)
    assert args.name == "temperature_sweep"  # the script's name is the default


def test_every_recorded_option_replays_to_itself():
    given = StudyArgs(preset="smoke", search="optuna", num_samples=7, asha=True, losses="dcl,infonce", seeds=4,
                      data_root="/data", effect_of_interest=("std_difference=1.0",), set=("optim.epochs=2",),
                      name="mine", design={"first": 3, "max_seeds": 9, "looks": 3})
    record = given.record("temperature_sweep")
    assert record["script"] == "temperature_sweep" and set(record) == {"script", *RECORDED}
    replayed = args_from_record(record, StudyArgs(), "x")
    assert all(getattr(replayed, k) == getattr(given, k) for k in RECORDED)
    # what is not recorded (how and where it ran) comes from the base, never from the file
    assert args_from_record({**record, "workers": 9, "resume": True}, StudyArgs(), "x").workers == 1


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("seeds", 0, f"command.seeds must be a whole number in [1, {MAX_SEEDS}], got '0'"),
    ("seeds", True, "command.seeds must be a whole number"),
    ("num_samples", MAX_SAMPLES + 1, f"command.num_samples must be a whole number in [1, {MAX_SAMPLES}]"),
    ("preset", "x" * 41, "command.preset must be text of at most 40 characters"),
    ("search", "random", "command.search must be grid or optuna, got 'random'"),
    ("asha", "yes", "command.asha must be true or false"),
    ("set", "optim.epochs=2", "command.set must be a list of KEY=VALUE texts"),
    ("effect_of_interest", ["a=1"] * 65, "command.effect_of_interest must be a list of KEY=VALUE texts"),
    ("losses", 3, "command.losses must be text of at most 4096 characters"),
])
def test_a_recorded_value_is_checked_by_its_declaration(key: str, value: Any, needle: str):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("(", r"\(")):
        args_from_record({key: value}, StudyArgs(), "f.json")


def test_a_recorded_design_is_checked_by_the_design_s_own_rules():
    with pytest.raises(ConfigError):
        args_from_record({"design": {"first": 9, "max_seeds": 4, "step": 1}}, StudyArgs(), "f.json")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("seeds", 0, f"--seeds must be in [1, {MAX_SEEDS}], got 0"),
    ("seeds", MAX_SEEDS + 1, f"--seeds must be in [1, {MAX_SEEDS}], got {MAX_SEEDS + 1}"),
    ("num_samples", 0, f"--num-samples must be in [1, {MAX_SAMPLES}], got 0"),
])
def test_a_number_outside_its_declared_bounds_is_one_line(field: str, value: int, message: str):
    with pytest.raises(ConfigError) as err:
        check_bounds(StudyArgs(**{field: value}))
    assert str(err.value) == message
    check_bounds(StudyArgs(**{field: 1}))


def test_the_run_s_options_are_the_command_line_s_of_the_same_name():
    # StudyOptions declares no option of its own: each of its fields but the seed of the searches, the recorded
    # command and the console's verbosity (-q / -v) is a study option of the same name, with the same default
    own = {f.name for f in dataclasses.fields(StudyOptions)} - {"search_seed", "command", "verbosity"}
    assert own <= set(FIELDS)
    defaults = StudyOptions()
    assert {k: getattr(defaults, k) for k in own - {"output_dir", "gpus_per_worker"}} == {
        k: FIELDS[k].default for k in own - {"output_dir", "gpus_per_worker"}}
    assert str(defaults.output_dir) == FIELDS["output_dir"].default and FIELDS["gpus_per_worker"].default is None
    args = StudyArgs(output_dir="o", workers=2, cpus_per_worker=0.5, max_failures=0, asha=True, quiet=True)
    options = options_of(args)
    assert all(getattr(options, k) == getattr(args, k) for k in own - {"output_dir", "gpus_per_worker"})
    assert str(options.output_dir) == "o" and options.verbosity == QUIET
    with pytest.raises(ConfigError, match="--output-dir is empty"):
        options_of(StudyArgs(output_dir=" "))


@pytest.mark.parametrize(("argv", "gpus"), [([], 0.0), (["--preset", "smoke"], 0.0), (["--preset", "paper"], 1.0),
                                            (["--preset", "paper", "--gpus-per-worker", "0"], 0.0),
                                            (["--gpus-per-worker", "0.5"], 0.5)])
def test_the_paper_preset_plans_one_gpu_a_worker_unless_told_otherwise(argv: list[str], gpus: float):
    """--help says the paper preset's default is one GPU: the options (and so the dry run's plan) say the same."""
    parser = build_parser("doc", "temperature_sweep", ("smoke", "cpu", "paper"))
    assert options_of(args_of(parser.parse_args(argv))).gpus_per_worker == gpus
    assert "default: 1 with --preset paper" in " ".join(parser.format_help().split())


def test_the_calibrate_and_mi_toy_commands_refuse_bad_input_in_one_line(capsys):
    from dcl_core.study.cli.calibrate_command import calibrate_main
    from dcl_core.study.cli.mi_toy_command import toy_main

    with pytest.raises(SystemExit) as exit_:
        calibrate_main(["--studies", "many"])
    assert exit_.value.code == 2 and "invalid int value: 'many'" in capsys.readouterr().err
    presets = {"cpu": {"mis": (2.0,), "ks": (16,), "steps": 1, "repeats": 1, "seeds": 1}}
    assert toy_main("doc", presets, ["--alpha", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: --alpha must be > 0, got 0.0"]
