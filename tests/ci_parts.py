"""CI's per-change selection: the slow tier's expensive tests split into parts of about equal duration.

``--slow-part G/K`` keeps every test that is not slow, every slow test marked ``core`` (the README's quick start
study, the MLflow view in the browser), every slow test that took at most ``CHEAP_S`` seconds when recorded (those
start a process or two but take seconds), and part G of K of the other slow tests; ``.ci/run`` takes one part a day
in rotation, so K consecutive days cover the whole suite (docs/testing.md#ci). The parts are balanced by the
durations ``--record-durations FILE`` wrote in an earlier run (``.ci/test_durations.json``; a test missing there
counts as ``UNKNOWN_S``): largest first, each to the part with the least so far. The tests of one ``xdist_group``
in one module (a module fixture such as a two-node cluster, computed once) count and move as one. The split is a
pure function of the collected tests and the file, so both xdist workers agree on it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

CHEAP_S = 15.0  # a slow test (or xdist_group) recorded at most this long runs on every change
UNKNOWN_S = 30.0  # a test the durations file does not know: a guess in the slow tier's range, so it rotates
_GROUP_SUFFIX = re.compile(r"@[\w-]+$")  # what --dist loadgroup appends to a grouped test's id


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ci parts")
    group.addoption("--slow-part", metavar="G/K", help="keep the fast tier, the slow tests marked core, the slow tests "
                    f"recorded at {CHEAP_S:g} s or less and part G of K of the others (balanced by --durations-file)")
    group.addoption("--durations-file", metavar="FILE", default=".ci/test_durations.json",
                    help="test durations for --slow-part, as --record-durations writes them")
    group.addoption("--record-durations", metavar="FILE", help="write each slow test's duration (setup, call "
                    "and teardown, seconds) to FILE as JSON, for --durations-file")


def _base_id(nodeid: str) -> str:
    return _GROUP_SUFFIX.sub("", nodeid)


def assign_parts(units: dict[str, float], parts: int) -> dict[str, int]:
    """Each unit (name: seconds) to a part 1..``parts``: largest first, to the part with the least so far (ties: the
    unit's name, then the lower part), so the same units always give the same split."""
    totals = [0.0] * parts
    where = {}
    for name, seconds in sorted(units.items(), key=lambda kv: (-kv[1], kv[0])):
        part = min(range(parts), key=lambda p: (totals[p], p))
        totals[part] += seconds
        where[name] = part + 1
    return where


def _unit(item: pytest.Item) -> str:
    groups = sorted(str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group"))
    # one unit per group and module: a module's fixture is computed once; a group spread over modules (Ray heads
    # that would fight over the machine) still runs on one worker within the part, wherever its modules fall
    return f"{item.nodeid.split('::')[0]}@{'_'.join(groups)}" if groups else _base_id(item.nodeid)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = config.getoption("slow_part")
    if not spec:
        return
    match = re.fullmatch(r"(\d+)/(\d+)", spec)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise pytest.UsageError(f"--slow-part must be G/K with 1 <= G <= K, not {spec!r}")
    part, parts = int(match[1]), int(match[2])
    path = Path(config.getoption("durations_file"))
    recorded = {_base_id(k): float(v) for k, v in json.loads(path.read_text()).items()} if path.is_file() else {}
    rotating = [i for i in items if i.get_closest_marker("slow") and not i.get_closest_marker("core")]
    units: dict[str, float] = {}
    for item in rotating:
        units[_unit(item)] = units.get(_unit(item), 0.0) + recorded.get(_base_id(item.nodeid), UNKNOWN_S)
    where = assign_parts({u: s for u, s in units.items() if s > CHEAP_S}, parts)
    dropped = [i for i in rotating if where.get(_unit(i), part) != part]
    if dropped:
        gone = {id(i) for i in dropped}
        items[:] = [i for i in items if id(i) not in gone]
        config.hook.pytest_deselected(items=dropped)


class _Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "slow" not in report.keywords:
            return
        key = _base_id(report.nodeid)
        self.seconds[key] = self.seconds.get(key, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        self.path.write_text(json.dumps({k: round(v, 2) for k, v in sorted(self.seconds.items())}, indent=0) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    target = config.getoption("record_durations")
    if target and not hasattr(config, "workerinput"):  # the xdist controller (or a run without xdist) sees every report
        config.pluginmanager.register(_Recorder(Path(target)), "ci_parts_recorder")
