"""Subscriptions: named consumer groups of a message table (what they are:
msgtable.core.subscriptions; their SQL: msgtable.store.subscriptions).

Modules:
    fanout    The fan-out loop of one message table with subscriptions
    registry  Subscriptions as a component of the engine (msgtable.engine.components)
"""
