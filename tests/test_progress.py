"""The progress helper: plain log lines with counts off a terminal, a tqdm bar on one."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest

from support.logs import log_lines
from zaya_pipeline.progress import Progress, format_duration


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def logged():
    with log_lines("test.progress") as lines:
        yield logging.getLogger("test.progress"), lines


@pytest.fixture
def not_a_terminal(monkeypatch):
    stream = io.StringIO()  # isatty() is False, as for CI logs and files
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


def test_log_lines_every_n_seconds_with_counts_rate_and_eta(logged, not_a_terminal):
    logger, lines = logged
    clock = Clock()
    with Progress(100, "held-out", "batch", logger=logger, every_s=30, clock=clock) as bar:
        assert bar.bar is None
        for _ in range(10):  # 10 batches in 20 s: no line yet
            clock.now += 2
            bar.update(1, loss="4.2000")
        assert lines == []
        for _ in range(10):
            clock.now += 2
            bar.update(1)
        assert len(lines) == 1  # 30 s passed at batch 15
        assert lines[0] == "held-out: 15/100 batch (15%)  0.5 batch/s  ETA 2m50s  loss=4.2000"
        for _ in range(80):
            clock.now += 2
            bar.update(1)
    assert re.fullmatch(r"held-out: 100/100 batch \(100%\)  0\.5 batch/s  in 3m20s  loss=4\.2000", lines[-1])
    counts = [int(re.match(r"held-out: (\d+)/100", line).group(1)) for line in lines]
    assert counts == [15, 30, 45, 60, 75, 90, 100]  # every 30 s, and one at the end
    assert not_a_terminal.getvalue() == ""  # no bar drawn


def test_log_lines_every_n_percent_and_a_last_line_on_close(logged, not_a_terminal):
    logger, lines = logged
    bar = Progress(8, "task 1/2 arc_easy", "request", logger=logger, every_s=1e9, every_pct=25, clock=Clock())
    for _ in range(5):
        bar.update(1)
    bar.close()  # stopped early: the last count is still logged
    assert [line.split("  ")[0] for line in lines] == [
        "task 1/2 arc_easy: 2/8 request (25%)",
        "task 1/2 arc_easy: 4/8 request (50%)",
        "task 1/2 arc_easy: 5/8 request (62%)",
    ]


def test_plain_false_is_silent_off_a_terminal_and_advance_to_counts_from_initial(logged, not_a_terminal):
    logger, lines = logged
    clock = Clock()
    with Progress(10, "train", "step", logger=logger, initial=4, plain=False, clock=clock) as bar:
        clock.now += 100
        bar.advance_to(10)
        assert bar.done == 10
        assert "  0.06 step/s" in bar.line()  # 6 steps in 100 s
    assert lines == []


def test_a_terminal_gets_a_tqdm_bar_and_no_log_lines(logged, monkeypatch):
    from tqdm import tqdm

    logger, lines = logged
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    with Progress(5, "held-out", "batch", logger=logger, every_s=0) as bar:
        assert isinstance(bar.bar, tqdm)
        for _ in range(3):
            bar.update(1, loss="1.5")
    assert lines == []
    drawn = term.getvalue()
    assert "held-out" in drawn and "3/5" in drawn and "loss=1.5" in drawn


def test_zaya_log_lines_go_above_the_bar_while_it_is_open(monkeypatch):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    zaya = logging.getLogger("zaya")
    handler = logging.StreamHandler(term)
    monkeypatch.setattr(zaya, "handlers", [handler])
    monkeypatch.setattr(zaya, "propagate", False)
    level = zaya.level
    zaya.setLevel(logging.INFO)
    try:
        with Progress(3, "train", "step"):
            assert zaya.handlers != [handler]  # redirected through tqdm.write
            zaya.info("step 1/3  loss 4.0")
    finally:
        zaya.setLevel(level)
    assert zaya.handlers == [handler]
    assert "step 1/3  loss 4.0" in term.getvalue()


def test_an_unknown_total_counts_without_percent_or_eta(logged, not_a_terminal):
    logger, lines = logged
    clock = Clock()
    with Progress(0, "tokenizer: reading", "doc", logger=logger, every_s=10, clock=clock) as bar:
        for _ in range(30):
            clock.now += 1
            bar.update(1)
    assert lines == ["tokenizer: reading: 10 doc  1 doc/s", "tokenizer: reading: 20 doc  1 doc/s",
                     "tokenizer: reading: 30 doc  1 doc/s"]  # fmt: skip


def test_format_duration():
    assert [format_duration(s) for s in (0, 42, 187, 3725)] == ["0s", "42s", "3m07s", "1h02m05s"]
