"""The web UI: static files (HTML, one script, one stylesheet) served beside /api.

There is no build step: the files in ui/ are what the browser runs. The pages
call the same /api as every other tool, with the user's credentials, so the UI
can do nothing the API would not let that user do.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

UI_DIR = Path(__file__).with_name("ui")


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(UI_DIR / "index.html", headers={"Cache-Control": "no-cache"})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_static("/ui/", UI_DIR, append_version=False)
