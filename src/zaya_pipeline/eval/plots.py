"""The evaluate stage's figure and DVC plots file for the zero-shot tasks (the train stage's figures are in
``train/plots.py``). Input: ``reports/metrics.json``'s ``tasks`` mapping,
``{task: {n, acc, acc_stderr, acc_norm, acc_norm_stderr, acc_per_byte, ..., chance}}``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

TASKS_CSV_HEADER = ("task", "acc", "acc_norm", "acc_per_byte", "chance")


def tasks_figure(tasks: dict) -> Figure:
    """Accuracy and length-normalized accuracy (per character, as lm-evaluation-harness) per task, ± one
    standard error, with chance marked."""
    names = list(tasks)
    x = np.arange(len(names))
    width = 0.38
    fig = Figure(figsize=(max(5.0, 1.25 * len(names) + 2.5), 4.2), layout="constrained")
    ax = fig.subplots()
    for offset, key, color, label in (
        (-width / 2, "acc", "tab:blue", "accuracy"),
        (width / 2, "acc_norm", "tab:cyan", "accuracy per character (acc_norm)"),
    ):
        ax.bar(
            x + offset,
            [tasks[t][key] for t in names],
            width,
            yerr=[tasks[t][f"{key}_stderr"] for t in names],
            capsize=3,
            color=color,
            label=f"{label} ± s.e.",
        )
    ax.hlines(
        [tasks[t]["chance"] for t in names], x - width, x + width, colors="black", linewidth=2, label="chance"
    )
    ax.set_xticks(x, [f"{t}\n(n={tasks[t]['n']})" for t in names], fontsize=9)
    ax.set(ylabel="accuracy (fraction of documents)", ylim=(0, 1), title="Zero-shot multiple choice")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    return fig


def no_tasks_figure() -> Figure:
    fig = Figure(figsize=(6, 2), layout="constrained")
    ax = fig.subplots()
    ax.set_axis_off()
    ax.set_title("Zero-shot multiple choice")
    ax.text(0.5, 0.5, "No tasks were scored: eval.tasks is empty.", ha="center", va="center")
    return fig


def write_task_plots(tasks: dict, plots: Path) -> list[Path]:
    """``tasks.csv`` (a DVC bar plot; only a header without tasks) and ``tasks.png`` (saying that there are
    no tasks when there are none: DVC expects every declared plot file to exist)."""
    plots = Path(plots)
    plots.mkdir(parents=True, exist_ok=True)
    with open(plots / "tasks.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(TASKS_CSV_HEADER)
        writer.writerows([name, *(m[k] for k in TASKS_CSV_HEADER[1:])] for name, m in tasks.items())
    (tasks_figure(tasks) if tasks else no_tasks_figure()).savefig(plots / "tasks.png", dpi=110)
    return [plots / "tasks.csv", plots / "tasks.png"]
