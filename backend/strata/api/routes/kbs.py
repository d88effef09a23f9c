"""Knowledge bases: list, create, documents (list, upload, delete) and stats.

An upload stops when its process is told to stop (``strata.api.stopping``): at its run's next batch boundary,
answering 503 ``indexing-stopped`` with Retry-After; should the grace run out first (a store call that does not
return), the cancelled request answers the same instead of uvicorn's plain-text 500.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, File, Query, Response, UploadFile
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from strata.api import stopping, uploads
from strata.api.deps import PrincipalDep, ReadableKb, ServiceDep, WritableKb, not_found
from strata.api.openapi import problems
from strata.api.problems import Problem
from strata.api.schemas import DocumentDeleted, DocumentEntryOut, DocumentList, KbCreate, KbCreated, KbList, KbOut
from strata.errors import IndexingStoppedError
from strata.indexing.consistency import KbStats
from strata.indexing.report import IndexReport

router = APIRouter(
    prefix="/kbs",
    tags=["knowledge bases"],
    default_response_class=JSONResponse,  # json.dumps, as ever
    route_class=uploads.UploadRoute,  # a request of too many files: strata's 413, not the form parser's 400
)


@router.get("", summary="the knowledge bases this key may read", response_model=KbList)
def list_kbs(service: ServiceDep, principal: PrincipalDep) -> KbList:
    kbs = [kb for kb in service.resources.documents.kbs.list_kbs() if principal.can_read(kb.kb_id)]
    return KbList(kbs=[KbOut.model_validate(kb) for kb in kbs])


@router.post(
    "",
    summary="create an empty knowledge base",
    status_code=201,
    response_model=KbCreated,
    responses={
        200: {"model": KbCreated, "description": "the knowledge base existed already"},
        **problems(403, 404, 409),
    },
)
def create_kb(body: KbCreate, service: ServiceDep, principal: PrincipalDep, response: Response) -> KbCreated:
    if not principal.can_read(body.kb_id):
        raise not_found(body.kb_id)
    if not principal.write:
        raise Problem(403, f"this key may not write to {body.kb_id!r}", title="Forbidden")
    created = service.create_kb(body.kb_id)
    if not created:
        response.status_code = 200
    return KbCreated(kb_id=body.kb_id, created=created)


@router.get(
    "/{kb}/documents",
    summary="the documents a knowledge base serves",
    response_model=DocumentList,
    responses=problems(404),
)
def list_documents(kb: ReadableKb, service: ServiceDep) -> DocumentList:
    entries = service.catalog.documents(kb)
    return DocumentList(kb=kb, documents=[DocumentEntryOut.model_validate(e) for e in entries])


@router.post(
    "/{kb}/documents",
    summary="upload files and index them (the report of strata index)",
    response_model=IndexReport,
    responses=problems(403, 404, 409, 429, 503),
    form_limits={"max_files": uploads.MAX_FILES + 1},  # and the `present` part; past it: UploadRoute's 413
)
async def upload_documents(
    kb: WritableKb,
    service: ServiceDep,
    files: Annotated[list[UploadFile], File(description="files; a name may be a relative path (folder/file.md)")],
    delete_missing: Annotated[
        bool, Query(description="delete documents of this root whose files were not sent")
    ] = False,
    recreate: Annotated[bool, Query(description="drop the knowledge base first")] = False,
    dry_run: Annotated[bool, Query(description="report what would change, write nothing")] = False,
    root: Annotated[str, Query(max_length=uploads.MAX_NAME_CHARS, description=uploads.ROOT_HELP)] = "",
    keep: Annotated[list[str], Query(max_length=uploads.MAX_KEPT, description=uploads.KEEP_HELP)] = [],  # noqa: B006
    max_delete: Annotated[int | None, Query(ge=0, description=uploads.MAX_DELETE_HELP)] = None,
    force: Annotated[bool, Query(description=uploads.FORCE_HELP)] = False,
    present: Annotated[UploadFile | None, File(description=uploads.PRESENT_HELP)] = None,
) -> IndexReport:
    uploads.check_name(root, "root")
    if len(files) > uploads.MAX_FILES:
        raise uploads.too_many_files()
    kept = [str(uploads.relative_name(name)) for name in keep] + await run_in_threadpool(uploads.present_names, present)

    def index(folder: Path) -> IndexReport:
        with stopping.on_stop(service.indexer.stop):
            return service.index_folder(
                kb,
                folder,
                delete_missing=delete_missing,
                recreate=recreate,
                dry_run=dry_run,
                root=uploads.root_name(root, lambda: {v.root for v in service.resources.documents.versions.of_kb(kb)}),
                keep=kept,
                max_delete=max_delete,
                force_delete=force,
            )

    try:
        return await run_in_threadpool(uploads.index_in_temporary_folder, files, index)  # errors: ERROR_TABLE
    except asyncio.CancelledError:  # the grace ran out (uvicorn cancels what still runs): the run was told to stop
        if not stopping.stopping():
            raise
        raise IndexingStoppedError("indexing stopped: the service is shutting down") from None


@router.delete(
    "/{kb}/documents/{doc_id:path}",
    summary="delete a document from every store",
    response_model=DocumentDeleted,
    responses=problems(403, 404, 409),
)
def delete_document(
    kb: ReadableKb,
    doc_id: Annotated[str, PathParam(pattern=uploads.NAME_PATTERN, max_length=uploads.MAX_NAME_CHARS)],
    service: ServiceDep,
    principal: PrincipalDep,
) -> DocumentDeleted:
    if not principal.can_write(kb):
        raise Problem(403, f"this key may not write to {kb!r}", title="Forbidden")
    uploads.check_name(doc_id, "document id")
    if not service.delete_document(kb, doc_id):
        raise Problem(404, f"no document {doc_id!r} in knowledge base {kb!r}", title="Not Found")
    return DocumentDeleted(kb=kb, deleted=doc_id)


@router.get(
    "/{kb}/stats",
    summary="documents, chunks per level and Milvus leaves (they must agree)",
    response_model=KbStats,
    responses=problems(404),
)
def kb_stats(kb: ReadableKb, service: ServiceDep) -> KbStats:
    return service.kb_stats(kb)
