"""What the service process holds: one ``Resources`` shared by retrieval and indexing.

Milvus Lite lets one process own its file, so the service builds the encoder
and the stores once and every route goes through them. Indexing runs in a
worker thread (retrieval keeps answering) and never twice at once on one kb:
a write to a kb another request is writing is refused at once with
``LeaseHeldError``, whether that request runs in this worker or another.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from strata.api.auth import KeyRing, Principal
from strata.api.metrics import Metrics
from strata.config import Settings
from strata.encoders.model_folder import check_encoder_loads
from strata.errors import LeaseHeldError
from strata.indexing.consistency import KbStats, kb_stats
from strata.indexing.pipeline import Indexer, chunking_signature
from strata.indexing.report import IndexReport
from strata.rag.expansion import SynonymDictionary, load_synonyms
from strata.rag.rerank import Reranker
from strata.rag.retrieve import Retriever
from strata.request import RetrievalRequest
from strata.resources import Resources
from strata.stores.catalog import Catalog
from strata.types import RetrievalResult

logger = logging.getLogger(__name__)

WARM_UP_QUERY = "warm-up 预热"
WRITERS_GRACE_S = 10.0  # at shutdown, how long stopped indexing runs get to release their leases


class Service:
    """The engine parts of one app, built once in its lifespan."""

    def __init__(
        self,
        settings: Settings,
        resources: Resources,
        *,
        owns_resources: bool,
        metrics: Metrics | None = None,
        keys: KeyRing | None = None,
    ) -> None:
        self.settings = settings
        self.resources = resources
        self.owns_resources = owns_resources
        self.keys = keys if keys is not None else KeyRing.from_settings(settings.api)
        self.metrics = metrics or Metrics()
        self.synonyms: SynonymDictionary = load_synonyms(settings.retrieval.synonyms)
        self.retriever = Retriever(resources, refuse_unknown_kbs=True)  # an unknown kb is a 404, not a result
        self.indexer = Indexer(resources, kb_only_notes=True)  # a key may be scoped to some kbs
        self._kb_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self._kb_locks_guard = threading.Lock()

    @property
    def catalog(self) -> Catalog:
        return Catalog(self.resources.documents.engine)

    def warm_up(self) -> None:
        """Loads the encoder and opens the stores, then runs one query (Milvus loads jieba's dictionary).

        A model this process loads (not an embeddings server) that cannot load stops the start with
        ``EncoderError``: a pod without its model would be live and never ready. Anything else is logged
        and ``/ready`` shows it.
        """
        started = time.perf_counter()
        if self.settings.embedding.provider != "openai":
            check_encoder_loads(self.resources.encoder, self.settings.embedding)
        try:
            self.resources.encoder.encode_queries([WARM_UP_QUERY])
            self.resources.open_leaf_index()
            result = self.retriever.retrieve(WARM_UP_QUERY, 1)
            logger.info(
                "warm-up query: status %s in %.0f ms", result.meta.status, (time.perf_counter() - started) * 1000
            )
        except Exception as exc:  # the service still starts; /ready shows what is wrong
            logger.warning("warm-up failed: %s: %s", type(exc).__name__, exc)

    def retrieve(self, request: RetrievalRequest, *, principal: Principal | None = None) -> RetrievalResult:
        """``Retriever.retrieve_request`` of the request as parsed, its query-cache entries the ``principal``'s own
        unless ``STRATA_RETRIEVAL__CACHE_SCOPE=kbs``. A requested kb that does not exist raises ``NotFoundError``
        (after its run is recorded and traced)."""
        keyed = self.settings.retrieval.cache_scope == "key"
        scope = principal.name if principal is not None and keyed else None
        # arguments the engine refuses raise InvalidArgumentError, a kb SQL does not know NotFoundError
        # (the retriever refuses unknown kbs): ERROR_TABLE answers them (422, 404)
        result = self.retriever.retrieve_request(request, cache_scope=scope)
        self.metrics.observe_retrieval(result)
        return result

    def index_folder(
        self,
        kb_id: str,
        folder: Path,
        *,
        delete_missing: bool,
        recreate: bool,
        dry_run: bool,
        root: str,
        keep: Sequence[str] = (),
        max_delete: int | None = None,
        force_delete: bool = False,
    ) -> IndexReport:
        """Indexes an uploaded folder into ``kb_id`` as the root ``root`` (call from a worker thread)."""
        with self._writing(kb_id):
            report = self.indexer.index_paths(
                [folder],
                kb_id=kb_id,
                delete_missing=delete_missing,
                recreate=recreate,
                dry_run=dry_run,
                root_names={folder: root},
                keep=keep,
                max_delete=max_delete,
                force_delete=force_delete,
            )
        report.sources_relative_to(folder)
        return report

    def delete_document(self, kb_id: str, doc_id: str) -> bool:
        with self._writing(kb_id):
            return self.indexer.delete_document(kb_id, doc_id)

    def create_kb(self, kb_id: str) -> bool:
        """Creates an empty kb for the configured encoder; False when it existed."""
        documents, encoder = self.resources.documents, self.resources.encoder
        with self._writing(kb_id):
            if documents.kbs.get_kb(kb_id) is not None:
                return False
            signature = chunking_signature(self.settings.chunking)
            documents.kbs.ensure_kb(kb_id, encoder=encoder.name, dim=encoder.dim, chunking=signature)
        return True

    def kb_stats(self, kb_id: str) -> KbStats:
        """What ``strata stats`` prints (``consistency.kb_stats``)."""
        kb = self.resources.documents.kbs.get_kb(kb_id)
        assert kb is not None
        return kb_stats(self.resources.documents.versions, self.resources.leaf_index, kb)

    @property
    def reranker(self) -> Reranker | None:
        """The configured reranker or None (the retriever owns it)."""
        return self.retriever.reranker

    def close(self) -> None:
        """Stops indexing runs (a parse in progress is killed), waits for them to unwind, then closes."""
        self.indexer.stop()
        self._wait_for_writers(WRITERS_GRACE_S)
        self.retriever.close()
        if self.owns_resources:
            self.resources.close()

    def _wait_for_writers(self, timeout_s: float) -> None:
        """Waits until no kb lock is held (the runs released their leases), at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._kb_locks_guard:
            locks = dict(self._kb_locks)
        for kb_id, lock in locks.items():
            if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                logger.warning("closing while a write to kb %r is still running (its lease expires)", kb_id)
                continue
            lock.release()

    @contextmanager
    def _writing(self, kb_id: str) -> Iterator[None]:
        """Holds this process's lock of ``kb_id``. Held by another request, it refuses at once, as another
        process's lease does: a client's answer must not depend on the worker its request reached, and a
        request waiting here would hold a worker thread for as long as the other one indexes."""
        lock = self._kb_lock(kb_id)
        if not lock.acquire(blocking=False):
            busy = f"knowledge base {kb_id!r} is being written by another request to this process"
            raise LeaseHeldError(busy, kb_id=kb_id)
        try:
            yield
        finally:
            lock.release()

    def _kb_lock(self, kb_id: str) -> threading.Lock:
        with self._kb_locks_guard:
            return self._kb_locks[kb_id]
