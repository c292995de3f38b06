"""The keyspace gateway (Vitess's vtgate): one endpoint for every shard of a keyspace, and the
Python clients that run one in process.

Modules:
    clients  Python clients of a keyspace that reach the shards' servers themselves
    gateway  ``msgtable gateway``
    merge    One MessageStream of a keyspace
    metrics  What ``msgtable gateway --metrics-listen HOST:PORT`` serves at /metrics
    strays   Messages a shard sent that do not belong to it (msgtable.gateway.gateway)
"""
