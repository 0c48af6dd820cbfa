"""The management HTTP server: aiohttp in the broker's own event loop.

Running in the broker's loop, handlers read the live model with no locks or
copies; every operation that changes something goes through broker.admin, the
same operations `leveret ctl` uses, and through its errors. Authentication is
HTTP Basic with the broker's users; tags decide what a user may see and do,
as in RabbitMQ: `management` (or monitoring, policymaker, administrator) to use
the API at all, `administrator` for users, vhosts, permissions and
definitions; other users see only the vhosts they have permissions in.

Error bodies are RabbitMQ's: {"error": ..., "reason": ...}.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from leveret.broker.definitions_json import DefinitionsRefused
from leveret.broker.errors import AccessRefused, AlreadyExists, InvalidValue, ModelError, NotFound
from leveret.broker.stats import Sampler
from leveret.management.columns import parse_columns, select_columns
from leveret.store import replica

if TYPE_CHECKING:
    from leveret.handle import NodeHandle

log = logging.getLogger("leveret.management")

MANAGEMENT_TAGS = {"management", "monitoring", "policymaker", "administrator"}
SERVER_KEY = web.AppKey("server", object)
SAMPLER_KEY = web.AppKey("sampler", Sampler)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error(status: int, error: str, reason: Any) -> web.Response:
    return web.json_response({"error": error, "reason": reason}, status=status)


def not_found() -> web.Response:
    return error(404, "Object Not Found", "Not Found")


#: the order of the methods in RabbitMQ's `Allow` header
METHOD_ORDER = ("HEAD", "GET", "PUT", "POST", "DELETE", "OPTIONS")
#: paths RabbitMQ routes to a handler of their own, which a pattern of ours also
#: matches (a user named bulk-delete), with the methods that handler takes
SHADOWED = {"/api/users/bulk-delete": frozenset({"POST"})}


def allow_header(methods: Any) -> str:
    """RabbitMQ's `Allow`: the path's methods, HEAD with GET, and always OPTIONS."""
    chosen = {*methods, "OPTIONS"}
    if "GET" in chosen:
        chosen.add("HEAD")
    return ", ".join(m for m in METHOD_ORDER if m in chosen)


def _with_columns(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """`columns` trims every successful GET answer, a single object's too, unless
    `page` is given (listing() then trims the page's items), as RabbitMQ does."""
    query = request.query
    if (
        request.method != "GET"
        or "columns" not in query
        or "page" in query
        or response.status != 200
        or not isinstance(response, web.Response)
        or response.content_type != "application/json"
        or not isinstance(response.body, bytes)
    ):
        return response
    body = select_columns(json.loads(response.body), parse_columns(query))
    return web.json_response(body, status=response.status, headers=_extra_headers(response))


def _extra_headers(response: web.Response) -> dict[str, str]:
    skip = {"content-type", "content-length"}
    return {k: v for k, v in response.headers.items() if k.lower() not in skip}


class Denied(Exception):
    """401 with RabbitMQ's body."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@web.middleware
async def errors_and_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Basic auth on every /api call, and model errors mapped to RabbitMQ's bodies."""
    server = request.app[SERVER_KEY]
    if request.path.startswith("/api/"):
        # As RabbitMQ (cowboy_rest), the method and the path are checked before the
        # credentials: an unknown path is a 404 with RabbitMQ's body, a method the path
        # does not take a bare 405 with the methods it does take in `Allow`, which is
        # also the answer to OPTIONS (200).
        unmatched = getattr(request.match_info, "http_exception", None)
        allowed = SHADOWED.get(request.path)
        if allowed is None and isinstance(unmatched, web.HTTPMethodNotAllowed):
            allowed = frozenset(unmatched.allowed_methods)
        elif allowed is None and unmatched is not None:
            allowed = frozenset({"GET"})  # RabbitMQ's handler of unknown paths
        if request.method == "OPTIONS":
            return web.Response(status=200, headers={"Allow": allow_header(allowed or ())})
        takes = allowed | {"HEAD"} if allowed is not None and "GET" in allowed else allowed
        if takes is not None and request.method not in takes:
            return web.Response(status=405, headers={"Allow": allow_header(takes)})
        if unmatched is not None and request.path not in SHADOWED:
            return not_found()
        user = _authenticate(server, request.headers.get("Authorization", ""))
        if user is None:
            response = error(401, "not_authorized", "Login failed")
            if request.headers.get("X-Requested-With") != "XMLHttpRequest":
                # Not for the web UI's own calls: browsers would pop up their login box.
                response.headers["WWW-Authenticate"] = 'Basic realm="Leveret Management"'
            return response
        if not MANAGEMENT_TAGS & set(user.tags):
            return error(401, "not_authorised", "Not management user")  # sic, as RabbitMQ
        request["user"] = user
        if server.recovering and not request.path.startswith(("/api/health/", "/api/whoami")):
            # Queues have their stored messages back only after recovery: answer then,
            # with counts that are right (health checks and whoami need no queue).
            await server.wait_recovered()
        stats = getattr(server, "worker_stats", None)
        if stats is not None and not request.path.startswith(("/api/health/", "/api/whoami")):
            # other workers' queues and connections (workers.py); the queues' JSON only
            # for the queue routes
            await stats.refresh(queue_docs=request.path.startswith("/api/queues"))
    try:
        if replica.TAP is not None and request.method != "GET":
            response = await _replicated(handler, request)
            meta = server.broker.meta
            if meta is not None and response.status < 400:
                await meta.settled()  # a leading cluster node of workers: every worker
            return response
        response = _with_columns(request, await handler(request))
        meta = server.broker.meta
        if meta is not None and request.method != "GET":
            # A broker of several workers: answer once every worker has the change
            # (an admin change on the metadata writer is sent on as it is made).
            await meta.settled()
        return response
    except Denied as exc:
        return error(401, "not_authorised", exc.reason)  # RabbitMQ's spelling here
    except NotFound:
        return not_found()
    except AccessRefused as exc:
        return error(401, "not_authorised", str(exc))
    except DefinitionsRefused as exc:
        return error(400, "bad_request", exc.reason)
    except (InvalidValue, AlreadyExists) as exc:
        return error(400, "bad_request", str(exc))
    except ModelError as exc:
        return error(400, "bad_request", str(exc))
    except web.HTTPException:
        raise
    except Exception:
        log.exception("management API: %s %s failed", request.method, request.path)
        return error(500, "internal_server_error", "see the broker log")


async def _replicated(handler: Handler, request: web.Request) -> web.StreamResponse:
    """A cluster leader answers a definition change once its followers hold it."""
    tap: Any = replica.TAP
    mark = tap.sql_position
    response = await handler(request)
    if tap.sql_position != mark:
        try:
            await tap.wait_safe(tap.sql_position)
        except replica.NotLeading as exc:
            return error(503, "service_unavailable", str(exc))
    return response


def _authenticate(server: NodeHandle, header: str) -> Any:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        username, _, password = base64.b64decode(encoded).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return server.broker.access.authenticate(username, password)


def build_app(server: NodeHandle) -> web.Application:
    from leveret.management import routes, ui

    app = web.Application(middlewares=[errors_and_auth])
    app[SERVER_KEY] = server
    app[SAMPLER_KEY] = Sampler(server.broker)  # rates once a second while the API runs
    routes.add_routes(app)
    ui.add_routes(app)
    return app


async def read_json(request: web.Request, reason: str = "not_json") -> Any:
    """The body as JSON; else RabbitMQ's 400 with `reason` (`not_json`; definitions
    say `failed_to_parse_json`)."""
    # Bytes that are not UTF-8 become U+FFFD, as RabbitMQ's JSON parser reads them.
    text = (await request.read()).decode("utf-8", "replace")
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except ValueError:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "bad_request", "reason": reason}),
            content_type="application/json",
        ) from None


class ManagementServer:
    """Starts and stops the HTTP listener beside the AMQP ones."""

    def __init__(self, server: NodeHandle, host: str, port: int) -> None:
        self.server = server
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self.sampler: Sampler | None = None  # the running API's rates (node views read it)

    async def start(self) -> int:
        app = build_app(self.server)
        self.sampler = app[SAMPLER_KEY]
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        app[SAMPLER_KEY].start()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        sockets = site._server.sockets if site._server is not None else []  # type: ignore[union-attr]
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("management API on http://%s:%d/api/", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.app[SAMPLER_KEY].stop()
            await self._runner.cleanup()
            self._runner = None
