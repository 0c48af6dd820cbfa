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

from leveret.broker.errors import AccessRefused, AlreadyExists, InvalidValue, ModelError, NotFound
from leveret.broker.stats import Sampler
from leveret.store import replica

if TYPE_CHECKING:
    from leveret.server.listener import Server

log = logging.getLogger("leveret.management")

MANAGEMENT_TAGS = {"management", "monitoring", "policymaker", "administrator"}
SERVER_KEY = web.AppKey("server", object)
SAMPLER_KEY = web.AppKey("sampler", Sampler)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error(status: int, error: str, reason: Any) -> web.Response:
    return web.json_response({"error": error, "reason": reason}, status=status)


def not_found() -> web.Response:
    return error(404, "Object Not Found", "Not Found")


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
        # does not take a bare 405.
        unmatched = getattr(request.match_info, "http_exception", None)
        if isinstance(unmatched, web.HTTPMethodNotAllowed) or (
            unmatched is not None and request.method not in ("GET", "HEAD")
        ):
            return web.Response(status=405)
        if unmatched is not None:
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
    try:
        if replica.TAP is not None and request.method != "GET":
            return await _replicated(handler, request)
        return await handler(request)
    except Denied as exc:
        return error(401, "not_authorised", exc.reason)  # RabbitMQ's spelling here
    except NotFound:
        return not_found()
    except AccessRefused as exc:
        return error(401, "not_authorised", str(exc))
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
        await tap.wait_safe(tap.sql_position)
    return response


def _authenticate(server: Server, header: str) -> Any:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        username, _, password = base64.b64decode(encoded).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return server.broker.access.authenticate(username, password)


def build_app(server: Server) -> web.Application:
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
    text = await request.text()
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

    def __init__(self, server: Server, host: str, port: int) -> None:
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
