"""When an unacked message comes back: exponential backoff by epoch, bounded, with jitter.

A send of a row whose epoch is ``e`` (0 on the first send) sets::

    time_next = now + ack_wait + clamp(min_backoff * 2**e * jitter, min_backoff, max_backoff)
    epoch     = e + 1

with ``jitter`` uniform in [2/3, 4/3) (one draw per postpone statement) and ``max_backoff``
0 meaning "no bound" (still capped at BACKOFF_CEILING_S, one year). The subscriber has
``ack_wait`` to ack; after that the message waits out its backoff and is sent again, so with
the default min_backoff = ack_wait the first resend comes about 2 x ack_wait after the send,
and every further attempt waits about twice as long as the one before.
"""

from __future__ import annotations

import random

from msgtable.core.tables import BACKOFF_CEILING_S

JITTER_LOW = 2.0 / 3.0
JITTER_HIGH = 4.0 / 3.0
_MAX_EXPONENT = 62  # beyond this every backoff is capped anyway; keeps floats finite


def draw_jitter(rng: random.Random) -> float:
    """One jitter factor in [JITTER_LOW, JITTER_HIGH)."""
    return JITTER_LOW + (JITTER_HIGH - JITTER_LOW) * rng.random()


def backoff_s(epoch: int, min_backoff_s: float, max_backoff_s: float, jitter: float) -> float:
    """The backoff part of the delay for a row sent with this epoch, in seconds."""
    exponent = min(max(epoch, 0), _MAX_EXPONENT)
    delay = min_backoff_s * float(2**exponent) * jitter
    upper = max_backoff_s if max_backoff_s > 0 else BACKOFF_CEILING_S
    return min(max(delay, min_backoff_s), upper)


def next_delivery_ns(
    now_ns: int,
    epoch: int,
    ack_wait_s: float,
    min_backoff_s: float,
    max_backoff_s: float,
    jitter: float,
) -> int:
    """time_next for a row sent now with this epoch (see the module docstring)."""
    delay = ack_wait_s + backoff_s(epoch, min_backoff_s, max_backoff_s, jitter)
    return now_ns + round(delay * 1e9)
