"""The pacing of the client's retry loops: the Python mirror of libs/io/backoff.h.

Waits grow as ``initial * multiplier**n`` up to ``max``; with jitter ``j`` each wait is drawn
uniformly from ``[cap * (1 - j), cap]`` so clients that lost the same server do not return in
lockstep. ``reset()`` after progress starts again from ``initial``; ``next()`` returns None when
the wait would reach the deadline (``time.monotonic()`` seconds; None: no deadline).
"""

import random
import time
from typing import Any, Callable, Optional

from .errors import Unavailable

# Seconds a call to the store that failed with Unavailable is made again, counted from the first
# failure: a restarting store, or the follower taking over from a writer that died (the C++
# client's CommitRetryWindow, its connect_timeout).
STORE_RETRY_WINDOW = 10.0


def delay(initial: float, maximum: float, multiplier: float, jitter: float, retry: int,
          uniform01: float) -> float:
    """The wait before retry ``retry`` (0-based) for a draw ``uniform01`` in [0, 1]."""
    initial = max(initial, 0.0)
    maximum = max(maximum, initial)
    multiplier = max(multiplier, 1.0)
    cap = initial
    for _ in range(retry):
        if cap >= maximum:
            break
        cap *= multiplier
    cap = min(cap, maximum)
    jitter = min(max(jitter, 0.0), 1.0)
    return cap * (1.0 - jitter * min(max(uniform01, 0.0), 1.0))


class Backoff:
    """Exponential, capped, jittered, deadline-aware waits (see the module docstring)."""

    def __init__(self, initial: float = 0.1, maximum: float = 5.0, multiplier: float = 2.0,
                 jitter: float = 0.2, deadline: Optional[float] = None,
                 uniform01: Callable[[], float] = random.random):
        self.initial, self.maximum = initial, maximum
        self.multiplier, self.jitter = multiplier, jitter
        self.deadline = deadline
        self._uniform01 = uniform01
        self.retries = 0

    def next(self) -> Optional[float]:
        wait = delay(self.initial, self.maximum, self.multiplier, self.jitter, self.retries,
                     self._uniform01())
        if self.deadline is not None and time.monotonic() + wait >= self.deadline:
            return None
        self.retries += 1
        return wait

    def wait(self) -> bool:
        """Sleeps the next wait; False at once when it would reach the deadline."""
        wait = self.next()
        if wait is None:
            return False
        time.sleep(wait)
        return True

    def reset(self) -> None:
        self.retries = 0


def while_unavailable(attempt: Callable[[], Any], await_channel: Callable[[float], None],
                      window: float = STORE_RETRY_WINDOW) -> Any:
    """``attempt()``, made again from the start while it raises Unavailable, for ``window``
    seconds from the first failure: each retry waits its Backoff, then up to the time left for
    the channel (``await_channel(seconds)``). Raises the last Unavailable when the window ends;
    any other error at once."""
    backoff = Backoff()
    while True:
        try:
            return attempt()
        except Unavailable:
            if backoff.deadline is None:
                backoff.deadline = time.monotonic() + window
            if not backoff.wait():
                raise
            await_channel(max(0.0, backoff.deadline - time.monotonic()))
