"""The benchmark suite runs: ``benchmarks/run.py --quick`` measures every row of every section (no speed goals),
once, and the studies section's post-hoc analyzer reads the study folder that run left behind.

Speed goals are reported by the suite, never asserted here. Skipped when the bench extra (lightly, kornia) is not
installed, or CIFAR-10 is not where the presets read it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cifar10_present import cifar10_present  # noqa: E402

from benchmarks.run import SECTIONS  # noqa: E402 - the repo root is on the path only from here
from benchmarks.studies import study_dir_rows  # noqa: E402
from benchmarks.study_timing import analyze_study  # noqa: E402

pytestmark = [
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("lightly", "kornia")),
                       reason="the benchmark baselines (pip install -e '.[bench]') are not installed"),
    pytest.mark.skipif(not cifar10_present(), reason="CIFAR-10 not present: the trainer and studies sections train"),
    pytest.mark.xdist_group("benchmarks"),  # under pytest-xdist, one worker runs the module's one quick_run
]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, str]:
    """One ``run.py --quick`` of every section (about 2 minutes on 2 cores): its JSON, work folder and stdout."""
    tmp = tmp_path_factory.mktemp("bench")
    out, work = tmp / "bench.json", tmp / "work"
    proc = subprocess.run(
        [sys.executable, "benchmarks/run.py", "--quick", "--json", str(out), "--work-dir", str(work)],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-5000:]}"
    return json.loads(out.read_text()), work, proc.stdout


@pytest.mark.slow
def test_quick_run_measures_every_row_of_every_section(quick_run: tuple[dict, Path, str]) -> None:
    report, _, stdout = quick_run
    assert "| section | measurement |" in stdout  # the Markdown table was printed
    assert report["meta"]["quick"] is True and report["meta"]["failed_sections"] == []
    assert report["meta"]["bytecode_cache"] is (not sys.flags.dont_write_bytecode)  # the run inherits this env
    rows = report["rows"]
    for section in SECTIONS:
        assert any(r["section"] == section for r in rows), f"no rows for {section}"
    bad = [r for r in rows if not (isinstance(r["ours"], float | int) and math.isfinite(r["ours"]) and r["ours"] > 0)]
    assert not bad, f"rows without a finite positive measurement: {bad}"
    names = " | ".join(r["name"] for r in rows)
    for what in ("platform overhead", "CPU busy", "epochs trained", "best kNN"):
        assert what in names
    overhead = next(r for r in rows if "platform overhead" in r["name"])
    assert 0 < overhead["baseline"] < overhead["ours"] and 0 < overhead["ratio"] < 1  # training < wall


@pytest.mark.slow
def test_post_hoc_analysis_of_the_search_the_quick_run_left(quick_run: tuple[dict, Path, str]) -> None:
    report, work, _ = quick_run
    search = work / "studies" / "search_full"  # the (τ, lr) search without ASHA: dcl, 2 trials of 2 epochs
    timing = analyze_study(search)
    assert timing.study == "tau_lr_search" and timing.mlflow_error is None  # spans from the MLflow runs
    assert len(timing.trials) == 2 and all(t.epochs == 2 for t in timing.trials)
    assert timing.slots >= 1 and timing.training > 0
    assert all(0 <= t.finish < t.end - t.start for t in timing.trials)
    assert timing.lock <= timing.ray_ready <= timing.tune_starts[0] <= timing.first_start < timing.last_end
    assert timing.last_end <= timing.done
    parts = timing.breakdown()
    assert all(math.isfinite(v) for v in parts.values())
    assert sum(parts.values()) == pytest.approx(timing.done - timing.lock, rel=1e-6)  # categories tile the wall
    (row, *_), _ = study_dir_rows(search)
    live = next(r for r in report["rows"] if "platform overhead" in r["name"])
    assert "platform overhead" in row.name and 0 < row.ratio < 1
    assert row.ours <= live["ours"]  # post hoc misses the imports before the lock file and the exit


@pytest.mark.slow  # runs benchmarks/run.py
def test_unknown_section_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, "benchmarks/run.py", "--sections", "nope"], cwd=REPO, capture_output=True, text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "unknown section" in proc.stderr


def test_a_study_benchmark_never_writes_its_log_through_a_planted_link(tmp_path):
    """``benchmarks/studies.py`` writes each study's console to ``<output>.log``: a link planted there is refused
    before the study starts, its target untouched (issue 46, item 6)."""
    from benchmarks.studies import launch
    from dcl_core.files import UnsafePathError

    precious = tmp_path / "precious"
    precious.write_text("keep")
    (tmp_path / "out.log").symlink_to(precious)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        launch("temperature_sweep.py", ["--dry-run"], tmp_path / "out")
    assert precious.read_text() == "keep"


@pytest.mark.parametrize("planted", ["link", "default link", "fifo"])
def test_run_refuses_a_link_or_fifo_at_its_json_in_one_line_before_any_work(tmp_path, monkeypatch, capsys, planted):
    """Issue 61, item 6: ``run.py --json LINK`` (its default ``outputs/benchmarks.json`` included) wrote the rows
    through the link into its target, and a FIFO there was a 56-line traceback after every section had run. Now one
    line, exit 2, before any section runs, the target and the FIFO as they were."""
    from benchmarks import run

    ran: list[object] = []
    monkeypatch.setattr(run, "run_sections", lambda *args: ran.append(args) or ([], []))
    precious = tmp_path / "precious.json"
    precious.write_text("keep me")
    monkeypatch.chdir(tmp_path)
    path = tmp_path / ("outputs/benchmarks.json" if planted == "default link" else "rows.json")
    path.parent.mkdir(exist_ok=True)
    if planted == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(precious)
    argv = ["--sections", "losses"] + ([] if planted == "default link" else ["--json", str(path)])
    code = run.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {path} is a "), err
    assert ran == [] and precious.read_text() == "keep me"
    assert (path.is_symlink() if planted != "fifo" else stat.S_ISFIFO(os.lstat(path).st_mode))
