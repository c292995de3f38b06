"""The core: pure rules and types, no I/O (no database driver, no gRPC): table configs,
rows, backoff, settlement rules, filters, ids, the codec of the wire types.

Modules:
    assignment     Which server sends which unit of a database
    backoff        When an unacked message comes back
    clock          Time as a dependency
    codec          Pure conversions between Python values and the wire types of msgtable.v1
    deadletters    What dead means, and what a dead-letter table must be
    dedup          Idempotent enqueue, the pure part
    endpoints      Push endpoints, the pure part
    events         Table events, the pure part
    filters        Subscription filters
    flow           Flow control, the pure part
    ids            Message ids as a request brings them
    keyspace       Keyspaces of shards
    latency        A latency histogram a table's manager fills per batch
    retry          Retrying with backoff, and the one way a retrying loop reports it
    rows           A message row as the engine moves it
    schedules      Schedules, the pure part
    settlement     Settlement
    sql            Writing SQL text safely
    sqltypes       The kinds of a MySQL or MariaDB column
    status         What operators see of a table
    subscriptions  Subscriptions
    tables         Message table definitions
    tomlfile       Reading a TOML file a user wrote (the auth file, the keyspace file)
    tracing        OpenTelemetry through messages
    window         A subscriber's window
    words          Counted nouns in what the CLI and the server say
"""
