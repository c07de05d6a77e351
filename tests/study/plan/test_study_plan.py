"""A study request prepared once (:func:`dcl_core.study.plan.study_plan.prepare_plan`): a round of
``--until-resolved`` (``plan.next_round(n)``) is exactly the study a resume at ``n`` seeds per cell prepares from
scratch, without making the plan's checks again; a dry run and a re-analysis plan nothing to run. No Ray here: the
plan's floor never imports it (tests/test_layering.py)."""

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest

from dcl_core.config import ConfigError, InputError
from dcl_core.study.cli.options import build_parser, request_of
from dcl_core.study.plan import prepared, study_plan
from dcl_core.study.plan.run_options import Resources
from dcl_core.study.plan.script import Script
from dcl_core.study.plan.study_plan import prepare_plan
from tests.cifar10_present import cifar10_present

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "docs" / "examples" / "my_losses.py"
pytestmark = pytest.mark.skipif(not cifar10_present(), reason="a study's plan checks its data: needs CIFAR-10")


def script(name="temperature_sweep"):
    spec = importlib.util.spec_from_file_location(f"plan_{name}", REPO / "studies" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Script(module.__doc__, name, module.build_spec, tuple(module.PRESETS))


def planned(tmp_path, *argv, name="temperature_sweep"):
    s = script(name)
    ns = build_parser(s.doc, s.name, s.presets).parse_args(["--output-dir", str(tmp_path / "out"), *argv])
    return prepare_plan(s, request_of(ns))


ROUNDS = ("--smoke", "--seeds", "2", "--until-resolved", "--max-seeds", "4", "--seeds-per-round", "1")


def test_a_round_is_the_resume_at_its_seeds_prepared_from_scratch(tmp_path):
    plan = planned(tmp_path, *ROUNDS, "--losses", f"{EXAMPLE}:PositiveWeighted,dcl")
    assert plan.study is not None and not plan.dry_run and plan.spec.design is not None
    assert plan.study.spec.loss_sources  # the user loss, checked once
    for seeds in (3, 4):
        got = plan.next_round(seeds)
        args = replace(plan.args, seeds=seeds)
        resumed = replace(plan.options, command=plan.script.command(args), resume=True, overwrite=False)
        fresh = prepared.prepare(plan.script.build(args, plan.data_root), resumed)
        assert got == fresh
        assert got.options.command["seeds"] == seeds and got.options.command["design"] == plan.args.design


def test_a_round_makes_none_of_the_plans_checks_again(tmp_path, monkeypatch):
    plan = planned(tmp_path, *ROUNDS, "--losses", f"{EXAMPLE}:PositiveWeighted,dcl")
    for name in ("check_user_losses", "check_output"):
        monkeypatch.setattr(prepared, name, lambda *a, _name=name, **k: pytest.fail(f"{_name} ran again"))
    monkeypatch.setattr(Resources, "check_fits", lambda *a, **k: pytest.fail("check_fits ran again"))
    assert plan.next_round(3).spec.base.loss.name == plan.study.spec.base.loss.name


def test_a_dry_run_and_a_reanalysis_plan_nothing_to_run(tmp_path):
    dry = planned(tmp_path, "--smoke", "--dry-run")
    assert dry.study is None and dry.dry_run[0].startswith("dry run of study temperature_sweep (preset smoke")
    assert not (tmp_path / "out").exists()  # nothing written
    again = planned(tmp_path, "--smoke", "--reanalyze", "--compare", "dcl,infonce")
    assert again.study is None and not again.dry_run and again.recorded == {} and not again.another_question


def test_the_plans_design_is_recorded_with_its_command(tmp_path):
    plan = planned(tmp_path, *ROUNDS)
    assert plan.options.command == plan.script.command(plan.args)
    assert plan.args.design == study_plan.rounds.to_record(plan.spec.design)
    assert plan.spec.design.looks == (2, 3, 4)


def test_a_resume_reads_the_study_s_record_once(tmp_path, monkeypatch):
    """Its seeds, its design, the rounds it ran and where it ran (a moved folder's check) come from one reading of
    ``study_options.json``, for a dry run and for the run itself (it was read three times, by three functions that
    each opened and checked it, then twice: the moved folder's check opened it again)."""
    from dcl_core.study.plan import record, storage

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # this test's signing key
    first = planned(tmp_path, *ROUNDS)
    path = storage.summary_dir(tmp_path / "out", "temperature_sweep") / storage.OPTIONS_FILE
    path.parent.mkdir(parents=True)
    command = {**first.options.command, "seeds": 3}
    record.write_record(path, {"spec": {}, "command": command, "seed_rounds": [[0, 1], [2]],
                               "output_dir": str((tmp_path / "out").resolve())})
    reads = []
    real = storage.read_bounded
    monkeypatch.setattr(storage, "read_bounded", lambda p, n: reads.append(Path(p)) or real(p, n))
    for dry_run in (("--dry-run",), ()):
        reads.clear()
        plan = planned(tmp_path, *ROUNDS, "--resume", *dry_run)
        assert reads == [path.resolve()]
        assert plan.args.seeds == 3 and plan.spec.design.looks == (2, 3, 4)


def test_a_resume_of_a_moved_folder_is_refused_before_the_spec_is_built(tmp_path, monkeypatch):
    """A real ``--resume`` of a folder moved here from where it ran (its own Tune storage) is one line before the
    spec is built, so before ``--download`` fetches anything (it was refused last, after the data and every other
    check); a dry run still prints what the study would run."""
    from dcl_core.study.plan import record, storage

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # this test's signing key
    first = planned(tmp_path, "--smoke")
    path = storage.summary_dir(tmp_path / "out", "temperature_sweep") / storage.OPTIONS_FILE
    path.parent.mkdir(parents=True)
    ran_in = tmp_path / "where_it_ran"
    record.write_record(path, {"spec": {}, "command": first.options.command, "seed_rounds": [[0, 1]],
                               "output_dir": str(ran_in), "storage": str(ran_in / "ray_results")})
    assert planned(tmp_path, "--smoke", "--resume", "--dry-run").dry_run
    monkeypatch.setattr(Script, "build", lambda *a, **k: pytest.fail("the spec was built"))
    with pytest.raises(ConfigError, match=f"^--resume: study temperature_sweep ran in {ran_in} "):
        planned(tmp_path, "--smoke", "--resume", "--download")


@pytest.mark.parametrize("doing", [("--resume",), ("--resume", "--dry-run"), ("--reanalyze",)])
def test_continuing_a_study_another_script_ran_is_refused_before_the_spec_is_built(tmp_path, monkeypatch, doing):
    """``batch_size_sweep.py --resume --name temperature_sweep`` was refused only under the study's lock, after
    the spec, the data, the user losses' checks and Ray's start (a re-analysis: after the spec); now one line before
    the spec is built, as a moved folder is, and a dry run says the same: the run it shows would be refused."""
    from dcl_core.study.plan import record, storage

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # this test's signing key
    first = planned(tmp_path, "--smoke")
    path = storage.summary_dir(tmp_path / "out", "temperature_sweep") / storage.OPTIONS_FILE
    path.parent.mkdir(parents=True)
    record.write_record(path, {"spec": {}, "command": first.options.command, "seed_rounds": [[0, 1]],
                               "output_dir": str((tmp_path / "out").resolve())})
    monkeypatch.setattr(Script, "build", lambda *a, **k: pytest.fail("the spec was built"))
    with pytest.raises(ConfigError, match=rf"^{doing[0]}: study temperature_sweep in .* was run by "
                                          r"studies/temperature_sweep\.py, not studies/batch_size_sweep\.py;"):
        planned(tmp_path, "--smoke", *doing, "--name", "temperature_sweep", name="batch_size_sweep")


def test_a_script_that_names_its_study_otherwise_than_name_is_one_line_before_anything(tmp_path):
    """A copied script whose build_spec writes its own name (not ``args.name``) would record its study under one
    name and look for it under another on --resume and `answer`: refused, saying what to pass."""
    s = script()
    own = replace(s, build_spec=lambda args: replace(s.build_spec(args), name="my_sweep"))
    ns = build_parser(s.doc, s.name, s.presets).parse_args(["--output-dir", str(tmp_path / "out"), "--smoke"])
    with pytest.raises(ConfigError, match=r"named its study 'my_sweep', not 'temperature_sweep' .*name=args\.name"):
        prepare_plan(own, request_of(ns))
    assert not (tmp_path / "out").exists()
    assert planned(tmp_path, "--smoke", "--name", "other", "--dry-run").spec.name == "other"


def test_what_the_command_line_alone_decides_is_refused_before_the_folders_are_looked_at(tmp_path):
    """The plan's checks run in one order, so a command with two faults names the same one each time: a trial no
    local Ray fits (the options alone) before an unusable output folder, and an unusable ``--storage`` before a
    link planted where the study writes."""
    (tmp_path / "a_file").write_text("not a folder")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "ray_results").symlink_to(tmp_path)
    cases = [
        (["--output-dir", str(tmp_path / "a_file" / "x"), "--num-cpus", "1", "--workers", "2"], "one trial needs 2.01"),
        (["--output-dir", str(linked), "--storage", str(tmp_path / "a_file")],
         "^storage .*a_file is a file, not a folder$"),  # the storage's line, not the output folder's
        (["--output-dir", str(linked)], "ray_results is a symbolic link"),
    ]
    s = script()
    for argv, first in cases:
        ns = build_parser(s.doc, s.name, s.presets).parse_args(["--smoke", *argv])
        with pytest.raises(ConfigError, match=first):
            prepare_plan(s, request_of(ns))


@pytest.mark.parametrize("dry_run", [False, True])
def test_an_output_folder_the_filesystem_cannot_hold_is_refused_in_one_line(tmp_path, dry_run):
    """Issue reproduction: a name of the folder longer than the filesystem's 255 bytes gave a traceback
    (ENAMETOOLONG from ``Path.exists`` under an existing folder; from the lock's ``mkdir`` under a missing one,
    which left that folder behind). A path leaving the study's own files too little of PATH_MAX is refused too."""
    long = "a" * 300
    deep = Path(tmp_path, "b" * 200, *(["d"] * 1600))  # every name short, the path ~3,400 bytes
    cases = [(tmp_path / long, f"^{tmp_path}/{long}: a name in it is longer than its filesystem allows$"),
             (tmp_path / "missing" / long / "x",
              f"^--output-dir {tmp_path}/missing/{long}/x: a name of 300 bytes, longer than the 255 its filesystem "
              "allows$"),
             (deep, f"^--output-dir {tmp_path}/.*: a path of \\d+ bytes leaves the study's own files too little of "
                    "the system's 4096: pass a shorter one$")]
    s = script()
    for out, why in cases:
        ns = build_parser(s.doc, s.name, s.presets).parse_args(
            ["--smoke", "--output-dir", str(out), *(["--dry-run"] if dry_run else [])])
        with pytest.raises(ConfigError, match=why):
            prepare_plan(s, request_of(ns))
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing made on the way


def test_a_loop_of_links_given_as_a_path_is_refused_in_one_line(tmp_path):
    """Issue reproduction: ``--output-dir``, ``--storage`` or ``--data-root`` naming a loop of links (``ln -s b a;
    ln -s a b``) gave Python's ``RuntimeError: Symlink loop`` traceback; so did a user loss's file."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    loop = tmp_path / "a"
    s = script()
    for argv in (["--output-dir", str(loop / "x")], ["--output-dir", str(loop), "--dry-run"],
                 ["--storage", str(loop)], ["--data-root", str(loop)]):
        ns = build_parser(s.doc, s.name, s.presets).parse_args(["--smoke", "--output-dir", str(tmp_path / "o"), *argv])
        with pytest.raises(ConfigError, match=f"^{loop}.*: its symbolic links lead into a loop: not followed$"):
            prepare_plan(s, request_of(ns))
    (tmp_path / "l.py").symlink_to(tmp_path / "l.py")
    ns = build_parser(s.doc, s.name, s.presets).parse_args(
        ["--smoke", "--output-dir", str(tmp_path / "o"), "--losses", f"{tmp_path}/l.py:MyLoss,dcl"])
    with pytest.raises(InputError, match=r"l\.py:MyLoss: its symbolic links lead into a loop: not followed$"):
        prepare_plan(s, request_of(ns))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("dry_run", [(), ("--dry-run",)])
def test_an_unusable_output_folder_is_refused_before_a_user_loss_s_pre_flight(tmp_path, monkeypatch, dry_run):
    """The pre-flight of a user loss starts a process that imports torch (seconds); the folder's checks take none.
    An output folder that is a file was refused only after that process had run."""
    (tmp_path / "a_file").write_text("not a folder")
    monkeypatch.setattr(prepared, "preflight_isolated", lambda *a, **k: pytest.fail("the pre-flight ran first"))
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        planned(tmp_path, "--smoke", "--losses", f"{EXAMPLE}:PositiveWeighted,dcl", "--output-dir",
                str(tmp_path / "a_file"), *dry_run)


def test_a_dry_run_checks_a_user_loss_as_the_run_does(tmp_path):
    """Issue reproduction: ``--dry-run --losses dcl,no_such_module:Loss`` (or a file with a syntax error) printed
    its plan and exited 0; the real run refused it in one line. The dry run now makes the same check; a good loss
    passes it."""
    (tmp_path / "broken.py").write_text("def oops(:\n")
    s = script()
    for losses, why in ((f"dcl,{tmp_path}/broken.py:L", "importing .*broken.py failed: SyntaxError"),
                        ("dcl,no_such_module_xyz:L", "importing no_such_module_xyz failed: ModuleNotFoundError")):
        ns = build_parser(s.doc, s.name, s.presets).parse_args(
            ["--smoke", "--dry-run", "--output-dir", str(tmp_path / "o"), "--losses", losses])
        with pytest.raises(InputError, match=why):
            prepare_plan(s, request_of(ns))
    assert planned(tmp_path, "--smoke", "--dry-run", "--losses", f"dcl,{EXAMPLE}:PositiveWeighted").dry_run
    assert not (tmp_path / "o").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["--output-dir", "--storage"])
def test_a_study_writing_among_the_images_its_trials_read_is_refused(tmp_path, where):
    """Issue reproduction (a single run showed it): an output folder inside an ImageFolder's train/ or test/
    becomes one of its classes, or files among a class's images, for every later run on that data."""
    from PIL import Image

    for split in ("train", "test"):
        for c in ("a", "b"):
            (tmp_path / "data" / split / c).mkdir(parents=True)
            Image.new("RGB", (8, 8)).save(tmp_path / "data" / split / c / "0.png")
    s = script()
    inside = tmp_path / "data" / "test" / "runs"
    ns = build_parser(s.doc, s.name, s.presets).parse_args(
        ["--smoke", "--set", "data.dataset=imagefolder", "--data-root", str(tmp_path / "data"),
         "--output-dir", str(inside if where == "--output-dir" else tmp_path / "out"),
         *(["--storage", str(inside)] if where == "--storage" else [])])
    with pytest.raises(InputError, match=r"runs is inside the data's test/ folder"):
        prepare_plan(s, request_of(ns))
    assert not inside.exists()


@pytest.mark.parametrize("argv", [(), ("--download",), ("--dry-run", "--download"), ("--reanalyze",)])
def test_a_study_s_spec_is_built_and_validated_once(tmp_path, monkeypatch, argv):
    """The script's build_spec runs once and the spec is validated once, --download included (its spec was built,
    the data fetched, and the spec built and validated again with the fetched root)."""
    import dcl_core.data
    from dcl_core.data import resolve_data_root
    from dcl_core.study.plan import script as script_module

    monkeypatch.setattr(dcl_core.data, "fetch_dataset", lambda dataset, root: resolve_data_root(dataset, None, False))
    s = script()
    calls = []
    s = replace(s, build_spec=lambda args, _build=s.build_spec: calls.append("build") or _build(args))
    validate = script_module.validate_spec
    monkeypatch.setattr(script_module, "validate_spec", lambda spec: calls.append("validate") or validate(spec))
    ns = build_parser(s.doc, s.name, s.presets).parse_args(["--output-dir", str(tmp_path / "out"), "--smoke", *argv])
    prepare_plan(s, request_of(ns))
    assert calls == ["build", "validate"]


@pytest.mark.parametrize("argv", [(), ("--reanalyze",), ROUNDS[1:], (*ROUNDS[1:], "--dry-run")])
def test_the_command_s_record_is_made_once_with_its_final_arguments(tmp_path, monkeypatch, argv):
    """The plan records the command once on every path, when its arguments are final (with --until-resolved it
    was recorded after the build and again after the design): the record holds the design."""
    made = []
    command = Script.command
    monkeypatch.setattr(Script, "command", lambda self, args: made.append(args) or command(self, args))
    plan = planned(tmp_path, "--smoke", *argv)
    assert made == [plan.args] and plan.options.command == command(plan.script, plan.args)


def test_download_fetches_once_after_the_spec_s_checks_and_is_the_data_root(tmp_path, monkeypatch):
    """``--download``: the release is fetched once (trials only read it), after every check of the spec (a bad
    ``--set`` costs no download), and is then the study's data root in its arguments (what a resume repeats) and in
    every trial's config, as if given with ``--data-root``."""
    import dcl_core.data
    from dcl_core.data import resolve_data_root

    release = str(resolve_data_root("cifar10", None, False))  # the embedded CIFAR-10 stands for the fetched one
    fetched = []
    monkeypatch.setattr(dcl_core.data, "fetch_dataset", lambda dataset, root: fetched.append(dataset) or release)
    with pytest.raises(ConfigError, match=r"loss\.tau"):
        planned(tmp_path, "--smoke", "--download", "--set", "loss.tau=0.3")
    assert fetched == []
    plan = planned(tmp_path, "--smoke", "--download")
    assert fetched == ["cifar10"]
    assert plan.args.data_root == plan.data_root == plan.spec.base.data.root == release
    assert plan.options.command["data_root"] == release and not plan.spec.base.data.download


@pytest.mark.parametrize("workers", ["3", "64"])
def test_workers_that_do_not_split_the_batch_are_refused_in_one_line_before_ray(tmp_path, workers):
    """A trial's DDP workers share its batch (32 in the smoke preset): more workers than images in it, or a batch
    they do not divide, is what every trial would refuse at its start; the plan refuses it once, as a ConfigError
    (``--workers 64`` was a ZeroDivisionError's traceback, ``--workers 3`` a failure inside each trial and a dry run's
    estimate of trials that could not run)."""
    for dry_run in ((), ("--dry-run",)):  # a dry run's estimate split the batch too
        with pytest.raises(ConfigError, match=rf"optim\.batch_size=32 is not divisible by the {workers} DDP workers"):
            planned(tmp_path, "--smoke", "--workers", workers, "--num-cpus", "64", *dry_run)
    assert not (tmp_path / "out").exists()


def test_a_dry_run_measures_the_cpu_s_rate_once(tmp_path, monkeypatch):
    """``--until-resolved --dry-run`` estimates the study at its first look (the design's pace), at its worst case
    and as the dry run's own estimate: one measured rate for all three (each estimate measured it again, so one
    printout mixed three measurements of the same rate)."""
    from dcl_core.study.plan import flops

    measured = []
    real = flops.measure_flop_rate
    monkeypatch.setattr(flops, "measure_flop_rate", lambda *a, **k: measured.append(1) or real(*a, **k))
    plan = planned(tmp_path, "--smoke", "--seeds", "2", "--until-resolved", "--max-minutes", "30", "--dry-run")
    assert any("worst case" in line for line in plan.dry_run)
    assert len(measured) == 1
