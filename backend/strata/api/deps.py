"""Route dependencies, as ``Annotated`` aliases: the service, its readiness, the caller and kb access."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.dependencies.models import Dependant
from starlette.routing import BaseRoute

from strata.api.auth import CHALLENGE, UNAUTHORIZED, Principal
from strata.api.middleware import principal_of
from strata.api.problems import Problem
from strata.api.readiness import Readiness
from strata.api.schemas import KB_ID_PATTERN
from strata.api.service import Service


def get_service(request: Request) -> Service:
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]


def get_readiness(request: Request) -> Readiness:
    return request.app.state.readiness


ReadinessDep = Annotated[Readiness, Depends(get_readiness)]


def get_principal(request: Request) -> Principal:
    """The caller's grants, as ``Authenticate`` found them from the headers (it answers 401 before the body)."""
    principal = principal_of(request.scope)
    if principal is None:  # a route the middleware did not know as protected
        raise Problem(401, UNAUTHORIZED, title="Unauthorized", headers=CHALLENGE)
    return principal


def needs_key(route: BaseRoute) -> bool:
    """Whether the route takes the caller's principal (then ``Authenticate`` checks the key before the body)."""
    dependant = getattr(route, "dependant", None)
    return dependant is not None and _calls(dependant, get_principal)


def _calls(dependant: Dependant, call: object) -> bool:
    return dependant.call is call or any(_calls(sub, call) for sub in dependant.dependencies)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def metrics_reader(principal: PrincipalDep) -> Principal:
    """A key that may read the metrics: they show every tenant's activity."""
    if not principal.can_read_metrics:
        raise Problem(403, 'this key may not read metrics: grant it "metrics": true', title="Forbidden")
    return principal


MetricsReader = Annotated[Principal, Depends(metrics_reader)]
KbPath = Annotated[str, Path(pattern=KB_ID_PATTERN, description="knowledge base id")]


def not_found(kb_id: str) -> Problem:
    """The same answer for a kb that does not exist and one the caller may not read."""
    return Problem(404, f"no knowledge base {kb_id!r}", title="Not Found")


def readable_kb(kb: KbPath, principal: PrincipalDep, service: ServiceDep) -> str:
    if not principal.can_read(kb) or service.resources.documents.kbs.get_kb(kb) is None:
        raise not_found(kb)
    return kb


def writable_kb(kb: KbPath, principal: PrincipalDep) -> str:
    """A kb the caller may write (it need not exist yet: uploads create it)."""
    if not principal.can_read(kb):
        raise not_found(kb)
    if not principal.write:
        raise Problem(403, f"this key may not write to {kb!r}", title="Forbidden")
    return kb


ReadableKb = Annotated[str, Depends(readable_kb)]
WritableKb = Annotated[str, Depends(writable_kb)]
