"""``/health`` (the process answers), ``/ready`` (the components; no key), ``/ready/detail`` and ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import JSONResponse, Response

from strata.api.deps import MetricsReader, ReadinessDep, ServiceDep
from strata.api.metrics import CONTENT_TYPE
from strata.api.openapi import problems
from strata.api.readiness import overall, public
from strata.api.schemas import ReadyDetailOut, ReadyOut

router = APIRouter(tags=["operations"], default_response_class=JSONResponse)  # json.dumps, as ever


@router.get("/health", summary="the process answers (no key needed)")
def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/ready",
    summary="a status per component (no key; one check serves STRATA_API__READY_CACHE_S); 503 only when this pod's own encoder (or a component STRATA_API__READY_REQUIRES names) is unusable, 200 degraded when a shared store is down",
    response_model=ReadyOut,
    responses={503: {"model": ReadyOut, "description": "a required component is unusable (the same body as the 200)"}},
)
async def ready(readiness: ReadinessDep, response: Response) -> ReadyOut:
    components, _ = await readiness.components()
    status, response.status_code = overall(components, readiness.requires)
    return ReadyOut(status=status, components=public(components))


@router.get(
    "/ready/detail",
    summary="a fresh check with timings, errors and details (the metrics grant or full access)",
    response_model=ReadyDetailOut,
    responses={
        503: {"model": ReadyDetailOut, "description": "a required component is unusable (the same body as the 200)"},
        **problems(403),
    },
)
async def ready_detail(readiness: ReadinessDep, _: MetricsReader, response: Response) -> ReadyDetailOut:
    components, age_s = await readiness.components(fresh=True)
    status, response.status_code = overall(components, readiness.requires)
    return ReadyDetailOut(status=status, checked_s_ago=round(age_s, 3), components=components)


@router.get(
    "/metrics",
    summary="Prometheus metrics (the metrics grant or full access)",
    response_class=Response,
    responses=problems(403),
)
def metrics(service: ServiceDep, _: MetricsReader) -> Response:
    return Response(service.metrics.render(), media_type=CONTENT_TYPE)
