"""The MLflow UI in a headless browser, for the UI test and the user guide's screenshots.

* :func:`mlflow_server` starts ``mlflow server`` on a free local port against a store (in its own process
  group, job execution off: ~0.5 GB instead of ~2.6 GB, ../shared/FACTS.md) and stops it afterwards;
* :func:`chromium` drives Debian's Chromium through Selenium and its ChromeDriver (``apt-get install chromium
  chromium-driver``; no browser download, no network);
* :func:`open_runs` opens an experiment's run table and waits until a run name shows; :func:`expand_run`
  unfolds a parent run (a sweep) so its child runs are listed.

The page structure used here (AG Grid rows, the expander button in the "Run Name" cell) is MLflow 3.17's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Flags for root in a container with no network: Chromium's background connections would only fail.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def browser_missing() -> str:
    """Why the browser cannot run here ("" when it can)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).is_file()]
    if missing:
        return f"{' and '.join(missing)} not installed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """A server process started by :func:`serving`: its base URL, process and log."""

    def __init__(self, url: str, proc: subprocess.Popen, log: Path):
        self.url, self.proc, self.log = url, proc, log

    def stop(self) -> None:
        """SIGTERM to the whole process group (servers fork workers), SIGKILL after 30 s."""
        if self.proc.returncode is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            self.proc.wait(timeout=30)


@contextlib.contextmanager
def serving(
    cmd: list[str], port: int, ready_path: str, log: Path, timeout_s: float = 120.0, **popen
) -> Iterator[Served]:
    """Run ``cmd`` (listening on 127.0.0.1:``port``) in its own process group, output to ``log``; yield once
    ``GET ready_path`` answers 200 (RuntimeError with the log's tail if it exits or never does); stop it."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **popen)
    served = Served(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{served.url}{ready_path}", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                state = f"exited with {proc.returncode}" if proc.returncode is not None else "never answered"
                raise RuntimeError(f"{cmd[0]} {cmd[1]} {state} on {served.url}:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        yield served
    finally:
        served.stop()


@contextlib.contextmanager
def mlflow_server(backend_uri: str, artifacts: Path, timeout_s: float = 120.0) -> Iterator[str]:
    """``mlflow server`` on 127.0.0.1; yields its base URL once ``/health`` answers."""
    port = free_port()
    mlflow = Path(sys.executable).parent / "mlflow"
    cmd = [str(mlflow), "server", "--backend-store-uri", backend_uri, "--default-artifact-root"]
    cmd += [artifacts.resolve().as_uri(), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = artifacts.parent / f"mlflow_server_{port}.log"
    with serving(cmd, port, "/health", log, timeout_s, env=env) as served:
        yield served.url


@contextlib.contextmanager
def chromium(width: int = 1600, height: int = 1000) -> Iterator:
    """A headless Chromium WebDriver (Selenium), closed afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in (*CHROMIUM_FLAGS, f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def open_runs(driver, base_url: str, experiment_id: str, run_name: str, timeout_s: float = 60.0):
    """Open the experiment's run table; returns the link of the run named ``run_name`` once it shows."""
    driver.get(f"{base_url}/#/experiments/{experiment_id}/runs")
    return wait_for_run(driver, run_name, timeout_s)


def wait_for_run(driver, run_name: str, timeout_s: float = 60.0):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    xpath = f"//a[normalize-space()={_xpath_literal(run_name)}]"
    return WebDriverWait(driver, timeout_s).until(EC.presence_of_element_located((By.XPATH, xpath)))


def expand_run(driver, run_link) -> None:
    """Click the expander of the parent run whose name link is ``run_link`` (lists its child runs)."""
    from selenium.webdriver.common.by import By

    cell = run_link.find_element(By.XPATH, "./ancestor::div[@role='gridcell']")
    cell.find_element(By.TAG_NAME, "button").click()


def close_assistant(driver) -> None:
    """Close MLflow's assistant side panel, if it is open (it takes a third of the page)."""
    from selenium.webdriver.common.by import By

    for button in driver.find_elements(By.CSS_SELECTOR, "button[data-component-id$='chat_panel.close']"):
        button.click()


def filter_charts(driver, text: str) -> None:
    """Type ``text`` into the chart view's "Search metric charts" box."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, "input[placeholder='Search metric charts']").send_keys(text)


def _xpath_literal(text: str) -> str:
    if "'" not in text:
        return f"'{text}'"
    return "concat(" + ', "\'", '.join(f"'{part}'" for part in text.split("'")) + ")"
