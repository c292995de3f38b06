"""Table events: the binlog's row events of source tables written into capture tables.

Modules:
    component  Table events as a component of the engine (msgtable.engine.components)
    follower   The capture follower
"""
