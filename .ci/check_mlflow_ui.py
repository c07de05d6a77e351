"""Open a study's MLflow runs view in a real headless browser and check it shows the study's runs.

    python .ci/check_mlflow_ui.py OUTPUT_DIR STUDY        # e.g. outputs temperature_sweep

Starts ``mlflow ui`` on the study folder's store, loads the URL the study printed (``runs: ...``) in headless
Chromium (Debian: ``apt-get install chromium``), and checks the page is the experiment's runs table (not MLflow
3's GenAI overview) listing the study's parent run. Prints what it saw; exit 0 if the check holds, 1 if not, 2 if
Chromium or the store is missing. ``tests/study/test_mlflow_ui.py`` runs it.
"""

from __future__ import annotations

import html
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from mlflow.tracking import MlflowClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page_text(browser: str, url: str) -> list[str]:
    """The rendered page's text lines (after 15 s of virtual time for the single-page app to load its data)."""
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000",
                          "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    dom = re.sub(r"<script.*?</script>|<style.*?</style>", "", dom, flags=re.S)
    return [t.strip() for t in html.unescape(re.sub(r"<[^>]+>", "\n", dom)).splitlines() if t.strip()]


def main(output_dir: str, study: str) -> int:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    db = Path(output_dir).resolve() / "mlflow.db"
    if browser is None or not db.exists():
        print(f"error: {'no Chromium on PATH' if browser is None else f'no MLflow store at {db}'}", file=sys.stderr)
        return 2
    uri = f"sqlite:///{db}"
    exp = MlflowClient(tracking_uri=uri).get_experiment_by_name(study)
    if exp is None:
        print(f"error: no experiment {study!r} in {uri}", file=sys.stderr)
        return 2
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host",
                               "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(120):  # the server takes a few seconds to start
            try:
                urllib.request.urlopen(base, timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        url = f"{base}/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning"
        lines = page_text(browser, url)
    finally:
        server.terminate()
        server.wait(timeout=30)
    title = lines[0] if lines else ""
    ok = title.startswith("Runs - Experiment") and "Run Name" in lines and study in lines
    print(f"{url}\n  title: {title!r}; runs table: {'Run Name' in lines}; study run listed: {study in lines}; "
          f"{'ok' if ok else 'NOT the runs view'}")
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
