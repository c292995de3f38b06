"""When the fault suite's drain gives up (test_chaos): after the faults, it waits for every
part (the push receiver, the capture table, each group) to settle.

On a quiet machine everything settles within seconds of the faults (the slowest: a slow
handler's hold, a backoff); on a busy one a subscription behind its producer drains at what the
machine has left, which can take minutes. So the drain fails at ``timeout_s`` unless its pending
ids fell within the last ``progress_s`` (a busy machine, not a stranded message), and at
``cap_s`` whatever it does, so that its verdict comes well before the test's own time-out. The
verdict lists how many ids each part had pending every ``sample_s``: a count that stays flat
is a stranded message; one that falls to the end is a slow machine.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

DRAIN_TIMEOUT_S = 90.0
DRAIN_PROGRESS_S = 30.0
DRAIN_CAP_S = 240.0
DRAIN_SAMPLE_S = 10.0


@dataclass
class Drain:
    began: float  # when the faults ended (monotonic)
    timeout_s: float = DRAIN_TIMEOUT_S
    progress_s: float = DRAIN_PROGRESS_S
    cap_s: float = DRAIN_CAP_S
    sample_s: float = DRAIN_SAMPLE_S
    why: str = ""  # why it gave up ("": it has not)
    # every sample_s: the ids pending by part (the part: a pending finding's text up to ":")
    samples: list[dict[str, int]] = field(default_factory=list)
    _totals: list[tuple[float, int]] = field(default_factory=list)  # (s after began, pending)

    def goes_on(self, now: float, pending: Mapping[str, Sequence[object]]) -> bool:
        """Whether to wait on, with ``pending`` (finding -> ids) unsettled at ``now``."""
        t = now - self.began
        total = sum(len(ids) for ids in pending.values())
        self._totals.append((t, total))
        if t >= len(self.samples) * self.sample_s:
            parts: Counter[str] = Counter()
            for what, ids in pending.items():
                parts[what.split(":")[0]] += len(ids)
            self.samples.append(dict(parts))
        if t >= self.cap_s:
            self.why = f"{self.cap_s:g}s after the faults (the drain's cap)"
            return False
        if t >= self.timeout_s:
            before = [n for at, n in self._totals if at <= t - self.progress_s]
            if not before or total >= before[-1]:
                self.why = (
                    f"{self.timeout_s:g}s after the faults, none of it in the last "
                    f"{self.progress_s:g}s"
                )
                return False
        return True
