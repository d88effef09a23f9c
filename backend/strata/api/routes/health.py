"""``/health`` (the process answers), ``/ready`` (the components) and ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from strata.api.deps import MetricsReader, PrincipalDep, ServiceDep
from strata.api.metrics import CONTENT_TYPE
from strata.api.openapi import problems
from strata.api.readiness import check_components, overall

router = APIRouter(tags=["operations"])


@router.get("/health", summary="the process answers (no key needed)")
def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/ready", summary="a status per component; 503 when Milvus or SQL is unusable",
    responses={503: {"description": "a component is unusable (the same body as the 200)", "content": {"application/json": {}}}},
)  # fmt: skip
async def ready(service: ServiceDep, _: PrincipalDep) -> JSONResponse:
    components: dict[str, Any] = await run_in_threadpool(check_components, service)
    status, code = overall(components)
    return JSONResponse({"status": status, "components": components}, status_code=code)


@router.get(
    "/metrics", summary="Prometheus metrics (the metrics grant or full access)", response_class=Response,
    responses=problems(403),
)  # fmt: skip
def metrics(service: ServiceDep, _: MetricsReader) -> Response:
    return Response(service.metrics.render(), media_type=CONTENT_TYPE)
