"""The checkpoint's tensors go to the host before ``torch.save`` (:func:`dcl_core.training.checkpoint.to_host`):
on a GPU the copies are queued together (tests/test_cuda.py checks the device side); on the CPU nothing is copied,
and what loading reads beside the tensors (a state dict's type and ``_metadata``, the optimizer's nesting) is kept."""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from typing import NamedTuple

import torch

from dcl_core.config import apply_overrides, preset
from dcl_core.training.builders import build_model
from dcl_core.training.checkpoint import to_host


class _Pair(NamedTuple):
    a: int
    b: str


def _state() -> dict:
    model = build_model(apply_overrides(preset("smoke"), {"model.width": 0.125}))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    return {"epoch": 3, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "history": [{"train/loss": 1.5}], "pair": _Pair(1, "x"), "shape": (2, 3),
            "counts": defaultdict(int, {"epochs": 3})}


def test_a_host_state_is_kept_tensor_for_tensor_and_nothing_is_copied() -> None:
    state = _state()
    host = to_host(state)
    assert host["model"].keys() == state["model"].keys()
    assert all(host["model"][k] is v for k, v in state["model"].items())
    momentum = [s["momentum_buffer"] for s in state["optimizer"]["state"].values()]
    assert [s["momentum_buffer"] for s in host["optimizer"]["state"].values()] == momentum  # the same objects
    assert host["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert host["history"] == state["history"] and host["epoch"] == 3


def test_what_loading_reads_beside_the_tensors_is_kept() -> None:
    state = _state()
    host = to_host(state)
    assert type(host["model"]) is OrderedDict
    assert host["model"]._metadata == state["model"]._metadata  # batch norm's version, read by load_state_dict
    assert host["pair"] is state["pair"] and host["shape"] == (2, 3) and type(host["shape"]) is tuple
    assert host["counts"] == {"epochs": 3}  # a mapping whose type takes no pairs (a defaultdict) saved as a dict
    fresh = build_model(apply_overrides(preset("smoke"), {"model.width": 0.125}))
    fresh.load_state_dict(host["model"])
    for key, value in state["model"].items():
        torch.testing.assert_close(fresh.state_dict()[key], value, rtol=0, atol=0)
