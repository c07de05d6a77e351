"""tests/ci_parts.py, the per-change selection .ci/run makes: the parts of the slow tier cover every slow test exactly
once, the fast tier, the core tests and the quick slow tests are in every part, a module's xdist_group moves whole,
and the recorded durations are what balances the parts."""

import json

import pytest
from ci_parts import assign_parts

pytest_plugins = ["pytester"]

SUITE = """
import pytest

def test_fast():
    pass

@pytest.mark.slow
@pytest.mark.core
def test_core():
    pass

@pytest.mark.slow
def test_quick_slow():
    pass

@pytest.mark.slow
@pytest.mark.parametrize("i", range(8))
def test_study(i):
    pass

@pytest.mark.slow
@pytest.mark.xdist_group("cluster")
@pytest.mark.parametrize("i", range(3))
def test_cluster(i):
    pass
"""


def _kept(pytester: pytest.Pytester, part: str) -> set[str]:
    result = pytester.runpytest("-p", "ci_parts", "--collect-only", "-q", "--slow-part", part,
                                "--durations-file", "d.json")
    return {line.split("::", 1)[1] for line in result.outlines if "::" in line}


def test_the_parts_cover_every_slow_test_once_and_keep_the_rest_in_each(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    durations = {f"test_suite.py::test_study[{i}]": 20.0 + i for i in range(8)}
    durations |= {f"test_suite.py::test_cluster[{i}]": 30.0 for i in range(3)}  # 90 s together
    durations |= {"test_suite.py::test_quick_slow": 5.0, "test_suite.py::test_core": 300.0}
    pytester.path.joinpath("d.json").write_text(json.dumps(durations))
    parts = [_kept(pytester, f"{g}/3") for g in (1, 2, 3)]
    always = {"test_fast", "test_core", "test_quick_slow"}
    rotating = {f"test_study[{i}]" for i in range(8)} | {f"test_cluster[{i}]" for i in range(3)}
    assert all(always <= p for p in parts)
    assert sorted(n for p in parts for n in p - always) == sorted(rotating)  # each exactly once
    cluster = {f"test_cluster[{i}]" for i in range(3)}
    assert sum(cluster <= p for p in parts) == 1  # the group whole, in one part
    loads = [sum(durations[f"test_suite.py::{n}"] for n in p - always) for p in parts]
    assert max(loads) - min(loads) <= 27  # balanced by the file: 90 (the group), 92 and 94 s


def test_a_bad_part_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    for bad in ("0/3", "4/3", "x"):
        result = pytester.runpytest("-p", "ci_parts", "--collect-only", "--slow-part", bad)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        assert "--slow-part must be G/K" in "\n".join(result.errlines)


def test_largest_first_to_the_least_loaded_part() -> None:
    assert assign_parts({"a": 10, "b": 6, "c": 5, "d": 4}, 2) == {"a": 1, "b": 2, "c": 2, "d": 1}
    assert assign_parts({}, 3) == {}


def test_the_recorded_durations_are_the_slow_tests_and_feed_the_split(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("-p", "ci_parts", "-q", "--record-durations", "rec.json")
    assert result.ret == 0
    recorded = json.loads(pytester.path.joinpath("rec.json").read_text())
    assert "test_suite.py::test_fast" not in recorded  # only slow tests: what --slow-part looks up
    assert set(recorded) == {"test_suite.py::test_core", "test_suite.py::test_quick_slow",
                             *(f"test_suite.py::test_study[{i}]" for i in range(8)),
                             *(f"test_suite.py::test_cluster[{i}]" for i in range(3))}
    assert all(0 <= s < 5 for s in recorded.values())
