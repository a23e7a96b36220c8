"""Screenshots of a sweep in the MLflow UI, for docs/user_guide.md, taken from a real store.

Starts ``mlflow server`` on the store, opens it in headless Chromium (Debian's chromium + chromedriver:
``make browser``) and saves, under ``--out``:

* ``mlflow_sweep_runs.png``: the experiment's run table with the sweep's parent run unfolded;
* ``mlflow_sweep_charts.png``: the chart view of the same runs (val loss and throughput side by side);
* ``mlflow_compare.png``: MLflow's compare page for the sweep's two best child runs (differences only).

    python scripts/mlflow_screenshots.py --store sqlite:///$PWD/mlflow.db --experiment zaya_pipeline_debug

The newest run tagged ``zaya.sweep=parent`` is the sweep shown (``--parent RUN_ID`` picks another).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from pathlib import Path

# The browser helpers are the MLflow UI test's (tests/support/mlflow_ui.py), not part of the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.mlflow_ui import (  # noqa: E402
    browser_missing,
    chromium,
    close_assistant,
    expand_run,
    filter_charts,
    mlflow_server,
    open_runs,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", required=True, help="MLflow backend store URI, e.g. sqlite:///$PWD/mlflow.db")
    p.add_argument("--artifacts", default="mlartifacts", help="artifact root the server serves")
    p.add_argument("--experiment", default="zaya_pipeline", help="experiment name")
    p.add_argument("--parent", default="", help="the sweep's parent run id (default: the newest sweep)")
    p.add_argument("--out", default="docs/img", help="folder for the PNGs")
    p.add_argument("--settle", type=float, default=4.0, help="seconds to let charts render before a shot")
    args = p.parse_args()
    if why := browser_missing():
        p.error(why)

    from mlflow import MlflowClient

    client = MlflowClient(args.store)
    exp = client.get_experiment_by_name(args.experiment)
    if exp is None:
        p.error(f"no experiment {args.experiment!r} in {args.store}")
    query = f"attributes.run_id = '{args.parent}'" if args.parent else "tags.`zaya.sweep` = 'parent'"
    parents = client.search_runs([exp.experiment_id], query, order_by=["attributes.start_time DESC"])
    if not parents:
        p.error(f"no sweep parent run in {args.experiment!r} (run `zaya train -m ...` first)")
    parent = parents[0]
    children = client.search_runs(
        [exp.experiment_id],
        f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
        order_by=["metrics.`final/val_loss` ASC"],
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with mlflow_server(args.store, Path(args.artifacts)) as url, chromium(1600, 1000) as driver:
        link = open_runs(driver, url, exp.experiment_id, parent.info.run_name)
        close_assistant(driver)
        expand_run(driver, link)
        time.sleep(args.settle)
        shot(driver, out / "mlflow_sweep_runs.png")

        driver.get(f"{url}/#/experiments/{exp.experiment_id}/runs?compareRunsMode=CHART")
        time.sleep(args.settle * 2)
        close_assistant(driver)
        filter_charts(driver, "final/val")
        time.sleep(args.settle)
        shot(driver, out / "mlflow_sweep_charts.png")

        if len(children) >= 2:
            ids = json.dumps([c.info.run_id for c in children[:2]])
            query = urllib.parse.urlencode({"runs": ids, "experiments": json.dumps([exp.experiment_id])})
            driver.get(f"{url}/#/compare-runs?{query}")
            time.sleep(args.settle * 2)
            close_assistant(driver)
            show_differences(driver)
            time.sleep(args.settle)
            shot(driver, out / "mlflow_compare.png")


def show_differences(driver) -> None:
    """On the compare page: fold the plots, keep only the parameters and metrics that differ, and scroll to
    them on a taller window."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.XPATH, "//*[normalize-space()='Visualizations']").click()
    for switch in driver.find_elements(By.XPATH, "//label[normalize-space()='Show diff only']")[:2]:
        switch.click()
    driver.set_window_size(1600, 1500)
    header = driver.find_element(By.XPATH, "//*[normalize-space()='Parameters']")
    driver.execute_script("arguments[0].scrollIntoView(true);", header)


def shot(driver, path: Path) -> None:
    driver.save_screenshot(str(path))
    print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
