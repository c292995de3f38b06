"""The store wing: the Store Protocol, the MySQL store and every SQL statement, each
feature's in a module of its own, and the connections to the database.

Modules:
    backlog        How big and how old the backlog of each table and subscription is
    bulk           The pipeline's SQL, all of it but a subscription's view
    capture        The capture follower's SQL (msgtable.features.capture.follower)
    dbpool         A small pool of DBAPI connections to one MySQL-family database
    deadletters    Every SQL statement of dead letters
    mysql          What msgtable knows of MySQL and MariaDB, in one place
    mysqlstore     Every SQL statement of the engine, in one place
    ordering       The SQL of ordering per key (msgtable.engine.ordered)
    subscriptions  Every SQL statement of subscriptions
"""
