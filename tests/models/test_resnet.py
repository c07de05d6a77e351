"""Tests for dcl_core.models: ResNet backbones, projection head and SSLModel."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from dcl_core.models import ARCHS, STEMS, ProjectionHead, SSLModel, build_backbone, last_block_convs


def _num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _input_size(stem: str) -> int:
    return 32 if stem == "cifar" else 64


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("stem", STEMS)
@pytest.mark.parametrize("width", [0.125, 0.25, 1.0])
def test_output_shape_and_feature_dim(arch: str, stem: str, width: float) -> None:
    backbone, feature_dim = build_backbone(arch, width=width, stem=stem)
    expansion = 1 if arch == "resnet18" else 4
    assert feature_dim == round(512 * width) * expansion
    size = _input_size(stem)
    backbone.eval()
    with torch.no_grad():
        out = backbone(torch.randn(2, 3, size, size))
    assert out.shape == (2, feature_dim)
    assert isinstance(backbone.fc, nn.Identity)


@pytest.mark.parametrize("stem", STEMS)
def test_feature_map_resolution(stem: str) -> None:
    """CIFAR stem keeps 32x32 until layer1 (-> 4x4 at layer4); ImageNet stem downsamples 4x (64 -> 2x2)."""
    backbone, _ = build_backbone("resnet18", width=0.125, stem=stem)
    shapes: dict[str, tuple[int, ...]] = {}
    for name in ("layer1", "layer4"):
        getattr(backbone, name).register_forward_hook(
            lambda _m, _i, out, name=name: shapes.__setitem__(name, tuple(out.shape))
        )
    backbone(torch.randn(2, 3, 32, 32) if stem == "cifar" else torch.randn(2, 3, 64, 64))
    if stem == "cifar":
        assert shapes["layer1"][-2:] == (32, 32)
        assert shapes["layer4"][-2:] == (4, 4)
    else:
        assert shapes["layer1"][-2:] == (16, 16)
        assert shapes["layer4"][-2:] == (2, 2)


def test_cifar_stem_structure() -> None:
    backbone, _ = build_backbone("resnet18", stem="cifar")
    conv1 = backbone.conv1
    assert conv1.kernel_size == (3, 3)
    assert conv1.stride == (1, 1)
    assert conv1.padding == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in backbone.modules())


def test_imagenet_stem_structure() -> None:
    backbone, _ = build_backbone("resnet18", stem="imagenet")
    assert backbone.conv1.kernel_size == (7, 7)
    assert backbone.conv1.stride == (2, 2)
    assert isinstance(backbone.maxpool, nn.MaxPool2d)


@pytest.mark.parametrize(
    ("arch", "reference"),
    [("resnet18", torchvision.models.resnet18), ("resnet50", torchvision.models.resnet50)],
)
def test_width1_matches_torchvision_param_count(arch: str, reference) -> None:
    tv = reference()
    tv_no_fc = _num_params(tv) - _num_params(tv.fc)
    imagenet, _ = build_backbone(arch, width=1.0, stem="imagenet")
    assert _num_params(imagenet) == tv_no_fc
    # CIFAR stem: conv1 is 64x3x3x3 instead of 64x3x7x7 (no bias); max-pool has no parameters.
    cifar, _ = build_backbone(arch, width=1.0, stem="cifar")
    assert _num_params(cifar) == tv_no_fc - 64 * 3 * 7 * 7 + 64 * 3 * 3 * 3
    # Same layer structure as torchvision (names and shapes of all weights except fc and conv1).
    ours = {k: v.shape for k, v in imagenet.state_dict().items()}
    theirs = {k: v.shape for k, v in tv.state_dict().items() if not k.startswith("fc.")}
    assert ours == theirs


@pytest.mark.parametrize("arch", ARCHS)
def test_width_scales_params_quadratically(arch: str) -> None:
    full = _num_params(build_backbone(arch, width=1.0)[0])
    half = _num_params(build_backbone(arch, width=0.5)[0])
    quarter = _num_params(build_backbone(arch, width=0.25)[0])
    # Conv weights scale with width^2; BatchNorm parameters (linear in width) add a little on top.
    assert 0.25 <= half / full < 0.26
    assert 0.0625 <= quarter / full < 0.07


def test_min_channels() -> None:
    backbone, feature_dim = build_backbone("resnet18", width=0.01)
    assert backbone.conv1.out_channels == 8
    assert feature_dim == 8
    assert backbone(torch.randn(2, 3, 8, 8)).shape == (2, 8)


def test_zero_init_residual() -> None:
    backbone, _ = build_backbone("resnet18", width=0.125, zero_init_residual=True)
    blocks = [m for m in backbone.modules() if isinstance(m, torchvision.models.resnet.BasicBlock)]
    assert len(blocks) == 8
    assert all(torch.all(b.bn2.weight == 0) for b in blocks)
    default, _ = build_backbone("resnet18", width=0.125)
    assert all(torch.all(m.weight == 1) for m in default.modules() if isinstance(m, nn.BatchNorm2d))


@pytest.mark.parametrize("kwargs", [{"arch": "resnet34"}, {"arch": "vit"}])
def test_unknown_arch_raises(kwargs: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="unknown arch"):
        build_backbone(**kwargs)


def test_unknown_stem_and_bad_width_raise() -> None:
    with pytest.raises(ValueError, match="unknown stem"):
        build_backbone("resnet18", stem="tiny")
    with pytest.raises(ValueError, match="width"):
        build_backbone("resnet18", width=0.0)


def test_projection_head_structure() -> None:
    head = ProjectionHead(64, 32)
    layers = list(head.children())
    assert [type(m) for m in layers] == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    assert (layers[0].in_features, layers[0].out_features) == (64, 32)
    assert layers[1].num_features == 32
    assert (layers[3].in_features, layers[3].out_features) == (32, 128)
    out = head(torch.randn(5, 64))
    assert out.shape == (5, 128)
    # Not L2-normalised.
    assert not torch.allclose(out.norm(dim=1), torch.ones(5))


@pytest.mark.parametrize("arch", ARCHS)
def test_ssl_model_forward(arch: str) -> None:
    backbone, feature_dim = build_backbone(arch, width=0.125)
    model = SSLModel(backbone, ProjectionHead(feature_dim, 32, 128))
    assert model.backbone is backbone
    x = torch.randn(3, 3, 16, 16)
    features, projections = model(x)
    assert features.shape == (3, feature_dim)
    assert projections.shape == (3, 128)
    model.eval()
    with torch.no_grad():
        f_eval, p_eval = model(x)
        assert torch.allclose(f_eval, backbone(x))
        assert torch.allclose(p_eval, model.head(f_eval))


@pytest.mark.parametrize(("arch", "names"), [("resnet18", ["layer4.0.conv2", "layer4.1.conv2"]),
                                            ("resnet50", ["layer4.1.conv3", "layer4.2.conv3"])])
def test_last_block_convs_are_the_last_two_blocks_last_convs(arch, names):
    backbone, _ = build_backbone(arch, width=0.125)
    by_module = {id(m): n for n, m in backbone.named_modules()}
    assert [by_module[id(c)] for c in last_block_convs(backbone)] == names
