"""A study's options are declared once (:class:`StudyArgs`' fields, and its ``run``'s: :class:`StudyOptions`'): the
parser, the record, its validated replay and the run's options all come from that declaration."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from dcl_core.config import ConfigError
from dcl_core.study.cli.options import args_of, build_parser
from dcl_core.study.plan.args import MAX_SAMPLES, MAX_SEEDS, StudyArgs, args_from_record, check_bounds, option_fields
from dcl_core.study.plan.run_options import PROGRESS, QUIET, VERBOSE, StudyOptions

FIELDS = {f.name: f for f in option_fields()}
RECORDED = [f.name for f in dataclasses.fields(StudyArgs) if f.metadata.get("record")]


def test_every_declared_flag_is_parsed_into_its_field():
    parser = build_parser("doc", "temperature_sweep")
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    flagged = {name for name, f in FIELDS.items()
               if (f.metadata["flag"] and not f.metadata["only"]) or name == "tracking_uri"} | {"verbose", "quiet"}
    assert dests == flagged  # no parser option without a field, no field with a flag left out
    only = {name for name, f in FIELDS.items() if f.metadata["only"]}  # the generic sweep's key and values
    extra = build_parser("doc", "sweep", extra=tuple(only))
    assert {a.dest for a in extra._actions if a.dest != "help"} == flagged | only
    args = args_of(parser.parse_args(["--seeds", "3", "--set", "optim.epochs=2", "--set", "seed=1", "--asha",
                                      "--max-minutes", "7.5", "-q", "--workers", "2"]))
    assert (args.seeds, args.set, args.run.asha, args.max_minutes, args.run.verbosity, args.run.workers) == (
        3, ("optim.epochs=2", "seed=1"), True, 7.5, QUIET, 2)
    assert args.name == "temperature_sweep"  # the script's name is the default


def test_each_option_is_declared_once():
    # a run option is a field of StudyOptions only, what to run a field of StudyArgs only: none in both, and none
    # recorded both in the record's command and among its run options
    own, run = {f.name for f in dataclasses.fields(StudyArgs)}, {f.name for f in dataclasses.fields(StudyOptions)}
    assert own & run == set() and "run" in own
    assert set(RECORDED) & set(StudyOptions().to_json_dict()) == set()
    assert len(FIELDS) == len(own) - 1 + len(run)


def test_every_recorded_option_replays_to_itself():
    given = StudyArgs(preset="smoke", search="optuna", num_samples=7, losses="dcl,infonce", seeds=4,
                      data_root="/data", effect_of_interest=("std_difference=1.0",), set=("optim.epochs=2",),
                      name="mine", design={"first": 3, "max_seeds": 9, "looks": 3})
    record = given.record("temperature_sweep")
    assert record["script"] == "temperature_sweep" and set(record) == {"script", *RECORDED}
    replayed = args_from_record(record, StudyArgs(), "x")
    assert all(getattr(replayed, k) == getattr(given, k) for k in RECORDED)
    # what is not recorded in the command (how and where it ran) comes from the base, never from the file
    replayed = args_from_record({**record, "workers": 9, "resume": True, "asha": True}, StudyArgs(), "x")
    assert replayed.run == StudyOptions()


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("seeds", 0, f"command.seeds must be a whole number in [1, {MAX_SEEDS}], got '0'"),
    ("seeds", True, "command.seeds must be a whole number"),
    ("num_samples", MAX_SAMPLES + 1, f"command.num_samples must be a whole number in [1, {MAX_SAMPLES}]"),
    ("preset", "x" * 41, "command.preset must be text of at most 40 characters"),
    ("search", "random", "command.search must be grid or optuna, got 'random'"),
    ("name", 3, "command.name must be text of at most 4096 characters"),
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


@pytest.mark.parametrize(("argv", "run"), [
    ([], StudyOptions()),
    (["--smoke"], StudyOptions(output_dir=Path("outputs/smoke"))),
    (["--output-dir", "o", "--workers", "2", "--cpus-per-worker", "0.5", "--max-failures", "0", "--asha", "-q"],
     StudyOptions(output_dir=Path("o"), workers=2, cpus_per_worker=0.5, max_failures=0, asha=True, verbosity=QUIET)),
    (["-v"], StudyOptions(verbosity=VERBOSE)),
    (["-v", "-q"], StudyOptions(verbosity=QUIET)),  # the quieter wins
])
def test_the_command_line_s_run_options_are_the_study_s_options(argv: list[str], run: StudyOptions):
    assert args_of(build_parser("doc", "temperature_sweep").parse_args(argv)).run == run
    assert StudyOptions().verbosity == PROGRESS


def test_an_empty_output_folder_is_one_line():
    with pytest.raises(ConfigError, match="--output-dir is empty"):
        args_of(build_parser("doc", "temperature_sweep").parse_args(["--output-dir", " "]))


def test_a_re_analysis_replays_the_recorded_asha_and_checks_it(tmp_path):
    from dcl_core.study.cli.answer_command import _load_script, reanalyze_recorded

    script = _load_script("temperature_sweep")
    command = StudyArgs(preset="smoke", name="temperature_sweep").record("temperature_sweep")
    with pytest.raises(ConfigError, match="asha must be true or false"):
        reanalyze_recorded(script, {"command": command, "asha": "yes"}, tmp_path, None, quiet=True)



@pytest.mark.parametrize("asha", [True, False])
def test_a_re_analysis_runs_with_the_recorded_asha_and_its_own_folder(tmp_path, monkeypatch, asha):
    from dcl_core.study.cli import answer_command

    script = answer_command._load_script("temperature_sweep")
    command = StudyArgs(preset="smoke", search="optuna", name="temperature_sweep").record("temperature_sweep")
    asked = []
    monkeypatch.setattr(answer_command, "run_request", lambda _script, request: asked.append(request) or 0)
    answer_command.reanalyze_recorded(script, {"command": command, "asha": asha, "output_dir": "/elsewhere"},
                                      tmp_path, "sqlite:///x.db", quiet=True)
    (request,) = asked
    assert request.args.reanalyze and request.args.search == "optuna" and request.args.preset == "smoke"
    assert request.options == StudyOptions(output_dir=tmp_path, tracking_uri="sqlite:///x.db", asha=asha,
                                           verbosity=QUIET)  # never the recorded folder


@pytest.mark.parametrize(("argv", "gpus"), [([], 0.0), (["--preset", "smoke"], 0.0), (["--preset", "paper"], 1.0),
                                            (["--preset", "paper", "--gpus-per-worker", "0"], 0.0),
                                            (["--gpus-per-worker", "0.5"], 0.5)])
def test_the_paper_preset_plans_one_gpu_a_worker_unless_told_otherwise(argv: list[str], gpus: float):
    """--help says the paper preset's default is one GPU: the options (and so the dry run's plan) say the same."""
    parser = build_parser("doc", "temperature_sweep", ("smoke", "cpu", "paper"))
    assert args_of(parser.parse_args(argv)).run.gpus_per_worker == gpus
    assert "default: 1 with --preset paper" in " ".join(parser.format_help().split())


def test_the_calibrate_and_mi_toy_commands_refuse_bad_input_in_one_line(capsys):
    from dcl_core.study.cli.calibrate_command import calibrate_main
    from dcl_core.study.cli.mi_toy_command import toy_main

    with pytest.raises(SystemExit) as exit_:
        calibrate_main(["--studies", "many"])
    assert exit_.value.code == 2 and "invalid int value: 'many'" in capsys.readouterr().err
    # a ZeroDivisionError's or numpy's traceback, or a run of 10^9 studies without end, before
    for argv, line in ((["--studies", "0"], "--studies must be 1 to 100,000, got 0"),
                       (["--studies", "1000000000"], "--studies must be 1 to 100,000, got 1000000000"),
                       (["--studies", "1", "--seed", "-1"], "--seed must be >= 0 (numpy's seed), got -1")):
        assert calibrate_main(argv) == 2
        assert capsys.readouterr().err == f"error: {line}\n"
    presets = {"cpu": {"mis": (2.0,), "ks": (16,), "steps": 1, "repeats": 1, "seeds": 1}}
    for alpha in ("0", "inf", "nan"):
        assert toy_main("doc", presets, ["--alpha", alpha]) == 2
        assert capsys.readouterr().err == f"error: --alpha must be a finite number > 0, got {float(alpha)}\n"


def test_help_lists_each_option_once_in_its_section_s_order():
    from dcl_core.study.plan.option_fields import GROUPS

    text = build_parser("doc", "temperature_sweep").format_help()
    assert [t for t in text.splitlines() if t.rstrip(":") in GROUPS] == [f"{g}:" for g in GROUPS]
    flags = [f.metadata["flag"] for f in option_fields() if f.metadata["flag"] and not f.metadata["only"]]
    assert all(len(re.findall(rf"^ +(?:-\w, )?{flag}(?=[ \n])", text, re.M)) == 1 for flag in flags)


@pytest.mark.parametrize("flag", ["--data-root", "--storage", "--losses"])
def test_an_empty_path_or_loss_list_is_refused_not_read_as_the_default(flag):
    """Issue reproduction: ``--data-root ''`` (so ``--storage ''``, ``--losses ''``) silently meant the default,
    where ``--set data.root=`` and ``--output-dir ''`` are refused; a smoke study then trained on the default data."""
    parser = build_parser("doc", "temperature_sweep", ("smoke", "cpu", "paper"))
    for empty in ("", "  "):
        with pytest.raises(ConfigError, match=f"^{flag} is empty; name one, or leave {flag} out for the default$"):
            args_of(parser.parse_args(["--smoke", flag, empty]))
    args_of(parser.parse_args(["--smoke", flag, "dcl" if flag == "--losses" else "/x"]))  # given: fine
