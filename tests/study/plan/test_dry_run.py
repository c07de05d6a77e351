"""``--dry-run``: a study prints its trials, totals and an estimated cost, then exits 0 having started nothing (no
Ray, no MLflow, no output folder); and the arithmetic of :mod:`dcl_core.study.plan.cost` on hand-made numbers."""

import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from dcl_core.config import apply_overrides, preset
from dcl_core.study.analysis import sequential
from dcl_core.study.cli.options import args_of, build_parser
from dcl_core.study.cli.script import main
from dcl_core.study.plan import cost
from dcl_core.study.plan import flops as flop_count
from dcl_core.study.plan.run_options import Resources
from dcl_core.study.plan.spec import StudySpec, grid_points, num_grid_points, tune_experiments
from dcl_core.training.builders import build_model
from search_spaces import Grid, LogUniform

REPO = Path(__file__).resolve().parents[3]
# (study, options): a grid and an Optuna study, each at the smoke and the paper preset. tau_lr_search's paper
# preset is ImageNet (absent here): the dry run still plans it, with ImageNet-1K's image counts.
RUNS = {
    "grid-smoke": ("temperature_sweep", ["--smoke"]),
    "grid-paper": ("temperature_sweep", ["--preset", "paper"]),
    "optuna-smoke": ("tau_lr_search", ["--smoke"]),
    "optuna-paper": ("tau_lr_search", ["--preset", "paper"]),
}
# Run as real subprocesses (`python studies/<name>.py ...`), which also shows that nothing imported Ray, MLflow
# or Optuna; the other two run in-process (importing torch twice more would double the test's time on 2 cores).
SUBPROCESS_RUNS = ("grid-smoke", "optuna-paper")
# Runs the study script as `python studies/<name>.py ...` would, then reports which heavy modules it loaded.
RUNNER = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as stop:
    code = stop.code
print("LOADED:", ",".join(m for m in ("ray", "mlflow", "optuna") if m in sys.modules))
sys.exit(code)
"""


def load(name):
    spec = importlib.util.spec_from_file_location(f"study_{name}", REPO / "studies" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected(name, argv):
    """(trials, epochs) of the study, counted from its spec: a grid point is a trial, a search runs num_samples."""
    module = load(name)
    parser = build_parser("", name)
    if name == "tau_lr_search":
        parser.set_defaults(search="optuna")
    spec = module.build_spec(args_of(parser.parse_args(argv)))
    trials = epochs = 0
    for exp in tune_experiments(spec):
        if spec.search is None:
            trials += num_grid_points(exp.grid)
            epochs += sum(apply_overrides(spec.base, p).optim.epochs for p in grid_points(exp.grid))
        else:
            trials += spec.num_samples
            epochs += spec.num_samples * apply_overrides(spec.base, exp.point).optim.epochs
    return trials, epochs


pytestmark = pytest.mark.xdist_group("dry_run")  # under pytest-xdist, one worker runs the module fixture dry_runs once


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """Every run of RUNS: (output folder, exit code, stdout, stderr). The subprocesses start together (each spends
    most of its time importing torch) and the in-process runs go while they import."""
    started = {}
    for key in SUBPROCESS_RUNS:
        name, argv = RUNS[key]
        out = tmp_path_factory.mktemp(key) / "out"
        cmd = [sys.executable, "-c", RUNNER, str(REPO / "studies" / f"{name}.py"), *argv, "--dry-run",
               "--output-dir", str(out)]
        env = {**os.environ, "RAY_ADDRESS": ""}
        started[key] = (out, subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True))
    done = {}
    for key in set(RUNS) - set(SUBPROCESS_RUNS):
        name, argv = RUNS[key]
        out = tmp_path_factory.mktemp(key) / "out"
        module = load(name)
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(module.__doc__, name, module.build_spec, argv=[*argv, "--dry-run", "--output-dir", str(out)],
                        defaults={"search": "optuna"} if name == "tau_lr_search" else None)
        done[key] = (out, code, stdout.getvalue(), stderr.getvalue())
    for key, (out, proc) in started.items():
        stdout, stderr = proc.communicate(timeout=180)
        done[key] = (out, proc.returncode, stdout, stderr)
    return done


@pytest.mark.slow  # dry_runs: 2 study scripts as subprocesses, 4 dry runs timing training steps (a CPU-minute)
@pytest.mark.parametrize("key", list(RUNS))
def test_dry_run_prints_the_trials_totals_and_an_estimate_and_starts_nothing(dry_runs, key):
    out, code, stdout, stderr = dry_runs[key]
    name, argv = RUNS[key]
    assert code == 0, stderr
    trials, epochs = expected(name, argv)
    total = re.search(r"^total: ([\d,]+) trials, ([\d,]+) epochs, ([\d,]+) training images", stdout, re.M)
    assert total, stdout
    assert int(total[1].replace(",", "")) == trials and int(total[2].replace(",", "")) == epochs
    assert sum(int(n) for n in re.findall(r"^experiment \S+: .*?(\d+) trials", stdout, re.M)) == trials
    assert "estimate" in stdout.lower() and "CPU, this machine:" in stdout and " min" in stdout
    assert f"{cost.GPU_NAME}'s {cost.GPU_PEAK_FLOPS / 1e12:g} TFLOP/s" in stdout
    assert f"{cost.GPU_UTILIZATION:.0%} utilization" in stdout and "GPU-hours" in stdout
    assert not out.exists()  # no output folder, so no lock file, MLflow store or Ray results
    assert f"writes: {out.resolve()} (--output-dir)" in stdout  # where the real run would write
    if name == "temperature_sweep":  # the smoke and paper presets: 1 seed per cell, which gives no interval
        assert "1 seed per cell: the verdict will have no interval, and so cannot resolve" in stdout
    if key in SUBPROCESS_RUNS:
        assert stdout.splitlines()[-1].strip() == "LOADED:"  # neither Ray nor MLflow nor Optuna was imported
    if name == "tau_lr_search":
        assert "Optuna TPE search" in stdout and "loss.temperature ~ log-uniform" in stdout
    if key == "optuna-paper":
        assert "assumed ImageNet-1K" in stdout
    # the paper preset's default is one GPU a worker, as --help says, and the plan says the same
    gpus = 1 if argv[-1] == "paper" else 0
    assert f"1 worker(s) x (1 CPU, {gpus} GPU)" in stdout
    if gpus and not torch.cuda.is_available():
        assert "a run on this machine would stop: --gpus-per-worker 1 needs GPUs" in stdout


@pytest.mark.slow  # dry_runs (see above)
def test_dry_run_lists_each_cell_with_its_seeds(dry_runs):
    stdout = dry_runs["grid-smoke"][2]
    cells = [line for line in stdout.splitlines() if line.startswith("  loss.name=")]
    assert len(cells) == 4 and all("seed 0: 1 epochs x 64 images, kNN 1x over 120 images" in c for c in cells)


def test_bad_input_still_exits_2_in_one_line_before_the_dry_run(tmp_path, capsys):
    module = load("temperature_sweep")
    for argv, message in ((["--seeds", "0"], "--seeds must be in"), (["--set", "optim.epochs=0"], "optim.epochs"),
                          (["--asha"], "--asha stops trials early")):
        code = main(module.__doc__, "temperature_sweep", module.build_spec,
                    argv=["--smoke", *argv, "--dry-run", "--output-dir", str(tmp_path / "out")])
        captured = capsys.readouterr()
        assert code == 2 and captured.out == "", captured.out
        assert captured.err.startswith("error: ") and message in captured.err and captured.err.count("\n") == 1
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------ cost.py, hand-made numbers


def test_flop_count_of_a_linear_layer_and_its_backward():
    layer = nn.Linear(10, 20, bias=False, device="meta")
    x = torch.empty(3, 10, device="meta", requires_grad=True)
    assert flop_count.count_flops(lambda: layer(x)) == 2 * 3 * 10 * 20
    # backward: the input's and the weight's gradients, each as costly as the forward
    assert flop_count.count_flops(lambda: layer(x).sum().backward()) == 3 * 2 * 3 * 10 * 20


def test_flops_scale_linearly_with_the_batch():
    cfg = preset("smoke")
    small = flop_count.model_flops(lambda: build_model(cfg), 32, batch=2)
    large = flop_count.model_flops(lambda: build_model(cfg), 32, batch=6)
    assert small == large  # per image: the count is exactly linear in the batch
    assert small.train_view > small.forward_view > small.backbone_forward > 0
    assert small.feature_dim == 512 // 8  # resnet18 at width 0.125


def test_training_flops_per_image_count_both_views_and_key_encoders():
    flops = flop_count.ModelFlops(train_view=10.0, forward_view=4.0, backbone_forward=3.0, feature_dim=8)
    assert flop_count.train_flops_per_image("simclr", flops) == 20.0
    assert flop_count.train_flops_per_image("nnclr", flops) == 20.0
    assert flop_count.train_flops_per_image("moco", flops) == flop_count.train_flops_per_image("simo", flops) == 28.0


def test_knn_evaluations_every_n_epochs_and_after_the_last():
    assert cost.knn_evaluations(8, 8) == 1
    assert cost.knn_evaluations(10, 3) == 4  # epochs 3, 6, 9 and 10
    assert cost.knn_evaluations(200, 10) == 20
    assert cost.knn_evaluations(5, 1) == 5


def test_trial_work_arithmetic():
    flops = flop_count.ModelFlops(train_view=10.0, forward_view=4.0, backbone_forward=3.0, feature_dim=8)
    sizes = cost.DataSizes(pretrain=100, bank=100, test=50, source="hand-made")
    work = cost.trial_work(epochs=5, batch_size=32, workers=1, sizes=sizes, knn_every=2, image_flops=20.0,
                           flops=flops)
    assert work.images_per_epoch == 96  # 3 full batches of 32; the last 4 images are dropped
    assert work.train_images == 480 and work.evaluations == 3 and work.eval_images == 150
    assert work.train_flops == 480 * 20.0
    assert work.eval_flops == 3 * (150 * 3.0 + 2 * 50 * 100 * 8)
    ddp = cost.trial_work(5, 32, 2, sizes, 2, 20.0, flops)  # 50 images per rank, 3 batches of 16
    assert ddp.images_per_epoch == 96


def test_total_epochs_of_a_grid_and_a_search():
    def fake_flops(cfg):
        return flop_count.ModelFlops(1.0, 1.0, 1.0, 1)

    def fake_sizes(cfg):
        return cost.DataSizes(64, 64, 10, "hand-made")

    base = preset("smoke")
    grid = StudySpec(name="s", base=base, x_key="seed", x_label="seed",
                     grid={"loss.name": Grid(("dcl", "infonce")), "optim.epochs": Grid((1, 3)), "seed": Grid((0, 1))})
    plans = cost.plan_study(grid, 1, fake_sizes, fake_flops)
    est = cost.estimate(plans, {cost.model_key(base): 1.0}, workers=1, slots=2, startup_s=0.0)
    assert est.trials == 8 and est.epochs == 2 * 2 * (1 + 3)
    assert [len(g.seeds) for g in plans[0].groups] == [2, 2, 2, 2]  # seeds grouped in their cell
    assert est.train_images == est.epochs * 64  # batch 32: 2 full batches of the 64 images
    search = StudySpec(name="s", base=base, x_key="seed", x_label="seed", grid={"loss.name": Grid(("dcl", "infonce"))},
                       search={"loss.temperature": LogUniform(0.1, 1.0)}, num_samples=5)
    est = cost.estimate(cost.plan_study(search, 1, fake_sizes, fake_flops), {cost.model_key(base): 1.0}, 1, 2, 0.0)
    assert est.trials == 2 * 5 and est.epochs == 2 * 5 * base.optim.epochs


def test_times_slots_and_gpu_hours():
    assert cost.makespan([3.0, 3.0, 3.0], 2) == 6.0
    assert cost.makespan([5.0, 1.0, 1.0, 1.0], 2) == 5.0
    assert cost.makespan([2.0, 2.0], 1) == 4.0
    assert cost.trial_slots(Resources(1, 1.0), cpus=2, max_concurrent=None) == 2
    assert cost.trial_slots(Resources(1, 1.0), cpus=2, max_concurrent=1) == 1
    assert cost.trial_slots(Resources(2, 1.0), cpus=2, max_concurrent=None) == 0  # + 0.01 CPU for the DDP trial
    assert cost.trial_slots(Resources(2, 1.0), cpus=5, max_concurrent=None) == 2
    assert cost.gpu_hours(cost.GPU_PEAK_FLOPS * cost.GPU_UTILIZATION * 3600) == pytest.approx(1.0)


def test_data_sizes_from_subsets_full_splits_and_folders(tmp_path):
    def counts(*args):
        sizes = cost.data_sizes(*args)
        return sizes.pretrain, sizes.bank, sizes.test

    assert counts("cifar10", None, 8, 4) == (80, 80, 40)
    assert counts("cifar100", None, 0, 0) == (50_000, 50_000, 10_000)
    assert counts("stl10", None, 10, 0) == (105_000, 100, 8_000)  # pretrains on train + unlabeled
    assert counts("imagefolder", str(tmp_path / "absent"), 0, 0) == cost.IMAGENET_SPLITS[:3]
    for split, per_class in (("train", 3), ("val", 2)):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(per_class):
                (tmp_path / split / c / f"{i}.png").touch()
    assert counts("imagefolder", str(tmp_path), 0, 0) == (6, 6, 4)
    assert counts("imagefolder", str(tmp_path), 1, 1) == (2, 2, 2)


def test_measured_rate_is_positive_and_restores_threads():
    threads = torch.get_num_threads()
    cfg = preset("smoke")
    flops = flop_count.model_flops(lambda: build_model(cfg), 32)
    rate = flop_count.measure_flop_rate(lambda: build_model(cfg), 32, views=4, flops_per_view=flops.train_view,
                                        threads=1, min_seconds=0.0, max_steps=1)
    assert rate.flops_per_second > 0 and rate.steps == 1 and rate.views == 4
    assert torch.get_num_threads() == threads


@pytest.mark.slow  # plans the last look by simulation: ~11 s
def test_until_resolved_dry_run_prints_the_looks_and_the_worst_case_of_the_caps(tmp_path):
    """``--until-resolved --dry-run``: the planned looks (from --max-minutes and the estimate when --max-seeds is
    not given), the nominal level of each look, the worst case in minutes, and nothing written."""
    module = load("temperature_sweep")

    def dry(*argv):
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = main(module.__doc__, "temperature_sweep", module.build_spec,
                        argv=["--smoke", "--seeds", "2", "--until-resolved", *argv, "--dry-run", "--output-dir",
                              str(tmp_path / "out")])
        assert code == 0
        return stdout.getvalue()

    fixed = dry("--max-seeds", "6", "--seeds-per-round", "2")
    assert "until resolved: looks at 2, 4, 6 seeds per cell; each look's bounds at a nominal one-sided" in fixed
    assert "all 3 looks together end ≤ 5% of null studies resolved and ≤ 5% of studies at δ ruling δ out" in fixed
    printed = re.search(r"one-sided ([\d.]+)%→([\d.]+)% \(paper's side\)", fixed)
    first, last = (float(v) / 100 for v in printed.groups())  # each look's tail rises to the last's
    design = sequential.GroupSequential(2, 6, step=2)
    assert first == pytest.approx(design.side(sequential.PAPER_SIDE_ERROR, 2).tail(0.025), rel=0.05)
    assert last == pytest.approx(design.side(sequential.PAPER_SIDE_ERROR, 6).tail(0.025), rel=0.05)
    assert first < last < sequential.PAPER_SIDE_ERROR
    worst = re.search(r"worst case \(no look resolves\): 6 seeds per cell, ~([\d.]+) min", fixed)
    assert worst and float(worst[1]) > 0
    timed = dry("--max-minutes", "3")  # 6 looks from 2 to what fits in 3 minutes
    looks = re.search(r"looks at 2, ([\d, ]+) seeds per cell", timed)
    assert looks and len(looks[1].split(", ")) == sequential.GROUP_LOOKS - 1 and int(looks[1].split(", ")[-1]) > 3
    assert "--max-minutes 3 stops it before any round" in timed
    # planned to fit 3 min; a second rate measurement (the worst case's) may differ on a busy machine
    assert float(re.search(r"worst case .*?, ~([\d.]+) min", timed)[1]) <= 3.0 * 1.5
    assert not (tmp_path / "out").exists()


def test_a_dry_run_says_when_the_real_run_would_be_refused_for_an_existing_study(tmp_path):
    """The study's output exists: the dry run says the command would be refused and what to add; with --resume or
    --overwrite it says nothing of it."""
    module = load("temperature_sweep")
    (tmp_path / "out" / "ray_results" / "temperature_sweep").mkdir(parents=True)  # what a first run leaves

    def dry(*argv):
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = main(module.__doc__, "temperature_sweep", module.build_spec,
                        argv=["--smoke", *argv, "--dry-run", "--output-dir", str(tmp_path / "out")])
        assert code == 0
        return stdout.getvalue()

    note = "this command would be refused; add --resume to continue it (with a larger --seeds: only its new seeds"
    assert note in " ".join(dry().split())
    assert "would be refused" not in dry("--resume") and "would be refused" not in dry("--overwrite")
