"""Progress of long loops: a tqdm bar on a terminal, plain INFO log lines everywhere else (CI, files, DVC).

    with Progress(len(batches), "held-out", unit="batch", logger=log) as bar:
        for batch in batches:
            ...
            bar.update(1, loss=f"{loss:.3f}")

The choice is made once, when the loop starts: stderr a TTY → a bar on stderr, while the console handlers of
the ``zaya`` loggers (and any other ``redirect`` names) print through ``tqdm.write`` so their lines land
above the bar instead of through it. Otherwise a line

    held-out: 120/480 batch (25%)  3.9 batch/s  ETA 1m32s  loss=4.211

every ``every_s`` seconds and every ``every_pct`` percent (0 = no percent lines), and one when the loop ends,
so a log always shows how far a stopped run got. ``plain=False`` keeps the non-TTY path silent for loops
that already print their own lines (training's telemetry).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable

from zaya_pipeline.utils import get_logger


def format_duration(seconds: float) -> str:
    """``1h02m05s``, ``3m07s`` or ``42s``."""
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    return f"{m}m{s:02d}s" if m else f"{s}s"


def stderr_is_terminal() -> bool:
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """``done`` of ``total`` units (0: unknown) counted from ``initial``, as a bar or as log lines.

    ``bar`` is the tqdm bar on a terminal, else None. ``update(n)`` adds ``n``, ``advance_to(done)`` sets the
    count (a loop that knows its position, e.g. the optimizer step); keyword arguments are shown after the
    count (``loss=...``).
    """

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str = "it",
        logger: logging.Logger | None = None,
        every_s: float = 30.0,
        every_pct: float = 0.0,
        initial: int = 0,
        plain: bool = True,
        redirect: tuple[str, ...] = ("zaya",),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total, self.desc, self.unit = total, desc, unit
        self.log = logger or get_logger("progress")
        self.every_s, self.every_pct, self.plain = every_s, every_pct, plain
        self.initial = self.done = self._done_logged = initial
        self._clock = clock
        self._start = self._last_s = clock()
        self._postfix: dict[str, object] = {}
        self._exit = contextlib.ExitStack()
        self.bar = None
        if stderr_is_terminal():
            self.bar = self._open_bar(redirect)

    def _open_bar(self, redirect: tuple[str, ...]):
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        self._exit.enter_context(logging_redirect_tqdm([logging.getLogger(name) for name in redirect]))
        bar = tqdm(
            total=self.total or None,  # 0: unknown, tqdm then counts without a bar
            initial=self.initial,
            desc=self.desc,
            unit=self.unit,
            file=sys.stderr,
            dynamic_ncols=True,
            smoothing=0.1,
        )
        self._exit.callback(bar.close)
        return bar

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1, **postfix) -> None:
        self.advance_to(self.done + n, **postfix)

    def advance_to(self, done: int, **postfix) -> None:
        step, self.done = done - self.done, done
        self._postfix.update(postfix)
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix({k: str(v) for k, v in self._postfix.items()}, refresh=False)
            self.bar.update(step)
        elif self.plain and self._line_due():
            self._log_line()

    def _line_due(self) -> bool:
        if self.done == self._done_logged:
            return False
        if self.total and self.done >= self.total:
            return True
        if self._clock() - self._last_s >= self.every_s:
            return True
        if self.every_pct > 0 and self.total:
            return 100 * (self.done - self._done_logged) / self.total >= self.every_pct
        return False

    def line(self) -> str:
        """The plain progress line: count, percent, rate, ETA and the postfix."""
        elapsed = max(self._clock() - self._start, 1e-9)
        rate = (self.done - self.initial) / elapsed
        text = f"{self.desc}: {self.done}"
        if self.total:
            text += f"/{self.total} {self.unit} ({100 * self.done / self.total:.0f}%)"
        else:
            text += f" {self.unit}"
        text += f"  {rate:.3g} {self.unit}/s"
        if self.total and rate > 0 and self.done < self.total:
            text += f"  ETA {format_duration((self.total - self.done) / rate)}"
        elif self.total and self.done >= self.total:
            text += f"  in {format_duration(elapsed)}"
        return "  ".join([text, *(f"{k}={v}" for k, v in self._postfix.items())])

    def _log_line(self) -> None:
        self.log.info("%s", self.line())
        self._last_s, self._done_logged = self._clock(), self.done

    def close(self) -> None:
        """Close the bar, or log the last count if it has not been logged yet."""
        if self.bar is None and self.plain and self.done != self._done_logged:
            self._log_line()
        self._exit.close()
