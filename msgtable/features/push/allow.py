"""The push allow-list: which endpoint URLs the server may POST to, and which addresses.

A row in the database must not make the server call an internal service, so nothing is
allowed unless the server's configuration says so (``serve --push-allow``). An entry is
``scheme://host[:port]`` (that host name or address), ``scheme://*.domain[:port]`` (any name
under the domain, not the domain itself) or ``scheme://CIDR[:port]`` (any address in the
network; an IPv6 one in brackets: ``http://[::1/128]``); without a port, any port. A URL is
checked twice: its name when the endpoint is loaded (``url_problem``), and every address the
name resolves to when a connection is made (``address_allowed``): a name allowed by a host or
wildcard entry may resolve anywhere (the operator trusts that name), a name allowed only by a
CIDR entry connects only to the resolved addresses inside it, so a DNS answer that changes to
an internal address (rebinding) gets no connection.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from msgtable.errors import InvalidArgument

SCHEMES = ("http", "https")
MAX_URL_CHARS = 2048
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Target:
    """A checked endpoint URL: where its requests go."""

    url: str
    scheme: str
    host: str  # lowercase; an IPv6 address without brackets
    port: int
    path: str  # with the query, at least "/"


@dataclass(frozen=True)
class Entry:
    """One entry of the allow-list."""

    scheme: str
    port: int | None  # None: any
    name: str = ""  # an exact host name (lowercase)
    suffix: str = ""  # "*.domain": ".domain"
    network: IPNetwork | None = None

    def port_ok(self, port: int) -> bool:
        return self.port is None or self.port == port


def parse_target(url: str) -> Target:
    """``url`` checked as an endpoint URL; InvalidArgument (one line) when it is not one."""
    if not isinstance(url, str) or not url:
        raise InvalidArgument("an endpoint URL is required")
    if len(url) > MAX_URL_CHARS:
        raise InvalidArgument(f"the endpoint URL is longer than {MAX_URL_CHARS} characters")
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in url):
        raise InvalidArgument("the endpoint URL has a space or a control character")
    if not url.isascii():
        raise InvalidArgument(
            "the endpoint URL has a character that is not ASCII: write a host in its "
            "punycode form (xn--...) and percent-encode the path"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidArgument(f"the endpoint URL is malformed: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise InvalidArgument(f"the endpoint URL must start with http:// or https://, not {url!r}")
    if "@" in parts.netloc:
        raise InvalidArgument("the endpoint URL must not carry a user name or password (user@)")
    if parts.fragment or url.endswith("#"):
        raise InvalidArgument("the endpoint URL must not have a #fragment")
    host = (parts.hostname or "").lower()
    if not host:
        raise InvalidArgument(f"the endpoint URL has no host: {url!r}")
    if parts.netloc.startswith("[") != (":" in host):
        raise InvalidArgument(f"the endpoint URL's host is malformed: {url!r}")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise InvalidArgument(f"the endpoint URL's host is malformed: {url!r}") from None
    elif not all(label and _label_ok(label) for label in host.split(".")):
        raise InvalidArgument(f"the endpoint URL's host is malformed: {url!r}")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Target(url, scheme, host, port or (443 if scheme == "https" else 80), path)


def _label_ok(label: str) -> bool:
    return len(label) <= 63 and all(ch.isalnum() or ch in "-_" for ch in label)


def _ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class AllowList:
    """The server's allow-list (see the module docstring); empty: nothing is allowed."""

    def __init__(self, entries: tuple[Entry, ...] = (), text: str = "") -> None:
        self.entries = entries
        self.text = text

    @classmethod
    def parse(cls, text: str | None) -> AllowList:
        """Comma-separated entries; InvalidArgument naming the bad one."""
        entries: list[Entry] = []
        for raw in (text or "").split(","):
            item = raw.strip()
            if item:
                entries.append(_entry(item))
        return cls(tuple(entries), ",".join(e.strip() for e in (text or "").split(",") if e))

    def __bool__(self) -> bool:
        return bool(self.entries)

    def url_problem(self, target: Target) -> str:
        """Why ``target`` may not be pushed to ("" when it may, subject to its addresses)."""
        if not self.entries:
            return "no endpoint is allowed: the server has no --push-allow"
        ip = _ip(target.host)
        for e in self.entries:
            if e.scheme != target.scheme or not e.port_ok(target.port):
                continue
            if ip is not None:
                if e.network is not None and ip in e.network:
                    return ""
            elif (
                e.name == target.host
                or (e.suffix and target.host.endswith(e.suffix))
                or e.network is not None
            ):
                return ""
        return (
            f"{target.scheme}://{_netloc(target)} is not in the server's --push-allow ({self.text})"
        )

    def address_allowed(self, target: Target, address: str) -> bool:
        """Whether a connection for ``target`` may go to ``address`` (one it resolved to)."""
        ip = _ip(address.split("%", 1)[0])
        for e in self.entries:
            if e.scheme != target.scheme or not e.port_ok(target.port):
                continue
            if e.network is not None:
                if ip is not None and ip in e.network:
                    return True
            elif _ip(target.host) is None and _name_matches(e, target.host):
                return True
        return False


def _name_matches(e: Entry, host: str) -> bool:
    return e.name == host or bool(e.suffix and host.endswith(e.suffix))


def _netloc(t: Target) -> str:
    host = f"[{t.host}]" if ":" in t.host else t.host
    return f"{host}:{t.port}"


def _entry(item: str) -> Entry:
    bad = f"--push-allow: {item!r} is not scheme://host[:port], scheme://*.domain or scheme://CIDR"
    scheme, sep, rest = item.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in SCHEMES or not rest:
        raise InvalidArgument(bad)
    if "@" in rest or not rest.isascii():
        raise InvalidArgument(bad)
    port: int | None = None
    if rest.startswith("["):
        inner, close, tail = rest[1:].partition("]")
        if not close:
            raise InvalidArgument(bad)
        host = inner
        port_text = tail[1:] if tail.startswith(":") else tail
        if tail and not tail.startswith(":"):
            raise InvalidArgument(bad)
    else:
        host, _, port_text = rest.partition(":")
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise InvalidArgument(bad)
        port = int(port_text)
    host = host.lower()
    if "/" in host or _ip(host) is not None:
        try:
            network = ipaddress.ip_network(host, strict=False)
        except ValueError:
            raise InvalidArgument(bad) from None
        return Entry(scheme, port, network=network)
    if host.startswith("*."):
        domain = host[2:]
        if not domain or not all(p and _label_ok(p) for p in domain.split(".")):
            raise InvalidArgument(bad)
        return Entry(scheme, port, suffix="." + domain)
    if not host or not all(p and _label_ok(p) for p in host.split(".")):
        raise InvalidArgument(bad)
    return Entry(scheme, port, name=host)
