"""The dashboard over HTTP: ``msgtable serve --http HOST:PORT``.

werkzeug routes and parses the requests; cheroot serves them from a small thread pool on
its own thread, with idempotent ``open()`` / ``close()`` (:class:`DashboardServer`). The page
is static files bundled in the package (``static/``: no CDN, nothing fetched from outside;
a Content-Security-Policy of ``'self'`` says so to the browser too); its data comes from the
JSON API (msgtable.observe.dashboard.api), which the page polls.

Routes: ``GET /`` the page; ``GET /static/NAME`` its files; ``GET /api/state``;
``GET /api/dead?table=T&subscription=S&limit=N``; ``POST /api/redrive`` (JSON
``{table, subscription, ids}``; needs ``Content-Type: application/json``).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
from importlib import resources
from typing import Any

from werkzeug.exceptions import HTTPException, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from msgtable.errors import MsgtableError
from msgtable.server import webserver
from msgtable.server.webserver import WebServer

from .api import REFRESH_S, ApiError, DashboardApi, status_of
from .history import Sampler

log = logging.getLogger("msgtable.observe.dashboard")

STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
THREADS = 4  # a dashboard has few viewers; each request is short
MAX_BODY = 1 << 20
# Without --auth, a page on another site whose name was rebound to this server's address
# (DNS rebinding) could read the state and redrive; its requests carry its own name as Host,
# so an open dashboard answers only to IP addresses and localhost.
REBINDING = (
    "an open dashboard (msgtable serve without --auth) answers only to an IP address or "
    "localhost in the URL, not to a name (DNS rebinding); use --auth to reach it by name"
)


def _static() -> dict[str, bytes]:
    """The bundled files, read once."""
    root = resources.files("msgtable.observe.dashboard") / "static"
    return {
        f.name: f.read_bytes()
        for f in root.iterdir()
        if f.is_file() and any(f.name.endswith(s) for s in STATIC_TYPES)
    }


class DashboardApp:
    """The WSGI application: routes to the page, its files and the JSON API."""

    def __init__(self, api: DashboardApi) -> None:
        self.api = api
        self.files = _static()
        self.urls = Map(
            [
                Rule("/", endpoint="page", methods=["GET"]),
                Rule("/static/<name>", endpoint="static", methods=["GET"]),
                Rule("/api/state", endpoint="state", methods=["GET"]),
                Rule("/api/dead", endpoint="dead", methods=["GET"]),
                Rule("/api/redrive", endpoint="redrive", methods=["POST"]),
            ]
        )

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        response = self.respond(request)
        return response(environ, start_response)

    def respond(self, request: Request) -> Response:
        if self.api.authorizer is None and not _local_name(request.host):
            return _json(403, {"error": REBINDING})
        try:
            # a Host that is no host name (".", an empty label) is werkzeug's BadHost: 400
            adapter = self.urls.bind_to_environ(request.environ)
            endpoint, values = adapter.match()
            if endpoint == "page":
                return self._file("index.html")
            if endpoint == "static":
                return self._file(str(values["name"]))
            return self._api(str(endpoint), request)
        except HTTPException as exc:
            return exc.get_response()

    def _file(self, name: str) -> Response:
        body = self.files.get(name)
        if body is None or name.startswith("."):
            raise NotFound()
        kind = next(t for s, t in STATIC_TYPES.items() if name.endswith(s))
        response = Response(body, content_type=kind)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cache-Control"] = "no-cache"
        return response

    def _api(self, endpoint: str, request: Request) -> Response:
        try:
            principal = self.api.principal(request.headers.get("Authorization"))
            if endpoint == "state":
                after = request.args.get("after")
                answer = self.api.state(principal, _float(after) if after else None)
            elif endpoint == "dead":
                answer = self.api.dead(principal, request.args)
            else:
                answer = self.api.redrive(principal, _json_body(request))
            return _json(200, answer)
        except ApiError as exc:
            response = _json(exc.status, {"error": exc.message})
            if exc.status == 401:
                response.headers["WWW-Authenticate"] = 'Bearer realm="msgtable"'
            return response
        except MsgtableError as exc:
            return _json(status_of(exc), {"error": str(exc)})
        except Exception:
            log.exception("dashboard: %s %s failed", request.method, request.path)
            return _json(500, {"error": "internal error (the server's log says more)"})


def _local_name(host: str) -> bool:
    """Whether a request's Host names this server by an IP address or as localhost: the
    only names an open dashboard answers to (:data:`REBINDING`)."""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host  # drop a port
    name = name[1:].split("]", 1)[0] if name.startswith("[") else name
    if name.lower() == "localhost" or name.lower().endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ApiError(400, f"after must be a time in seconds, not {text!r}") from None
    if not math.isfinite(value):
        raise ApiError(400, f"after must be a time in seconds, not {text!r}")
    return value


def _json_body(request: Request) -> Any:
    if request.mimetype != "application/json":
        raise ApiError(415, "send JSON (Content-Type: application/json)")
    if (request.content_length or 0) > MAX_BODY:
        raise ApiError(413, "the body is too large")
    try:
        return json.loads(request.get_data(cache=False) or b"null")
    except ValueError:
        raise ApiError(400, "the body is not valid JSON") from None


def _json(status: int, body: Any) -> Response:
    response = Response(
        json.dumps(body, separators=(",", ":")), status=status, content_type="application/json"
    )
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) as (host, port); InvalidArgument otherwise."""
    return webserver.parse_listen(listen, "--http", "127.0.0.1:8080")


class DashboardServer(webserver.Served):
    """The dashboard on ``listen``: its HTTP server and the sampler of its rate history,
    each on its own thread."""

    def __init__(self, api: DashboardApi, listen: str) -> None:
        host, port = parse_listen(listen)
        self.api = api
        self.app = DashboardApp(api)
        self.sampler = Sampler(api.history, api.sample)
        self.refresher = Sampler(
            api.history,
            api.refresh,
            REFRESH_S,
            "reading the tables",
            "msgtable-dashboard-refresher",
        )
        self.web = WebServer(self.app, host, port, "--http", THREADS, "msgtable-dashboard-http")

    @property
    def url(self) -> str:
        return f"http://{self.address}/"

    def open(self) -> None:
        """Listen (InvalidArgument, one line, when it cannot) and start serving."""
        self.web.open()
        self.sampler.open()
        self.refresher.open()

    def close(self) -> None:
        self.refresher.close()
        self.sampler.close()
        self.web.close()
