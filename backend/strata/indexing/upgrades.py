"""What a document's stored version is compared under: the chunking settings, and the chunker's revision apart.

A version records its file's content hash under the **settings signature** (``settings_signature``: the
chunking settings alone, what the user changes on purpose; a change of them re-chunks every document). The
chunker's revision (``CHUNKER_REVISION``, raised by a release whose chunker cuts some text differently) is
not in it: the kb records it in its **stamp** (``stamp``: both, written after a run that failed nothing).
So a release does not re-version unchanged documents by itself, in either direction of an upgrade: a run
that finds the kb stamped by another revision chunks each document whose file and settings are unchanged
and compares the chunks with those its version holds (``carried_over``); a document whose chunks are the
same stays as it is, one whose chunks differ is written again.

Versions written before the signature left the revision out (their hash is under ``legacy_signature``, the
revision and settings together) are recognised by each revision strata knows, compared the same way, and
given the settings signature's hash when they are found unchanged (``Carried.rehashed``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata.config import ChunkingSettings
from strata.errors import LoaderError
from strata.indexing.chunking import CHUNKER_REVISION, iter_chunks
from strata.indexing.plan import index_hash
from strata.stores.chunks import Chunks
from strata.types import ACTIVE, Chunk, DocumentVersion, SourceDocument

Read = Callable[[SourceDocument], SourceDocument]  # the document whole (its text read again if the scan let it go)


def settings_signature(settings: ChunkingSettings) -> str:
    """What a version's hash is taken under: the chunking settings (not the chunker's revision)."""
    return hashlib.sha1(settings.model_dump_json().encode()).hexdigest()[:16]


def legacy_signature(settings: ChunkingSettings, revision: int) -> str:
    """The signature versions were hashed under before it left the revision out."""
    return hashlib.sha1(f"{revision}:{settings.model_dump_json()}".encode()).hexdigest()[:16]


def stamp(settings: ChunkingSettings) -> str:
    """What a kb records of the chunking its documents were written with: settings signature and revision."""
    return f"{settings_signature(settings)}/r{CHUNKER_REVISION}"


def same_settings(kb_stamp: str, settings: ChunkingSettings) -> bool:
    """Whether a kb stamped ``kb_stamp`` was chunked with ``settings`` (by this chunker revision or another)."""
    signature = kb_stamp.split("/r", 1)[0]
    legacy = {legacy_signature(settings, revision) for revision in range(1, CHUNKER_REVISION + 1)}
    return signature == settings_signature(settings) or kb_stamp in legacy


@dataclass(frozen=True)
class Carried:
    """What ``carried_over`` found: documents left as they are, and those whose chunks this revision changes."""

    unchanged: frozenset[str] = frozenset()
    """doc ids whose file and settings are unchanged and whose stored chunks this chunker makes again"""
    rehashed: dict[str, tuple[int, str]] = field(default_factory=dict)
    """of those, doc id -> (active version, the hash it is to record): versions hashed under a legacy signature"""
    rechunked: frozenset[str] = frozenset()
    """doc ids whose file and settings are unchanged but whose chunks this chunker makes differently"""


def carried_over(
    chunks: Chunks,
    kb_id: str,
    kb_stamp: str,
    docs: Iterable[SourceDocument],
    versions: Sequence[DocumentVersion],
    *,
    settings: ChunkingSettings,
    read: Read,
) -> Carried:
    """The documents an upgrade (or a downgrade) of the chunker leaves as they are (reads only).

    A version hashed under the settings signature of a kb stamped by this revision is unchanged as ever (no
    chunk is compared); one of a kb stamped by another revision (or none), or hashed under a legacy
    signature, is compared chunk by chunk."""
    signature, current = settings_signature(settings), kb_stamp == stamp(settings)
    legacy = {legacy_signature(settings, revision): revision for revision in range(1, CHUNKER_REVISION + 1)}
    active = {v.doc_id: v for v in versions if v.status == ACTIVE}
    unchanged, rechunked, rehashed = set(), set(), {}
    for doc in docs:
        previous = active.get(doc.doc_id)
        if previous is None:
            continue
        hashed = index_hash(doc.content_hash, signature)
        was = next((s for s in legacy if previous.content_hash == index_hash(doc.content_hash, s)), None)
        if previous.content_hash == hashed and current:
            continue  # the plan finds it unchanged by its hash
        if previous.content_hash != hashed and was is None:
            continue  # another file, or other settings: written again
        if was is not None and legacy[was] == CHUNKER_REVISION:  # this chunker wrote it
            unchanged.add(doc.doc_id)
            rehashed[doc.doc_id] = (previous.version, hashed)
            continue
        try:
            whole = read(doc)
        except LoaderError:
            continue  # changed or gone since the scan: the run's write of it fails and says so
        if same_chunks(chunks, whole, previous, settings):
            unchanged.add(doc.doc_id)
            if was is not None:
                rehashed[doc.doc_id] = (previous.version, hashed)
        else:
            rechunked.add(doc.doc_id)
    return Carried(frozenset(unchanged), rehashed, frozenset(rechunked))


def same_chunks(chunks: Chunks, doc: SourceDocument, previous: DocumentVersion, settings: ChunkingSettings) -> bool:
    """Whether ``previous`` holds exactly the chunks this chunker makes of ``doc`` (ids, texts, spans, headings,
    parents, metadata), read a page at a time; the document's own chunks are held by id and fingerprint."""
    made = {
        chunk.chunk_id: _fingerprint(chunk)
        for chunk in iter_chunks(doc, kb_id=previous.kb_id, version=previous.version, settings=settings)
    }
    for page in chunks.version_chunk_pages(previous.kb_id, previous.doc_id, previous.version):
        for chunk in page:
            if made.pop(chunk.chunk_id, None) != _fingerprint(chunk):
                return False
    return not made


def _fingerprint(chunk: Chunk) -> str:
    fields: list[Any] = [
        chunk.level,
        chunk.parent_id,
        chunk.root_id,
        chunk.ordinal,
        chunk.text,
        chunk.heading_path,
        chunk.char_start,
        chunk.char_end,
        chunk.child_count,
        json.dumps(dict(chunk.metadata), sort_keys=True, ensure_ascii=False, default=str),
    ]
    return hashlib.sha256(json.dumps(fields, ensure_ascii=False).encode()).hexdigest()
