"""Table events: the binlog's row events of source tables written into capture tables.

Modules:
    follower  The capture follower
"""
