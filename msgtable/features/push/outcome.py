"""What an endpoint's answer means for the batch it was sent (the outcome table).

=====================================  ===========================================
answer                                 the batch is
=====================================  ===========================================
2xx                                    acked
408, 429, 5xx                          released: due again after Retry-After (capped
                                       at MAX_RETRY_AFTER_S) or the table's backoff
time-out, refused, reset, DNS error    released with the backoff
an address not in --push-allow         released with the backoff (the status says why)
3xx                                    rejected (dead): redirects are not followed
other 4xx (and 1xx)                    rejected: ``HTTP <status>: <body start>``
=====================================  ===========================================
"""

from __future__ import annotations

import email.utils
import enum
from dataclasses import dataclass

MAX_RETRY_AFTER_S = 3600.0
BODY_START_CHARS = 200


class Verdict(enum.Enum):
    ACK = "ack"
    RELEASE = "release"
    REJECT = "reject"


@dataclass(frozen=True)
class Outcome:
    """What to do with a batch: the verb, a delay for a release (None: the table's backoff),
    and a reason (kept as the messages' last_error)."""

    verdict: Verdict
    reason: str = ""
    delay_s: float | None = None


def retry_after_s(value: str | None, now_s: float) -> float | None:
    """A Retry-After header in seconds (delay-seconds or an HTTP date), capped; None when
    absent or unreadable."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return min(float(int(text)), MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return min(max(0.0, when.timestamp() - now_s), MAX_RETRY_AFTER_S)


def _start(body: bytes) -> str:
    text = body[: BODY_START_CHARS * 4].decode("utf-8", "replace")
    text = " ".join(text.split())
    return text[:BODY_START_CHARS]


def for_answer(
    status: int, body: bytes, retry_after: str | None, location: str | None, now_s: float
) -> Outcome:
    """The outcome of an HTTP answer (see the module docstring)."""
    if 200 <= status < 300:
        return Outcome(Verdict.ACK)
    start = _start(body)
    reason = f"HTTP {status}: {start}" if start else f"HTTP {status}"
    if status in (408, 429) or 500 <= status < 600:
        return Outcome(Verdict.RELEASE, reason, retry_after_s(retry_after, now_s))
    if 300 <= status < 400:
        where = f" to {location[:BODY_START_CHARS]}" if location else ""
        return Outcome(Verdict.REJECT, f"HTTP {status}: redirect{where} not followed")
    return Outcome(Verdict.REJECT, reason)


def for_failure(what: str) -> Outcome:
    """The outcome of a request that got no answer (time-out, refused, reset, ...)."""
    return Outcome(Verdict.RELEASE, what)
