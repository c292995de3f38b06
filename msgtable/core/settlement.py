"""Settlement: what a subscriber may say of a message besides ack, and the limits of saying it.

* **release**: not now. The message is due again after the delay the subscriber gives (0: at
  once), to any subscriber. It counts as an attempt (the send it answers is counted in its
  epoch), so a message released vt_max_attempts times is dead when it falls due.
* **reject**: never. The message is dead at once (msgtable.core.deadletters: moved to the
  dead-letter table, or dead in place).
* **renew**: still working. A message sent and not due again yet stays so for the
  extension (default: the table's vt_ack_wait) from now: a heartbeat that keeps a slow
  handler's message from being sent to another subscriber.

A release or renew may name the delivery it answers for each id (its attempt, as received):
such an id is changed only if it was not sent again since, so a handler's late release or
renew of an earlier delivery leaves the later one alone (another handler may hold it). An id
without one (a call by id alone, as the clients' release and renew of ids) changes whichever
delivery is current. A reject is a verdict on the message, not on a delivery: by id alone.

Each takes ids of one table (any, as MessageAck: not only the caller's) and an optional
reason, kept in the message's last_error column where the table has one. Each is idempotent
in effect and answers the exact count of messages it changed: ids unknown, acked, dead, or
not in a state the verb applies to (a release or renew of a message never sent; a renew of
one already due again) are not counted and not changed. A malformed request (no ids, more
than MAX_ACK_IDS, an id of the wrong type, a negative, non-finite or too long delay, a reason
over MAX_REASON_CHARS) is InvalidArgument and changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from msgtable.core.words import counted
from msgtable.errors import InvalidArgument
from msgtable.limits import MAX_REASON_CHARS, MAX_SETTLE_DELAY_S


def check_reason(table: str, reason: str | None) -> str | None:
    """The reason to keep (None: none given), or InvalidArgument."""
    if not reason:
        return None
    if len(reason) > MAX_REASON_CHARS:
        raise InvalidArgument(
            f"table {table}: a reason of {len(reason):,} characters; at most {MAX_REASON_CHARS:,}"
        )
    return reason


def check_attempts(table: str, attempts: Sequence[int], ids: int) -> list[int] | None:
    """The delivery of each id a release or renew answers (0: whichever is current); None when
    the call names none. InvalidArgument unless there is one per id."""
    if not attempts:
        return None
    if len(attempts) != ids:
        raise InvalidArgument(
            f"table {table}: {counted(len(attempts), 'attempt')} for {counted(ids, 'id')}; "
            "one per id, or none"
        )
    out = [int(a) for a in attempts]
    if any(a < 0 for a in out):
        raise InvalidArgument(f"table {table}: an attempt below 0 ({min(out)})")
    return out


def check_delay(table: str, what: str, seconds: float) -> float:
    """A release's delay or a renew's extension in seconds, or InvalidArgument."""
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidArgument(f"table {table}: {what} must be zero or more seconds, not {seconds}")
    if seconds > MAX_SETTLE_DELAY_S:
        raise InvalidArgument(
            f"table {table}: {what} of {seconds:g} s is over the limit of {MAX_SETTLE_DELAY_S:g} s"
        )
    return seconds
