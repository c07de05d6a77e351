"""Feature extraction fits the evaluation batch to the memory free: a large image size (a checkpoint trained at
1024 px) takes a smaller batch with the same features, or is refused in one line when one image does not fit,
instead of a forward pass that allocates tens of GB and is OOM-killed."""

from __future__ import annotations

import pytest
import torch

from dcl_core.config import InputError
from dcl_core.eval.features import extract_features, fitting_batch_size, forward_bytes_per_image
from dcl_core.models.resnet import build_backbone


def _backbone(width: float = 0.125) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_backbone("resnet18", width=width, stem="cifar")[0].eval()


def test_the_estimate_counts_the_largest_activation_at_the_image_size() -> None:
    backbone = _backbone()
    small, large = forward_bytes_per_image(backbone, (3, 32, 32)), forward_bytes_per_image(backbone, (3, 64, 64))
    assert small is not None and large is not None
    # the CIFAR stem keeps 32x32 in the first stage: 8 channels (width 1/8), 3 such maps, plus the float input
    assert small == 4 * (3 * 32 * 32 + 3 * 8 * 32 * 32)
    assert large == 4 * small  # four times the pixels
    wide = forward_bytes_per_image(_backbone(1.0), (3, 1024, 1024))
    assert wide == 4 * (3 + 3 * 64) * 1024**2  # the checkpoint: 0.8 GB an image, 125 GB a batch of 160


def test_a_batch_that_does_not_fit_shrinks_and_gives_the_same_features() -> None:
    backbone = _backbone()
    images = torch.randint(0, 256, (20, 3, 32, 32), dtype=torch.uint8)
    per_image = forward_bytes_per_image(backbone, (3, 32, 32))
    assert per_image is not None
    cpu = torch.device("cpu")
    assert fitting_batch_size(backbone, (3, 32, 32), 512, cpu, available=10**12) == 512
    batch = fitting_batch_size(backbone, (3, 32, 32), 512, cpu, available=2 * 6 * per_image + 1)
    assert batch == 6

    calls: list[int] = []
    backbone.register_forward_hook(lambda _m, inputs, _o: calls.append(inputs[0].shape[0]))
    full = extract_features(backbone, images, lambda x: x.float() / 255, batch_size=512)
    part = extract_features(backbone, images, lambda x: x.float() / 255, batch_size=batch)
    assert calls == [20, 6, 6, 6, 2]
    torch.testing.assert_close(part, full, atol=1e-5, rtol=1e-5)


def test_one_image_that_does_not_fit_is_refused_in_one_line() -> None:
    backbone = _backbone(1.0)
    with pytest.raises(InputError, match=r"one 1024x1024 image takes 0\.\d GB .* use a smaller data.image_size"):
        fitting_batch_size(backbone, (3, 1024, 1024), 512, torch.device("cpu"), available=1024**3)
