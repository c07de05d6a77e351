"""``benchmarks/gpu.py``, the GPU check, cannot rot: its ``--tiny`` run (the same code at toy sizes) runs every part
on the CPU of a machine without Ray, Optuna or MLflow (as the bare GPU machine it is made for), writes each row to
``gpu.json`` and the table to ``gpu.md``, and exits 0."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dcl_core.data import resolve_data_root

REPO = Path(__file__).resolve().parent.parent
# Run the script with Ray, Optuna and MLflow unimportable: the GPU machine has none of them.
WITHOUT = """
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('ray', 'mlflow', 'optuna'):
            raise ImportError('not on the GPU machine: ' + name)
sys.meta_path.insert(0, Block())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


@pytest.mark.slow  # ~1 minute: every part, sharing processes and a 2-epoch smoke run included
@pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(), reason="embedded CIFAR-10 not present")
def test_the_tiny_gpu_check_runs_every_part_without_ray_optuna_or_mlflow(tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    proc = subprocess.run([sys.executable, "-c", WITHOUT, "benchmarks/gpu.py", "--tiny", "--out", str(out),
                           "--device", "cpu"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu.json").read_text())
    names = [r["name"] for r in report["rows"]]
    assert not [n for n in names if n.endswith(("failed", "skipped"))], names
    autocast = [r for r in report["rows"] if r["name"].startswith("autocast")]
    assert len(autocast) == 8 and all(r["met"] for r in autocast)  # bf16 and fp16 x 4 losses, equal to fp32
    for start in ("matmul", "conv 3x3", "trainer vs bare loop", "paper epoch", "1 process", "2 processes",
                  "smoke run, 2 epochs"):
        row = next(r for r in report["rows"] if r["name"].startswith(start))
        assert math.isfinite(row["ours"]) and row["ours"] > 0, row
    assert next(r for r in report["rows"] if r["name"].startswith("smoke run"))["met"]  # finite loss, kNN > 10%
    assert report["meta"]["device"] == "cpu" and "| gpu | autocast bfloat16" in (out / "gpu.md").read_text()


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
    assert last.endswith("(Table 1, 200 epochs: +4.8)") and (tmp_path / "answer.md").read_text().strip().endswith(last)
