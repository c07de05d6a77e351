"""``benchmarks/gpu.py``, the GPU check, cannot rot: its ``--tiny`` run (the same code at toy sizes) runs every part
on the CPU of a machine without Ray, Optuna or MLflow (as the bare GPU machine it is made for), writes each row to
``gpu.json`` and the table to ``gpu.md``, and exits 0."""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dcl_core.data import resolve_data_root

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # benchmarks/ (its --summarize is called in this process)
# Every process a GPU script starts (pytest, gpu.py's sharing processes, gpu_runs.py and its training runs) without
# Ray, Optuna and MLflow, as on the GPU machine: a sitecustomize on PYTHONPATH, which every Python imports at start.
BLOCK_EVERYWHERE = """
import sys
class _NotOnTheGpuMachine:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('ray', 'mlflow', 'optuna'):
            raise ImportError('not on the GPU machine: ' + name)
sys.meta_path.insert(0, _NotOnTheGpuMachine())
"""


def _as_on_the_gpu_machine(tmp_path: Path) -> dict[str, str]:
    """An environment in which no process can import Ray, Optuna or MLflow."""
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(BLOCK_EVERYWHERE)
    return os.environ | {"PYTHONPATH": str(block), "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow  # ~1 minute: every part, sharing processes and a 2-epoch smoke run included
@pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(), reason="embedded CIFAR-10 not present")
def test_the_tiny_gpu_check_runs_every_part_without_ray_optuna_or_mlflow(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    proc = subprocess.run([sys.executable, "benchmarks/gpu.py", "--tiny", "--out", str(out), "--device", "cpu"],
                          cwd=REPO, capture_output=True, text=True, timeout=900, env=_as_on_the_gpu_machine(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu.json").read_text())
    names = [r["name"] for r in report["rows"]]
    assert not [n for n in names if n.endswith(("failed", "skipped"))], names
    autocast = [r for r in report["rows"] if r["name"].startswith("autocast")]
    assert len(autocast) == 8 and all(r["met"] for r in autocast)  # bf16 and fp16 x 4 losses, equal to fp32
    for start in ("matmul", "conv 3x3", "trainer vs bare loop", "paper epoch", "paper epoch measured",
                  "augmentation's draws", "1 process", "2 processes", "smoke run, 2 epochs"):
        row = next(r for r in report["rows"] if r["name"].startswith(start))
        assert math.isfinite(row["ours"]) and row["ours"] > 0, row
    assert next(r for r in report["rows"] if r["name"].startswith("smoke run"))["met"]  # finite loss, kNN > 10%
    profiled = {r["name"]: r for r in report["rows"] if r["section"] == "profile"}
    wall = profiled["trainer vs bare loop: wall"]
    assert wall["ours"] > 0 and wall["baseline"] > 0 and "one epoch of 10 steps a side" in wall["note"]
    assert profiled["trainer vs bare loop: host reads of a tensor value"]["baseline"] > 0  # the augmentation's
    assert profiled["trainer's extra CPU time by operator"]["note"].count("aten::") >= 1
    checkpoint = profiled["the trainer's checkpoint, written after every epoch"]
    assert checkpoint["ours"] > 0 and checkpoint["baseline"] > 0 and "MB, fsync'd" in checkpoint["note"]
    assert report["meta"]["device"] == "cpu" and "| gpu | autocast bfloat16" in (out / "gpu.md").read_text()


@pytest.mark.slow  # ~2 minutes: the tests step, gpu.py's start and 4 toy runs of 2 epochs
@pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(), reason="embedded CIFAR-10 not present")
def test_the_one_gpu_command_reports_every_step_in_eight_files(tmp_path: Path) -> None:
    """``benchmarks/gpu_check.py --tiny``: the command a lent GPU machine runs, rehearsed on the CPU."""
    out = tmp_path / "out"
    cmd = [sys.executable, "benchmarks/gpu_check.py", "--tiny", "--out", str(out), "--budget-s", "420",
           "--tests-s", "150", "--gpu-s", "0", "--epochs", "2", "--tests", "tests/training/test_mixed_precision.py"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=_as_on_the_gpu_machine(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [  # the lending machine returns 8 files at most
        "answer.md", "check.log", "curves.png", "gpu.json", "gpu.md", "runs.jsonl", "runs_logs.txt", "tests.txt"]
    assert (out / "curves.png").read_bytes().startswith(b"\x89PNG")
    assert "6 passed" in (out / "tests.txt").read_text()
    assert "every step exit 0" in (out / "check.log").read_text()
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert sorted({r["run"] for r in runs}) == ["dcl_s0", "dcl_s1", "infonce_s0", "infonce_s1"] and len(runs) == 8
    assert all(math.isfinite(r["train/loss"]) and "eval/knn_top1" in r for r in runs)
    answer = (out / "answer.md").read_text()
    assert "compared at epoch 2" in answer and "DCL − InfoNCE kNN top-1 at epoch 2" in answer
    logs = (out / "runs_logs.txt").read_text()
    assert "==> dcl_s0.log <==" in logs and "==> driver.log <==" in logs and "not on the GPU machine" not in logs


@pytest.mark.slow  # ~5 s
def test_the_gpu_runs_summary_compares_at_the_last_epoch_every_run_finished(tmp_path: Path) -> None:
    """``benchmarks/gpu_runs.py --summarize``: paired by seed at the common last epoch, verdict against Table 1."""
    knn = {("dcl", 0): [40.0, 52.0, 60.0], ("dcl", 1): [41.0, 50.0], ("infonce", 0): [38.0, 47.0, 55.0],
           ("infonce", 1): [39.0, 46.0, 58.0]}
    for (loss, seed), values in knn.items():
        (tmp_path / f"{loss}_s{seed}").mkdir()
        (tmp_path / f"{loss}_s{seed}" / "metrics.jsonl").write_text(
            "".join(json.dumps({"eval/knn_top1": v, "train/q_mean": 0.9}) + "\n" for v in values))
        (tmp_path / f"{loss}_s{seed}" / "config.json").write_text(json.dumps(  # a run shrunk with --set
            {"model.arch": "resnet18", "model.width": 1.0, "data.dataset": "cifar10", "data.train_per_class": 500}))
    proc = subprocess.run([sys.executable, "benchmarks/gpu_runs.py", "--summarize", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "compared at epoch 2" in proc.stdout  # dcl s1 stopped after 2 epochs
    assert proc.stdout.startswith("DCL vs InfoNCE, resnet18, cifar10, 500 images per class, batch 32:")
    # differences at epoch 2: 52 - 47 = 5, 50 - 46 = 4: mean +4.50, t-interval over 2 seeds [-1.85, +10.85]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("DCL − InfoNCE kNN top-1 at epoch 2: +4.50 [-1.85, +10.85] over 2 seed(s): not resolved")
    assert last.endswith("(Table 1, 200 epochs: +4.8; a gap at epoch 2 is not weighed against it)")
    assert (tmp_path / "answer.md").read_text().strip().endswith(last)


def test_a_gap_after_fewer_epochs_than_the_paper_s_is_not_said_to_rule_out_its_size(tmp_path: Path) -> None:
    """A gap at epoch 5 is not Table 1's gap at epoch 200: "rules out the paper's size" (+0.45 [-0.64, +1.53] at
    epoch 5 on an H200) compared the two; only its sign is weighed."""
    knn = {("dcl", 0): [40.1, 50.1], ("dcl", 1): [41.0, 50.3], ("infonce", 0): [40.0, 50.0],
           ("infonce", 1): [41.0, 50.1]}
    for (loss, seed), values in knn.items():
        (tmp_path / f"{loss}_s{seed}").mkdir()
        (tmp_path / f"{loss}_s{seed}" / "metrics.jsonl").write_text(
            "".join(json.dumps({"eval/knn_top1": v, "train/q_mean": 0.9}) + "\n" for v in values))
    proc = subprocess.run([sys.executable, "benchmarks/gpu_runs.py", "--summarize", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]  # +0.15 [-0.48, +0.79]: far below +4.8, and only at epoch 2
    assert "paper's size" not in last and last.endswith("a gap at epoch 2 is not weighed against it)"), last


# ---- what --summarize reads and writes (issue 46, items 4, 6 and 10): bounded, never through a link, one line

def _runs(out: Path, knn: dict | None = None, config: dict | None = None) -> Path:
    """Four runs' folders as ``gpu_runs.py`` leaves them (two epochs each)."""
    for (loss, seed), values in (knn or {("dcl", 0): [40.0, 52.0], ("dcl", 1): [41.0, 50.0],
                                          ("infonce", 0): [38.0, 47.0], ("infonce", 1): [39.0, 46.0]}).items():
        (out / f"{loss}_s{seed}").mkdir(parents=True)
        (out / f"{loss}_s{seed}" / "metrics.jsonl").write_text(
            "".join(json.dumps({"eval/knn_top1": v, "train/q_mean": 0.9}) + "\n" for v in values))
        (out / f"{loss}_s{seed}" / "config.json").write_text(json.dumps(config or {
            "model.arch": "resnet18", "model.width": 1.0, "data.dataset": "cifar10", "data.train_per_class": 500}))
    return out


def _summarize(out: Path, capsys: pytest.CaptureFixture[str], code: int = 2) -> str:
    """``gpu_runs.py --summarize OUT`` in this process (a hang fails in 20 s): its one error line, or its table."""
    from benchmarks.gpu_runs import main

    def hung(*_: object) -> None:
        raise TimeoutError("gpu_runs --summarize hung")

    before = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        assert main(["--summarize", str(out)]) == code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    captured = capsys.readouterr()
    if code == 0:
        return captured.out
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in captured.err, captured.err
    return err[0]


def test_the_summary_replaces_a_link_planted_at_answer_md_never_its_target(tmp_path: Path, capsys) -> None:
    """``ln -s ~/precious OUT/answer.md; gpu_runs.py --summarize OUT`` overwrote precious."""
    out = _runs(tmp_path / "out")
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    (out / "answer.md").symlink_to(precious)
    assert "compared at epoch 2" in _summarize(out, capsys, code=0)
    assert precious.read_text() == "keep me"
    assert not (out / "answer.md").is_symlink() and "compared at epoch 2" in (out / "answer.md").read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_the_summary_reads_regular_files_only_and_within_their_bound(tmp_path: Path, capsys) -> None:
    """A metrics.jsonl linked to /dev/zero read 3.4 GB; a FIFO there hung; a larger file is refused unread."""
    out = _runs(tmp_path / "out")
    metrics = out / "dcl_s0" / "metrics.jsonl"
    metrics.unlink()
    os.mkfifo(metrics)  # opened for reading, a FIFO without a writer blocks forever
    assert _summarize(out, capsys).endswith("metrics.jsonl is a FIFO, not a regular file: not read")
    metrics.unlink()
    os.mknod(metrics, 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # the device /dev/zero is, made here
    assert _summarize(out, capsys).endswith("metrics.jsonl is a character device, not a regular file: not read")
    metrics.rename(tmp_path / "zero")
    metrics.symlink_to(tmp_path / "zero")
    assert _summarize(out, capsys).endswith("metrics.jsonl is a symbolic link, not a regular file: not read")
    metrics.unlink()
    from benchmarks.gpu_runs import MAX_METRICS_BYTES

    with metrics.open("wb") as f:  # sparse: its size says what it holds before a byte is read
        f.truncate(MAX_METRICS_BYTES + 1)
    assert f"holds more than {MAX_METRICS_BYTES:,} bytes" in _summarize(out, capsys)


@pytest.mark.parametrize(("damage", "needle"), [
    (lambda out: (out / "dcl_s0" / "metrics.jsonl").write_text('{"eval/knn_top1": 40.0}\n{not json\n'),
     "dcl_s0/metrics.jsonl, line 2 is not JSON"),
    (lambda out: (out / "dcl_s0" / "metrics.jsonl").write_text('[1, 2]\n'), "line 1 is not a JSON object"),
    (lambda out: (out / "dcl_s1" / "metrics.jsonl").write_text('{"eval/knn_top1": 40.0}\n{"train/q_mean": 0.9}\n'),
     "dcl_s1/metrics.jsonl: no eval/knn_top1 at epoch 2, the one the runs are compared at"),
    (lambda out: (out / "dcl_s1" / "metrics.jsonl").write_text('{"eval/knn_top1": "40"}\n{"eval/knn_top1": 1}\n'),
     "dcl_s1/metrics.jsonl, epoch 1: eval/knn_top1 is '40', not a number in [0, 100]"),
    (lambda out: (out / "dcl_s1" / "metrics.jsonl").write_text('{"eval/knn_top1": 1e308}\n'),
     "eval/knn_top1 is '1e+308', not a number in [0, 100]"),
    (lambda out: (out / "dcl_s0" / "config.json").write_text("{"), "dcl_s0/config.json is not JSON"),
    (lambda out: (out / "dcl_s0" / "config.json").write_text('{"model.arch": "resnet18", "model.width": "wide", '
                                                             '"data.dataset": "cifar10"}'),
     "config.json: model.width is 'wide', not a number"),
    (lambda out: (out / "dcl_s0" / "config.json").write_text('{"model.arch": "\\u001b[31mred", '
                                                             '"data.dataset": "cifar10"}'),
     "config.json: model.arch is '\\x1b[31mred', not a name"),
    (lambda out: (out / "dcl_s0" / "config.json").write_text('{"model.arch": "resnet18", "data.dataset": "cifar10",'
                                                             ' "data.train_per_class": "many"}'),
     "data.train_per_class is 'many', not a count"),
])
def test_a_damaged_run_file_is_one_line_exit_2(tmp_path: Path, capsys, damage, needle) -> None:
    """Bad JSON, a missing or string kNN, a bad config.json: each was a traceback."""
    out = _runs(tmp_path / "out")
    damage(out)
    assert needle in _summarize(out, capsys)
    assert not (out / "answer.md").exists()


def test_a_missing_folder_or_a_file_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    assert _summarize(tmp_path / "missing", capsys).endswith("missing does not exist: name the folder of the runs "
                                                             "(--out of an earlier run)")
    assert _summarize(tmp_path / "file", capsys).endswith("file is not a folder: name the folder of the runs "
                                                          "(--out of an earlier run)")


def test_the_gpu_check_writes_its_report_never_through_a_planted_link(tmp_path: Path) -> None:
    """``benchmarks/gpu.py --out OUT`` wrote through links at ``gpu.json.partial`` and ``gpu.md`` (issue 46, item 6)."""
    from benchmarks.common import Row
    from benchmarks.gpu import Report

    out = tmp_path / "out"
    out.mkdir()
    precious = {name: tmp_path / f"precious_{name}" for name in ("gpu.json.partial", "gpu.json", "gpu.md")}
    for name, target in precious.items():
        target.write_text("keep me")
        (out / name).symlink_to(target)
    report = Report(out, {"device": "cpu", "torch": "2", "date": "today"})
    report.add(Row("gpu", "matmul 8^3 float32", 1.5, unit="TFLOP/s"))
    assert all(target.read_text() == "keep me" for target in precious.values())
    assert "| gpu | matmul 8^3 float32 | 1.5 TFLOP/s |" in report.finish()
    assert all(target.read_text() == "keep me" for target in precious.values())
    assert json.loads((out / "gpu.json").read_text())["rows"][0]["ours"] == 1.5
    assert (out / "gpu.md").read_text().startswith("cpu, torch 2, today") and not (out / "gpu.md").is_symlink()


@pytest.mark.parametrize("name", ["gpu.md", "gpu.json"])
def test_the_gpu_check_refuses_a_fifo_at_its_report_before_any_work(tmp_path: Path, monkeypatch, capsys,
                                                                    name: str) -> None:
    """Issue 61, item 11: a FIFO at ``OUT/gpu.md`` was refused only after every part had run (minutes of a GPU's
    budget), in a traceback. Now one line, exit 2, before any part runs; the FIFO as it was."""
    from benchmarks import gpu

    ran: list[str] = []
    for part in ("autocast_rows", "peak_rows", "step_rows", "sharing_rows", "paper_run_rows"):
        monkeypatch.setattr(gpu, part, lambda *args, part=part: ran.append(part) or iter([]))
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / name)
    code = gpu.main(["--tiny", "--device", "cpu", "--out", str(out)])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0] == (f"error: {out / name} is a FIFO, not a regular file: refusing "
                                                      "to replace it (name a regular file or a new path)"), err
    assert ran == [] and "Traceback" not in captured.err
    assert stat.S_ISFIFO(os.lstat(out / name).st_mode) and sorted(p.name for p in out.iterdir()) == [name]


def test_the_gpu_check_runs_the_parts_asked_for_in_its_order_and_refuses_an_unknown_one(tmp_path: Path, monkeypatch,
                                                                                          capsys) -> None:
    """``--parts``: a call of a lent machine runs only what it needs; an unknown key is one line, exit 2, before
    any part runs."""
    from benchmarks import gpu

    ran: list[str] = []
    for part in ("autocast_rows", "peak_rows", "step_rows", "draws_rows", "profile_rows", "sharing_rows",
                 "paper_run_rows"):
        monkeypatch.setattr(gpu, part, lambda *args, part=part, **kw: ran.append(part) or iter([]))
    assert gpu.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), "--parts", "profile,peak"]) == 0
    assert ran == ["peak_rows", "profile_rows"]  # the order of the parts, not of the flag
    ran.clear()
    with pytest.raises(SystemExit) as exit_:
        gpu.main(["--tiny", "--device", "cpu", "--out", str(tmp_path / "x"), "--parts", "peak,warp"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and ran == [] and err[-1].endswith(
        "argument --parts: unknown part warp: choose from autocast, peak, step, epoch, draws, profile, sharing, paper")


def test_the_step_profile_counts_per_step_what_it_names() -> None:
    """``benchmarks/step_profile.py``'s figures from a profile of a known loop: 5 steps, each reading two tensor
    values (``float()`` and ``.item()``) and running one matrix product."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.step_profile import summarize

    a = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            float((a @ a).sum())
            a.max().item()
    got = summarize(prof.key_averages(), seconds=0.5, steps=5, on_gpu=False)
    assert got.reads == 2 and got.syncs == 0 and got.copies == 0 and got.device_ms == 0
    assert got.wall_ms == pytest.approx(100.0) and got.self_ms["aten::mm"] > 0


def test_the_step_profile_counts_a_kernel_s_time_once_on_a_gpu() -> None:
    """A CUDA profile lists a kernel twice: as its own event and as the self device time of the operator that
    launched it. The device's busy time counts it once; the operators' times name the operator. The averages are
    written here as a CUDA profile gives them, so that a machine without a GPU checks it."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from benchmarks.step_profile import summarize

    def avg(key, count, cpu_us, device_us, kind):
        return SimpleNamespace(key=key, count=count, self_cpu_time_total=cpu_us, self_device_time_total=device_us,
                               device_type=kind)

    events = [avg("aten::mm", 10, 50.0, 3000.0, DeviceType.CPU), avg("ampere_sgemm_64x64", 10, 0.0, 3000.0,
                                                                     DeviceType.CUDA),
              avg("aten::_local_scalar_dense", 20, 40.0, 0.0, DeviceType.CPU),
              avg("cudaStreamSynchronize", 20, 900.0, 0.0, DeviceType.CPU),
              avg("cudaMemcpyAsync", 30, 60.0, 0.0, DeviceType.CPU)]
    got = summarize(events, seconds=0.1, steps=10, on_gpu=True)
    assert got.device_ms == pytest.approx(0.3) and got.self_ms == {"aten::mm": pytest.approx(0.3)}
    assert (got.reads, got.syncs, got.copies, got.wall_ms) == (2, 2, 3, pytest.approx(10.0))
