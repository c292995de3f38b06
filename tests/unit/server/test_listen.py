"""msgtable.server.listen: whether an address can be listened on, asked before gRPC binds it."""

from __future__ import annotations

import socket

from msgtable.server.listen import cannot_listen


def test_a_port_another_process_listens_on_is_in_use():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert cannot_listen(f"127.0.0.1:{port}") == (
            "the address is in use (another process listens on it)"
        )
    assert cannot_listen(f"127.0.0.1:{port}") is None  # free again


def test_an_address_of_another_machine_is_named_so():
    assert cannot_listen("192.0.2.1:50051") == "the address is not one of this machine's"


def test_what_is_not_a_port_to_try_is_left_to_grpc():
    for listen in ("127.0.0.1:0", "unix:/tmp/msgtable.sock", "127.0.0.1", "[::1]:0"):
        assert cannot_listen(listen) is None, listen


def test_a_name_that_does_not_resolve_is_named():
    why = cannot_listen("no-such-host.invalid:50051")
    assert why is not None and "'no-such-host.invalid'" in why
