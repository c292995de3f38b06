"""The engine wing, Vitess's messager: the engine (every table of one database), the manager
(one table; its docstring holds the state machines), the cache, the loops that poll, send,
postpone and purge, the binlog follower, and the placement of tables on servers.

Modules:
    acks         Group commit for acks
    binlog       Following the database's row-based binary log
    binlogrows   How many rows a binlog WRITE_ROWS event holds, from its raw bytes
    cache        The bounded per-table cache
    components   How a feature plugs into the engine
    deadletters  Dead letters across the tables of one database
    dispatch     One send's dispatch
    due          The rows of one table that are due, or fall due before the next poll
    engine       All message tables of one database
    flow         Flow control at the sender
    inflight     What one table's server has sent and not seen settled
    lease        A lease's rules, shared by every server of one database
    manager      One message table
    ordered      Ordering per key
    placement    Which server sends which table
    postpone     The postpone of a sent message
    purger       The purger of one table
    rechecks     Passes again soon after an INSERT the binlog showed that a pass missed
    redeliveries  The redelivery poll: the due rows given a time, read apart while a pass lags
    routes       Which due rows each filtered stream of a table may take
    subscriber   A subscriber
    tail         Where a plain table's passes got to
    tenure       What this server sends, as the placement last said
"""
