"""``GET /ui``: the retrieval console, three static files shipped in the package, and its strategy list.

The page needs no key to load (it holds no data); it asks for one when the
service has keys and sends it as ``Authorization: Bearer`` on every API call
it makes. The Content-Security-Policy lets it load and call nothing but this
service, and run no inline script.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from starlette.responses import FileResponse, JSONResponse

from strata.strategy_table import COMPARE_PAIR, STRATEGIES

STATIC = Path(__file__).resolve().parent.parent / "static"
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
}

router = APIRouter(tags=["console"], include_in_schema=False)


@router.get("/ui")
def console() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/ui/strategies")
def strategies() -> JSONResponse:
    """The strategy table (``strata.strategy_table``), so the console lists what the service accepts."""
    body = {"strategies": [s.to_dict() for s in STRATEGIES.values()], "compare": list(COMPARE_PAIR)}
    return JSONResponse(body, headers=HEADERS)


@router.get("/ui/app.js")
def script() -> FileResponse:
    return _asset("app.js")


@router.get("/ui/app.css")
def stylesheet() -> FileResponse:
    return _asset("app.css")


def _asset(name: str) -> FileResponse:
    return FileResponse(STATIC / name, media_type=ASSETS[name], headers=HEADERS)
