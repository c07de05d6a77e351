"""Another library's loss through the adapter (dcl_core/losses/foreign.py), written here as lightly writes its
losses: an ``nn.Module`` whose constructor takes ``temperature`` and whose ``forward(z1, z2)`` returns a 0-d tensor.
The same losses from lightly itself go through the checker in test_check.py and through a study in
tests/study/cli/test_foreign_loss_e2e.py."""

from __future__ import annotations

import pytest
import reference as ref
import torch
import torch.nn.functional as F
from torch import nn

from dcl_core.config import InputError
from dcl_core.losses import DCLLoss
from dcl_core.losses.foreign import ForeignLoss, adapt, is_foreign, takes_gather
from dcl_core.losses.user import build_user_loss, load_loss_class

LIBRARY_STYLE = '''
import torch
import torch.nn.functional as F
from torch import nn


class PlainDCL(nn.Module):
    """DCL as another library writes it: its own normalisation, both views' anchors, a bare scalar."""

    def __init__(self, temperature=0.1, gather_distributed=False, scale=1.0):
        super().__init__()
        self.temperature, self.gather_distributed, self.scale = temperature, gather_distributed, scale
        self.seen_dtype = None

    def forward(self, out0, out1):
        self.seen_dtype = out0.dtype
        z = F.normalize(torch.cat([out0, out1]), dim=1)
        n = out0.shape[0]
        sim = z @ z.T / self.temperature
        idx = torch.arange(2 * n)
        pos = sim[idx, (idx + n) % (2 * n)]
        mask = torch.ones_like(sim, dtype=torch.bool)
        mask[idx, idx] = False
        mask[idx, (idx + n) % (2 * n)] = False
        neg = sim.masked_fill(~mask, float("-inf"))
        return self.scale * (torch.logsumexp(neg, dim=1) - pos).mean()


class NoGather(nn.Module):
    def __init__(self, temperature=0.1):
        super().__init__()
        self.temperature = temperature

    def forward(self, out0, out1):
        return (out0 * out1).sum() / self.temperature


class NoTemperature(nn.Module):
    def forward(self, out0, out1):
        return (out0 * out1).sum()


class Vector(NoGather):
    def forward(self, out0, out1):
        return (out0 * out1).sum(dim=1)
'''


@pytest.fixture
def library(tmp_path):
    path = tmp_path / "library_losses.py"
    path.write_text(LIBRARY_STYLE)
    return path


def test_a_library_style_module_is_adapted_and_a_contrastive_loss_is_not(library):
    cls = load_loss_class(f"{library}:PlainDCL")
    assert issubclass(cls, ForeignLoss) and cls.__name__ == "PlainDCL" and takes_gather(cls.wrapped)
    assert is_foreign(cls.wrapped) and not is_foreign(DCLLoss) and not is_foreign(nn.Linear) and not is_foreign(3)
    assert load_loss_class("dcl_core.losses:DCLLoss") is DCLLoss


def test_the_adapted_loss_is_dcl_with_its_temperature_and_params(library):
    loss = build_user_loss(f"{library}:PlainDCL", '{"scale": 2.0}', 0.3, False)
    assert loss.module.temperature == 0.3 and loss.module.scale == 2.0 and loss.module.gather_distributed is False
    z1, z2 = ref.random_pair(6, 5, seed=1)
    out = loss(z1, z2)
    assert out.diagnostics == {} and out.npc is None  # a bare scalar: no q_B, no similarity means
    torch.testing.assert_close(out.loss, 2.0 * ref.dcl(z1, z2, 0.3), rtol=1e-10, atol=1e-12)


def test_it_runs_in_fp32_under_autocast_as_this_project_s_similarities(library):
    loss = build_user_loss(f"{library}:PlainDCL", "{}", 0.05, False)
    layer = nn.Linear(5, 8).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z1, z2 = layer(torch.randn(4, 5, dtype=torch.bfloat16)), layer(torch.randn(4, 5, dtype=torch.bfloat16))
        out = loss(z1, z2)
    assert loss.module.seen_dtype == torch.float32 and out.loss.dtype == torch.float32
    loss(*ref.random_pair(4, 5, seed=2))
    assert loss.module.seen_dtype == torch.float64  # float64 (the checker's) stays float64


def test_what_it_cannot_do_is_said_in_one_line(library):
    with pytest.raises(NotImplementedError, match=r"runs with framework\.name=simclr only"):
        build_user_loss(f"{library}:PlainDCL", "{}", 0.1, False).from_similarities(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Vector.forward returned Tensor\(4,\), not a 0-d float tensor"):
        build_user_loss(f"{library}:Vector", "{}", 0.1, False)(*ref.random_pair(4, 3, seed=0))
    with pytest.raises(InputError, match=r"NoTemperature must be a subclass of dcl_core\.losses\.ContrastiveLoss, "
                                         r"or an nn\.Module whose constructor takes temperature"):
        load_loss_class(f"{library}:NoTemperature")
    with pytest.raises(InputError, match=r"NoGather\(temperature=0.1\) does not take temperature, margin "
                                         r"\(loss.params\)"):
        build_user_loss(f"{library}:NoGather", '{"margin": 1}', 0.1, False)


def test_a_module_without_gather_distributed_builds_alone_and_gathers_nothing(library):
    loss = build_user_loss(f"{library}:NoGather", "{}", 0.1, True)  # one process: nothing to gather
    assert not takes_gather(type(loss).wrapped) and loss.gather_distributed


def test_adapt_names_the_class_after_the_library_s():
    class Outer(nn.Module):
        def __init__(self, temperature: float = 0.1) -> None:
            super().__init__()

        def forward(self, a, b):
            return F.mse_loss(a, b)

    adapted = adapt(Outer)
    assert adapted.__name__ == "Outer" and adapted.wrapped is Outer and "Outer, adapted" in adapted.__doc__
