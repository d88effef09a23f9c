"""A per-knowledge-base indexing lease in SQL: one writer per kb at a time.

Two indexers on one kb (possible on a Milvus server, where no file lock
exists) would pick the same version numbers and delete each other's pending
rows. The lease is a row (kb id, owner, expiry) in the SQL store that every
writer shares: taking it is one INSERT, or an UPDATE that succeeds only when
the row's lease has expired or is already ours. A holder renews it from a
background thread while it works; a crashed holder's lease simply expires.
A second writer fails at once with ``LeaseHeldError`` naming the holder.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from datetime import datetime, timedelta, timezone

from sqlalchemy import delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from strata.errors import LeaseHeldError, StoreError
from strata.stores.sql import DocumentStore
from strata.stores.sql_schema import kb_leases

logger = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)  # naive UTC: the same on SQLite and PostgreSQL


def owner_name() -> str:
    """Who holds a lease: host, process id and a token unique to this holder."""
    return f"{socket.gethostname()}:pid {os.getpid()}:{uuid.uuid4().hex[:8]}"


class KbLease:
    """Holds the indexing lease of one kb; re-entrant within its owner (``with lease: ... with lease: ...``)."""

    def __init__(self, store: DocumentStore, kb_id: str, *, ttl_s: float = 60.0, owner: str | None = None) -> None:
        self._store = store
        self.kb_id = kb_id
        self.owner = owner or owner_name()
        self._ttl = timedelta(seconds=ttl_s)
        self._depth = 0
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def __enter__(self) -> KbLease:
        if self._depth == 0:
            self.acquire()
        self._depth += 1
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.release()

    def acquire(self) -> None:
        """Takes the lease or raises ``LeaseHeldError`` naming the holder."""
        if not self._try_take():
            raise LeaseHeldError(self._held_message())
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, name=f"lease-{self.kb_id}", daemon=True)
        self._renewer.start()

    def release(self) -> None:
        """Gives the lease back; with SQL unreachable it is left to expire (never masks the caller's error)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        try:
            with self._store._begin() as conn:
                conn.execute(delete(kb_leases).where(kb_leases.c.kb_id == self.kb_id, kb_leases.c.owner == self.owner))
        except StoreError as exc:
            logger.warning("could not release the indexing lease of %s (it expires by itself): %s", self.kb_id, exc)

    def _try_take(self) -> bool:
        now = _now()
        values = {"owner": self.owner, "acquired_at": now, "expires_at": now + self._ttl}
        try:
            with self._store._begin() as conn:
                conn.execute(insert(kb_leases).values(kb_id=self.kb_id, **values))
            return True
        except StoreError as exc:  # the row exists: take it only if it expired or is ours
            if not isinstance(exc.__cause__, IntegrityError):
                raise
        takeable = [kb_leases.c.expires_at < now, kb_leases.c.owner == self.owner]
        dead = self._dead_local_holder()
        if dead:  # a killed indexer on this host: its lease need not run out first
            takeable.append(kb_leases.c.owner == dead)
        with self._store._begin() as conn:
            taken = conn.execute(update(kb_leases).where(kb_leases.c.kb_id == self.kb_id, or_(*takeable)).values(**values))
        if taken.rowcount == 1 and dead:
            logger.warning("took over the indexing lease of %s from %s, which is no longer running", self.kb_id, dead)
        return taken.rowcount == 1

    def _dead_local_holder(self) -> str | None:
        """The holder's name when it is a process of this host that no longer exists."""
        with self._store._connect() as conn:
            owner = conn.execute(select(kb_leases.c.owner).where(kb_leases.c.kb_id == self.kb_id)).scalar()
        host, _, rest = (owner or "").partition(":pid ")
        pid = rest.split(":", 1)[0]
        if host != socket.gethostname() or not pid.isdigit():
            return None
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return owner
        except PermissionError:  # alive, owned by another user
            return None
        return None

    def _renew_loop(self) -> None:
        interval = self._ttl.total_seconds() / 3
        while not self._stop.wait(interval):
            try:
                with self._store._begin() as conn:
                    conn.execute(
                        update(kb_leases)
                        .where(kb_leases.c.kb_id == self.kb_id, kb_leases.c.owner == self.owner)
                        .values(expires_at=_now() + self._ttl)
                    )
            except Exception as exc:  # SQL down: the next renewal tries again; the lease may lapse
                logger.warning("could not renew the indexing lease of %s: %s", self.kb_id, exc)

    def _held_message(self) -> str:
        with self._store._connect() as conn:
            row = conn.execute(select(kb_leases).where(kb_leases.c.kb_id == self.kb_id)).first()
        holder = f"{row.owner} (since {row.acquired_at:%Y-%m-%d %H:%M:%S} UTC, lease until {row.expires_at:%H:%M:%S} UTC)" if row else "another indexer"
        return (
            f"knowledge base {self.kb_id!r} is being indexed by {holder}; "
            "wait for that run to finish (a crashed run's lease expires by itself) and run again"
        )
