"""The same study command on a Ray cluster: a real head node on 127.0.0.1, ``ray job submit``, and a real
``mlflow server`` on loopback as the tracking store, read back with MlflowClient."""

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from dcl_core.data import resolve_data_root
from dcl_core.study import summary_dir
from dcl_core.study.report import read_table

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer (e.g. 401 under token auth) means the server is up
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(url)


@pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(), reason="no embedded CIFAR-10")
def test_ray_job_submit_to_local_head_node(tmp_path):
    data_root = resolve_data_root("cifar10", None)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    # Ray 2.5x clusters authenticate job submissions with a token; head node and client share this one.
    token = tmp_path / "ray_auth_token"
    token.write_text(secrets.token_hex(32))
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    gcs, dash, mlflow_port = free_port(), free_port(), free_port()
    mlflow = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(mlflow_port),
            "--backend-store-uri",
            f"sqlite:///{tmp_path / 'server.db'}",
            "--artifacts-destination",
            str(tmp_path / "server-artifacts"),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    # --block keeps `ray start` in the foreground; terminating it stops exactly this head node (`ray stop`
    # would stop every Ray instance on the machine).
    head = subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={gcs}",
            "--num-cpus=2",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            # Its own ports for the node's agents: another Ray on the machine (a study running beside the tests)
            # holds the defaults, and the job agent then never comes up ("No available agent").
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            "--disable-usage-stats",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{dash}/api/version", timeout=180)
        wait_http(f"http://127.0.0.1:{mlflow_port}/health")
        tracking = f"http://127.0.0.1:{mlflow_port}"
        out = tmp_path / "job-outputs"
        cmd = [
            str(BIN / "ray"),
            "job",
            "submit",
            "--address",
            f"http://127.0.0.1:{dash}",
            "--working-dir",
            str(REPO),
            "--",
            "python",
            "studies/temperature_sweep.py",
            "--smoke",
            "--losses",
            "dcl",
            "--output-dir",
            str(out),
            "--data-root",
            str(data_root),
            "--tracking-uri",
            tracking,
        ]
        deadline = time.monotonic() + 180  # the head's job agent may start well after its HTTP server on a busy machine
        while True:
            job = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            if "No available agent" not in job.stdout + job.stderr or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert job.returncode == 0, job.stdout[-4000:] + job.stderr[-2000:]
        assert "succeeded" in (job.stdout + job.stderr).lower()
        assert len(read_table(summary_dir(out, "temperature_sweep") / "results.parquet")) == 2

        client = MlflowClient(tracking_uri=tracking)
        exp = client.get_experiment_by_name("temperature_sweep")
        runs = client.search_runs([exp.experiment_id])
        trials = [r for r in runs if r.data.tags.get("dcl.summary") != "true"]
        summary = [r for r in runs if r.data.tags.get("dcl.summary") == "true"]
        assert len(trials) == 2 and len(summary) == 1
        # What MLflow's UI reads (its REST API): the study is one parent run, its trials nested beneath it.
        parent, children = _rest_runs(tracking, exp.experiment_id)
        assert parent["info"]["run_name"] == "temperature_sweep" and len(children) == 2
        assert all(_tags(c)["mlflow.parentRunId"] == parent["info"]["run_id"] for c in children)
        assert all(r.info.status == "FINISHED" and "eval/knn_top1" in r.data.metrics for r in trials)
        arts = {a.path for a in client.list_artifacts(summary[0].info.run_id)}
        assert "results.parquet" in arts and "temperature_sweep.png" in arts

        # With a cluster running on the machine, a study without --address still gets its own local Ray
        # (plain ray.init() would attach to that cluster and then reject num_cpus).
        probe = subprocess.run(
            [sys.executable, "-c", "from dcl_core.study import init_ray; import ray; init_ray(None, 1); "
             "print(ray.get_runtime_context().gcs_address, ray.cluster_resources()['CPU'])"],
            capture_output=True, text=True, env=env, timeout=180, cwd=REPO,
        )
        assert probe.returncode == 0, probe.stderr[-2000:]
        gcs_address, cpus = probe.stdout.split()[-2:]
        assert not gcs_address.endswith(f":{gcs}") and float(cpus) == 1.0
    finally:
        head.terminate()
        head.wait(timeout=120)
        mlflow.terminate()
        mlflow.wait(timeout=30)


def _tags(run: dict) -> dict:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def _rest_runs(tracking: str, experiment_id: str) -> tuple[dict, list[dict]]:
    """(parent, children) of an experiment, read through the tracking server's REST API as the UI does."""
    import json
    import urllib.request

    body = json.dumps({"experiment_ids": [experiment_id], "max_results": 1000}).encode()
    request = urllib.request.Request(f"{tracking}/api/2.0/mlflow/runs/search", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        runs = json.load(response)["runs"]
    parents = [r for r in runs if "mlflow.parentRunId" not in _tags(r)]
    assert len(parents) == 1, [_tags(r) for r in parents]
    return parents[0], [r for r in runs if "mlflow.parentRunId" in _tags(r)]
