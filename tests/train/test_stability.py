from __future__ import annotations

import math

import pytest

from zaya_pipeline.config import StabilityConfig
from zaya_pipeline.errors import ConfigError, TrainingError
from zaya_pipeline.train.stability import SpikeGuard


def _warm(guard: SpikeGuard, n: int = 20) -> None:
    for i in range(n):
        assert guard.decide(3.0 + 0.01 * (i % 3), 1.0) == (True, False)


def test_a_spike_is_flagged_by_rolling_zscore_and_skipped_only_when_asked():
    for skip in (False, True):
        guard = SpikeGuard(StabilityConfig(spike_zscore=6.0, spike_window=20, spike_skip=skip))
        _warm(guard)
        assert guard.decide(3.05, 1.0) == (True, False)  # a normal wobble
        assert guard.decide(4.0, 1.0) == (not skip, True)  # ~100 std above the window mean
        assert guard.spikes_total == 1 and guard.skipped_total == int(skip)
        assert 4.0 not in guard.window  # spikes never pollute the statistics
        assert guard.decide(3.01, 1.0) == (True, False) and guard.skips_in_row == 0


def test_no_spike_check_before_enough_history_or_when_off():
    guard = SpikeGuard(StabilityConfig(spike_zscore=6.0, spike_skip=True))
    assert guard.decide(3.0, 1.0) == (True, False) and guard.decide(30.0, 1.0) == (True, False)
    off = SpikeGuard(StabilityConfig(spike_zscore=0.0, spike_skip=True))
    _warm(off)
    assert off.decide(100.0, 1.0) == (True, False)


def test_non_finite_loss_or_grad_norm_is_always_skipped_and_a_streak_stops_training():
    guard = SpikeGuard(StabilityConfig(max_skips_in_row=3))
    assert guard.decide(math.nan, 1.0) == (False, False)
    assert guard.decide(2.0, math.inf) == (False, False)
    assert guard.decide(2.0, 1.0) == (True, False) and guard.skips_in_row == 0 and guard.skipped_total == 2
    guard.decide(math.inf, 1.0)
    guard.decide(math.nan, 1.0)
    with pytest.raises(TrainingError, match="3 updates in a row skipped.*not finite"):
        guard.decide(math.nan, 1.0)


def test_state_round_trip_gives_the_same_decisions():
    cfg = StabilityConfig(spike_zscore=3.0, spike_window=12, spike_skip=True)
    a = SpikeGuard(cfg)
    _warm(a, 15)
    b = SpikeGuard(cfg)
    b.load_state_dict(a.state_dict())
    for loss in (3.0, 3.5, 3.01, 9.0, 3.02):
        assert a.decide(loss, 1.0) == b.decide(loss, 1.0)
    assert a.state_dict() == b.state_dict()


def test_bad_settings_name_the_key():
    with pytest.raises(ConfigError, match="train.stability"):
        SpikeGuard(StabilityConfig(spike_window=3))
