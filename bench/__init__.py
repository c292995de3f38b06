"""msgtable's benchmark suite: ``python -m bench.run --quick | --full`` (``make bench``).

One run measures, on one MySQL-family server and with one message shape, the raw-SQL limit of
the message lifecycle (bench.raw), msgtable end to end (bench.engine), a peer queue on the
same database (bench.peer), delivery latency (bench.latency), the server's memory per
cached message (bench.memory) and settlement (release, dead letters, renew: bench.settle);
``--full`` adds batch-size and subscriber sweeps, a large backlog, purge under load and the
poll query's plan (bench.scale), and messages dying of vt_max_attempts. Shared pieces: the
database and its message tables (bench.database), the producer both throughput runs use
(bench.producer), worker processes and the msgtable server subprocess (bench.processes),
measurement (bench.measure) and BenchError (bench.errors); bench.report prints the table,
the targets and the closing JSON line.
"""
