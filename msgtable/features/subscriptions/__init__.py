"""Subscriptions: named consumer groups of a message table (what they are:
msgtable.core.subscriptions; their SQL: msgtable.store.subscriptions).

Fan-out at the cost of a delivery (issue 42, item 3) is designed in design.md next to this
file: (a) a commit-ordered sequence numbering the rows handed over (built:
msgtable.store.sequences), (b) a cursor per subscription over it for the messages it was never
sent, read from the message table (built: the store's part, the window over the cursor, and
lazy, which serves a subscription created with state_rows=lazy from them), (c) state rows only
for messages sent and not settled in cursor order, settlement (gRPC and the DML upsert) that
handles a missing row, (d) at least once through a crash, attempts, order per key, filters,
purge and lag from the cursor, (e) the hand-over between servers and the migration of
existing subscriptions; with the row writes per settled message counted (about 0.26 with four
subscriptions, against 3.25 today).

Modules:
    fanout    The fan-out loop of one message table with subscriptions
    lazy      A lazy subscription's store: its cursor's scan and window in front of its state rows
    registry  Subscriptions as a component of the engine (msgtable.engine.components)
    window    A subscription's window over its cursor (design.md (c))
"""
