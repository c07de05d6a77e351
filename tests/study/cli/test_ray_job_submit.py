"""docs/cluster.md's cluster recipe, run as written: ``ray start --head`` with Ray's token authentication on, ``ray job
submit`` of the smoke study, and the head stopped by its own process; then the study's MLflow store served by a
real ``mlflow server`` and read back through its REST API as the UI reads it."""

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from dcl_core.config import ConfigError
from dcl_core.data import resolve_data_root
from dcl_core.study import summary_dir
from dcl_core.study.analysis.tables import read_table
from dcl_core.study.plan.checks import check_ray_address

# Under pytest-xdist, never beside the two-node cluster (the same group, one worker): a `ray start --head` on this
# machine and the cluster's head shared /tmp/ray/ray_current_cluster, and a job's driver attached to the other (the
# recipe now runs with a TMPDIR of its own, so its head's address file is its own too).
pytestmark = pytest.mark.xdist_group("ray_heads")

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
RECIPE_MARK = "<!-- cluster recipe: tests/study/cli/test_ray_job_submit.py runs the next block -->"


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


def readme_recipe() -> str:
    """The one-machine cluster recipe of docs/cluster.md: the fenced block after its marker."""
    text = (REPO / "docs" / "cluster.md").read_text()
    assert RECIPE_MARK in text, "docs/cluster.md lost its cluster recipe's marker"
    block = re.search(r"```bash\n(.*?)```", text[text.index(RECIPE_MARK):], re.S)
    assert block is not None
    return block.group(1)


OWN_LOSS_MARK = ("<!-- own loss on a cluster: tests/study/cli/test_ray_job_submit.py submits the next block to the "
                 "recipe's head -->")


def own_loss_job() -> str:
    """docs/own-loss.md's ``ray job submit`` of a user loss: the fenced block after its marker."""
    text = (REPO / "docs" / "own-loss.md").read_text()
    assert OWN_LOSS_MARK in text, "docs/own-loss.md lost its cluster command's marker"
    block = re.search(r"```bash\n(.*?)```", text[text.index(OWN_LOSS_MARK):], re.S)
    assert block is not None and block.group(1).startswith("ray job submit ")
    return block.group(1)


def test_readme_recipe_is_what_a_newcomer_types():
    """What the recipe must keep saying (the test below runs whatever it says): token auth on for every ray
    command, a token made before the head starts, the head in the foreground and stopped by its own pid."""
    recipe = readme_recipe()
    lines = [line.split("#")[0].strip() for line in recipe.splitlines()]
    assert lines[0] == "export RAY_AUTH_MODE=token" and "RAY_AUTH_MODE=disabled" not in recipe
    assert "chmod 600 ~/.ray/auth_token" in lines
    assert lines.index("ray get-auth-token --generate > /dev/null") < next(
        i for i, line in enumerate(lines) if line.startswith("ray start --head"))
    assert "--block" in recipe and "kill $HEAD_PID" in recipe and "ray stop" not in "".join(lines)


@pytest.mark.slow  # a Ray head, ray job submit, an mlflow server
@pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(), reason="no embedded CIFAR-10")
def test_readme_cluster_recipe_runs_as_written(tmp_path, request):
    """The recipe's block with only its values substituted (ports, the data's path), in a fresh home folder (no
    token yet, as on a new machine) and an environment without any RAY_ variable: the job succeeds, its log
    carries no traceback and no advice to disable auth, and the head's processes are gone after its kill."""
    data_root = resolve_data_root("cifar10", None)
    gcs, dash = free_port(), free_port()
    # docs/own-loss.md's job (a user loss, by file) goes to the same head, after the recipe's own job
    recipe = readme_recipe().replace("\nkill $HEAD_PID", "\n" + own_loss_job() + "kill $HEAD_PID", 1)
    recipe = recipe.replace("6379", str(gcs)).replace("8265", str(dash)).replace("/data/cifar10", str(data_root))
    home = tmp_path / "home"
    home.mkdir()
    # Ray's temp folder ($TMPDIR/ray) of its own: the address file the head leaves is this test's, not /tmp/ray's
    temp = Path(tempfile.mkdtemp(prefix="dclrecipe", dir="/tmp"))  # short: Ray's socket paths live under it
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"HOME": str(home), "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0",
            "TMPDIR": str(temp)}
    # As typed into a shell (no `set -e`). The script's status is its last command's, `wait`'s: the head's own
    # exit after SIGTERM (1 or 143 as Ray's shutdown path goes), not the job's; the job's is its "succeeded" line.
    try:
        job = subprocess.run(["bash", "-c", recipe], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=900)
    finally:  # a recipe that failed half-way leaves its head running: stop it (only it: by its own port)
        subprocess.run(["pkill", "-TERM", "-f", f"ray start --head .*--port {gcs} "], capture_output=True)
    log = job.stdout + job.stderr
    assert len(re.findall(r"Job 'raysubmit_\w+' succeeded", log)) == 2, log[-4000:]
    for noise in ("Traceback", "Exception ignored", "AuthenticationError", "RAY_AUTH_MODE=disabled"):
        assert noise not in log, log[-6000:]
    token = (home / ".ray" / "auth_token").stat()  # the recipe's token, made in the fresh home, its owner's only
    assert token.st_size > 0 and token.st_mode & 0o777 == 0o600
    # `kill $HEAD_PID; wait $HEAD_PID` stopped every process of this head (and only of this head)
    left = subprocess.run(["pgrep", "-f", f"gcs_server_port={gcs}"], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout
    # ... and left its address behind (docs/cluster.md): `--address auto` is refused in one line, not waited for
    assert (temp / "ray" / "ray_current_cluster").read_text().strip().endswith(f":{gcs}")
    nothing_runs = tmp_path / "proc"  # this machine's other Rays (other tests') aside
    nothing_runs.mkdir()
    with pytest.raises(ConfigError, match=f"no Ray cluster answers at auto .*:{gcs}: the cluster the last `ray start` "
                                          "recorded in"):
        check_ray_address("auto", timeout=5, environ={"TMPDIR": str(temp)}, proc=nothing_runs)

    out = home / "dcl-cluster" / "outputs"
    rows = read_table(summary_dir(out, "temperature_sweep") / "results.parquet")
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    store = f"sqlite:///{out / 'mlflow.db'}"
    exp = MlflowClient(tracking_uri=store).get_experiment_by_name("temperature_sweep")
    runs = MlflowClient(tracking_uri=store).search_runs([exp.experiment_id])
    trials = [r for r in runs if "trial_id" in r.data.tags]
    assert len(trials) == 4 and all(r.info.status == "FINISHED" and "eval/knn_top1" in r.data.metrics
                                   for r in trials)

    # The user loss's study: its file found in the job's copy of the checkout, trained by the head's trials
    own = home / "dcl-cluster" / "own-loss"
    rows = read_table(summary_dir(own, "temperature_sweep") / "results.parquet")
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    assert {r["series"] for r in rows} == {"dcl", "PositiveWeighted"}
    client = MlflowClient(tracking_uri=f"sqlite:///{own / 'mlflow.db'}")
    mine = [r for r in client.search_runs([client.get_experiment_by_name("temperature_sweep").experiment_id])
            if r.data.tags.get("dcl.loss.source")]
    assert len(mine) == 2 and all(r.data.tags["dcl.loss.source"].endswith("docs/examples/my_losses.py") and
                                  r.data.params["loss.params"] == '{"positive_weight": 0.5}' for r in mine)

    # What MLflow's UI reads (a server's REST API): the study is one parent run, its trials nested beneath it.
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                               "--backend-store-uri", store, "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # no job consumers
    try:
        tracking = f"http://127.0.0.1:{port}"
        wait_http(f"{tracking}/health")
        parent, children = _rest_runs(tracking, exp.experiment_id)
        trials = [c for c in children if "trial_id" in _tags(c)]  # and the run holding the study's figure
        assert parent["info"]["run_name"] == "temperature_sweep" and len(trials) == 4
        assert [c["info"]["run_name"] for c in children if c not in trials] == ["temperature_sweep: figure"]
        assert all(_tags(c)["mlflow.parentRunId"] == parent["info"]["run_id"] for c in children)
    finally:
        server.terminate()
        server.wait(timeout=30)


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


@pytest.mark.slow  # a Ray head and a local Ray
def test_a_local_study_does_not_attach_to_a_head_running_on_the_machine(tmp_path, request):
    """With a cluster running on the machine, a study without --address still gets its own local Ray (plain
    ``ray.init()`` would attach to that cluster, the last one started here, and then reject num_cpus)."""
    token = tmp_path / "ray_auth_token"
    token.write_text("0" * 32 + "1" * 32)
    # Ray's temp folder ($TMPDIR/ray), where the head records itself as the last one started, of this test's own:
    # the head's address file would otherwise outlive it in /tmp/ray (and name a dead head to `--address auto`)
    temp = Path(tempfile.mkdtemp(prefix="dclhead", dir="/tmp"))  # short: Ray's socket paths live under it
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0",
           "TMPDIR": str(temp)}
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_TMPDIR", None)
    gcs = free_port()
    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
                             f"--port={gcs}", "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, current = time.monotonic() + 180, temp / "ray" / "ray_current_cluster"
        # up: it answers, and `ray start` has recorded it as the last head started here (read as soon as the head
        # first answered, that file was once missing on a loaded machine)
        while not current.is_file() or subprocess.run([str(BIN / "ray"), "status", "--address", f"127.0.0.1:{gcs}"],
                                                      env=env, capture_output=True).returncode != 0:
            assert time.monotonic() < deadline and head.poll() is None, "the head did not come up"
            time.sleep(2)
        assert current.read_text().endswith(f":{gcs}")  # what ray.init() would take
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
