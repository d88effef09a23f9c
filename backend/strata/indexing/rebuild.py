"""Rebuilding a knowledge base's leaves in Milvus from SQL, the source of truth.

Every L3 chunk of the kb's active versions is written again with its search
text and its vector from the SQL embedding cache (only what the cache lacks is
encoded, and stored there), in batches, then flushed, and the leaves in Milvus
are verified against SQL by id.

Two targets:

- **in place** (no target): the kb's leaves are deleted from the configured
  collection, then written again. Queries of that kb find nothing meanwhile.
  Nothing is deleted before the checks every other command makes have passed:
  the kb's encoder against SQL, the isolation level, and the kb's collection
  opened as written (its encoder, its BM25 analyzer against
  ``STRATA_MILVUS__ANALYZER``, its layout).
- **another Milvus** (a target ``MilvusSettings``: a Lite file or a server):
  the configured Milvus is never opened, so it keeps serving; the copy is
  written and verified, and the operator switches ``STRATA_MILVUS__URI`` to it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath
from typing import Any

from strata.config import MilvusSettings
from strata.errors import EncoderMismatchError, IndexingError, NotFoundError
from strata.indexing.embedding import upsert_leaves
from strata.indexing.report import NoProgress, Progress
from strata.resources import Resources
from strata.stores.catalog import Catalog
from strata.stores.leaf_index import LeafIndex
from strata.stores.lease import KbLease
from strata.stores.sql import ACTIVE, DocumentVersion
from strata.types import LEAF_LEVEL, Chunk

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RebuildReport:
    """The outcome of one rebuild (also the ``--json`` output of ``strata rebuild``)."""

    kb: str
    target_uri: str
    collection: str
    isolation: str
    in_place: bool
    documents: int
    leaves_written: int
    encoded: int
    reused: int
    sql_leaves: int
    milvus_leaves: int
    verified: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 3)}


def index_order(version: DocumentVersion) -> tuple[str, tuple[tuple[int, str], ...]]:
    """Where ``strata index`` of the version's folder writes it: folder by folder, and in a folder its files by
    name before its subfolders by name (``walk_folder``). Leaves written in that order rank as the kb indexed
    afresh ranks: a Milvus collection's HNSW graph (and Milvus Lite's BM25 statistics, kept per segment)
    depend on the order rows arrive in, and the order of doc ids (front-matter ``doc_id`` or path) is not it."""
    *folders, name = PurePosixPath(version.source).parts or ("",)
    return version.root, (*((1, folder) for folder in folders), (0, name))


class Rebuilder:
    """Writes a kb's leaves from SQL into the configured Milvus (in place) or into ``target``."""

    def __init__(self, resources: Resources, target: MilvusSettings | None = None, *, batch_leaves: int = 2000) -> None:
        self._res = resources
        self._target = target
        self._batch = batch_leaves

    @property
    def target_settings(self) -> MilvusSettings:
        return self._target or self._res.settings.milvus

    def rebuild(self, kb_id: str, *, progress: Progress | None = None) -> RebuildReport:
        """Rebuilds ``kb_id``; ``NotFoundError`` when SQL has no such kb, ``IndexingError`` when the copy disagrees."""
        progress = progress or NoProgress()
        started = time.perf_counter()
        self._check_kb(kb_id)
        with KbLease(self._res.documents, kb_id):  # no `strata index` writes the kb while it is rebuilt
            active = [v for v in self._res.documents.versions.of_kb(kb_id) if v.status == ACTIVE]
            versions = sorted(active, key=index_order)
            index = self._open_target()
            try:
                if self._target is None:
                    # Opening the kb's collection checks what every command checks of it (encoder, analyzer,
                    # layout; the level was checked as the index opened): a rebuild refused by them drops nothing.
                    index.open_kb(kb_id)
                    logger.info("rebuilding kb %s in place: deleting its leaves first", kb_id)
                    index.delete_kb(kb_id)
                    index.flush()
                expected, encoded, reused = self._write(index, kb_id, versions, progress)
                index.flush()
                report = self._verify(index, kb_id, len(versions), expected, encoded, reused, started)
            finally:
                if self._target is not None:
                    index.close()
        return report

    def _check_kb(self, kb_id: str) -> None:
        kb = self._res.documents.kbs.get_kb(kb_id)
        if kb is None:
            raise NotFoundError(f"no knowledge base {kb_id!r}")
        encoder = self._res.encoder
        if kb.encoder != encoder.name or kb.dim != encoder.dim:
            raise EncoderMismatchError(
                f"knowledge base {kb_id!r} was built with encoder {kb.encoder} (dim {kb.dim}); the configured encoder "
                f"is {encoder.name} (dim {encoder.dim}). Rebuild with the kb's encoder (STRATA_EMBEDDING__*)."
            )

    def _open_target(self) -> LeafIndex:
        if self._target is None:
            return self._res.leaf_index
        encoder = self._res.encoder
        # A collection created here gets the BM25 dictionary a collection created by `strata index`
        # gets (every front-matter module and skill point SQL knows), so the copy tokenizes alike.
        catalog = Catalog(self._res.documents.engine)
        return LeafIndex(
            self._target,
            encoder_name=encoder.name,
            dim=encoder.dim,
            vocabulary=lambda kb_ids: catalog.vocabulary(kb_ids).terms,
            tenants=self._res.tenants,
        )

    def _write(
        self, index: LeafIndex, kb_id: str, versions: Sequence[DocumentVersion], progress: Progress
    ) -> tuple[set[str], int, int]:
        """Writes every leaf of ``versions``; returns the ids written and the passages encoded and reused."""
        progress.files_planned(len(versions))
        written: set[str] = set()
        encoded = reused = 0
        for batch, done in self._batches(kb_id, versions):
            embedded = upsert_leaves(self._res, index, kb_id, batch, progress=progress)
            written.update(leaf.chunk_id for leaf in batch)
            encoded, reused = encoded + embedded.encoded, reused + embedded.reused
            for version, leaves in done:
                progress.file_done(version.source, "rebuilt", leaves)
        return written, encoded, reused

    def _batches(
        self, kb_id: str, versions: Sequence[DocumentVersion]
    ) -> Iterator[tuple[list[Chunk], list[tuple[DocumentVersion, int]]]]:
        """Leaves in batches of ``batch_leaves`` to twice that, with the versions each batch completes; a
        version's leaves are read a page at a time, so a version of 200,000 leaves is never held whole."""
        batch: list[Chunk] = []
        done: list[tuple[DocumentVersion, int]] = []
        documents = self._res.documents
        for version in versions:
            count = 0
            for page in documents.chunks.version_chunk_pages(
                kb_id, version.doc_id, version.version, levels=(LEAF_LEVEL,), page=self._batch
            ):
                batch.extend(page)
                count += len(page)
                if len(batch) >= self._batch:
                    yield batch, done
                    batch, done = [], []
            done.append((version, count))
        if batch or done:
            yield batch, done

    def _verify(
        self,
        index: LeafIndex,
        kb_id: str,
        documents: int,
        expected: set[str],
        encoded: int,
        reused: int,
        started: float,
    ) -> RebuildReport:
        """The target must hold exactly the leaves of the active versions in SQL (read under the kb's lease)."""
        found = set(index.leaf_ids(kb_id))
        stale = found - expected
        if stale:  # a copy target written before: leaves SQL no longer has
            logger.info("removing %d leaves of kb %s that SQL no longer has", len(stale), kb_id)
            index.delete_leaves(kb_id, sorted(stale))
            index.flush()
        target = self.target_settings
        found, count = set(index.leaf_ids(kb_id)), index.count(kb_id)  # both Strong: every flushed row
        verified = found == expected and count == len(expected)
        report = RebuildReport(
            kb=kb_id,
            target_uri=str(target.uri),
            collection=target.collection,
            isolation=index.isolation,
            in_place=self._target is None,
            documents=documents,
            leaves_written=len(expected),
            encoded=encoded,
            reused=reused,
            sql_leaves=len(expected),
            milvus_leaves=count,
            verified=verified,
            seconds=time.perf_counter() - started,
        )
        if not verified:
            missing = len(expected - found)
            raise IndexingError(
                f"rebuild of kb {kb_id!r} into {target.uri} does not match SQL: {count} leaves in Milvus, "
                f"{len(expected)} in SQL ({missing} missing)"
            )
        return report
