"""Schedules: recurring messages defined in the database (msgtable.core.schedules), each tick
enqueued exactly once across the servers of the database by the one that sends the
placement's SCHEDULES unit.

Modules:
    component  Schedules as a component of the engine (msgtable.engine.components)
    ticker     The loop that enqueues the due ticks
"""
