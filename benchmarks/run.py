"""The benchmark suite: every comparison measured in one run, printed as a Markdown table and saved as JSON.

    python benchmarks/run.py [--quick] [--sections losses,augmentation] [--json outputs/benchmarks.json]
    python benchmarks/studies.py --study-dir outputs   # the platform overhead of a study that already ran

Sections (each ``benchmarks/<section>.py`` with ``run(quick) -> list[Row]``):

* ``losses``: our InfoNCE / DCL / DCLW vs lightly's, forward + backward;
* ``augmentation``: our batched two-view augmentation vs torchvision per-sample and kornia batched;
* ``roofline``: a training step's achieved FLOP/s vs this machine's fp32 / bf16 GEMM rate;
* ``levers``: channels_last, bf16 autocast, torch.compile, processes × threads vs today's trainer setting;
* ``trainer``: the trainer vs a bare training loop, and where a step's time goes;
* ``studies``: a study's platform overhead and CPU use, and ASHA's saving on a (τ, lr) search.

Every comparison interleaves its two sides (A B A B …) and reports each side's median and their ratio; ratios
are what to compare across machines. ``--quick`` (CI) runs smaller sizes with fewer repetitions and asserts no
speed: it checks that every row can be measured. A section that raises becomes an error row and the script exits
with status 1 after printing the table. ``--json`` names a new path or a regular file: a link (never followed), a
folder, a FIFO or a device there is refused in one line, exit 2, before any section runs.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python benchmarks/run.py` puts benchmarks/ on the path, not the repo root
    sys.path.insert(0, str(REPO))

from benchmarks.common import Row, markdown_table, write_json  # noqa: E402 - needs the path set above
from dcl_core.config import ConfigError  # noqa: E402
from dcl_core.files import check_output_file  # noqa: E402

SECTIONS: tuple[str, ...] = ("losses", "augmentation", "roofline", "levers", "trainer", "studies")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages for the report, or ``n/a`` where the OS has none."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def run_section(name: str, quick: bool, work_dir: Path | None = None) -> tuple[list[Row], bool]:
    """The section's rows and whether it succeeded; a failure (including a missing module) is one error row.
    ``work_dir`` goes to sections that write outputs (the studies), which then keep them there."""
    try:
        module = importlib.import_module(f"benchmarks.{name}")
        keeps_outputs = "work_dir" in inspect.signature(module.run).parameters
        rows = list(module.run(quick, work_dir=work_dir / name) if keeps_outputs and work_dir else module.run(quick))
        if not rows:
            raise RuntimeError("the section returned no rows")
        return rows, True
    except Exception as err:  # any failure is reported as a row, the run goes on
        if isinstance(err, ModuleNotFoundError) and err.name == f"benchmarks.{name}":
            message = f"benchmarks/{name}.py does not exist"
        else:
            traceback.print_exc(file=sys.stderr)
            message = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        return [Row(name, f"ERROR: {message}", math.nan, note="section failed, see stderr")], False


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The command line's options and the sections it chose, in its order; an unknown or empty choice of sections
    ends the program with argparse's usage error (exit status 2)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repetitions (CI: checks it runs)")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of: {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--json", type=Path, default=Path("outputs/benchmarks.json"),
                        help="where to write the rows as JSON (default: outputs/benchmarks.json)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="keep what sections write (the studies' output folders) under this folder "
                             "(default: a temporary folder, deleted)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads for the sections that do not set their own (default: torch's)")
    args = parser.parse_args(argv)
    selected = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in selected if s not in SECTIONS]
    if unknown or not selected:
        parser.error(f"unknown section(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(SECTIONS)}")
    return args, selected


def run_sections(selected: list[str], quick: bool, work_dir: Path | None) -> tuple[list[Row], list[str]]:
    """The rows of the ``selected`` sections in their order, and the names of those that failed; each section's
    row count and seconds go to stderr as it ends."""
    rows: list[Row] = []
    failed: list[str] = []
    for name in selected:
        t0 = time.perf_counter()
        section_rows, ok = run_section(name, quick, work_dir)
        rows += section_rows
        if not ok:
            failed.append(name)
        print(f"  {name}: {len(section_rows)} rows in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return rows, failed


def main(argv: list[str] | None = None) -> int:
    """Run the chosen benchmark sections, print their rows and write them as JSON; the exit status."""
    args, selected = parse_args(argv)
    json_path = Path(os.path.abspath(args.json.expanduser()))  # not resolved: a link there is refused, not followed
    try:  # before any section runs: a link, a FIFO or a device there, or a folder that takes no file
        check_output_file(json_path)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    import torch  # after argument parsing: --help and bad arguments need no torch import

    if args.threads > 0:
        torch.set_num_threads(args.threads)

    started = time.perf_counter()
    meta: dict[str, object] = {
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "quick": args.quick,
        "sections": selected,
        "load_average_start": load_average(),
        # PYTHONDONTWRITEBYTECODE: every process (each study, each trial's worker) compiles torch, torchvision, Ray
        # and MLflow again, ~10-20 s each on a 2-core machine: the studies' fixed costs are not comparable across it
        "bytecode_cache": not sys.flags.dont_write_bytecode,
    }
    print(f"# Benchmarks{' (--quick)' if args.quick else ''}")
    print(f"torch {meta['torch']}, {meta['cpu']}, {meta['cores']} cores, {meta['threads']} torch threads, "
          f"{meta['date']}, load average {meta['load_average_start']} (1/5/15 min), bytecode cache "
          f"{'on' if meta['bytecode_cache'] else 'off (PYTHONDONTWRITEBYTECODE)'}", flush=True)

    work_dir = args.work_dir.expanduser().resolve() if args.work_dir else None
    rows, failed = run_sections(selected, args.quick, work_dir)

    meta["load_average_end"] = load_average()
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["failed_sections"] = failed
    print()
    print(markdown_table(rows))
    print()
    print(f"{meta['seconds']} s, load average at the end {meta['load_average_end']}; JSON: {json_path}")
    sys.stdout.flush()
    write_json(rows, json_path, meta)
    if failed:
        print(f"failed sections: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
