"""The chat page: `GET /` and its files (`/page/NAME`), served from specdec_cli/server/webui as they are.

No build step and nothing fetched from the network: the page is three hand-written files (HTML, CSS, JavaScript)
with no third-party code. Every response carries a Content-Security-Policy that lets the page load only its own
files and talk only to this server, and run no inline script: model text the page shows is text, and even a bug
that put it into HTML could not run it. No key is needed for these files (the page asks for the key, where the
server has one, and sends it with its API requests).
"""

from __future__ import annotations

import functools
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

from .api_errors import ApiError

FILES = {"index.html": "text/html; charset=utf-8", "page.js": "text/javascript; charset=utf-8",
         "page.css": "text/css; charset=utf-8"}
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
          "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@functools.lru_cache(maxsize=len(FILES))
def _body(name: str) -> bytes:
    """A page file's bytes, read once (they are the package's own)."""
    return resources.files("specdec_cli.server").joinpath("webui", name).read_bytes()


def _file(name: str) -> Response:
    if name not in FILES:
        raise ApiError(404, f"no page file {name!r}")
    return Response(_body(name), media_type=FILES[name], headers={"Content-Security-Policy": POLICY,
                                                            "X-Content-Type-Options": "nosniff",
                                                            "Cache-Control": "no-cache"})


async def index(request: Request) -> Response:
    return _file("index.html")


async def asset(request: Request) -> Response:
    return _file(request.path_params["name"])
