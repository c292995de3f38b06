"""The error catalogue: every error msgtable raises on purpose is a MsgtableError.

Domain code raises these; server.py maps them to gRPC status codes in one place and
client.py maps status codes back, so callers on both sides see the same classes.
"""

from __future__ import annotations


class MsgtableError(Exception):
    """Root of all msgtable errors. The message is safe to show to a user."""


class TableNotFound(MsgtableError):
    """No message table of that name is known (or it was dropped)."""


class TableLoadError(MsgtableError):
    """The table exists and is marked as a message table, but its definition is invalid."""


class InvalidArgument(MsgtableError):
    """A request or configuration value is malformed."""


class Unavailable(MsgtableError):
    """The database cannot be reached right now, or the server is shutting down; retry later."""


class ServerUnreachable(Unavailable):
    """No msgtable server could be connected to at an address (nothing listens there, or the
    name does not resolve): a client waits for one within its time-out, unless it was made
    not to (a command line's, which says so at once)."""


class DatabaseUnavailable(Unavailable):
    """The database does not answer, or refuses this server (a wrong password, an unknown
    database): the server waits for it, and says once why (msgtable.core.retry.Outage)."""


class ServerBinaryNotFound(MsgtableError):
    """No mysqld / mariadbd binary exists to start a throwaway local server."""


class Unauthenticated(MsgtableError):
    """The call carries no credentials this server accepts."""


class PermissionDenied(MsgtableError):
    """The caller may not do this to this table."""


class ResourceExhausted(Unavailable):
    """A limit is reached (streams of one client, subscribers of one table): retry later."""


LEADER_METADATA_KEY = "msgtable-leader"  # NotLeader's trailing metadata: the leader's address


class NotLeader(Unavailable):
    """Another server sends this database's messages (the lease holder); ``leader`` is its
    address ("" while no server holds the lease). Clients resubscribe there."""

    def __init__(self, message: str, leader: str = "") -> None:
        super().__init__(message)
        self.leader = leader


class PartlySettled(Unavailable):
    """A gateway of a keyspace settled some of a call's ids and could not reach the shard of
    the others in time: ``unreached`` were not acked (released, rejected, renewed) and come
    again; ``count`` is what the call did settle."""

    def __init__(self, message: str, count: int, unreached: list[object]) -> None:
        super().__init__(message)
        self.count = count
        self.unreached = unreached
