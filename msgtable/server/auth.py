"""Who may do what: callers are authenticated by a bearer token in the call's metadata
(``authorization: Bearer TOKEN``) or by their TLS client certificate, and authorised per
table and action from a TOML file (``msgtable serve --auth FILE``)::

    [tokens]                      # token = principal
    "k3y-of-the-billing-worker" = "billing"
    "k3y-of-the-dashboard" = "ops"

    [certificates]                # client certificate common name = principal
    "worker-1.internal" = "billing"

    [access_keys]                 # the SQS API's (msgtable serve --sqs-listen): SigV4 keys
    "AKIABILLINGWORKER01" = { secret = "a-secret-of-16-or-more-characters", principal = "billing" }

    [[allow]]
    principal = "billing"         # a principal, or "*" for every authenticated caller
    tables = ["invoice_*"]        # table names; * and ? match as in shell patterns
    actions = ["subscribe", "ack"]

    [[allow]]
    principal = "ops"
    tables = ["*"]
    actions = ["list"]

Actions: ``subscribe`` (MessageStream), ``ack`` (MessageAck, and release / reject / renew),
``list`` (ListTables shows the tables the caller may list, and only those; ListDeadLetters,
ListSubscriptions), ``redrive``, ``manage`` (CreateSubscription, AlterSubscription,
DropSubscription, SetEndpoint, DropEndpoint), and ``send`` (the SQS API's SendMessage: gRPC
has no send, an application INSERTs). A request to the SQS API is its principal's when an
access key of ``[access_keys]`` signed it (msgtable.server.sqs.signature). A subscription is named
``table/subscription`` in ``tables``: a rule for ``orders`` alone does not reach
``orders/billing``; ``orders/*`` (or ``orders*``) does.
Nothing is allowed unless a rule allows it. A call without valid credentials is
UNAUTHENTICATED; an authenticated call to a table its principal may not use is
PERMISSION_DENIED, with the same message whether or not the table exists. Without a file
every caller is anonymous and allowed everything, as before.
"""

from __future__ import annotations

import fnmatch
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msgtable.core import tomlfile
from msgtable.errors import InvalidArgument, PermissionDenied, Unauthenticated

# ack covers release, reject and renew; list covers ListDeadLetters; redrive is its own.
ACTIONS = frozenset({"subscribe", "ack", "list", "redrive", "manage", "send"})
ANONYMOUS = ""


@dataclass(frozen=True)
class AccessKey:
    """An SQS API access key's secret, and whose key it is."""

    secret: str
    principal: str


@dataclass(frozen=True)
class Rule:
    principal: str
    tables: tuple[str, ...]
    actions: frozenset[str]

    def allows(self, principal: str, action: str, table: str) -> bool:
        return (
            action in self.actions
            and self.principal in ("*", principal)
            and any(fnmatch.fnmatchcase(table, p) for p in self.tables)
        )


class Authorizer:
    """Authentication (tokens, certificate names) and the allow rules of one auth file."""

    def __init__(
        self,
        tokens: Mapping[str, str],
        certificates: Mapping[str, str],
        rules: Sequence[Rule],
        access_keys: Mapping[str, AccessKey] | None = None,
    ) -> None:
        self._tokens = [(t.encode(), p) for t, p in tokens.items()]
        self.access_keys: dict[str, AccessKey] = dict(access_keys or {})
        self._certificates = dict(certificates)
        self.rules = tuple(rules)

    @classmethod
    def from_file(cls, path: str | Path) -> Authorizer:
        return cls.from_dict(tomlfile.read(path, "the auth file"), str(path))

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str = "the auth file") -> Authorizer:
        unknown = set(doc) - {"tokens", "certificates", "allow", "access_keys"}
        if unknown:
            raise InvalidArgument(f"{where}: unknown section {sorted(unknown)[0]!r}")
        tokens = _names(doc.get("tokens", {}), "tokens", where)
        for token in tokens:
            if len(token) < 16:
                raise InvalidArgument(f"{where}: tokens must be at least 16 characters long")
        certificates = _names(doc.get("certificates", {}), "certificates", where)
        rules = []
        for i, raw in enumerate(doc.get("allow", [])):
            rules.append(_rule(raw, f"{where}: allow rule {i + 1}"))
        return cls(tokens, certificates, rules, _access_keys(doc.get("access_keys", {}), where))

    def authenticate(self, metadata: Iterable[tuple[str, Any]], cert_names: Sequence[str]) -> str:
        """The caller's principal, from its bearer token or else its certificate's common
        name; Unauthenticated when neither is known."""
        for key, value in metadata:
            if key.lower() != "authorization":
                continue
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("the authorization metadata must be 'Bearer TOKEN'")
            given = token.strip().encode()
            found = ANONYMOUS
            for known, principal in self._tokens:  # compare every one: no timing hint
                if hmac.compare_digest(known, given):
                    found = principal
            if found == ANONYMOUS:
                raise Unauthenticated("unknown token")
            return found
        for name in cert_names:
            if name in self._certificates:
                return self._certificates[name]
        raise Unauthenticated("no credentials: send 'authorization: Bearer TOKEN' metadata")

    def allows(self, principal: str, action: str, table: str) -> bool:
        return any(r.allows(principal, action, table) for r in self.rules)

    def check(self, principal: str, action: str, table: str) -> None:
        if not self.allows(principal, action, table):
            raise PermissionDenied(f"{principal} may not {action} table {table!r}")


def _names(raw: Any, section: str, where: str) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in raw.items()
    ):
        raise InvalidArgument(f"{where}: [{section}] maps strings to principal names")
    return dict(raw)


def _access_keys(raw: Any, where: str) -> dict[str, AccessKey]:
    """[access_keys]: access key id = { secret = "...", principal = "..." }."""
    if not isinstance(raw, dict):
        raise InvalidArgument(
            f"{where}: [access_keys] maps access key ids to a secret and principal"
        )
    out = {}
    for key_id, entry in raw.items():
        if (
            not isinstance(entry, dict)
            or set(entry) != {"secret", "principal"}
            or not all(isinstance(v, str) and v for v in entry.values())
        ):
            raise InvalidArgument(
                f'{where}: access key {key_id!r}: give {{ secret = "...", principal = "..." }}'
            )
        if len(entry["secret"]) < 16:
            raise InvalidArgument(
                f"{where}: access key secrets must be at least 16 characters long"
            )
        out[str(key_id)] = AccessKey(entry["secret"], entry["principal"])
    return out


def _rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, dict):
        raise InvalidArgument(f"{where}: a rule is a table of principal, tables, actions")
    unknown = set(raw) - {"principal", "tables", "actions"}
    if unknown:
        raise InvalidArgument(f"{where}: unknown key {sorted(unknown)[0]!r}")
    principal = raw.get("principal")
    tables = raw.get("tables")
    actions = raw.get("actions")
    if not isinstance(principal, str) or not principal:
        raise InvalidArgument(f"{where}: principal must be a name or '*'")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, str) for t in tables):
        raise InvalidArgument(f"{where}: tables must be a list of names or patterns")
    if not isinstance(actions, list) or not actions or not set(actions) <= ACTIONS:
        raise InvalidArgument(f"{where}: actions must be a list of {', '.join(sorted(ACTIONS))}")
    return Rule(principal, tuple(tables), frozenset(actions))
