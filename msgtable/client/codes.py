"""Status codes back to msgtable's errors: the reverse of msgtable.server.servicer's one mapping,
so a
client catches the same classes the engine raises."""

from __future__ import annotations

import grpc

from msgtable import errors
from msgtable.errors import LEADER_METADATA_KEY, MsgtableError, NotLeader, Unavailable

ERRORS_BY_CODE: dict[grpc.StatusCode, type[MsgtableError]] = {
    grpc.StatusCode.NOT_FOUND: errors.TableNotFound,
    grpc.StatusCode.FAILED_PRECONDITION: errors.TableLoadError,
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.INTERNAL: MsgtableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
    grpc.StatusCode.CANCELLED: Unavailable,
}


# How grpc's details begin when no connection could be made: nothing listens (refused), or
# the name does not resolve (the wording of grpc's resolvers, old and new).
UNREACHABLE = ("failed to connect", "errors resolving", "dns resolution failed")


def error_from_rpc(error: grpc.RpcError, target: str = "") -> MsgtableError:
    """The MsgtableError for a failed call (the one place that maps status codes back)."""
    code: grpc.StatusCode | None = error.code() if hasattr(error, "code") else None
    details: str = (error.details() if hasattr(error, "details") else None) or ""
    name = code.name if code is not None else "UNKNOWN"
    cls = ERRORS_BY_CODE.get(code) if code is not None else None
    if code is grpc.StatusCode.UNAVAILABLE:
        trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
        for key, value in trailing or ():
            if key == LEADER_METADATA_KEY:
                return NotLeader(details or name, leader=str(value))
    if code is grpc.StatusCode.UNAVAILABLE and details.lower().startswith(UNREACHABLE):
        return errors.ServerUnreachable(f"cannot reach the msgtable server at {target}: {details}")
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return Unavailable(f"no answer from the msgtable server at {target} in time")
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return MsgtableError(f"the server at {target} does not serve msgtable.v1 ({details})")
    if cls is None:
        return MsgtableError(f"{details or 'server error'} ({name})")
    return cls(details or name)
