"""The bench's on-time figure (bench.latency.on_time) does not depend on how fast a process
starts: its messages fall due ON_TIME_LEAD_S after they are inserted, and a subscriber process
takes seconds to start on a busy machine (the imports), so the process is started first."""

from __future__ import annotations

import pytest

from bench import latency
from bench.processes import ServerProcess


def test_on_time_runs_with_a_lead_shorter_than_a_process_takes_to_start(
    db_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a spawned worker imports grpc, SQLAlchemy and msgtable: well over half a second
    monkeypatch.setattr(latency, "ON_TIME_LEAD_S", 0.5)
    with ServerProcess(db_dsn) as server:
        result = latency.on_time(server, db_dsn, postpone_after_s=None, n=50, spread_s=0.2)
    assert result.messages == 50
    assert result.earliest_ms > -50, "a message went out well before its time_next"
