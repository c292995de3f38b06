"""Subscriptions: named consumer groups of a message table (what they are:
msgtable.core.subscriptions; their SQL: msgtable.store.subscriptions).

Modules:
    fanout    The fan-out loop of one message table with subscriptions
    registry  The engine's side of subscriptions (msgtable.core.subscriptions)
"""
