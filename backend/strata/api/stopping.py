"""The moment a server process is told to stop (SIGTERM), told to the work that must not wait for the grace.

uvicorn lets requests in flight run for ``STRATA_API__SHUTDOWN_GRACE_S`` before it cancels them; an upload
can index for longer than that. So the server (``strata.cli.supervisor.StrataServer``) calls ``notify`` as the
signal arrives, and an upload registered with ``on_stop`` stops its run at once: at the run's next batch
boundary it raises ``IndexingStoppedError``, whose answer is a 503 with Retry-After, well inside the grace,
and its pending version is left for the next upload of the same files to continue.

One notice per process (a server process serves one app); a hook registered after the notice runs at once.
Hooks run in the signal handler: they must be quick and take no lock the main thread may hold (setting a
``threading.Event`` is what they do).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_hooks: dict[object, Callable[[], None]] = {}
_stopping = threading.Event()


def notify() -> None:
    """The process is stopping: every registered hook runs, and every later one as it registers."""
    _stopping.set()
    for hook in list(_hooks.values()):
        hook()


def stopping() -> bool:
    """Whether ``notify`` has been called in this process."""
    return _stopping.is_set()


@contextmanager
def on_stop(hook: Callable[[], None]) -> Iterator[None]:
    """Runs ``hook`` when the process is told to stop while the block runs (at once if it was told already)."""
    key = object()
    _hooks[key] = hook
    try:
        if _stopping.is_set():
            hook()
        yield
    finally:
        _hooks.pop(key, None)


def reset() -> None:
    """Forgets a notice (for tests that serve several apps in one process)."""
    _stopping.clear()
