"""Click through a study's MLflow UI in a real headless browser, as docs/outputs.md tells a researcher to.

    python .ci/check_mlflow_ui.py OUTPUT_DIR STUDY        # e.g. outputs temperature_sweep

Starts ``mlflow ui`` on the study folder's store and drives Debian's Chromium (``apt-get install chromium``)
with Playwright (``pip install playwright``, the ``test`` extra; it uses the system browser, nothing is
downloaded). It checks, each in a fresh browser profile unless said otherwise:

1. the ``runs:`` URL the study printed opens the experiment's runs table (not MLflow 3's GenAI overview) in the
   saved view "study: verdict and kNN": with no click, the study's row (its summary run, the trials' parent)
   shows its verdict, "Verdict: <words>", in the Description column, the words whole inside the column and the
   window (legible, not cut by the column's width), and a kNN top-1 column beside it; MLflow's assistant panel
   closed with its × (before the first screenshot); then its (+) unfolds the study's row and lists its trials;
2. the ``compare:`` URL opens the study's saved view: the trials grouped into cells with the kNN column, and,
   unfolding "Additional runs", the study's verdict in its summary run's row (column Description); in the chart
   view the study's first chart, whose points have exactly one colour per loss, the trial runs' ``mlflow.runColor``
   (per series where a study's series split a loss, EqCo's framework × α; no colour shared between losses);
   clicking the study's run in the runs table opens its page, with the verdict and the study's plot (embedded in
   its description, loaded from its artifacts);
3. the ``answer:`` URL the study printed opens its summary run's page, whose description shows, each line whole in
   the window (legible, not cut): the verdict lines in full, the cells' table (each cell's mean and 95% interval,
   in x order) and the study's figure;
4. docs/outputs.md's clicks from the experiment list: click the experiment (MLflow 3.17 opens it in GenAI mode in a
   new browser profile, whatever the experiment's kind), click "Model training" in the sidebar (the browser
   remembers it), which shows the runs; back to the list and into the experiment again, which now opens on the
   runs; then "Views" → the study's view, which groups the trials into cells.

Prints one line per step; exit 0 if every step holds, 1 if one does not, 2 if Chromium, Playwright or the store
is missing. ``tests/study/tracking/test_mlflow_ui.py`` runs it; ``--screenshots DIR`` keeps a PNG of every step.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient

from dcl_core import metric_names as M
from dcl_core.study.tracking import SUMMARY_TAG, TRIAL_TAG, runs_page
from dcl_core.study.tracking.mlflow_runs import run_page
from dcl_core.study.tracking.mlflow_view import (
    DESCRIPTION_COLUMN,
    NAME_COLUMN,
    RUN_COLOR_TAG,
    RUNS_VIEW_ID,
    VIEW_ID,
    VIEW_TAG_PREFIX,
    read_tag,
    view_query,
)
from dcl_core.study.tracking.notes import verdict_lines

TIMEOUT_MS = 60_000  # the UI's first load on a busy 2-core machine takes a while


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it), for the MLflow UI server."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Steps:
    """Runs the checks, printing one line each; remembers whether all held."""

    def __init__(self, shots: Path | None) -> None:
        self.ok = True
        self.shots = shots
        self.n = 0

    def check(self, page, what: str, text: str | None = None, title: str | None = None, locator=None,
              then=None) -> bool:
        """Wait for ``text`` (or ``locator``) on the page and for the title to start with ``title``; ``then(page)``
        (closing the assistant) before the screenshot; print what was seen."""
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
        if then is not None:
            then(page)
        if self.shots is not None:
            page.screenshot(path=str(self.shots / f"{self.n:02d}.png"))
        print(f"{'ok  ' if held else 'FAIL'} {self.n}. {what} (title {page.title()!r})")
        self.ok &= held
        return held

    def verify(self, page, what: str, held: bool, seen: str) -> bool:
        """A step whose condition was computed from the page: print it with what was seen."""
        self.n += 1
        if self.shots is not None:
            page.screenshot(path=str(self.shots / f"{self.n:02d}.png"))
        print(f"{'ok  ' if held else 'FAIL'} {self.n}. {what}" + (f" ({seen})" if seen else ""))
        self.ok &= held
        return held


@dataclass(frozen=True)
class Answer:
    """What the study logged that the UI must show: its first verdict's words and all of them (``words``, "; "
    between two questions' words, as its description starts), its summary run, the trials' colours."""

    verdict: str
    words: str
    summary_run: str
    colours: dict[str, set[str]]  # loss -> its runs' mlflow.runColor: one, or one per series of it (EqCo's α)
    trials: int
    lines: tuple[str, ...] = ()  # the verdict lines, as the study printed them last
    cells: tuple[str, ...] = ()  # the rows of the cells' table in its description (means and 95% intervals)


def logged_answer(client: MlflowClient, exp_id: str) -> Answer | None:
    """The study's answer and trial colours as MLflow holds them (None without a finished summary run)."""
    runs = client.search_runs([exp_id], max_results=1000)
    summary = [r for r in runs if r.data.tags.get(SUMMARY_TAG) == "true"]
    if not summary or "verdict_0" not in summary[0].data.tags:
        return None
    trials = [r for r in runs if TRIAL_TAG in r.data.tags]  # not the summary run, nor the figure's
    colours: dict[str, set[str]] = {}
    for r in trials:
        colours.setdefault(r.data.tags.get("loss", ""), set()).add(r.data.tags.get(RUN_COLOR_TAG, ""))
    tags = summary[0].data.tags
    note = tags.get("mlflow.note.content", "").split("```")
    cells = tuple(line for line in note[1].strip("\n").splitlines()) if len(note) == 3 else ()
    return Answer(tags["verdict_0"], tags.get("verdict", tags["verdict_0"]), summary[0].info.run_id, colours,
                  len(trials), tuple(verdict_lines(tags)), cells)


def legible(page, needles: list[str]) -> list[str]:
    """The ``needles`` not shown whole on the page: each must be a visible text's part whose characters lie inside
    the element that holds them and inside the window (not cut by a column, a scroll box or the window's edge)."""
    return page.evaluate(
        """needles => needles.filter(needle => {
            const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
            let node, at = -1;
            while ((node = walker.nextNode()) && (at = node.textContent.indexOf(needle)) < 0) {}
            if (!node) return true;
            const range = document.createRange();
            range.setStart(node, at);
            range.setEnd(node, at + needle.length);
            const r = range.getBoundingClientRect(), box = node.parentElement.getBoundingClientRect();
            return !(r.width > 0 && r.left >= box.left - 1 && r.right <= box.right + 1
                     && r.left >= 0 && r.right <= window.innerWidth);
        })""", needles)


def close_assistant(page) -> None:
    """Close MLflow 3.17's assistant panel, open by default over a quarter of the page, as a user does (the browser
    remembers it closed)."""
    close = page.locator("[data-component-id='mlflow.assistant.chat_panel.close']")
    try:  # it opens once the page has settled
        close.first.wait_for(state="visible", timeout=5_000)
    except Exception:  # Playwright's TimeoutError: not open in this browser
        return
    close.first.click()
    close.first.wait_for(state="hidden", timeout=TIMEOUT_MS)


# MLflow 3.17's (+) beside a parent run's name (RunNameCellRenderer's expander); a saved view cannot unfold runs (its
# runsExpanded is left out of what the view restores), so a user clicks it
EXPANDER = "[data-component-id$='runnamecellrenderer.tsx_46']"


def trial_names(page) -> list[str]:
    """The run names in the runs table that name a trial (``dcl_s0_t0.1_…``: loss, seed, cell)."""
    cells = page.locator(f"[role=gridcell][col-id='{NAME_COLUMN}']")
    return [t for t in (c.strip() for c in cells.all_inner_texts()) if re.search(r"_s\d+_", t)]


def verdict_in_row(page, study: str, needle: str) -> dict:
    """Where the study's row (whose Run Name link is ``study``; MLflow's grid draws a row's pinned and scrolled
    columns as two elements with one ``row-id``) shows ``needle`` in its Description cell: ``text``, the cell's
    text (None: no such cell), and ``whole``, whether the needle's characters lie inside the cell, the grid's
    visible part and the window, so a column cutting the words (its text is all in the page still) fails."""
    return page.evaluate(
        """([study, nameColumn, column, needle]) => {
            const name = [...document.querySelectorAll(`[role=gridcell][col-id="${nameColumn}"] a`)]
                .find(a => a.textContent.trim() === study && a.closest('[row-id]'));
            if (!name) return {text: null, whole: false};
            const id = name.closest('[row-id]').getAttribute('row-id');
            const cell = [...document.querySelectorAll(`[row-id="${id}"] [col-id="${column}"]`)][0];
            if (!cell) return {text: null, whole: false};
            const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
            let node, at = -1;
            while ((node = walker.nextNode()) && (at = node.textContent.indexOf(needle)) < 0) {}
            if (!node) return {text: cell.textContent, whole: false};
            const range = document.createRange();
            range.setStart(node, at);
            range.setEnd(node, at + needle.length);
            const r = range.getBoundingClientRect(), c = cell.getBoundingClientRect();
            const grid = cell.closest('.ag-center-cols-viewport');  // the scrolled columns' visible part
            const right = Math.min(window.innerWidth, grid ? grid.getBoundingClientRect().right : Infinity);
            return {text: cell.textContent, whole: r.width > 0 && r.left >= c.left && r.right <= c.right
                    && r.right <= right};
        }""", [study, NAME_COLUMN, DESCRIPTION_COLUMN, needle])


def point_colours(page, axis: str) -> list[str]:
    """The fills (``#rrggbb``) of the points of the chart whose axis is titled ``axis`` (plotly's SVG markers)."""
    return page.evaluate(
        """axis => {
            const plots = [...document.querySelectorAll('.js-plotly-plot')].filter(p =>
                [...p.querySelectorAll('svg text')].some(t => t.textContent === axis));
            if (!plots.length) return [];
            return [...plots[0].querySelectorAll('path.point')].map(p => {
                const [r, g, b] = getComputedStyle(p).fill.match(/\\d+/g).map(Number);
                return '#' + [r, g, b].map(v => v.toString(16).padStart(2, '0')).join('');
            });
        }""", axis)


def run_checks(base: str, exp_id: str, study: str, view: tuple[str, dict], shots: Path | None,
               answer: Answer) -> bool:
    """Click through the study's MLflow UI in Chromium, one printed line per check; True if every check held."""
    from playwright.sync_api import sync_playwright

    view_name, state = view
    first_chart = state["compareRunCharts"][0]
    plotted = next(c for c in state["compareRunCharts"] if c["type"] in ("SCATTER", "LINE"))
    axis = plotted["xaxis"]["key"] if plotted["type"] == "SCATTER" else plotted["metricKey"]
    runs = base + runs_page(exp_id)  # the runs: URL as the study prints it (StudyRuns.runs_url)
    compare = base + runs_page(exp_id, view_query(charts=False))
    needle = f"Verdict: {answer.words}"
    steps = Steps(shots)
    browser_path = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox", "--disable-gpu"])
        try:
            profile = browser.new_context(viewport={"width": 1600, "height": 1000})
            page = profile.new_page()
            page.goto(runs)
            steps.check(page, f"runs: URL shows the runs table, the study's row {study!r} with its verdict "
                        f"({needle!r}) and the kNN column, no click",
                        locator=page.locator(f"[role=gridcell][col-id='{DESCRIPTION_COLUMN}']", has_text=needle),
                        title="Runs", then=close_assistant)
            seen = verdict_in_row(page, study, needle)
            header = page.locator(f"[role=columnheader][col-id='metrics.`{M.KNN_TOP1}`']")
            steps.verify(page, "... legible: the verdict words whole in the study's row, inside the column and window,"
                         " beside a kNN top-1 column", bool(seen["whole"]) and header.count() > 0,
                         f"cell {(seen['text'] or 'not found')[:70]!r}, kNN column {header.count() > 0}")
            folded = trial_names(page)
            try:
                page.locator(EXPANDER).first.click(timeout=TIMEOUT_MS)
                page.locator(f"[role=gridcell][col-id='{NAME_COLUMN}']", has_text="_s0_").first.wait_for(
                    timeout=TIMEOUT_MS)
            except Exception:  # Playwright's TimeoutError: the step below says what was seen
                pass
            listed = trial_names(page)
            steps.verify(page, "... and unfolding the study's row (+) lists its trials under it, each named by its "
                         "loss, seed and cell", not folded and len(listed) >= min(answer.trials, 9),
                         f"{len(folded)} trial row(s) before the click, {len(listed)} after, e.g. "
                         f"{listed[0] if listed else None!r}")
            page.goto(compare)
            steps.check(page, "compare: URL (table) groups the trials into cells", "Group:", "Runs")
            steps.check(page, "... with the kNN column", "eval/knn_top1")
            # the summary run, folded in the trials' parents' group: its chevron unfolds it
            page.locator("[role=gridcell]", has_text="Additional runs").locator("[role=button]").first.click(
                timeout=TIMEOUT_MS)
            steps.check(page, f"... and, unfolding 'Additional runs', the verdict ({answer.verdict!r}) in the study's "
                        "row", locator=page.locator(f"[col-id='{DESCRIPTION_COLUMN}']",
                                                    has_text=f"Verdict: {answer.verdict}"))
            page.goto(base + runs_page(exp_id, view_query(charts=True)))
            key = first_chart.get("imageKeys", ["?"])[0]
            figure = page.locator(f"img[src*='{key}']")
            steps.check(page, f"compare: URL (charts) opens on the study's figure (image {key!r}: the cells' means "
                        "with their 95% intervals against the swept value)", locator=figure)
            drawn = steps.check(page, f"... and the trials' charts (axis {axis!r})",
                                locator=page.locator("svg text", has_text=axis))
            shown = figure.count() > 0 and page.evaluate(
                "img => img.complete && img.naturalWidth > 0", figure.first.element_handle())
            above = figure.count() > 0 and drawn and page.evaluate(
                """([img, axis]) => {
                    const plot = [...document.querySelectorAll('.js-plotly-plot')].find(p =>
                        [...p.querySelectorAll('svg text')].some(t => t.textContent === axis));
                    const a = img.getBoundingClientRect(), b = plot ? plot.getBoundingClientRect() : null;
                    return !!b && (a.right <= b.left + 1 || a.bottom <= b.top + 1);  // left of it, or above it
                }""", [figure.first.element_handle(), axis])
            steps.verify(page, "... the figure loaded, first: before the trials' charts", bool(shown and above),
                         f"loaded {bool(shown)}, first {bool(above)}")
            fills = point_colours(page, axis) if drawn else []
            per_loss = all(len(c) == 1 for c in answer.colours.values())
            shared = [c for c in set().union(*answer.colours.values())
                      if sum(c in cs for cs in answer.colours.values()) > 1]
            steps.verify(page, f"... its points have {'one colour per loss' if per_loss else 'one colour per series'}"
                         f", their runs' ({ {k: sorted(v) for k, v in answer.colours.items()} })",
                         len(fills) == answer.trials and set(fills) == set().union(*answer.colours.values())
                         and not shared, f"fills {sorted(set(fills))} of {len(fills)} points")
            page = profile.new_page()  # a new tab: leaving a shared view by its URL's hash left MLflow loading
            page.goto(runs)
            page.locator(f"[col-id='{NAME_COLUMN}'] a", has_text=study).first.click(timeout=TIMEOUT_MS)
            steps.check(page, "clicking the study's run opens its page, which shows the verdict",
                        f"Verdict: {answer.verdict}", "Run ")
            more = page.get_by_text("Show more", exact=True)  # the description starts clipped to a few lines
            if more.count() and more.first.is_visible():
                more.first.click()
            plot = page.locator("img[src*='get-artifact']")
            if plot.count():
                plot.first.scroll_into_view_if_needed(timeout=TIMEOUT_MS)
            steps.check(page, "... and the study's plot, in the description", locator=plot)
            shown = plot.count() > 0 and page.evaluate("img => img.complete && img.naturalWidth > 0",
                                                       plot.first.element_handle())
            steps.verify(page, "... loaded from the run's artifacts", bool(shown),
                         plot.first.get_attribute("src") if plot.count() else "no image")

            # the answer: URL the study printed, in a new profile: the run page of the study's summary run
            page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
            page.goto(base + run_page(exp_id, answer.summary_run))
            steps.check(page, f"answer: URL opens the study's run page, its description starting with {needle!r}",
                        needle, "Run ")
            close_assistant(page)
            more = page.get_by_text("Show more", exact=True)
            if more.count() and more.first.is_visible():
                more.first.click()
            cut = legible(page, [*answer.lines, *answer.cells]) if answer.cells else ["no cells' table"]
            steps.verify(page, f"... legible at a glance: the {len(answer.lines)} verdict line(s) in full and the "
                         f"cells' table ({len(answer.cells) - 1} rows of means with their 95% intervals), each line "
                         "whole in the window", not cut, f"not shown whole: {[c[:60] for c in cut]}" if cut else
                         f"first row {answer.cells[1] if len(answer.cells) > 1 else '-'!r}")

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
            close_assistant(page)
            page.get_by_text("Model training", exact=True).first.click(timeout=TIMEOUT_MS)
            steps.check(page, "'Model training' in the sidebar shows the runs", study, "Runs")
            page.goto(f"{base}/#/experiments")
            experiment_link.click(timeout=TIMEOUT_MS)
            steps.check(page, "the experiment list now opens the experiment on its runs", study, "Runs")
            page.locator("[data-component-id='mlflow.experiment_page.saved_views.trigger']").click(
                timeout=TIMEOUT_MS)
            page.get_by_text(view_name, exact=True).first.click(timeout=TIMEOUT_MS)
            steps.check(page, f"Views → {view_name!r} groups the trials into cells", "Group:", "Runs")
        except Exception as exc:  # a click that found nothing to click: the UI is not what docs/outputs.md says
            print(f"FAIL {steps.n + 1}. {type(exc).__name__}: {str(exc).splitlines()[0]}")
            steps.ok = False
        finally:
            browser.close()
    return steps.ok


def main(argv: list[str] | None = None) -> int:
    """Serve the study's MLflow store and check its UI as the README describes; the exit status."""
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
    if exp is None or not {VIEW_TAG_PREFIX + VIEW_ID, VIEW_TAG_PREFIX + RUNS_VIEW_ID} <= exp.tags.keys():
        print(f"error: no experiment {args.study!r} with the study's two saved views in {uri}", file=sys.stderr)
        return 2
    view = read_tag(exp.tags[VIEW_TAG_PREFIX + VIEW_ID])
    answer = logged_answer(MlflowClient(tracking_uri=uri), exp.experiment_id)
    if answer is None:
        print(f"error: no summary run with a verdict in {args.study!r}", file=sys.stderr)
        return 2
    if args.screenshots:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host",
                               "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              # MLflow 3's GenAI job consumers (8 processes) are not part of what is checked
                              env=os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):  # the server takes a few seconds to start
            try:
                urllib.request.urlopen(base, timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        ok = run_checks(base, exp.experiment_id, args.study, view, args.screenshots, answer)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
