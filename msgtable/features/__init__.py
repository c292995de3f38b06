"""The features a table may use, each a package: subscriptions (named consumer groups),
capture (table events), push (HTTP endpoints), schedules (recurring messages); the assembly
plugs them into the engine as components (msgtable.engine.components).

Modules:
    assembly        The engine with its features
    capture/        Table events: source tables' row changes written into capture tables
    push/           Push to HTTP endpoints
    schedules/      Schedules: recurring messages defined in the database
    subscriptions/  Subscriptions: named consumer groups of a message table
"""
