"""Flow control (msgtable.engine.flow) end to end through ``msgtable serve`` (the ``flow``
section of ``python -m bench.run``): a rate held under a backlog, caps per key, fair share.

Every table has the current layout plus a ``tenant varchar(64)`` column; its comment is the
run's (bench.database.message_comment) plus its limits. The subscribers are K threads of
this process (the Python client), subscribing at go and acking each batch with
``ack_async``; each delivery is recorded with the server's hand-over time
(``Message.sent_ns``) and when its ack began. Throughput is the messages over the span of
their hand-over times (first to last), so that a subscribe's cost is not in it.

* **Rate** (``rate_limit_error``, target <= 0.05): a backlog of more than SIZES' seconds at
  ``vt_rate=RATE/s`` (default burst); the rate measured over SIZES["rate_s"] seconds of the
  steady drain (from half a second after the first send), its error against RATE, and the
  windows the sends overshot (``rate_windows_overshot``: any interval with more than
  ``burst + RATE * T`` sends; 0).
* **Caps** (``key_cap_violations``, target 0; ``caps_ratio``, target >= 0.8): the same
  backlog over many keys drained from a table with ``vt_key_concurrency`` (no key reaches
  it: the keys are many, the cap high) and from the same table without, alternately; the
  ratio of their rates. Then a table whose keys are few and whose cap is 2, drained by
  subscribers that hold each batch a moment: the most messages of a key in flight at any
  instant (a delivery's hand-over to its ack's start, inside the server's in flight), and
  the keys that ever exceeded the cap, in both runs.
* **Fair share** (``fair_dwell_ratio``, target <= 2; ``fair_ratio``, target >= 0.9), in
  SIZES["fair_rounds"] rounds (3 quick, 5 full), each a pair run side by side, every other
  round in the other order; each figure is the median round's ratio, with its spread
  (``fair_ratio_spread``/``fair_dwell_ratio_spread``: [min, max]) and every round's
  (``..._rounds``): a machine busy with other work moves a single run by a third. A backlog
  (SIZES["fair_rows"], 90 % the noisy tenant's) drained with the fairness key and without:
  the ratio of their rates (``fair_ratio``). Live, for SIZES["live_s"] seconds, quiet
  tenants enqueue QUIET_PER_S messages a second in all while a noisy tenant enqueues
  NOISY_FACTOR times that, in bursts (a burst every BURST_EVERY_S), into a table with
  ``vt_fair_key=tenant``: the quiet messages' p99 time from commit to send against the same
  quiet traffic alone (``fair_dwell_ratio``; ``fair_dwell_p99_ms`` and
  ``fair_base_dwell_p99_ms`` are the median round's). ``unfair_dwell_p99_ms`` is the quiet
  messages' p99 with the noisy tenant on the same table without the fairness key, for
  comparison (the first round only). A fair table has the index on (time_acked, tenant,
  priority, time_next) the docs give it; the drain's table without the fairness key has the
  same index (the same table, its comment without ``vt_fair_key``: what the key itself costs).
  What the index costs on its own is ``fair_index_ratio`` (no target; the first round only):
  that table's rate over the same table without the index (each ack, postpone and purge
  writes one more index entry).
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench import smoke
from bench.database import connect, execute, message_comment
from bench.errors import BenchError
from bench.measure import percentile
from bench.processes import ServerProcess
from msgtable.core.flow import fair_index_columns, rate_violations
from msgtable.core.tables import current_layout_ddl

RATE_PER_S = 1000
RATE_BURST = 100  # vt_rate's default: a tenth of a second
KEY_CAP = 2
HIGH_CAP = 50  # the caps table's: no key reaches it
NOISY_FACTOR = 100
QUIET_PER_S = 20
QUIET_TENANTS = 10
BURST_EVERY_S = 0.25
SUBSCRIBERS = 4
BATCH_SIZE = 50
HOLD_S = 0.002  # the small-cap run's subscribers hold each batch this long
INSERT_CHUNK = 2_000
TARGETS = {
    "rate_limit_error": 0.05,
    "key_cap_violations": 0,
    "caps_ratio": 0.8,
    "fair_dwell_ratio": 2.0,
    "fair_ratio": 0.9,
}
SIZES: dict[str, dict[str, Any]] = {
    "quick": {"rate_s": 30.0, "caps_rows": 40_000, "caps_keys": 1_000, "cap_rows": 2_000,
              "cap_keys": 20, "fair_rows": 30_000, "live_s": 8.0, "fair_rounds": 3},
    "full": {"rate_s": 60.0, "caps_rows": 200_000, "caps_keys": 10_000, "cap_rows": 10_000,
             "cap_keys": 100, "fair_rows": 200_000, "live_s": 30.0, "fair_rounds": 5},
    "smoke": smoke.FLOW,
}  # fmt: skip
TENANT = "tenant varchar(64)"


@dataclass(frozen=True)
class Seen:
    """One delivery: id, tenant, the server's hand-over (unix ns), its ack's start (unix ns)."""

    id: int
    tenant: str | None
    sent_ns: int
    acking_ns: int


@dataclass
class FlowResult:
    rate_per_s: float = RATE_PER_S
    rate_measured: float | None = None
    rate_windows_overshot: int | None = None
    caps_msgs_s: float | None = None
    nocaps_msgs_s: float | None = None
    key_cap_violations: int | None = None
    most_in_flight_per_key: int | None = None
    fair_msgs_s: float | None = None
    unfair_msgs_s: float | None = None
    fair_dwell_p99_ms: float | None = None
    fair_base_dwell_p99_ms: float | None = None
    unfair_dwell_p99_ms: float | None = None
    plain_msgs_s: float | None = None  # no fairness key, no fair index (the first round's)
    fair_ratio_rounds: list[float] = field(default_factory=list)  # each round's, in order
    # each round's drain (fair msgs/s, without the key msgs/s)
    fair_drain_rounds: list[tuple[float, float]] = field(default_factory=list)
    fair_dwell_ratio_rounds: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def rate_limit_error(self) -> float | None:
        m = self.rate_measured
        return None if m is None else abs(m / self.rate_per_s - 1)

    @property
    def caps_ratio(self) -> float | None:
        return _ratio(self.caps_msgs_s, self.nocaps_msgs_s)

    @property
    def fair_ratio(self) -> float | None:
        """The median round's (one run: its own ratio)."""
        rounds = self.fair_ratio_rounds
        if rounds:
            return statistics.median(rounds)
        return _ratio(self.fair_msgs_s, self.unfair_msgs_s)

    @property
    def fair_index_ratio(self) -> float | None:
        """The fair index's own cost: the first round's table without the key, with the
        index over without it."""
        first = self.fair_drain_rounds[0] if self.fair_drain_rounds else None
        return _ratio(first[1] if first else None, self.plain_msgs_s)

    @property
    def fair_dwell_ratio(self) -> float | None:
        rounds = self.fair_dwell_ratio_rounds
        if rounds:
            return statistics.median(rounds)
        return _ratio(self.fair_dwell_p99_ms, self.fair_base_dwell_p99_ms)

    def headline(self) -> dict[str, Any]:
        """The section's figures at the JSON line's top level (bench.report)."""
        return {
            "rate_limit_error": _rnd(self.rate_limit_error, 4),
            "key_cap_violations": self.key_cap_violations,
            "caps_ratio": _rnd(self.caps_ratio, 3),
            "fair_dwell_ratio": _rnd(self.fair_dwell_ratio, 3),
            "fair_dwell_ratio_spread": _spread(self.fair_dwell_ratio_rounds),
            "fair_dwell_ratio_rounds": [round(r, 3) for r in self.fair_dwell_ratio_rounds],
            "fair_ratio": _rnd(self.fair_ratio, 3),
            "fair_ratio_spread": _spread(self.fair_ratio_rounds),
            "fair_ratio_rounds": [round(r, 3) for r in self.fair_ratio_rounds],
            "fair_index_ratio": _rnd(self.fair_index_ratio, 3),
        }

    def as_dict(self) -> dict[str, Any]:
        rnd = _rnd
        return {
            "rate_per_s": self.rate_per_s,
            "rate_measured": rnd(self.rate_measured, 1),
            "rate_windows_overshot": self.rate_windows_overshot,
            "caps_msgs_s": rnd(self.caps_msgs_s, 0),
            "nocaps_msgs_s": rnd(self.nocaps_msgs_s, 0),
            "most_in_flight_per_key": self.most_in_flight_per_key,
            "fair_msgs_s": rnd(self.fair_msgs_s, 0),
            "unfair_msgs_s": rnd(self.unfair_msgs_s, 0),
            "plain_msgs_s": rnd(self.plain_msgs_s, 0),
            "fair_dwell_p99_ms": rnd(self.fair_dwell_p99_ms, 1),
            "fair_base_dwell_p99_ms": rnd(self.fair_base_dwell_p99_ms, 1),
            "unfair_dwell_p99_ms": rnd(self.unfair_dwell_p99_ms, 1),
            "notes": self.notes,
        }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _rnd(v: float | None, digits: int = 3) -> float | None:
    return None if v is None else round(v, digits)


def _spread(rounds: list[float]) -> list[float] | None:
    """[min, max] of the rounds (None: none ran)."""
    return [round(min(rounds), 3), round(max(rounds), 3)] if rounds else None


# -- tables and rows ------------------------------------------------------------------------------
def make_table(
    dsn: str,
    table: str,
    poller_interval_s: float,
    limits: str,
    fair_index: bool | None = None,
    **kw: Any,
) -> None:
    comment = message_comment(BATCH_SIZE, poller_interval_s, postpone_after_s=kw.get("postpone"))
    # a fair table has the index the docs' DDL gives it (msgtable.core.flow.fair_index_columns);
    # ``fair_index``: with it or without it whatever the comment
    if fair_index is None:
        fair_index = "vt_fair_key" in limits
    index = f"  index fair_idx({', '.join(fair_index_columns('tenant'))}),\n" if fair_index else ""
    ddl = current_layout_ddl(table, comment + (f",{limits}" if limits else "")).replace(
        "  primary key(id)", f"  {TENANT},\n{index}  primary key(id)"
    )
    execute(dsn, f"drop table if exists {table}", ddl)


def insert(cur: Any, table: str, rows: list[tuple[int, str]]) -> None:
    for i in range(0, len(rows), INSERT_CHUNK):
        chunk = rows[i : i + INSERT_CHUNK]
        values = ",".join(f"({rid},'{tenant}','m')" for rid, tenant in chunk)
        cur.execute(f"insert into {table}(id, tenant, message) values {values}")


def wait_loaded(server: ServerProcess, table: str, timeout_s: float = 30.0) -> None:
    """Until the server lists ``table`` loaded (its discovery found the new comment)."""
    from msgtable.client import Client

    deadline = time.monotonic() + timeout_s
    with Client(server.address) as client:
        while time.monotonic() < deadline:
            for t in client.list_tables():
                if t.name == table and t.loaded:
                    return
                if t.name == table and t.load_error:
                    raise BenchError(f"{table}: {t.load_error}")
            time.sleep(0.2)
    raise BenchError(f"{table} was not loaded within {timeout_s:g} s")


# -- subscribers ----------------------------------------------------------------------------------
class Drain:
    """K subscriber threads of ``table`` recording every delivery, until ``target`` came
    (or ``stop``); ``hold_s``: each batch is held that long before its ack."""

    def __init__(self, server: ServerProcess, table: str, target: int, hold_s: float = 0.0):
        from msgtable.client import Client

        self.seen: list[Seen] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._target, self._hold_s = target, hold_s
        self._client = Client(server.address, timeout_s=30.0)
        self._threads = [
            threading.Thread(target=self._run, args=(table,), daemon=True)
            for _ in range(SUBSCRIBERS)
        ]
        for t in self._threads:
            t.start()

    def _run(self, table: str) -> None:
        try:
            with self._client.subscribe(table) as sub:
                threading.Thread(
                    target=lambda: (self._done.wait(), sub.close()), daemon=True
                ).start()
                for batch in sub.batches():
                    if self._hold_s:
                        time.sleep(self._hold_s)
                    acking = time.time_ns()
                    got = [
                        Seen(int(m.id), m.values.get("tenant"), m.sent_ns, acking) for m in batch
                    ]
                    sub.ack_async(batch)
                    with self._lock:
                        self.seen += got
                        if len(self.seen) >= self._target:
                            self._done.set()
                sub.flush_acks(30.0)
        except Exception as exc:
            if not self._done.is_set():
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self._done.set()

    def wait(self, timeout_s: float) -> list[Seen]:
        if not self._done.wait(timeout_s):
            self.errors.append(f"{len(self.seen)} of {self._target} in {timeout_s:g} s")
        self.stop()
        if self.errors:
            raise BenchError("; ".join(self.errors[:3]))
        return self.seen

    def stop(self) -> None:
        self._done.set()
        for t in self._threads:
            t.join(10)
        self._client.close()


def msgs_s(seen: list[Seen]) -> float:
    span = (max(s.sent_ns for s in seen) - min(s.sent_ns for s in seen)) / 1e9
    return len(seen) / span if span > 0 else float("nan")


def most_per_key(seen: list[Seen]) -> dict[str, int]:
    """The most deliveries of each key in flight at one instant (hand-over to ack start)."""
    events: dict[str, list[tuple[int, int]]] = {}
    for s in seen:
        if s.tenant is not None:
            events.setdefault(s.tenant, []).extend([(s.sent_ns, 1), (s.acking_ns, -1)])
    out = {}
    for key, evs in events.items():
        evs.sort()
        n = most = 0
        for _, step in evs:
            n += step
            most = max(most, n)
        out[key] = most
    return out


# -- the runs -------------------------------------------------------------------------------------
def run(
    server: ServerProcess,
    dsn: str,
    mode: str,
    poller_interval_s: float,
    postpone_after_s: float | None = None,
) -> FlowResult:
    sizes = SIZES[mode]
    out = FlowResult()
    kw = {"postpone": postpone_after_s}
    with contextlib.closing(connect(dsn)) as conn, conn.cursor() as cur:
        _rate(server, dsn, cur, sizes, poller_interval_s, kw, out)
        _caps(server, dsn, cur, sizes, poller_interval_s, kw, out)
        fair_rounds(server, dsn, cur, sizes, poller_interval_s, kw, out)
    return out


def _rate(server, dsn, cur, sizes, poller_interval_s, kw, out) -> None:  # type: ignore[no-untyped-def]
    seconds = sizes["rate_s"]
    n = round(RATE_PER_S * (seconds + 2))
    make_table(dsn, "flow_rate", poller_interval_s, f"vt_rate={RATE_PER_S}/s", **kw)
    insert(cur, "flow_rate", [(i, "t") for i in range(1, n + 1)])
    wait_loaded(server, "flow_rate")
    seen = Drain(server, "flow_rate", round(RATE_PER_S * (seconds + 1))).wait(seconds + 60)
    sent = sorted(s.sent_ns for s in seen)
    begin = sent[0] + 500_000_000
    end = begin + round(seconds * 1e9)
    out.rate_measured = sum(1 for t in sent if begin <= t < end) / seconds
    out.rate_windows_overshot = len(rate_violations(sent, RATE_PER_S, RATE_BURST))


def _caps(server, dsn, cur, sizes, poller_interval_s, kw, out) -> None:  # type: ignore[no-untyped-def]
    rows, keys = sizes["caps_rows"], sizes["caps_keys"]
    backlog = [(i, f"k{(i * 2_654_435_761) % keys}") for i in range(1, rows + 1)]
    capped = f"vt_limit_key=tenant,vt_key_concurrency={HIGH_CAP}"
    rates: dict[str, list[float]] = {"caps": [], "nocaps": []}
    worst: dict[str, int] = {}
    for rnd in range(2):
        for name, limits in (("caps", capped), ("nocaps", "")):
            table = f"flow_{name}_{rnd}"
            make_table(dsn, table, poller_interval_s, limits, **kw)
            insert(cur, table, backlog)
            wait_loaded(server, table)
            seen = Drain(server, table, rows).wait(120)
            rates[name].append(msgs_s(seen))
            if name == "caps":
                worst.update({k: v for k, v in most_per_key(seen).items() if v > HIGH_CAP})
            execute(dsn, f"drop table {table}")
    out.caps_msgs_s = statistics.median(rates["caps"])
    out.nocaps_msgs_s = statistics.median(rates["nocaps"])
    few = [(i, f"k{i % sizes['cap_keys']}") for i in range(1, sizes["cap_rows"] + 1)]
    make_table(
        dsn,
        "flow_cap",
        poller_interval_s,
        f"vt_limit_key=tenant,vt_key_concurrency={KEY_CAP}",
        **kw,
    )
    insert(cur, "flow_cap", few)
    wait_loaded(server, "flow_cap")
    seen = Drain(server, "flow_cap", len(few), hold_s=HOLD_S).wait(120)
    per_key = most_per_key(seen)
    out.most_in_flight_per_key = max(per_key.values())
    over = [k for k, v in per_key.items() if v > KEY_CAP] + list(worst)
    out.key_cap_violations = len(over)
    if over:
        out.notes.append(f"keys over their cap: {over[:5]}")


def fair_rounds(server, dsn, cur, sizes, poller_interval_s, kw, out) -> None:  # type: ignore[no-untyped-def]
    """The fair-share figures (see the module docstring): SIZES["fair_rounds"] rounds of a
    backlog drained with the fairness key and without, and the quiet tenants' live p99
    beside the noisy tenant and alone; each pair side by side, every other round the other
    way round (a machine's load drifts over seconds). The median round's runs are kept."""
    rows = sizes["fair_rows"]
    backlog = [(i, "noisy" if i % 10 else f"q{i // 10 % 100}") for i in range(1, rows + 1)]
    drains: list[tuple[float, float, float]] = []  # (ratio, fair msgs/s, unfair msgs/s)
    lives: list[tuple[float, float, float]] = []  # (ratio, beside the noisy one, alone)

    def drain(name: str, limits: str, index: bool) -> float:
        table = f"flow_{name}"
        make_table(dsn, table, poller_interval_s, limits, index, **kw)
        insert(cur, table, backlog)
        wait_loaded(server, table)
        got = msgs_s(Drain(server, table, rows).wait(120))
        execute(dsn, f"drop table {table}")
        return got

    for rnd in range(sizes["fair_rounds"]):
        order = (True, False) if rnd % 2 == 0 else (False, True)
        rate: dict[bool, float] = {}
        for fair in order:  # the same table (fair index and all), with the key and without
            name = "fair" if fair else "unfair"
            rate[fair] = drain(f"{name}_{rnd}", "vt_fair_key=tenant" if fair else "", True)
        drains.append((rate[True] / rate[False], rate[True], rate[False]))
        out.fair_drain_rounds.append((rate[True], rate[False]))
        if rnd == 0:  # the fair index's own cost: the same table without it
            out.plain_msgs_s = drain(f"plain_{rnd}", "", False)
        p99: dict[bool, float] = {}
        for with_noisy in (True, False) if rnd % 2 == 0 else (False, True):
            live_s = sizes["live_s"]
            p99[with_noisy] = _fair_live(
                server, dsn, live_s, poller_interval_s, kw, with_noisy, True
            )
        lives.append((p99[True] / p99[False], p99[True], p99[False]))
        if rnd == 0:  # for comparison: the noisy tenant without the fairness key
            out.unfair_dwell_p99_ms = _fair_live(
                server, dsn, sizes["live_s"], poller_interval_s, kw, True, False
            )
    out.fair_ratio_rounds = [r for r, _, _ in drains]
    out.fair_dwell_ratio_rounds = [r for r, _, _ in lives]
    _, out.fair_msgs_s, out.unfair_msgs_s = sorted(drains)[len(drains) // 2]
    _, out.fair_dwell_p99_ms, out.fair_base_dwell_p99_ms = sorted(lives)[len(lives) // 2]
    out.notes.append(
        "live p99 rounds (ms, beside the noisy tenant / alone): "
        f"{[(round(a, 1), round(b, 1)) for _, a, b in lives]}"
    )


def _fair_live(  # type: ignore[no-untyped-def]
    server, dsn, seconds: float, poller_interval_s, kw, with_noisy: bool, fair: bool
) -> float:
    """The quiet tenants' p99 commit -> send (ms), with the noisy tenant or without."""
    table = f"flow_live_{int(with_noisy)}{int(fair)}"
    make_table(dsn, table, poller_interval_s, "vt_fair_key=tenant" if fair else "", **kw)
    wait_loaded(server, table)
    drain = Drain(server, table, 10**9)
    committed: dict[int, int] = {}
    next_id = [1]

    def put(cur: Any, rows: list[str]) -> list[int]:
        ids = list(range(next_id[0], next_id[0] + len(rows)))
        next_id[0] += len(rows)
        insert(cur, table, list(zip(ids, rows, strict=True)))
        return ids

    burst = round(QUIET_PER_S * NOISY_FACTOR * BURST_EVERY_S)
    time.sleep(1.0)  # the subscribers are in
    with contextlib.closing(connect(dsn)) as conn, conn.cursor() as cur:
        began = time.monotonic()
        quiet_at = noisy_at = began
        n = 0
        while time.monotonic() - began < seconds:
            now = time.monotonic()
            if with_noisy and now >= noisy_at:
                put(cur, ["noisy"] * burst)
                noisy_at += BURST_EVERY_S
            if now >= quiet_at:
                (rid,) = put(cur, [f"q{n % QUIET_TENANTS}"])
                committed[rid] = time.time_ns()
                n += 1
                quiet_at += 1 / QUIET_PER_S
            time.sleep(
                max(0.0, min(quiet_at, noisy_at if with_noisy else quiet_at) - time.monotonic())
            )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = {s.id for s in list(drain.seen)}
        if set(committed) <= got:
            break
        time.sleep(0.1)
    drain.stop()
    sent = {s.id: s.sent_ns for s in drain.seen if s.id in committed}
    if set(sent) != set(committed):
        raise BenchError(f"{table}: {len(committed) - len(sent)} quiet messages never came")
    execute(dsn, f"drop table {table}")
    waits = sorted(max(0, sent[i] - committed[i]) / 1e6 for i in committed)
    return percentile(waits, 99)


def summary(r: FlowResult) -> str:
    """The section's progress line."""

    def f(v: float | None, spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    return (
        f"flow: rate {f(r.rate_measured, ',.0f')}/s for {r.rate_per_s:g}/s "
        f"(error {f(r.rate_limit_error, '.3f')}, {r.rate_windows_overshot} windows overshot); "
        f"caps {f(r.caps_ratio, '.2f')} ({r.key_cap_violations} keys over their cap); "
        f"fair share {f(r.fair_ratio, '.2f')} {_spread(r.fair_ratio_rounds)}, quiet p99 "
        f"{f(r.fair_dwell_p99_ms, '.0f')} ms vs {f(r.fair_base_dwell_p99_ms, '.0f')} ms alone "
        f"({f(r.fair_dwell_ratio, '.2f')} {_spread(r.fair_dwell_ratio_rounds)}; "
        f"{f(r.unfair_dwell_p99_ms, '.0f')} ms without the fairness key)"
    )
