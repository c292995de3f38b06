"""The soak's judge of resource use (tests/faults/test_soak.py): what one server process holds
(memory, threads, file descriptors, connections to the database), sampled once a minute, and
whether it stayed flat.

A soak restarts the database and kills subscribers and the other server, so a sample can
catch a moment of recovery (a connection pool refilling, a stream's threads). The rule looks
past those moments: it compares the last samples with the first ones after a warm-up,
by their medians for memory and by their highest values for the counts, each with a stated
slack (SLACK). A leak grows without bound and shows at the end whatever the slack; a
transient stays within it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, fields

import psutil

MB = 1024 * 1024
WINDOW = 5  # samples compared at each end
# What a resource may grow by, end against start, before the soak calls it growth:
# (absolute, fraction of the start); the larger of the two.
SLACK = {
    "rss_mb": (24.0, 0.10),
    "threads": (3.0, 0.0),
    "fds": (8.0, 0.0),
    "db_connections": (3.0, 0.0),
}


@dataclass(frozen=True)
class Sample:
    minute: int
    rss_mb: float
    threads: int
    fds: int
    db_connections: int

    def line(self) -> str:
        return (
            f"rss {self.rss_mb:.1f} MB, threads {self.threads}, fds {self.fds}, "
            f"database connections {self.db_connections}"
        )


def sample(pid: int, database_port: int, minute: int) -> Sample:
    """What process ``pid`` holds now (psutil): resident memory, threads, open file
    descriptors, and TCP connections to ``database_port`` (established)."""
    p = psutil.Process(pid)
    with p.oneshot():
        rss = p.memory_info().rss / MB
        threads = p.num_threads()
        fds = p.num_fds()
    connections = sum(
        1
        for c in p.net_connections(kind="tcp")
        if c.raddr and c.raddr.port == database_port and c.status == psutil.CONN_ESTABLISHED
    )
    return Sample(minute, rss, threads, fds, connections)


def growth(samples: list[Sample], warmup: int) -> list[str]:
    """Each resource that grew past its slack from the first WINDOW samples after
    ``warmup`` minutes to the last WINDOW ones ([]: flat). Memory by median, counts by
    highest value."""
    settled = [s for s in samples if s.minute >= warmup]
    if len(settled) < 2 * WINDOW:
        return [f"too few samples to judge: {len(settled)} after the warm-up, need {2 * WINDOW}"]
    first, last = settled[:WINDOW], settled[-WINDOW:]
    out = []
    for f in fields(Sample):
        if f.name == "minute":
            continue
        pick = statistics.median if f.name == "rss_mb" else max
        before = float(pick([getattr(s, f.name) for s in first]))
        after = float(pick([getattr(s, f.name) for s in last]))
        absolute, fraction = SLACK[f.name]
        allowed = before + max(absolute, fraction * before)
        if after > allowed:
            out.append(
                f"{f.name} grew from {before:g} (minutes {first[0].minute}-{first[-1].minute}) "
                f"to {after:g} (minutes {last[0].minute}-{last[-1].minute}); allowed {allowed:g}"
            )
    return out
