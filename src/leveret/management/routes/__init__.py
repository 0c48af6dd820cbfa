"""The /api routes: RabbitMQ 3.10's paths, methods, status codes and field names.

One module per area, as RabbitMQ's API documentation groups them; each has
add_routes(router).
"""

from __future__ import annotations

from aiohttp import web

from leveret.management.routes import (
    access,
    global_parameters,
    links,
    messages,
    overview,
    policies,
    runtime,
    topology,
    user_limits,
)


def add_routes(app: web.Application) -> None:
    for module in (
        overview,
        access,
        topology,
        messages,
        runtime,
        policies,
        links,
        user_limits,
        global_parameters,
    ):
        module.add_routes(app.router)
