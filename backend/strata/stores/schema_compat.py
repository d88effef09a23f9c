"""Which code may run on a schema: the migrations' compatibility marks, recorded in the database.

Every migration module declares ``compatible_with``: the oldest revision whose
code still runs on the schema the migration leaves (an *expand* step: it adds
a table or a nullable column, and the previous release's code never notices),
or None (a *contract* step: only code that knows this migration runs on it).
A migration whose ``downgrade()`` would lose rows says so in
``lossy_downgrade`` (one line: what it loses).

Code does not know the migrations of a newer release, so every step that
upgrades a database writes its mark into ``strata_schema_compat`` (one row per
applied revision: its parent and its mark) and every downgrade step removes its
row. Code at revision H then runs on a database at an unknown, newer revision D
when the rows lead from D back to H by their parents and every revision on the
way (D included, H excluded) names H or an older revision as compatible:
each step of the way keeps what H's code needs. A chain of expand steps inside
one release therefore all mark the previous release's head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

COMPAT_TABLE = "strata_schema_compat"

_compat = sa.Table(
    COMPAT_TABLE,
    sa.MetaData(),
    sa.Column("revision", sa.String(64), primary_key=True),
    sa.Column("down_revision", sa.String(64), comment="the revision it upgrades from; null for the baseline"),
    sa.Column(
        "compatible_with", sa.String(64), comment="oldest revision whose code runs on this schema; null: none older"
    ),
)


@dataclass(frozen=True)
class RecordedStep:
    """One applied migration as the database records it."""

    revision: str
    down_revision: str | None
    compatible_with: str | None


def compatible_with(scripts: ScriptDirectory, revision: str) -> str | None:
    """The migration's own mark (``compatible_with`` in its module; absent means None)."""
    return getattr(scripts.get_revision(revision).module, "compatible_with", None)


def lossy_downgrade(scripts: ScriptDirectory, revision: str) -> str | None:
    """What the migration's downgrade loses (``lossy_downgrade`` in its module), or None when it loses nothing."""
    return getattr(scripts.get_revision(revision).module, "lossy_downgrade", None)


def record_step(*, ctx: Any, step: Any, heads: Any, run_args: Any) -> None:
    """Alembic's ``on_version_apply`` hook: keeps ``strata_schema_compat`` in step with the version table."""
    conn: Connection = ctx.connection
    _compat.create(conn, checkfirst=True)
    if step.is_stamp:
        return
    revision = step.up_revision_id
    conn.execute(sa.delete(_compat).where(_compat.c.revision == revision))
    if step.is_upgrade:
        script = step.up_revision
        mark = getattr(script.module, "compatible_with", None)
        conn.execute(
            sa.insert(_compat).values(revision=revision, down_revision=script.down_revision, compatible_with=mark)
        )


def recorded_steps(conn: Connection) -> dict[str, RecordedStep]:
    """The marks the database holds, by revision (empty before any strata that records them upgraded it)."""
    if not sa.inspect(conn).has_table(COMPAT_TABLE):
        return {}
    rows = conn.execute(sa.select(_compat)).all()
    return {r.revision: RecordedStep(r.revision, r.down_revision, r.compatible_with) for r in rows}


def refusal(steps: dict[str, RecordedStep], current: str, head: str, known: set[str]) -> str | None:
    """Why code at ``head`` (knowing the revisions ``known``, all ancestors of ``head``) cannot run on a database
    at the newer revision ``current``; None when every recorded step from ``current`` back to ``head`` is
    compatible with ``head``'s code."""
    revision: str | None = current
    while revision != head:
        if revision is None:
            return f"its revisions do not lead back to {head}"
        step = steps.get(revision)
        if step is None:
            return f"the database records no compatibility mark for {revision}"
        if step.compatible_with is None or step.compatible_with not in known:
            return f"{step.revision} is compatible only with code from {step.compatible_with or step.revision} on"
        revision = step.down_revision
    return None
