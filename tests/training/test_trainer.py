"""The trainer: its per-epoch accumulator, light package imports, and end-to-end single runs on the embedded
CIFAR-10 (smoke preset): metrics, determinism, resume, failures."""

import ast
import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cifar10_present import cifar10_present

import dcl_core.training
from dcl_core.config import ConfigError, apply_overrides, preset
from dcl_core.training import NonFiniteLossError, epoch, train, trainer
from dcl_core.training import runtime as runtime_module
from dcl_core.training.checkpoint import load_checkpoint
from dcl_core.training.epoch import EpochStats
from dcl_core.training.run_setup import build_run
from dcl_core.training.runtime import Runtime
from dcl_core.training.schedule import cosine_lr, steps_per_epoch

needs_cifar = pytest.mark.skipif(not cifar10_present(), reason="CIFAR-10 not present")


def smoke(tmp_path, **overrides):
    return apply_overrides(preset("smoke"), {"output_dir": str(tmp_path / "run"), "threads": 2, **overrides})


def test_cosine_schedule_hand_computed():
    # 1) warm-up: linear to the peak over 4 steps; 2) cosine from peak to floor over the remaining 10.
    assert [cosine_lr(s, 14, 1.0, warmup_steps=4) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert cosine_lr(4, 14, 1.0, warmup_steps=4) == pytest.approx(1.0)
    assert cosine_lr(9, 14, 1.0, warmup_steps=4) == pytest.approx(0.5)  # halfway through the decay
    assert cosine_lr(14, 14, 1.0, warmup_steps=4, min_ratio=0.1) == pytest.approx(0.1)
    assert cosine_lr(0, 10, 0.3) == pytest.approx(0.3)


def test_steps_per_epoch_match_the_distributed_sampler():
    # Full per-rank batches in each rank's drop_last shard; the CLI checks this before loading the data.
    for n, batch, world in [(160, 32, 1), (161, 32, 2), (10, 4, 4), (99, 8, 4), (64, 64, 2)]:
        shard = len(torch.utils.data.DistributedSampler(range(n), num_replicas=world, rank=0, drop_last=True))
        assert steps_per_epoch(n, batch, world) == shard // (batch // world)
    with pytest.raises(ConfigError, match=r"^160 pretraining images give no full batch of 4096; lower"):
        steps_per_epoch(160, 4096)
    for batch, world in [(32, 64), (32, 3)]:  # more ranks than images in a batch divided by zero
        with pytest.raises(ConfigError, match=rf"^optim\.batch_size={batch} is not divisible by the {world} DDP"):
            steps_per_epoch(160, batch, world)


def test_epoch_stats_hand_computed():
    # Two steps of 4 images in 2 s: losses 1 and 3, probe gradient norms 3 and 5, q_B of 3 anchors once.
    cpu = torch.device("cpu")
    stats = EpochStats(cpu)
    stats.add_gradients(torch.tensor(3.0, dtype=torch.float64), torch.tensor([0.11, 0.31, 0.99]))
    stats.add_losses({"loss": torch.tensor(1.0), "q_mean": torch.tensor(0.5)}, images=4, lr=0.2)
    stats.add_gradients(torch.tensor(5.0, dtype=torch.float64), None)
    stats.add_losses({"loss": torch.tensor(3.0), "q_mean": torch.tensor(0.75)}, images=4, lr=0.1)
    stats.seconds = 2.0
    metrics = stats.metrics(Runtime(rank=0, world_size=1, device=cpu, owns_process_group=False))
    assert metrics.pop("train/q_hist") == [1 / 3 if i in (4, 12, 39) else 0.0 for i in range(40)]
    assert metrics == {
        "train/loss": 2.0,
        "train/q_mean": 0.625,
        "train/images_per_s": 4.0,
        "train/grad_norm_mean": 4.0,
        "train/grad_norm_std": 1.0,  # sqrt((9 + 25) / 2 - 4^2)
        "train/grad_norm_cv": 0.25,
        "train/lr": 0.1,  # the last step's
    }
    # A loss without q_B (none seen all epoch): no histogram.
    empty = EpochStats(cpu)
    empty.add_losses({"loss": torch.tensor(1.0)}, images=2, lr=0.1)
    empty.add_gradients(torch.tensor(0.0, dtype=torch.float64), None)
    empty.seconds = 1.0
    assert "train/q_hist" not in empty.metrics(Runtime(0, 1, cpu, False))


@pytest.mark.slow  # a fresh interpreter: ~10 s
def test_importing_the_checkpoint_module_leaves_the_trainer_unimported():
    # dcl_core.study's tracking reads CHECKPOINT_NAME; that must not import models, losses and data code.
    code = (
        "import sys, dcl_core.training.checkpoint; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dcl_core'))"
    )
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo, timeout=60)
    loaded = ast.literal_eval(out.stdout.strip())
    assert "dcl_core.training.checkpoint" in loaded
    # Only the torch-free config (its errors) comes along.
    heavy = [m for m in loaded
             if m.split(".")[1:2] in (["models"], ["losses"], ["data"], ["eval"], ["study"], ["frameworks"])
             or (m.startswith("dcl_core.training.") and m != "dcl_core.training.checkpoint")]
    assert heavy == [], loaded
    # ... while the package still gives the trainer's names.
    assert dcl_core.training.train is trainer.train is train
    assert dcl_core.training.NonFiniteLossError is trainer.NonFiniteLossError is NonFiniteLossError
    with pytest.raises(AttributeError):
        dcl_core.training.no_such_name  # noqa: B018


@needs_cifar
@pytest.mark.parametrize("loss", ["dcl", "infonce"])
def test_smoke_run_reports_every_metric(tmp_path, loss):
    cfg = smoke(tmp_path, **{"loss.name": loss})
    result = train(cfg)
    assert len(result.history) == cfg.optim.epochs
    final = result.final
    for key in (
        "train/loss",
        "train/q_mean",
        "train/q_cv",
        "train/lr",
        "train/images_per_s",
        "eval/knn_top1",
    ):
        assert math.isfinite(final[key]), key
    assert 0.0 <= final["eval/knn_top1"] <= 100.0
    assert 0.0 < final["train/q_mean"] <= 1.0
    assert ("train/mi_bound" in final) == (loss == "infonce")
    # DCL Fig. 5: gradient-norm statistics of the last residual blocks' last convolutions.
    assert final["train/grad_norm_mean"] > 0 and final["train/grad_norm_std"] >= 0
    assert final["train/grad_norm_cv"] == pytest.approx(final["train/grad_norm_std"] / final["train/grad_norm_mean"])
    # DCL Fig. 1: the q_B histogram is a distribution whose binned mean is the epoch's q_mean (to half a bin).
    hist = final["train/q_hist"]
    assert len(hist) == 40 and sum(hist) == pytest.approx(1.0) and min(hist) >= 0
    binned_mean = sum((i + 0.5) / 40 * h for i, h in enumerate(hist))
    assert binned_mean == pytest.approx(final["train/q_mean"], abs=1 / 80 + 1e-6)
    lines = (result.output_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]
    state = load_checkpoint(result.output_dir / "checkpoint.pt")
    assert state["epoch"] == 2 and state["config"]["loss.name"] == loss


@needs_cifar
@pytest.mark.slow  # three training runs: ~11 s
def test_deterministic_given_seed_and_resume_is_exact(tmp_path):
    full = train(smoke(tmp_path / "a", **{"optim.epochs": 2}))
    again = train(smoke(tmp_path / "b", **{"optim.epochs": 2}))
    assert full.history[-1]["train/loss"] == again.history[-1]["train/loss"]

    # Train 1 epoch, then resume the same run to 2 epochs: identical weights to the uninterrupted run.
    first = smoke(tmp_path / "c", **{"optim.epochs": 2})
    with pytest.raises(KeyboardInterrupt):

        def stop_after_first(epoch, metrics, checkpoint):
            raise KeyboardInterrupt

        train(first, callbacks=[stop_after_first])
    assert load_checkpoint(tmp_path / "c" / "run" / "checkpoint.pt")["epoch"] == 1
    resumed = train(first, resume=True)
    assert len(resumed.history) == 2
    a = load_checkpoint(full.output_dir / "checkpoint.pt")["model"]
    b = load_checkpoint(resumed.output_dir / "checkpoint.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.history[-1]["train/loss"] == full.history[-1]["train/loss"]


@needs_cifar
def test_resume_refuses_a_different_config(tmp_path):
    train(smoke(tmp_path, **{"optim.epochs": 1}))
    with pytest.raises(ValueError, match=r"config differs in loss\.temperature"):
        train(smoke(tmp_path, **{"optim.epochs": 1, "loss.temperature": 0.3}), resume=True)


@needs_cifar
def test_nan_loss_stops_the_run(tmp_path):
    # An absurd learning rate blows the weights up; the run must stop with a clear error, not train on NaNs.
    cfg = smoke(tmp_path, **{"optim.base_lr": 1e30, "optim.epochs": 2})
    with pytest.raises(NonFiniteLossError, match="loss became"):
        train(cfg)


@needs_cifar
@pytest.mark.parametrize("loss", ["dclw", "dclw_exp", "eqco", "align_uniform"])
def test_every_loss_trains(tmp_path, loss):
    extra = {"loss.num_negatives": 16, "loss.alpha": 256.0} if loss == "eqco" else {}
    result = train(smoke(tmp_path, **{"loss.name": loss, "optim.epochs": 1, **extra}))
    assert math.isfinite(result.final["train/loss"])


@needs_cifar
def test_same_seed_gives_every_loss_the_same_init_and_data_order(tmp_path):
    # The studies pair DCL and InfoNCE trials by seed (dcl_core.study.analysis.intervals.paired_difference): that
    # pairing is only meaningful if a seed fixes the initial weights, the images, their order and their views
    # whatever the loss.
    runtime = Runtime(rank=0, world_size=1, device=torch.device("cpu"), owns_process_group=False)

    def start(loss, seed):
        run = build_run(smoke(tmp_path / f"{loss}{seed}", **{"loss.name": loss, "seed": seed}), runtime)
        run.sampler.set_epoch(0)
        order = list(run.sampler)
        gen = torch.Generator().manual_seed(trainer._epoch_seed(seed, 0, 0))
        n = run.derived.per_rank_batch
        views = next(iter(run.data.epoch_views([torch.tensor(order[:n])], gen, runtime.device)))
        return run.model.state_dict(), order, views

    weights, order, views = start("infonce", 0)
    for loss in ("dcl", "dclw", "eqco"):
        w, o, v = start(loss, 0)
        assert w.keys() == weights.keys() and all(torch.equal(w[k], weights[k]) for k in w)
        assert o == order
        assert all(torch.equal(a, b) for a, b in zip(v, views, strict=True))
    w, o, _ = start("infonce", 1)  # and a different seed changes them
    assert o != order and not all(torch.equal(w[k], weights[k]) for k in w)


def test_free_cpu_threads_leave_busy_cpus_alone():
    # 0 = auto: a loaded machine gets fewer threads (oversubscribed intra-op threads run several times slower).
    assert runtime_module.free_cpu_threads(cpus=2, busy=0.0) == 2
    assert runtime_module.free_cpu_threads(cpus=2, busy=1.2) == 1
    assert runtime_module.free_cpu_threads(cpus=2, busy=7.0) == 1  # never 0
    assert runtime_module.free_cpu_threads(processes=2, cpus=8, busy=0.3) == 4  # torchrun's ranks share the free CPUs
    assert runtime_module.free_cpu_threads(cpus=16, busy=3.4) == 13
    assert 0.0 <= runtime_module.busy_cpus(window=0.05) <= (os.cpu_count() or 1) + 1e-9


def test_step_progress_draws_a_bar_on_a_terminal_and_log_lines_otherwise(monkeypatch, caplog):
    import io
    import logging

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr("sys.stderr", term)
    with epoch.StepProgress(1, 3, steps=8, enabled=True) as bar:
        for _ in range(8):
            bar.step(32)
    assert "epoch 1/3:" in term.getvalue() and "/8 [" in term.getvalue() and bar.done == 8  # tqdm's bar

    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a terminal: a log line at each quarter of the epoch
    with caplog.at_level(logging.INFO, logger="dcl_core.training.epoch"), \
            epoch.StepProgress(2, 3, steps=8, enabled=True) as bar:
        for _ in range(8):
            bar.step(32)
    steps = [r.getMessage() for r in caplog.records if "s left in the epoch" in r.getMessage()]
    assert [m.split(",")[0] for m in steps] == ["epoch 2/3: step 2/8", "epoch 2/3: step 4/8", "epoch 2/3: step 6/8"]
    with epoch.StepProgress(3, 3, steps=8, enabled=False) as bar:  # Ray trials: nothing
        bar.step(32)
    assert bar.done == 0


@pytest.mark.slow  # trains one epoch with the CLI in a subprocess
@needs_cifar
def test_single_run_cli_shows_progress_within_the_first_epoch(tmp_path):
    # Not a terminal (captured): plain progress lines, printed before the first epoch ends.
    proc = subprocess.run([sys.executable, "-m", "dcl_core.train", "--preset", "smoke", "--epochs", "1",
                           "--output-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    first_step = next(i for i, ln in enumerate(lines) if "epoch 1/1: step " in ln)
    first_epoch = next(i for i, ln in enumerate(lines) if "epoch 1/1  loss" in ln)
    assert first_step < first_epoch


def test_the_loss_watch_names_the_first_non_finite_step_when_it_is_read_back():
    """On a GPU the check is read back every GPU_CHECK_EVERY steps, not after each (no host sync per step): the
    error still names the first non-finite step, its loss and its learning rate; on the CPU it is read each step."""
    from types import SimpleNamespace

    run = SimpleNamespace(runtime=SimpleNamespace(world_size=1),
                          cfg=SimpleNamespace(loss=SimpleNamespace(name="dcl", temperature=0.1)))
    assert trainer.LossWatch(torch.device("cpu"), 10).every == 1
    watch = trainer.LossWatch(torch.device("cpu"), 7)
    watch.every = 3  # as on a GPU, shortened
    assert [s for s in range(7) if watch.due(s)] == [2, 5, 6]  # every 3rd step and the epoch's last
    for step, value in enumerate([1.0, float("nan"), float("inf"), 2.0]):
        watch.add(torch.tensor(value), step, lr=0.1 * (step + 1))
        if step == 0:
            watch.stop_if_not_finite(run, epoch=0)  # nothing yet
    with pytest.raises(NonFiniteLossError, match=r"at epoch 4, step 2 \(this rank's: nan; loss=dcl, tau=0.1, "
                                                 r"lr=0.2\)"):
        watch.stop_if_not_finite(run, epoch=3)


@needs_cifar
def test_the_training_line_names_a_user_loss_by_its_class_and_its_reference(tmp_path, monkeypatch, caplog):
    """The run's first line glued framework and reference with a slash (``simclr//abs/.../my_losses.py:
    PositiveWeighted``); it names the class, then where it comes from. A built-in's stays ``simclr/dcl``."""
    reference = f"{Path(__file__).resolve().parents[2]}/docs/examples/my_losses.py:PositiveWeighted"

    class StopError(Exception):
        pass

    def stop(*args, **kwargs):
        raise StopError

    monkeypatch.setattr(trainer, "_train_one_epoch", stop)  # the line comes before the first epoch
    for name, shown in ((reference, f"training simclr/PositiveWeighted ({reference}) on cpu"),
                        ("dcl", "training simclr/dcl on cpu")):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="dcl_core.training.trainer"), pytest.raises(StopError):
            train(smoke(tmp_path / name.rpartition(":")[2], **{"loss.name": name, "device": "cpu"}))
        (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training ")]
        assert line.startswith(shown), line


@pytest.mark.parametrize(("where", "device", "same"), [
    ("cuda:0", "cuda", True), ("cuda:0", "cuda:0", True), ("cuda:1", "cuda:0", False), ("cpu", "cuda", False),
    ("cuda:0", "cpu", False), ("cpu", "cpu", True)])
def test_images_already_on_the_gpu_are_not_copied_there_again(where: str, device: str, same: bool) -> None:
    """The trainer passes ``cuda``; the images it copied there are on ``cuda:0``, which torch calls another device:
    each epoch copied the pretraining images again (tests/test_cuda.py saw it on an H200)."""
    from dcl_core.training.builders import same_device

    assert same_device(torch.device(where), torch.device(device)) is same
