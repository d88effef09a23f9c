"""Route dependencies, as ``Annotated`` aliases: the service, the caller and kb access."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from strata.api.auth import OPEN, Principal, bearer_token
from strata.api.problems import Problem
from strata.api.schemas import KB_ID_PATTERN
from strata.api.service import Service


def get_service(request: Request) -> Service:
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]


def get_principal(request: Request, service: ServiceDep) -> Principal:
    """The caller's grants; 401 without a valid key when keys are configured."""
    if not service.keys.enabled:
        return OPEN
    token = bearer_token(request.headers.get("authorization"))
    principal = service.keys.lookup(token) if token else None
    if principal is None:
        raise Problem(
            401, "send a valid key as 'Authorization: Bearer <key>'", title="Unauthorized",
            headers={"WWW-Authenticate": 'Bearer realm="strata"'},
        )  # fmt: skip
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]
KbPath = Annotated[str, Path(pattern=KB_ID_PATTERN, description="knowledge base id")]


def not_found(kb_id: str) -> Problem:
    """The same answer for a kb that does not exist and one the caller may not read."""
    return Problem(404, f"no knowledge base {kb_id!r}", title="Not Found")


def readable_kb(kb: KbPath, principal: PrincipalDep, service: ServiceDep) -> str:
    if not principal.can_read(kb) or service.resources.documents.get_kb(kb) is None:
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
