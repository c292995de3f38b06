"""Measurement: a process's memory and CPU time, percentiles, and the throughput figure every
throughput benchmark returns (with the deadline a run of it gets).

CPU and memory are read from Linux's /proc, so a figure can be taken of any process on this
machine (the database server, the msgtable server) without its cooperation.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MiB (Linux /proc; psutil elsewhere)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    psutil: Any = importlib.import_module("psutil")  # not on Linux, where /proc answers
    return float(psutil.Process(pid).memory_info().rss) / (1 << 20)


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds (user + system, all threads) a running process has used so far; 0.0 when
    the process is not on this machine (``pid`` None) or cannot be read."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def cpu_meter(**pids: int | None) -> Iterator[dict[str, float]]:
    """CPU seconds each named process used while the block ran (filled in at its end)."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    used: dict[str, float] = {}
    yield used
    used.update({name: cpu_seconds(pid) - before[name] for name, pid in pids.items()})


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, round(q / 100 * len(sorted_values) + 0.5 - 1e-9))
    return sorted_values[min(len(sorted_values), rank) - 1]


@dataclass
class Throughput:
    """One throughput figure: ``messages`` through the lifecycle in ``seconds``."""

    kind: str  # "raw", "msgtable", "kombu", ...
    batch_size: int
    clients: int  # consumer connections or subscribers
    messages: int
    seconds: float
    note: str = ""
    cpu_s: dict[str, float] = field(default_factory=dict)  # process class -> CPU seconds
    spans: int = 0  # consumer spans the subscribers exported (bench.metrics' traced runs)

    @property
    def msgs_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else float("nan")

    def cpu_per_msg(self) -> dict[str, float]:
        return {k: round(v / self.messages * 1e6, 1) for k, v in self.cpu_s.items()}

    def cpu_note(self) -> str:
        """CPU microseconds per message by process class, e.g. "database 31, clients 40"."""
        if not self.cpu_s or not self.messages:
            return ""
        parts = [f"{name} {s / self.messages * 1e6:.0f}" for name, s in self.cpu_s.items()]
        total = sum(self.cpu_s.values()) / self.messages * 1e6
        return f"CPU us/msg: {', '.join(parts)}; total {total:.0f}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "batch_size": self.batch_size,
            "clients": self.clients,
            "messages": self.messages,
            "seconds": round(self.seconds, 3),
            "msgs_s": round(self.msgs_s),
            **({"note": self.note} if self.note else {}),
            **({"cpu_us_per_msg": self.cpu_per_msg()} if self.cpu_s else {}),
        }


def run_timeout_s(n: int) -> float:
    """How long one throughput run may take before it counts as stuck (>= 500 msgs/s)."""
    return 60.0 + n / 500
