"""What only a GPU can check: each loss, the kNN monitor and the augmentation on CUDA against the CPU, the
pretraining images kept on the device, and the trainer end to end under bf16 and under fp16 with its GradScaler.

Skipped without CUDA. ``benchmarks/gpu_check.py`` (the one command a lent GPU machine runs) runs this module
first; there the data is the packed CIFAR-10 named by ``DCL_DATA_ROOT``. ``DCL_TEST_DEVICE=cpu`` runs the same
code on the CPU (each comparison then trivially equal), so that the module is exercised where no GPU is.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from cifar10_present import cifar10_present

from dcl_core import metric_names as M
from dcl_core.config import LOSS_NAMES, apply_overrides, preset
from dcl_core.data.augment import POLICIES, ViewAugmentation
from dcl_core.eval.knn import knn_top1
from dcl_core.losses import LOSSES
from dcl_core.training import run_setup as run_module

DEVICE = torch.device(os.environ.get("DCL_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device")
TAUS = (0.005, 0.07, 0.2, 1.0)


def _loss_and_grad(name: str, tau: float, z1: torch.Tensor, z2: torch.Tensor) -> tuple[float, torch.Tensor]:
    x = z1.detach().clone().requires_grad_(True)
    loss = LOSSES[name](temperature=tau)(x, z2).loss
    (grad,) = torch.autograd.grad(loss, x)
    return loss.item(), grad.cpu()


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("tau", TAUS)
def test_each_loss_on_the_device_equals_the_cpu(name: str, tau: float) -> None:
    gen = torch.Generator().manual_seed(3)
    z1, z2 = torch.randn(256, 128, generator=gen), torch.randn(256, 128, generator=gen)
    cpu_loss, cpu_grad = _loss_and_grad(name, tau, z1, z2)
    dev_loss, dev_grad = _loss_and_grad(name, tau, z1.to(DEVICE), z2.to(DEVICE))
    assert math.isfinite(dev_loss) and torch.isfinite(dev_grad).all()
    assert dev_loss == pytest.approx(cpu_loss, rel=1e-4, abs=1e-5)
    torch.testing.assert_close(dev_grad, cpu_grad, rtol=1e-3, atol=1e-3 * cpu_grad.abs().max().item())


def test_the_knn_monitor_on_the_device_equals_the_cpu() -> None:
    gen = torch.Generator().manual_seed(4)
    centers = torch.randn(10, 64, generator=gen)
    bank_labels = torch.randint(0, 10, (4000,), generator=gen)
    query_labels = torch.randint(0, 10, (1000,), generator=gen)
    bank = torch.nn.functional.normalize(centers[bank_labels] + 2.0 * torch.randn(4000, 64, generator=gen), dim=1)
    query = torch.nn.functional.normalize(centers[query_labels] + 2.0 * torch.randn(1000, 64, generator=gen), dim=1)
    vote = {"k": 200, "temperature": 0.1}  # the monitor's own, never the training tau
    cpu = knn_top1(query, query_labels, bank, bank_labels, 10, **vote)
    dev = knn_top1(query.to(DEVICE), query_labels.to(DEVICE), bank.to(DEVICE), bank_labels.to(DEVICE), 10, **vote)
    assert 20.0 < cpu < 100.0  # a real vote, not chance or a degenerate one
    assert abs(dev - cpu) <= 0.2  # at most 2 of 1,000 queries decided differently (a near-tie's rounding)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_views_on_the_device_equal_the_cpu_s_call_after_call(policy: str) -> None:
    """Every policy's two views, blur on, of 512 images on the device equal the CPU's for four calls in a row: the
    draws go to the device through pinned memory without the host waiting (``image_ops.to_device``), so a buffer
    reused before its copy ran would show as another image's crop, jitter or blur."""
    aug = ViewAugmentation(32, policy, blur=True)
    images = torch.randint(0, 256, (512, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    on_device = [aug(images.to(DEVICE), torch.Generator().manual_seed(seed)) for seed in range(4)]  # no wait between
    for seed, views in enumerate(on_device):
        for got, want in zip(views, aug(images, torch.Generator().manual_seed(seed)), strict=True):
            assert got.device.type == DEVICE.type
            worst = (got.cpu() - want).abs().amax(dim=(1, 2, 3))  # (512,): each image's largest difference
            assert worst.max() <= 1e-3, f"call {seed}: {int((worst > 1e-3).sum())} of 512 images differ"


def test_a_draw_already_on_the_device_is_moved_as_it_is() -> None:
    """``image_ops.to_device`` pins a CPU draw; a tensor already on the device (no CPU memory to pin) is kept."""
    from dcl_core.data.image_ops import to_device

    on_device = torch.arange(4.0, device=DEVICE)
    moved = to_device(on_device, DEVICE, torch.float64)
    assert moved.device.type == DEVICE.type and moved.dtype == torch.float64
    assert moved.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_checkpoint_of_a_run_on_the_device_holds_host_tensors_equal_to_the_device_s(tmp_path: Path) -> None:
    """The trainer's checkpoint state (a model with batch-norm buffers, SGD's momentum) on the device is written
    with its tensors on the host, each equal to the device's: what ``torch.save`` stores without a
    ``map_location``. A resume loads it back into a model on the device (its momentum too)."""
    from dcl_core.training.builders import build_model
    from dcl_core.training.checkpoint import save_checkpoint

    cfg = apply_overrides(preset("smoke"), {"model.width": 0.125})
    model = build_model(cfg).to(DEVICE, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3, 32, 32, device=DEVICE))[1].square().sum().backward()
    optimizer.step()
    state = {"epoch": 1, "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": {},
             "config": {}, "history": []}
    saved = torch.load(save_checkpoint(state, tmp_path / "checkpoint.pt"), weights_only=True)
    stored = [*saved["model"].values(), *(b["momentum_buffer"] for b in saved["optimizer"]["state"].values())]
    assert len(stored) > 100 and all(t.device.type == "cpu" for t in stored)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(saved["model"][key], value.cpu(), rtol=0, atol=0)
    again = build_model(cfg).to(DEVICE)
    again.load_state_dict(saved["model"])
    resumed = torch.optim.SGD(again.parameters(), lr=0.1, momentum=0.9)
    resumed.load_state_dict(saved["optimizer"])  # moved to each parameter's device by the optimizer
    momentum = next(iter(resumed.state.values()))["momentum_buffer"]
    assert momentum.device.type == DEVICE.type


@pytest.mark.skipif(not cifar10_present(), reason="CIFAR-10 not present (embedded, or a pack in DCL_DATA_ROOT)")
def test_the_pretraining_images_stay_on_the_device() -> None:
    from dcl_core.training.builders import InMemoryData, build_data

    cfg = apply_overrides(preset("smoke"), {"data.train_per_class": 8, "data.test_per_class": 2})
    data = build_data(cfg)
    assert isinstance(data, InMemoryData)
    batches = [torch.arange(0, 16), torch.arange(16, 32)]
    views = list(data.epoch_views(batches, torch.Generator().manual_seed(0), DEVICE))
    assert all(v.device.type == DEVICE.type and v.shape[0] == 16 for pair in views for v in pair)
    if DEVICE.type != "cpu":
        resident = data._resident
        assert resident is not None and resident.device.type == DEVICE.type  # copied once ...
        list(data.epoch_views(batches, torch.Generator().manual_seed(1), DEVICE))
        assert data._resident is resident  # ... and not again the next epoch


@pytest.mark.skipif(not cifar10_present(), reason="CIFAR-10 not present (embedded, or a pack in DCL_DATA_ROOT)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_the_trainer_on_the_device_under_autocast(dtype: torch.dtype, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two epochs of the smoke preset with the trainer's mixed precision (fp16 with its GradScaler: the dtype a
    GPU without bf16 gets): a finite loss every epoch, a kNN top-1, every metric finite."""
    from dcl_core.training import train

    monkeypatch.setattr(run_module, "amp_dtype", lambda device: dtype if device.type == DEVICE.type else None)
    scalers: list[torch.amp.GradScaler] = []
    real = run_module.grad_scaler

    def recording(device: torch.device, amp: torch.dtype | None) -> torch.amp.GradScaler:
        scalers.append(real(device, amp))
        return scalers[-1]

    monkeypatch.setattr(run_module, "grad_scaler", recording)
    cfg = apply_overrides(preset("smoke"), {"device": DEVICE.type, "optim.epochs": 2, "output_dir": str(tmp_path)})
    train(cfg)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(math.isfinite(x[M.TRAIN_LOSS]) for x in lines)
    assert 0.0 <= lines[-1][M.KNN_TOP1] <= 100.0
    assert [s.is_enabled() for s in scalers] == [dtype == torch.float16]  # loss scaling exactly for fp16
