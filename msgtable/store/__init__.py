"""The store wing: the Store Protocols, the MySQL store and every SQL statement, each
feature's in a module of its own (an object the MySQL store composes), and the connections to
the database.

Modules:
    backlog        How big and how old the backlog of each table and subscription is
    bulk           The pipeline's SQL, all of it but a subscription's view
    capture        The capture follower's SQL (msgtable.features.capture.follower)
    dbpool         A small pool of DBAPI connections to one MySQL-family database
    deadletters    Every SQL statement of dead letters
    discovery      What information_schema says of the message tables
    endpoints      Every SQL statement of push endpoints
    fanout         The fan-out's SQL of one message table and its subscriptions
    mysql          What msgtable knows of MySQL and MariaDB, in one place
    mysqlstore     The Store on MySQL and MariaDB: the statements of each table run on its pools
    ordering       The SQL of ordering per key (msgtable.engine.ordered)
    protocol       The Store Protocols: what the engine and each feature ask of a database
    schedules      Every SQL statement of schedules (msgtable.features.schedules)
    sequences      The commit-ordered fan-out sequence of each message table (time_fanout)
    sqsqueues      The SQS API's managed queues' SQL: CREATE TABLE, DROP TABLE, a purge
    statements     The SQL of one message table, written once per TableConfig
    subscriptions  Every SQL statement of subscriptions
"""
