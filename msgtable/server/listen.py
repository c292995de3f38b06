"""Whether this machine can listen on a gRPC server's address, asked before gRPC binds it.

gRPC's C-core writes its own line to stderr when a bind fails (``E1128 ... add_port.cc:83]
Failed to add port to server: ...``), before msgtable can say what it means, and its logging
cannot be turned off for that one call once grpc is loaded. So the server tries the address
itself first, as gRPC will bind it (SO_REUSEADDR, every address the host resolves to; it
listens where at least one binds), and fails with its own one line. The socket is closed at
once: another process may still take the port before gRPC binds it, and then gRPC's line
shows after all, followed by msgtable's.
"""

from __future__ import annotations

import errno
import socket

_WHY = {
    errno.EADDRINUSE: "the address is in use (another process listens on it)",
    errno.EADDRNOTAVAIL: "the address is not one of this machine's",
    errno.EACCES: "permission denied (a port below 1024 needs privileges)",
}


def cannot_listen(listen: str) -> str | None:
    """Why no socket can be bound at ``listen`` (HOST:PORT, [V6]:PORT, :PORT), or None when
    one can, or when the address is not one to try (a unix socket, port 0, no port)."""
    if listen.startswith("unix"):
        return None
    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) == 0:
        return None
    host = host.strip("[]")
    try:
        found = socket.getaddrinfo(
            host or None, int(port_text), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, UnicodeError):
        return f"{host!r} is not a name or address this machine resolves"
    errors = []
    for family, kind, proto, _, address in found:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        except OSError as exc:
            errors.append(exc.errno)
        else:
            return None
    for code, why in _WHY.items():
        if code in errors:
            return why
    return "no address of it can be bound" if errors else None
