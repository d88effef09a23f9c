"""``aretrieve_documents``: the library's call for an event loop, which it keeps free.

The engine blocks: its stores' clients (pymilvus, SQLAlchemy, redis-py) and the query encoder wait in C
extensions and sockets of their own, and an asynchronous engine would be a second engine to keep equal to the
first. So an awaitable call runs the blocking one in strata's own thread pool of ``ASYNC_WORKERS`` threads
(``run_in_pool``) and the loop awaits its future: the loop stays free, and however many coroutines ask at once,
at most ``ASYNC_WORKERS`` queries hold a thread (the rest wait in the pool's queue; a query's deadline starts
when a thread takes it). The pool is strata's, not the loop's default executor, so an application's own
``to_thread`` work and strata's queries do not wait behind each other.

A caller of a remote service awaits ``strata.client.AsyncStrataClient`` instead: no thread at all.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from strata.config import Settings
from strata.rag.retrieve import retrieve_documents
from strata.request import takes_request_options
from strata.types import RetrievalResult

T = TypeVar("T")

ASYNC_WORKERS = 8
"""Threads of the pool the awaitable calls run the engine in: queries of one process running at once."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=ASYNC_WORKERS, thread_name_prefix="strata-query")
        return _pool


async def run_in_pool(call: Callable[[], T]) -> T:
    """``call()`` run in strata's query pool, awaited (the event loop stays free meanwhile)."""
    return await asyncio.get_running_loop().run_in_executor(_executor(), call)


@takes_request_options
async def aretrieve_documents(
    query: str, top_k: int = 5, *, settings: Settings | None = None, **options: Any
) -> RetrievalResult:
    """``strata.rag.retrieve.retrieve_documents``, awaited: the same arguments, result and errors."""
    return await run_in_pool(partial(retrieve_documents, query, top_k, settings=settings, **options))
