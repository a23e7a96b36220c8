"""The spike guard decides on the device: its decisions against a plain-Python reference, streaks found at the
next check, state round trips (and older checkpoints' records), and no host read in ``decide``."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from zaya_pipeline.config import StabilityConfig
from zaya_pipeline.errors import ConfigError, TrainingError
from zaya_pipeline.profiling import HostSyncs
from zaya_pipeline.train.stability import MIN_HISTORY, SpikeGuard


def decide(guard: SpikeGuard, loss: float, norm: float = 1.0) -> tuple[bool, bool]:
    apply, spike = guard.decide(torch.tensor(loss), torch.tensor(norm))
    return bool(apply), bool(spike)


def _warm(guard: SpikeGuard, n: int = 20) -> None:
    for i in range(n):
        assert decide(guard, 3.0 + 0.01 * (i % 3)) == (True, False)


class Reference:
    """The rule as the docstring states it, in plain Python on the host."""

    def __init__(self, cfg: StabilityConfig):
        self.cfg, self.window, self.skips_in_row, self.tripped = cfg, [], 0, False

    def decide(self, loss: float, norm: float) -> tuple[bool, bool]:
        finite = math.isfinite(loss) and math.isfinite(norm)
        z = 0.0
        if len(self.window) >= MIN_HISTORY and statistics.pstdev(self.window) > 0:
            z = (loss - statistics.fmean(self.window)) / statistics.pstdev(self.window)
        spike = finite and self.cfg.spike_zscore > 0 and z > self.cfg.spike_zscore
        apply = finite and not (spike and self.cfg.spike_skip)
        if finite and not spike:
            self.window = (self.window + [loss])[-self.cfg.spike_window :]
        self.skips_in_row = 0 if apply else self.skips_in_row + 1
        self.tripped |= self.skips_in_row >= self.cfg.max_skips_in_row
        return apply, spike


def test_decisions_match_the_host_reference_over_a_noisy_run_with_spikes_and_nans():
    rng = random.Random(0)
    for skip in (False, True):
        cfg = StabilityConfig(spike_zscore=3.0, spike_window=15, spike_skip=skip, max_skips_in_row=4)
        guard, ref = SpikeGuard(cfg), Reference(cfg)
        for i in range(300):
            loss = 3.0 - i / 300 + rng.gauss(0, 0.02)
            norm = 1.0
            if i % 37 == 5:
                loss += rng.choice([0.5, 2.0])  # spikes
            if i % 53 == 7:
                loss, norm = rng.choice([(math.nan, 1.0), (loss, math.inf)])
            assert decide(guard, loss, norm) == ref.decide(loss, norm), (skip, i)
        assert guard.guard_state()["window"] == pytest.approx(ref.window, rel=1e-6)  # fp32 losses
        assert int(guard.skips_in_row) == ref.skips_in_row and not ref.tripped


def test_a_spike_is_flagged_by_rolling_zscore_and_skipped_only_when_asked():
    for skip in (False, True):
        guard = SpikeGuard(StabilityConfig(spike_zscore=6.0, spike_window=20, spike_skip=skip))
        _warm(guard)
        assert decide(guard, 3.05) == (True, False)  # a normal wobble
        assert decide(guard, 4.0) == (not skip, True)  # ~100 std above the window mean
        assert guard.totals() == (int(skip), 1)
        assert 4.0 not in guard.recent_losses()  # spikes never pollute the statistics
        assert decide(guard, 3.01) == (True, False) and int(guard.skips_in_row) == 0


def test_no_spike_check_before_enough_history_or_when_off():
    guard = SpikeGuard(StabilityConfig(spike_zscore=6.0, spike_skip=True))
    assert decide(guard, 3.0) == (True, False) and decide(guard, 30.0) == (True, False)
    off = SpikeGuard(StabilityConfig(spike_zscore=0.0, spike_skip=True))
    _warm(off)
    assert decide(off, 100.0) == (True, False)


def test_non_finite_loss_or_grad_norm_is_always_skipped_and_a_streak_stops_training_at_the_next_check():
    guard = SpikeGuard(StabilityConfig(max_skips_in_row=3))
    assert decide(guard, math.nan) == (False, False)
    assert decide(guard, 2.0, math.inf) == (False, False)
    assert decide(guard, 2.0) == (True, False) and int(guard.skips_in_row) == 0 and guard.totals()[0] == 2
    guard.check()  # two in a row: fine
    for loss in (math.inf, math.nan, math.nan, 2.0, 2.0):  # the streak of 3 ends before the check
        decide(guard, loss)
    with pytest.raises(TrainingError, match="3 updates in a row skipped by step 6 .*not finite"):
        guard.check()


def test_decide_never_reads_the_device():
    guard = SpikeGuard(StabilityConfig(spike_zscore=3.0, spike_skip=True))
    with HostSyncs() as syncs:
        for i in range(30):
            guard.decide(torch.tensor(3.0 + 0.01 * (i % 3)), torch.tensor(1.0))
        guard.decide(torch.tensor(math.nan), torch.tensor(1.0))
    assert syncs.calls == []


def test_state_round_trip_gives_the_same_decisions_and_reads_older_records():
    cfg = StabilityConfig(spike_zscore=3.0, spike_window=12, spike_skip=True)
    a = SpikeGuard(cfg)
    _warm(a, 15)
    b = SpikeGuard(cfg)
    b.load_guard_state(a.guard_state())
    for loss in (3.0, 3.5, 3.01, 9.0, 3.02):
        assert decide(a, loss) == decide(b, loss)
    assert a.guard_state() == b.guard_state()
    old = {"window": [3.0, 3.01] * 10, "skips_in_row": 1, "skipped_total": 4, "spikes_total": 2}
    c = SpikeGuard(cfg)
    c.load_guard_state(old)  # a checkpoint written before the guard moved to the device
    assert c.recent_losses() == old["window"][-12:] and c.totals() == (4, 2)


def test_bad_settings_name_the_key():
    with pytest.raises(ConfigError, match="train.stability"):
        SpikeGuard(StabilityConfig(spike_window=3))
