"""Test-suite-wide hooks."""

from __future__ import annotations

import os

import pytest

# The suite runs 2 pytest workers on 2 cores, each starting studies, Ray and torch processes of its own, so torch's
# OpenMP threads always share cores with other processes. Left to spin while they wait (libgomp's default), they
# burn the cores the other processes need: tests/training took 158 s over 2 workers, 108 s with PASSIVE (sleep while
# waiting; same results, scheduling only). Set before any test module imports torch; every subprocess inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from _pytest.nodeid import coerce_node_id  # pytest 9.2's node ids: the one way to give an item a new one


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--dist loadgroup``: keep each ``xdist_group`` on one worker under pytest 9.2.

    pytest-xdist 3.8 groups a test by appending ``@group`` to its node id through ``item._nodeid``, which pytest 9.2
    no longer reads (a node's id is ``item._id``), so every group was spread over the workers: a module fixture
    computed once per worker, two-node clusters built twice. This appends the suffix the way pytest 9.2 stores it,
    and does nothing where xdist's own suffix took.
    """
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and "@" not in item.nodeid.rsplit("]", 1)[-1]:
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")
