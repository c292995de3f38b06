"""AWS Signature Version 4, verified: who signed an SQS request, if anyone we know did.

An SDK signs each request with its secret access key: an HMAC-SHA256 chain (the key of the
date, region, service and ``aws4_request``) over a string to sign that holds the request's
time, its scope and the SHA-256 of its canonical request (method, path, query, the headers
it names, and the SHA-256 of its body). The server computes the same from what it received
and the secret it knows for the access key the request names; equal (compared in constant
time) means that key's holder sent this very request. The access keys and their principals
come from the auth file's ``[access_keys]`` (msgtable.server.auth): a request so signed is
its principal's, and the file's rules say what it may do.

Checked besides the signature: the request's time is within ``MAX_SKEW_S`` of the server's
(a captured request cannot be replayed later), its scope's date is that time's date, and the
signed headers include ``host`` and the time. The region and service of the scope are the
SDK's (any region works: the SDKs need one, msgtable has none).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote

from msgtable.server.auth import AccessKey
from msgtable.server.sqs.protocol import SqsError

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW_S = 15 * 60  # as AWS: a request older or newer than this is refused
_AUTH = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<credential>[^,\s]+)\s*,\s*"
    r"SignedHeaders=(?P<signed>[^,\s]+)\s*,\s*Signature=(?P<signature>[0-9a-fA-F]{64})\s*"
)
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class Request:
    """What a signature covers, as the server received it: ``path`` and ``query`` raw (as
    on the request line), ``headers`` by lower-case name."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes


def verify(request: Request, keys: Mapping[str, AccessKey], now: datetime.datetime) -> str:
    """The principal whose access key signed ``request``; SqsError (SQS's codes) when it
    is unsigned, malformed, signed by a key not known, too old or new, or not matching."""
    header = request.headers.get("authorization", "")
    if not header:
        raise SqsError("MissingAuthenticationToken", "Request is missing Authentication Token", 403)
    m = _AUTH.fullmatch(header.strip())
    if m is None:
        raise SqsError(
            "IncompleteSignature",
            f"Authorization header requires the {ALGORITHM} Credential, SignedHeaders and "
            "Signature parameters",
        )
    parts = m["credential"].split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not all(parts):
        raise SqsError(
            "IncompleteSignature",
            "Credential must be ACCESS_KEY/DATE/REGION/SERVICE/aws4_request",
        )
    key_id, date, region, service, _ = parts
    key = keys.get(key_id)
    if key is None:
        raise SqsError(
            "InvalidClientTokenId", "The security token included in the request is invalid.", 403
        )
    signed = m["signed"].lower().split(";")
    amz_date = request.headers.get("x-amz-date", "")
    if "host" not in signed or "x-amz-date" not in signed or not amz_date:
        raise SqsError("IncompleteSignature", "the signed headers must include host and x-amz-date")
    when = _parse_time(amz_date)
    if abs((now - when).total_seconds()) > MAX_SKEW_S:
        raise SqsError(
            "SignatureDoesNotMatch",
            f"Signature expired: {amz_date} is not within {MAX_SKEW_S // 60} minutes of the "
            f"server's time {now.strftime('%Y%m%dT%H%M%SZ')}",
            403,
        )
    if date != amz_date[:8]:
        raise SqsError("SignatureDoesNotMatch", "the credential's date is not x-amz-date's", 403)
    scope = f"{date}/{region}/{service}/aws4_request"
    canonical = canonical_request(request, signed)
    to_sign = "\n".join(
        (ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest())
    )
    expected = hmac.new(
        signing_key(key.secret, date, region, service), to_sign.encode(), hashlib.sha256
    ).hexdigest()
    if not hmac.compare_digest(expected, m["signature"].lower()):
        raise SqsError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method.",
            403,
        )
    return key.principal


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    k = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


def canonical_request(request: Request, signed: list[str]) -> str:
    headers = []
    for name in signed:
        value = request.headers.get(name)
        if value is None:
            raise SqsError("IncompleteSignature", f"signed header {name!r} is missing")
        headers.append(f"{name}:{_SPACES.sub(' ', value.strip())}\n")
    return "\n".join(
        (
            request.method.upper(),
            canonical_path(request.path),
            canonical_query(request.query),
            "".join(headers),
            ";".join(signed),
            hashlib.sha256(request.body).hexdigest(),
        )
    )


def canonical_path(raw: str) -> str:
    """The path as the SDKs sign it for services other than S3: normalized, and its
    (already encoded) text encoded once more."""
    path = raw or "/"
    normal = posixpath.normpath(path)
    if path.endswith("/") and normal != "/":
        normal += "/"
    normal = "/" + normal.lstrip("/")
    return quote(normal, safe="/~")


def canonical_query(raw: str) -> str:
    pairs = []
    for part in raw.split("&") if raw else ():
        k, _, v = part.partition("=")
        pairs.append((quote(unquote(k), safe="-_.~"), quote(unquote(v), safe="-_.~")))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _parse_time(text: str) -> datetime.datetime:
    try:
        return datetime.datetime.strptime(text, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
    except ValueError:
        raise SqsError(
            "IncompleteSignature", f"x-amz-date {text[:40]!r} is not YYYYMMDDTHHMMSSZ"
        ) from None
