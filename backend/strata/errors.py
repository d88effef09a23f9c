"""strata's exception tree.

Every error strata raises on purpose derives from ``StrataError``; third-party
errors are translated where they cross into strata (stores, encoders, the
rerank client) with ``raise ... from exc`` so the cause stays attached::

    StrataError
    ├── ConfigError              a setting is missing or invalid (also a ValueError)
    │   └── KeyGrantError        an API key or grant that cannot be used, named by position only
    ├── EncoderError             an encoder could not load or encode
    ├── StoreError               a store call failed
    │   ├── IndexLockedError     the Milvus Lite file is held by another process
    │   ├── EncoderMismatchError a collection/kb was built with another encoder
    │   ├── LeavesMissingError   the configured collection lacks leaves a kb serves in SQL
    │   ├── CacheError           the chunk cache (Redis) failed
    │   └── StoreTimeoutError    a store did not answer within a bound (names the store and the setting)
    ├── LoaderError              a source file could not be read
    ├── IndexingError            a document could not be indexed consistently
    │   └── IndexingStoppedError an indexing run was stopped (the service is shutting down)
    ├── RerankError              the rerank service failed or answered nonsense
    ├── NotFoundError            a knowledge base or document does not exist
    ├── InvalidArgumentError     a call's argument is outside what strata accepts (also a ValueError)
    ├── DeleteRefusedError       --delete-missing would delete more than a run may (an emptied folder)
    ├── LeaseHeldError           another indexer holds the knowledge base's lease
    │   └── LeaseLostError       another indexer took this run's lease while it worked
    ├── DeadlineExceeded         a retrieval stage found no time left (also a TimeoutError)
    ├── UnsupportedAnalyzer      BM25 analyzer params strata cannot tokenize (also a ValueError)
    └── ServiceError             the HTTP service refused a request or could not be reached

Each class answers the service's callers as one row of
``strata.api.problems.ERROR_TABLE`` (status, problem type, Retry-After).
Every class of the tree is defined here, whichever layer raises it (the
config layer, the stores, the engine, the client). This module imports nothing
of the package, so ``strata.config`` (which must import without the engine)
and ``strata.client`` (which imports the domain only) take their errors from
here. The second bases keep ``except ValueError`` / ``except TimeoutError``
callers working.
``strata.api.problems.Problem`` is outside the tree on purpose: it is the
service's HTTP answer, raised in routes and always turned into a response.
"""

from __future__ import annotations

from typing import Any


class StrataError(Exception):
    """Base class of every error strata raises on purpose."""


class ConfigError(StrataError, ValueError):
    """A setting is missing or invalid; the message names the variable."""


class KeyGrantError(ConfigError):
    """A key or grant that cannot be used, described by position only."""


class EncoderError(StrataError):
    """An encoder could not be loaded or failed to encode."""


class StoreError(StrataError):
    """A store (Milvus, SQL, Redis) call failed."""


class IndexLockedError(StoreError):
    """The Milvus Lite data file is opened by another process."""


class EncoderMismatchError(StoreError):
    """A collection or knowledge base was built with a different encoder."""


class LeavesMissingError(StoreError):
    """The configured Milvus collection lacks leaves that SQL says a knowledge base serves (its leaves were
    written to another Milvus or collection, or lost): an index run would call its documents unchanged."""


class CacheError(StoreError):
    """The chunk cache failed; callers fall back to SQL."""


class StoreTimeoutError(StoreError):
    """A store call waited out its bound (a hung or overloaded server): ``store`` names the store ("PostgreSQL",
    "Milvus", "Redis"), ``setting`` the bound that ended the wait (a setting's variable, or the request's
    deadline). Built by ``strata.stores.store_timeouts``, the one place such errors are worded. Not a
    ``TimeoutError``: ``concurrent.futures`` would take it for its own wait running out."""

    def __init__(self, message: str, *, store: str, setting: str, timeout_s: float) -> None:
        super().__init__(message)
        self.store, self.setting, self.timeout_s = store, setting, timeout_s


class LoaderError(StrataError):
    """A source file could not be loaded (unsupported, unreadable or empty)."""


class IndexingError(StrataError):
    """A document could not be written consistently to the stores."""


class IndexingStoppedError(IndexingError):
    """An indexing run was stopped before it finished (``Indexer.stop``: the service is shutting down)."""


class RerankError(StrataError):
    """The rerank service failed, timed out or answered something unusable."""


class NotFoundError(StrataError):
    """A knowledge base or document does not exist."""


class InvalidArgumentError(StrataError, ValueError):
    """An argument (a query, top_k, kb ids, a deadline) is outside what strata accepts; the message says which."""


class DeleteRefusedError(StrataError):
    """A ``--delete-missing`` run would delete more documents than it may (``strata.indexing.plan.refuse_deletions``):
    it stopped before writing anything. ``count`` is how many it would have deleted."""

    def __init__(self, message: str, *, count: int) -> None:
        super().__init__(message)
        self.count = count


class LeaseHeldError(StrataError):
    """Another process is indexing the knowledge base (the message names the holder).

    ``retry_after_s`` is how long until the holder's lease could expire: a holder that is still working
    renews it, one that crashed on another host is taken over then.
    """

    def __init__(self, message: str, *, kb_id: str = "", retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.kb_id = kb_id
        self.retry_after_s = retry_after_s


class LeaseLostError(LeaseHeldError):
    """An indexing run's lease was taken by another writer while it worked (it was paused past the lease):
    the run stops at its next write, and nothing it left unfinished serves."""


class DeadlineExceeded(StrataError, TimeoutError):
    """A stage found no time left (or its wait ran out)."""

    reason = "deadline_exceeded"
    """the reason code a retrieval records when a stage finds no time left"""

    def __init__(self, stage: str) -> None:
        super().__init__(f"{self.reason}: no time left for {stage} within the request deadline")


class UnsupportedAnalyzer(StrataError, ValueError):
    """The analyzer params name a tokenizer ``strata.stores.analyzer`` does not reproduce (the message says which)."""


class ServiceError(StrataError):
    """The service refused a request or could not be reached; ``status`` is the HTTP status (0 = no answer)."""

    def __init__(self, message: str, *, status: int = 0, problem: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.problem = problem or {}
