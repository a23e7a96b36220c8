"""The zero-shot task bars (figure, PNG, DVC CSV) and the evaluation loops' progress lines off a terminal."""

from __future__ import annotations

import csv
import io
import sys

import numpy as np
import pytest
import torch
from matplotlib.container import BarContainer

from support.logs import log_lines
from zaya_pipeline.eval.plots import tasks_figure, write_task_plots

TASKS = {
    "arc_easy": {
        "n": 500,
        "acc": 0.31,
        "acc_stderr": 0.021,
        "acc_norm": 0.29,
        "acc_norm_stderr": 0.02,
        "acc_per_byte": 0.3,
        "acc_per_byte_stderr": 0.02,
        "chance": 0.25,
    },  # fmt: skip
    "winogrande": {
        "n": 400,
        "acc": 0.51,
        "acc_stderr": 0.025,
        "acc_norm": 0.5,
        "acc_norm_stderr": 0.025,
        "acc_per_byte": 0.5,
        "acc_per_byte_stderr": 0.025,
        "chance": 0.5,
    },  # fmt: skip
}


def test_task_bars_show_accuracy_with_standard_errors_against_chance():
    fig = tasks_figure(TASKS)
    (ax,) = fig.axes
    assert ax.get_title() and "accuracy" in ax.get_ylabel() and ax.get_ylim() == (0, 1)
    acc, acc_norm = [c for c in ax.containers if isinstance(c, BarContainer)]  # with their error bars
    assert [b.get_height() for b in acc] == [0.31, 0.51]
    assert [b.get_height() for b in acc_norm] == [0.29, 0.5]
    (bars,) = acc.errorbar.lines[2]  # the vertical error-bar segments, ((x, low), (x, high)) per task
    assert [hi[1] - lo[1] for lo, hi in bars.get_segments()] == pytest.approx([2 * 0.021, 2 * 0.025])
    chance = [c for c in ax.collections if c.get_label() == "chance"][0]
    assert [seg[0][1] for seg in chance.get_segments()] == [0.25, 0.5]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["arc_easy\n(n=500)", "winogrande\n(n=400)"]


def test_write_task_plots_writes_the_csv_and_a_png(tmp_path):
    paths = write_task_plots(TASKS, tmp_path)
    assert [p.name for p in paths] == ["tasks.csv", "tasks.png"]
    assert (tmp_path / "tasks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "tasks.png").stat().st_size > 10_000
    with open(tmp_path / "tasks.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["task"], float(r["acc"]), float(r["chance"])) for r in rows] == [
        ("arc_easy", 0.31, 0.25),
        ("winogrande", 0.51, 0.5),
    ]
    empty = tmp_path / "none"
    assert write_task_plots({}, empty) == [empty / "tasks.csv", empty / "tasks.png"]
    assert (empty / "tasks.csv").read_text().splitlines() == ["task,acc,acc_norm,acc_per_byte,chance"]
    assert (empty / "tasks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # a note, for dvc plots


@pytest.fixture
def eval_lines(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal: log lines, no bar
    with log_lines("zaya.eval") as lines:  # zaya.eval.tasks propagates to it
        yield lines


class Bigram(torch.nn.Module):
    def __init__(self, vocab: int = 8):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, vocab)
        self.cfg = type("Cfg", (), {"max_seq_len": 16})()

    def forward(self, ids):
        return self.emb(ids)


def test_held_out_and_task_scoring_log_their_counts_off_a_terminal(eval_lines):
    from zaya_pipeline.data.loader import PackedDataset
    from zaya_pipeline.eval.metrics import evaluate_lm
    from zaya_pipeline.eval.tasks import score_token_requests

    torch.manual_seed(0)
    model = Bigram()
    dataset = PackedDataset(np.arange(100, dtype=np.uint16) % 8, 8)  # 12 windows
    evaluate_lm(model, dataset, np.ones(8), batch_size=5)
    assert len(eval_lines) == 1 and eval_lines[0].startswith("held-out: 3/3 batch (100%)")
    assert "tokens=96" in eval_lines[0] and "loss=" in eval_lines[0]

    reqs = [([1, 2, 3, 4], 2)] * 7
    score_token_requests(model, reqs, 0, batch_size=3, log_every_s=0.0, desc="task 1/1 toy")
    assert [line.split("  ")[0] for line in eval_lines[1:]] == [
        "task 1/1 toy: 3/7 request (43%)",
        "task 1/1 toy: 6/7 request (86%)",
        "task 1/1 toy: 7/7 request (100%)",
    ]
