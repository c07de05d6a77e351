"""Click through a study's MLflow UI in a real headless browser, as the README tells a researcher to.

    python .ci/check_mlflow_ui.py OUTPUT_DIR STUDY        # e.g. outputs temperature_sweep

Starts ``mlflow ui`` on the study folder's store and drives Debian's Chromium (``apt-get install chromium``)
with Playwright (``pip install playwright``, the ``test`` extra; it uses the system browser, nothing is
downloaded). It checks, each in a fresh browser profile unless said otherwise:

1. the ``runs:`` URL the study printed opens the experiment's runs table (not MLflow 3's GenAI overview) with
   the study's parent run listed;
2. the ``compare:`` URL opens the study's saved view: the trials grouped into cells with the kNN column, and in
   the chart view the section of the study's charts;
3. the README's clicks from the experiment list: click the experiment (MLflow 3.17 opens it in GenAI mode in a
   new browser profile, whatever the experiment's kind), click "Model training" in the sidebar (the browser
   remembers it), which shows the runs; back to the list and into the experiment again, which now opens on the
   runs; then "Views" → the study's view, which groups the trials into cells.

Prints one line per step; exit 0 if every step holds, 1 if one does not, 2 if Chromium, Playwright or the store
is missing. ``tests/study/test_mlflow_ui.py`` runs it; ``--screenshots DIR`` keeps a PNG of every step.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from mlflow.tracking import MlflowClient

from dcl_core.study.mlflow_view import VIEW_ID, VIEW_TAG_PREFIX, read_tag, view_query

TIMEOUT_MS = 60_000  # the UI's first load on a busy 2-core machine takes a while


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Steps:
    """Runs the checks, printing one line each; remembers whether all held."""

    def __init__(self, shots: Path | None) -> None:
        self.ok = True
        self.shots = shots
        self.n = 0

    def check(self, page, what: str, text: str | None = None, title: str | None = None, locator=None) -> bool:
        """Wait for ``text`` (or ``locator``) on the page and for the title to start with ``title``; print what
        was seen."""
        self.n += 1
        held = True
        try:
            if text is not None:
                locator = page.get_by_text(text, exact=False)
            if locator is not None:
                locator.first.wait_for(timeout=TIMEOUT_MS)
            if title is not None:
                page.wait_for_function("t => document.title.startsWith(t)", arg=title, timeout=TIMEOUT_MS)
        except Exception:  # Playwright's TimeoutError: report it as a failed step, keep going
            held = False
        if self.shots is not None:
            page.screenshot(path=str(self.shots / f"{self.n:02d}.png"))
        print(f"{'ok  ' if held else 'FAIL'} {self.n}. {what} (title {page.title()!r})")
        self.ok &= held
        return held


def run_checks(base: str, exp_id: str, study: str, view: tuple[str, dict], shots: Path | None) -> bool:
    from playwright.sync_api import sync_playwright

    view_name, state = view
    first_chart = state["compareRunCharts"][0]
    axis = first_chart["xaxis"]["key"] if first_chart["type"] == "SCATTER" else first_chart["metricKey"]
    runs = f"{base}/#/experiments/{exp_id}/runs?workflowType=machine_learning"
    compare = f"{runs}&{view_query(charts=False)}"
    steps = Steps(shots)
    browser_path = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
            page.goto(runs)
            steps.check(page, f"runs: URL shows the runs table with the study's run {study!r}", study, "Runs")
            page.goto(compare)
            steps.check(page, "compare: URL (table) groups the trials into cells", "Group:", "Runs")
            steps.check(page, "... with the kNN column", "eval/knn_top1")
            page.goto(f"{runs}&{view_query(charts=True)}")
            steps.check(page, f"compare: URL (charts) draws the study's first chart (axis {axis!r})",
                        locator=page.locator("svg text", has_text=axis))

            page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()  # a new profile
            page.goto(f"{base}/#/experiments")
            experiment_link = page.get_by_role("link", name=study, exact=True).last  # the table's, not the sidebar's
            experiment_link.click(timeout=TIMEOUT_MS)
            page.wait_for_function("() => /^(Overview|Traces|Runs) - /.test(document.title)", timeout=TIMEOUT_MS)
            print(f"     -  clicking the experiment in a new browser profile opened {page.title()!r}")
            page.wait_for_timeout(2000)  # the GenAI overview may open a tip over the page: dismiss it, as a user does
            got_it = page.get_by_role("button", name="Got it")
            if got_it.count() and got_it.first.is_visible():
                got_it.first.click()
            page.get_by_text("Model training", exact=True).first.click(timeout=TIMEOUT_MS)
            steps.check(page, "'Model training' in the sidebar shows the runs", study, "Runs")
            page.goto(f"{base}/#/experiments")
            experiment_link.click(timeout=TIMEOUT_MS)
            steps.check(page, "the experiment list now opens the experiment on its runs", study, "Runs")
            page.locator("[data-component-id='mlflow.experiment_page.saved_views.trigger']").click(
                timeout=TIMEOUT_MS)
            page.get_by_text(view_name, exact=True).first.click(timeout=TIMEOUT_MS)
            steps.check(page, f"Views → {view_name!r} groups the trials into cells", "Group:", "Runs")
        except Exception as exc:  # a click that found nothing to click: the UI is not what the README says
            print(f"FAIL {steps.n + 1}. {type(exc).__name__}: {str(exc).splitlines()[0]}")
            steps.ok = False
        finally:
            browser.close()
    return steps.ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output_dir")
    ap.add_argument("study")
    ap.add_argument("--screenshots", type=Path, help="keep a PNG of every step in this folder")
    args = ap.parse_args(argv)
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    db = Path(args.output_dir).resolve() / "mlflow.db"
    try:
        import playwright
    except ImportError:
        playwright = None
    missing = ("no Chromium on PATH (apt-get install chromium)" if browser is None else
               "no Playwright (pip install playwright)" if playwright is None else
               f"no MLflow store at {db}" if not db.exists() else None)
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    uri = f"sqlite:///{db}"
    exp = MlflowClient(tracking_uri=uri).get_experiment_by_name(args.study)
    if exp is None or VIEW_TAG_PREFIX + VIEW_ID not in exp.tags:
        print(f"error: no experiment {args.study!r} with a saved view in {uri}", file=sys.stderr)
        return 2
    view = read_tag(exp.tags[VIEW_TAG_PREFIX + VIEW_ID])
    if args.screenshots:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host",
                               "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):  # the server takes a few seconds to start
            try:
                urllib.request.urlopen(base, timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        ok = run_checks(base, exp.experiment_id, args.study, view, args.screenshots)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
