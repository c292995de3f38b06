"""What a client's channels carry to prove who it is: TLS (a CA to trust, and optionally a
client certificate for mutual TLS) and a bearer token in every call's metadata."""

from __future__ import annotations

from typing import Any

import grpc

from msgtable.errors import InvalidArgument


def channel_credentials(
    tls_ca: str | None, tls_cert: str | None, tls_key: str | None
) -> grpc.ChannelCredentials | None:
    """TLS credentials from PEM files (None: plain channels)."""
    if not (tls_ca or tls_cert or tls_key):
        return None
    if bool(tls_cert) != bool(tls_key):
        raise InvalidArgument("a client certificate needs both tls_cert and tls_key")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls_ca) if tls_ca else None,
        private_key=_read(tls_key) if tls_key else None,
        certificate_chain=_read(tls_cert) if tls_cert else None,
    )


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InvalidArgument(f"cannot read {path}: {exc}") from None


class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Adds ``authorization: Bearer TOKEN`` to every call's metadata."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._header]
        return (
            details._replace(metadata=metadata)
            if hasattr(details, "_replace")
            else (_CallDetails(details, metadata))
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)


class _CallDetails(grpc.ClientCallDetails):  # type: ignore[misc]
    def __init__(self, base: Any, metadata: Any) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)
