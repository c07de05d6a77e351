"""``--dist loadgroup`` keeps an ``xdist_group`` on one worker (tests/conftest.py): its module fixture is computed
once, and what two runs would fight over (the two-node cluster's fixed addresses) never runs twice at once."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")
GROUPED = """
import pytest

pytestmark = pytest.mark.xdist_group("one")


@pytest.mark.parametrize("i", range(8))
def test_grouped(i):
    pass


@pytest.mark.parametrize("i", range(8))
@pytest.mark.xdist_group("two")
def test_other_group(i):
    pass
"""


def _workers(tmp_path: Path, with_conftest: bool) -> dict[str, set[str]]:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    if with_conftest:
        shutil.copy(CONFTEST, tmp_path / "conftest.py")
        shutil.copy(CONFTEST.with_name("ci_select.py"), tmp_path / "ci_select.py")  # the plugin conftest.py loads
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p",
                           "no:cacheprovider", "test_grouped.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    out: dict[str, set[str]] = {}
    for worker, test in re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED test_grouped.py::(test_\w+)", proc.stdout):
        out.setdefault(test, set()).add(worker)
    return out


@pytest.mark.slow  # pytest with xdist in a subprocess: ~10 s
def test_each_group_runs_on_one_worker(tmp_path):
    workers = _workers(tmp_path, with_conftest=True)
    assert set(workers) == {"test_grouped", "test_other_group"}
    assert all(len(w) == 1 for w in workers.values()), workers
