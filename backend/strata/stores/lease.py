"""A per-knowledge-base indexing lease in SQL: one writer per kb at a time.

Two indexers on one kb (possible on a Milvus server, where no file lock
exists) would pick the same version numbers and delete each other's pending
rows. The lease is a row (kb id, owner, expiry) in the SQL store that every
writer shares: taking it is one INSERT, or an UPDATE that succeeds only when
the row's lease has expired or is already ours. Expiry is by the database's
clock, never the writer's (a writer whose clock runs ahead cannot take a live
lease). A holder renews it from a background thread while it works; a crashed
holder's lease simply expires. A second writer fails at once with
``LeaseHeldError`` naming the holder.

Holding the lease fences the holder's writes: the thread that took it begins
every transaction by locking the lease row and checking it is still the owner
(``SqlDatabase.fenced``), and checks again before each Milvus write. A holder
paused past its lease (Ctrl-Z, a long GC, a stalled database) whose lease was
taken stops at its next write with ``LeaseLostError``; a renewal that finds the
lease gone says so at once.

A holder records where its pid means something (``process_space``: host name,
boot and pid namespace) and its pid, so a taker in the same space whose holder
no longer runs (killed: SIGKILL, an OOM kill, uvicorn replacing a worker)
takes the lease over at once instead of waiting for it to expire. A pid is
only trusted in its own space: containers sharing a host name (host
networking) have pid namespaces of their own, and a pid of another host says
nothing here.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import threading
import uuid
from contextlib import AbstractContextManager
from datetime import timedelta
from pathlib import Path

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from strata.errors import LeaseHeldError, StoreError
from strata.stores.sql import DocumentStore
from strata.stores.sql_schema import documents, kb_leases
from strata.types import PENDING, RETIRED

logger = logging.getLogger(__name__)


def owner_name() -> str:
    """Who holds a lease: where its pid means something, its pid and a token unique to this holder."""
    return f"{process_space()}:pid {os.getpid()}:{uuid.uuid4().hex[:8]}"


@functools.cache
def process_space() -> str:
    """The host name, and on Linux the boot and pid namespace: two processes with the same value see the
    same pids (pods with host networking share the node's name, not its pids)."""
    host = socket.gethostname()
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()[:8]
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # not Linux: the host name alone
        return host
    return f"{host}~{boot}.{namespace}"


def process_gone(pid: int) -> bool:
    """Whether no process of this pid namespace runs as ``pid``; a zombie (exited, not yet reaped by its parent)
    counts as gone, since it holds nothing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by another user
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:  # no /proc (not Linux), or it exited just now: alive is the safe answer
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]  # the name in parentheses may hold spaces


class KbLease:
    """Holds the indexing lease of one kb; re-entrant within its owner (``with lease: ... with lease: ...``)."""

    def __init__(self, store: DocumentStore, kb_id: str, *, ttl_s: float = 60.0, owner: str | None = None) -> None:
        self._db = store.db  # the lease row's database: the store's own
        self.kb_id = kb_id
        self.owner = owner or owner_name()
        self._ttl = timedelta(seconds=ttl_s)
        self._depth = 0
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._fence: AbstractContextManager[None] | None = None

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
        """Takes the lease (and fences this thread's writes) or raises ``LeaseHeldError`` naming the holder."""
        if not self._try_take():
            raise self._held_error()
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, name=f"lease-{self.kb_id}", daemon=True)
        self._renewer.start()
        # last: nothing after it can fail, so a pooled thread never keeps the fence of a lease it does not hold
        self._fence = self._db.fenced(self.kb_id, self.owner)
        self._fence.__enter__()

    def release(self) -> None:
        """Gives the lease back; with SQL unreachable it is left to expire (never masks the caller's error)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        if self._fence is not None:
            self._fence.__exit__(None, None, None)
            self._fence = None
        try:
            with self._db.begin() as conn:
                conn.execute(delete(kb_leases).where(kb_leases.c.kb_id == self.kb_id, kb_leases.c.owner == self.owner))
        except StoreError as exc:
            logger.warning("could not release the indexing lease of %s (it expires by itself): %s", self.kb_id, exc)

    def _try_take(self) -> bool:
        now = self._db.now()
        values = {"owner": self.owner, "acquired_at": now, "expires_at": now + self._ttl}
        try:
            with self._db.begin() as conn:
                conn.execute(insert(kb_leases).values(kb_id=self.kb_id, **values))
            return True
        except StoreError as exc:  # the row exists: take it only if it expired or is ours
            if not isinstance(exc.__cause__, IntegrityError):
                raise
        abandoned = 0
        dead = self._dead_local_holder()
        with self._db.begin() as conn:
            holder = conn.execute(
                select(kb_leases.c.owner, kb_leases.c.expires_at)
                .where(kb_leases.c.kb_id == self.kb_id)
                .with_for_update()
            ).first()
            if holder is None:  # released between the insert and this read: the next attempt inserts
                return False
            mine, gone = holder.owner == self.owner, dead is not None and holder.owner == dead
            if not (mine or gone or holder.expires_at < now):
                return False
            conn.execute(update(kb_leases).where(kb_leases.c.kb_id == self.kb_id).values(**values))
            if not (mine or gone):  # an expired holder that may still run: nothing it left pending is continued
                abandoned = _abandon_pending(conn, self.kb_id)
        if gone:
            logger.warning("took over the indexing lease of %s from %s, which is no longer running", self.kb_id, dead)
        elif not mine and abandoned:
            logger.warning(
                "took over the expired indexing lease of %s from %s, which may still run: its %d pending "
                "version(s) are retired, not continued",
                self.kb_id,
                holder.owner,
                abandoned,
            )
        return True

    def _dead_local_holder(self) -> str | None:
        """The holder's name when it is a process of this pid space that no longer runs."""
        with self._db.connect() as conn:
            owner = conn.execute(select(kb_leases.c.owner).where(kb_leases.c.kb_id == self.kb_id)).scalar()
        space, _, rest = (owner or "").partition(":pid ")
        pid = rest.split(":", 1)[0]
        if space != process_space() or not pid.isdigit():
            return None
        return owner if process_gone(int(pid)) else None

    def _renew_loop(self) -> None:
        interval = self._ttl.total_seconds() / 3
        while not self._stop.wait(interval):
            try:
                expires = self._db.now() + self._ttl
                with self._db.begin() as conn:
                    renewed = conn.execute(
                        update(kb_leases)
                        .where(kb_leases.c.kb_id == self.kb_id, kb_leases.c.owner == self.owner)
                        .values(expires_at=expires)
                    )
            except Exception as exc:  # SQL down: the next renewal tries again; the lease may lapse
                logger.warning("could not renew the indexing lease of %s: %s", self.kb_id, exc)
                continue
            if renewed.rowcount == 0:  # taken by another writer: the run's next write stops it (fenced)
                logger.error(
                    "the indexing lease of %s was taken by another writer: this run stops at its next write", self.kb_id
                )
                return

    def _held_error(self) -> LeaseHeldError:
        with self._db.connect() as conn:
            row = conn.execute(select(kb_leases).where(kb_leases.c.kb_id == self.kb_id)).first()
        if row is None:  # released between our attempt and this read: the caller may simply try again
            return LeaseHeldError(_held_text(self.kb_id, "another indexer"), kb_id=self.kb_id, retry_after_s=1.0)
        holder = (
            f"{row.owner} (since {row.acquired_at:%Y-%m-%d %H:%M:%S} UTC, lease until {row.expires_at:%H:%M:%S} UTC)"
        )
        left_s = max(1, math.ceil((row.expires_at - self._db.now()).total_seconds()))  # when it could next be free
        return LeaseHeldError(_held_text(self.kb_id, holder), kb_id=self.kb_id, retry_after_s=float(left_s))


def _abandon_pending(conn: Connection, kb_id: str) -> int:
    """Retires every pending version of ``kb_id`` in the transaction that takes its lease over from a holder
    that may still run: that holder may yet write to any of them (a call already on the wire when it was
    paused), so none is continued, and a retired version is only ever removed. Its number is never given
    again (``version_marks``), so nothing the old holder still writes can reach a version that serves."""
    pending = and_(documents.c.kb_id == kb_id, documents.c.status == PENDING)
    return int(conn.execute(update(documents).where(pending).values(status=RETIRED)).rowcount or 0)


def _held_text(kb_id: str, holder: str) -> str:
    return (
        f"knowledge base {kb_id!r} is being indexed by {holder}; "
        "wait for that run to finish (a crashed run's lease expires by itself) and run again"
    )
