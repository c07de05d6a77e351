"""The CPUs' busy share while a study runs: ``/proc/stat`` and the study's process tree, sampled on a thread.

:class:`CpuSampler` gives the ``CPU busy while trials run`` rows of :mod:`benchmarks.studies` (its docstring says
what they measure); Linux only.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass

SAMPLE_EVERY = 0.5  # seconds between /proc/stat samples
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class CpuSample:
    """One reading of ``/proc/stat`` and of the sampled process tree's CPU time."""

    t: float  # time.time()
    busy: tuple[int, ...]  # per core, jiffies (user nice system irq softirq steal)
    total: tuple[int, ...]  # per core, jiffies (busy + idle + iowait)
    tree: int  # jiffies (user + system) of the sampled process tree so far, exited processes included


def _proc_stat() -> tuple[tuple[int, ...], tuple[int, ...]]:
    busy, total = [], []
    with open("/proc/stat") as f:
        for line in f:
            if not re.match(r"cpu\d+ ", line):
                continue
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + v[4]  # idle + iowait
            b = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)  # guest is inside user
            busy.append(b)
            total.append(b + idle)
    return tuple(busy), tuple(total)


def _tree_jiffies(root: int, seen: dict[tuple[int, int], int]) -> int:
    """CPU jiffies (user + system) spent so far by ``root`` and its descendants. ``seen`` keeps every process of
    the tree met so far ((pid, start time) -> its last jiffies), so the time of a trial's worker that has exited
    still counts (Ray's workers' time does not reliably reach their parents' cutime)."""
    parent, spent = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        pid = int(entry)
        parent[pid] = int(rest[1])
        spent[(pid, int(rest[19]))] = int(rest[11]) + int(rest[12])
    for key, jiffies in spent.items():
        p, hops = key[0], 0
        while p and p != root and hops < 64:
            p, hops = parent.get(p, 0), hops + 1
        if p == root or key in seen:
            seen[key] = jiffies
    return sum(seen.values())


class CpuSampler(threading.Thread):
    """Samples ``/proc/stat`` (and the CPU time of ``root``'s process tree) every ``interval`` seconds."""

    def __init__(self, root: int | None, interval: float = SAMPLE_EVERY) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.samples: list[CpuSample] = []
        self._seen: dict[tuple[int, int], int] = {}
        self._stop_event = threading.Event()

    def _sample(self) -> None:
        busy, total = _proc_stat()
        tree = _tree_jiffies(self.root, self._seen) if self.root else 0
        self.samples.append(CpuSample(time.time(), busy, total, tree))

    def run(self) -> None:
        """Sample every ``interval`` seconds until :meth:`stop` (the thread's body)."""
        self._sample()
        while not self._stop_event.wait(self.interval):
            self._sample()

    def stop(self) -> None:
        """Stop sampling, wait for the thread, and take one last sample."""
        self._stop_event.set()
        self.join()
        self._sample()

    def utilization(self, t0: float, t1: float) -> tuple[list[float], float] | None:
        """(busy share of each core, the process tree's share of all cores) between the samples nearest inside
        ``[t0, t1]``; None if fewer than two samples fall in it."""
        inside = [s for s in self.samples if t0 - self.interval / 2 <= s.t <= t1 + self.interval / 2]
        if len(inside) < 2:
            return None
        a, b = inside[0], inside[-1]
        cores = [(b.busy[i] - a.busy[i]) / max(1, b.total[i] - a.total[i]) for i in range(len(a.busy))]
        tree = (b.tree - a.tree) / CLK_TCK / (len(cores) * (b.t - a.t))
        return cores, tree

