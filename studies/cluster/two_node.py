"""A real two-node Ray cluster on one Linux machine, and a study submitted to it (optionally losing a node).

Does a study submitted with docs/cluster.md's `ray job submit` line run across nodes that have their own addresses,
under Ray's token auth, with MLflow on a server, and does it survive its worker node dying mid-study? As root,
two network namespaces joined by a veth pair are two hosts to Ray:

    sudo bash studies/cluster/two_node.sh                           # 2 nodes, the smoke study: ~2 min
    sudo bash studies/cluster/two_node.sh --kill-worker-after 20    # ... the worker node killed mid-study: ~3 min

1. Namespaces ``dcl<pid>h`` (head) and ``dcl<pid>w`` (worker) and a veth pair between them, addressed
   198.51.100.1 and .2 (TEST-NET-2, a documentation range) with no route anywhere else: the cluster's traffic
   stays inside the two namespaces.
2. Token auth as docs/cluster.md's recipe sets it up: ``RAY_AUTH_MODE=token``, ``ray get-auth-token --generate`` in a
   home folder of its own (the token both nodes read), mode 600.
3. In the head namespace: ``ray start --head`` (with its dashboard, 1 CPU) and an ``mlflow server``; in the
   worker namespace: ``ray start --address 198.51.100.1:6379`` (1 CPU). It waits until Ray lists 2 alive nodes.
4. In the head namespace, docs/cluster.md's line: ``ray job submit --address http://198.51.100.1:8265 --working-dir
   <checkout> -- python studies/temperature_sweep.py --smoke --seeds 1 --set optim.epochs=10 --data-root ...
   --output-dir ... --tracking-uri http://198.51.100.1:5000`` (4 trials, one per node at a time; 10
   epochs, so that a trial is killed between two of its checkpoints rather than before its first).
5. ``--kill-worker-after N``: once the trials have reported N epochs in all (Tune's result files) and a trial on
   the worker is mid-way (2 epochs done, 3 to go), every process of the worker namespace gets SIGKILL: the node
   is lost as a machine is when it powers off.
6. Checks (exit 1 if any fails): the job succeeded; every trial finished all its epochs; trials ran on both
   nodes (each trial's ``node_ip`` in Tune's results); each trial that was on the killed node continued on the
   head from the epoch after its last checkpoint (retried from its checkpoint, not from scratch).
7. Teardown, also on Ctrl-C, SIGTERM or failure: SIGTERM then SIGKILL to every process in its own two namespaces
   (nothing else on the machine), ``ip netns del`` (which removes the veth pair), its Ray temp folders.

Exit codes: 0 all checks hold, 1 a check failed, 2 it cannot run here (not root, no network namespaces, bad
option), 130 Ctrl-C, 143 SIGTERM. Outputs stay in ``--work-dir``: ``outputs/`` (the study), ``mlflow/`` (the
server's store), ``logs/``. Arguments after ``--`` replace the study's options (``--seeds 1 --set
optim.epochs=10``). What it cannot show: the "shared" filesystem both nodes use is this machine's own.

This script is the command line (its options, the checks before any namespace exists, signals and exit codes); the
cluster is ``studies/cluster/netns.py``, the study's job and its checks ``studies/cluster/job.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn


def _interrupted_before_the_cluster() -> NoReturn:
    print("two_node: interrupted before the cluster was built; nothing to tear down", file=sys.stderr)
    sys.exit(130)


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
# dcl_core is imported where it is used (it imports torch: seconds), a Ctrl-C held until the import is done.
try:  # a Ctrl-C during this script's own imports: the same one line as during its checks
    from studies.cluster.job import REPO, STUDY_ARGS, Run, ctrl_c_deferred, planned_trials, study_command
    from studies.cluster.netns import HEAD_IP, WORKER_IP, Cluster, UnusableError
except KeyboardInterrupt:
    _interrupted_before_the_cluster()

CLAIM = ".two_node"  # in the work folder: this run owns it
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class StoppedError(Exception):
    """SIGTERM or SIGHUP (the terminal closed), handled like Ctrl-C; ``args[0]`` is the signal's number."""


# Stop the run and tear the cluster down: Ctrl-C (KeyboardInterrupt), and these, each with its exit status.
STOP_SIGNALS = {signal.SIGTERM: 143, signal.SIGHUP: 129}


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, tuple[str, ...]]:
    """This script's options and the study arguments after ``--`` (the default study's without them)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    study_args = tuple(argv[argv.index("--") + 1:]) if "--" in argv else STUDY_ARGS
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kill-worker-after", type=int, metavar="N",
                   help="kill the worker node once the trials have reported N epochs (and one of its trials is "
                        "mid-way); its trials must then finish on the head from their checkpoints")
    p.add_argument("--work-dir", type=Path, help="a new or empty folder for outputs, MLflow and logs "
                                                 "(default: a new one under /tmp)")
    p.add_argument("--data-root", type=Path, help="CIFAR-10 (ImageFolder); default: the embedded copy")
    return p.parse_args(argv), study_args


def preflight(args: argparse.Namespace, study_args: tuple[str, ...]) -> tuple[Path, Path, int, int]:
    """Everything that can be refused before a namespace exists: one line each."""
    if sys.platform != "linux":
        raise UnusableError("network namespaces are Linux only")
    if os.geteuid() != 0:
        raise UnusableError("run as root: network namespaces need CAP_SYS_ADMIN (sudo bash studies/cluster/...)")
    if shutil.which("ip") is None:
        raise UnusableError("the `ip` command (iproute2) is not installed")
    if not Path(sys.executable).with_name("ray").exists():
        raise UnusableError(f"no `ray` command beside {sys.executable}: install the project (pip install -e .)")
    with ctrl_c_deferred():
        from dcl_core.data import resolve_data_root

    data_root = resolve_data_root("cifar10", str(args.data_root) if args.data_root else None).resolve()
    if not (data_root / "train").is_dir():
        raise UnusableError(f"no CIFAR-10 at {data_root}: pass --data-root")
    work = args.work_dir.resolve() if args.work_dir else None
    if work is not None and work.exists() and (not work.is_dir() or any(work.iterdir())):
        raise UnusableError(f"--work-dir {work} is not a new or empty folder")
    trials, epochs = planned_trials(study_args, data_root)
    if args.kill_worker_after is not None and not 0 < args.kill_worker_after < trials * epochs - epochs:
        raise UnusableError(f"--kill-worker-after must be between 1 and {trials * epochs - epochs - 1} "
                       f"(the study reports {trials * epochs} epochs), got {args.kill_worker_after}")
    work = work or Path(tempfile.mkdtemp(prefix="dcl-two-node-"))
    work.mkdir(parents=True, exist_ok=True)
    try:  # claimed atomically: of two runs started on one empty folder, the second stops here
        os.close(os.open(work / CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        raise UnusableError(f"--work-dir {work} is being used by another run") from None
    return work, data_root, trials, epochs


def main(argv: list[str] | None = None) -> int:
    """Build the two-node cluster, run the study on it, check the outcome and tear it down; the exit status."""
    args, study_args = parse(argv)
    try:
        work, data_root, trials, epochs = preflight(args, study_args)
    except UnusableError as err:
        print(f"two_node: {err}", file=sys.stderr)
        return EXIT_USAGE
    cluster = Cluster(work)

    stopping = False

    def stop(signum: int, _frame: Any) -> None:
        """The first Ctrl-C, SIGTERM or SIGHUP stops the run; any later one waits for the teardown it started."""
        nonlocal stopping
        if stopping:
            return
        stopping = True
        raise KeyboardInterrupt if signum == signal.SIGINT else StoppedError(signum)

    try:
        for sig in (signal.SIGINT, *STOP_SIGNALS):
            signal.signal(sig, stop)
        cluster.create_network()
        cluster.start_ray()
        print(f"== 2 nodes: head {HEAD_IP} (namespace {cluster.head_ns}), worker {WORKER_IP} "
              f"(namespace {cluster.worker_ns}); token auth; work folder {work}; Ray temp folders {cluster.temp}",
              flush=True)
        tracking_uri = cluster.start_mlflow()
        run = Run(cluster, trials, epochs, args.kill_worker_after)
        command = [*study_command(data_root, run.output_dir, study_args), "--tracking-uri", tracking_uri]
        print(f"== ray job submit --address {cluster.dashboard} --working-dir {REPO} -- {' '.join(command)}",
              flush=True)
        failed = run.check(run.submit(command))
    except UnusableError as err:
        print(f"two_node: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("two_node: interrupted; tearing the cluster down", file=sys.stderr)
        return 130
    except StoppedError as stopped:
        sig = signal.Signals(stopped.args[0])
        print(f"two_node: stopped ({sig.name}); tearing the cluster down", file=sys.stderr)
        return STOP_SIGNALS[sig]
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        print(f"two_node: {err}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        stopping = True  # nothing cuts the teardown short: a Ctrl-C, SIGTERM or SIGHUP now waits until it is done
        cluster.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for line in failed:
        print(f"two_node: FAILED: {line}", file=sys.stderr)
    if not failed:
        print(f"== OK: every trial finished on a 2-node cluster{' that lost its worker' if run.killed else ''}; "
              f"outputs in {work}")
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # before main's own handlers (the checks before the cluster, its imports)
        _interrupted_before_the_cluster()
