"""Rollback-safe schema changes, on a real PostgreSQL and on SQLite.

Code that knew only the previous revision (``check_schema`` given the
migrations up to it) runs on the head schema when the newer migrations are
marked compatible with it, and is refused with one line when one is not; an
older schema is refused; ``strata db downgrade`` goes back where that loses
nothing and refuses a lossy step without ``--force``; ``strata db wait``
returns once the schema is one strata runs on; ``strata db copy`` fills a
fresh PostgreSQL database from a SQLite file.
"""

from __future__ import annotations

import hashlib
import logging
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, insert, select, text

from strata.errors import StoreError
from strata.stores import schema_version
from strata.stores.sql_schema import chunks, kb_embeddings, knowledge_bases
from tests.support.paths import REPO
from tests.support.processes import STRATA, run_strata, strata_env
from tests.support.stores import assert_kb_rows_kept, fresh_pg_database, write_kb_rows

pytestmark = [pytest.mark.integration, pytest.mark.cost(30)]

MIGRATIONS = Path(schema_version.__file__).parent / "migrations"
HEAD = schema_version.head_revision()


@pytest.fixture(params=["postgresql", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a fresh PostgreSQL one, or a SQLite file."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'strata.sqlite3'}"
        return
    with fresh_pg_database(migrate=False) as pg:
        yield pg


@pytest.fixture
def engine(url: str) -> Iterator[Engine]:
    engine = create_engine(url)
    yield engine
    engine.dispose()


def migrations_up_to(tmp_path: Path, revision: str, extra: str = "") -> str:
    """A copy of strata's migrations holding only the revisions up to ``revision`` (plus ``extra``, a further
    migration's source): what an older (or newer) strata ships."""
    location = tmp_path / f"migrations_{revision}_{hashlib.sha256(extra.encode()).hexdigest()[:6]}"
    if location.exists():
        return str(location)
    shutil.copytree(MIGRATIONS, location, ignore=shutil.ignore_patterns("__pycache__"))
    for script in (location / "versions").glob("0*.py"):
        if script.name[:4] > revision:
            script.unlink()
    if extra:
        (location / "versions" / "0099_test.py").write_text(extra)
    return str(location)


def known_up_to(tmp_path: Path, revision: str) -> ScriptDirectory:
    return ScriptDirectory(migrations_up_to(tmp_path, revision))


def upgrade_to(engine: Engine, revision: str, script_location: str | None = None) -> None:
    with engine.begin() as conn:
        config = schema_version.alembic_config(conn, *([script_location] if script_location else []))
        command.upgrade(config, revision)


def test_the_previous_revisions_code_serves_on_the_head_schema_marked_compatible(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    schema_version.upgrade(engine)
    previous = known_up_to(tmp_path, "0002")  # release N-1: 0003 is a migration it never saw

    with caplog.at_level(logging.WARNING, logger="strata.stores.schema_version"):
        schema_version.check_schema(engine, scripts=previous)
        schema_version.check_schema(engine, scripts=previous)

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"is at {HEAD}, newer than this strata (0002)" in warnings[0], warnings


def test_code_older_than_a_newer_steps_mark_is_refused_with_one_line(engine: Engine, tmp_path: Path) -> None:
    schema_version.upgrade(engine)
    with pytest.raises(StoreError) as refused:
        schema_version.check_schema(engine, scripts=known_up_to(tmp_path, "0001"))  # 0002 is a contract step

    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert message.startswith(f"database schema is at {HEAD}, newer than this strata (0001) and not compatible")
    assert "0003 is compatible only with code from 0002 on" in message and "strata db downgrade 0001" in message


NEXT_MIGRATION = '''"""A test migration after strata's head."""
import sqlalchemy as sa
from alembic import op

revision = "0099"
down_revision = "{head}"
branch_labels = None
depends_on = None
compatible_with = {mark!r}


def upgrade() -> None:
    op.create_table("strata_next_release", sa.Column("id", sa.Integer, primary_key=True))


def downgrade() -> None:
    op.drop_table("strata_next_release")
'''


def test_the_next_releases_migration_decides_by_its_mark(engine: Engine, tmp_path: Path) -> None:
    """Today's code against a database a newer strata upgraded: served when its migration marks today's head
    compatible, refused when it is a contract step."""
    contract = NEXT_MIGRATION.format(head=HEAD, mark=None)
    upgrade_to(engine, "head", migrations_up_to(tmp_path, HEAD, extra=contract))
    with pytest.raises(
        StoreError,
        match=f"at 0099, newer than this strata \\({HEAD}\\) and not compatible with it "
        "\\(0099 is compatible only with code from 0099 on\\)",
    ):
        schema_version.check_schema(engine)
    with pytest.raises(StoreError, match="not compatible"):
        schema_version.upgrade(engine)  # today's migration Job applied after the next release's: refused, untouched
    with engine.begin() as conn:
        command.downgrade(schema_version.alembic_config(conn, migrations_up_to(tmp_path, HEAD, extra=contract)), HEAD)
    schema_version.check_schema(engine)  # the step undone, its mark is gone with it

    expand = NEXT_MIGRATION.format(head=HEAD, mark=HEAD)
    upgrade_to(engine, "head", migrations_up_to(tmp_path, HEAD, extra=expand))
    schema_version.check_schema(engine)
    assert schema_version.upgrade(engine) == ("0099", "0099")  # today's Job after the next release's: nothing to do
    # 0003 keeps 0002's code running, but 0099 names only code from 0003 on: every step must accept the code
    with pytest.raises(StoreError, match=f"0099 is compatible only with code from {HEAD} on"):
        schema_version.check_schema(engine, scripts=known_up_to(tmp_path, "0002"))


def test_an_older_schema_is_refused(engine: Engine) -> None:
    upgrade_to(engine, "0002")
    with pytest.raises(StoreError, match=f"^database schema is at 0002, strata needs {HEAD}: run `strata db upgrade`$"):
        schema_version.check_schema(engine)


def test_migration_0002_pages_through_many_leaves(engine: Engine, url: str) -> None:
    """0002 reads a kb's leaves a page at a time (memory flat in the kb's size); a text two leaves share is kept
    once."""
    upgrade_to(engine, "0001")
    texts = [f"leaf {i % 1500}" for i in range(3000)]  # 1,500 texts, each twice, over several pages
    with engine.begin() as conn:
        conn.execute(insert(knowledge_bases).values(kb_id="kb", encoder="enc", dim=4, chunking="c", generation=1))
        conn.execute(
            insert(chunks),
            [
                {
                    "chunk_id": f"c{i:05d}",
                    "kb_id": "kb",
                    "doc_id": "a.md",
                    "version": 1,
                    "level": 3,
                    "parent_id": None,
                    "root_id": "r",
                    "ordinal": i,
                    "text": t,
                    "heading_path": "",
                    "char_start": 0,
                    "char_end": 1,
                    "child_count": 0,
                    "metadata": {},
                }
                for i, t in enumerate(texts)
            ],
        )
        conn.execute(
            text("INSERT INTO strata_embedding_cache (encoder, text_hash, vector) VALUES (:e, :h, :v)"),
            [{"e": "enc", "h": hashlib.sha256(t.encode()).hexdigest(), "v": bytes(8)} for t in sorted(set(texts))]
            + [{"e": "enc", "h": hashlib.sha256(b"no leaf").hexdigest(), "v": bytes(8)}],
        )
    upgrade_to(engine, "0002")
    with engine.connect() as conn:
        kept = conn.execute(select(kb_embeddings.c.text_hash)).scalars().all()
    assert len(kept) == 1500 and hashlib.sha256(b"no leaf").hexdigest() not in kept


@pytest.mark.slow
def test_db_downgrade_goes_back_where_allowed_and_refuses_a_lossy_step(url: str, tmp_path: Path) -> None:
    env = strata_env(tmp_path / "data", STRATA_DATABASE__URL=url)
    assert run_strata(["db", "upgrade"], env).returncode == 0

    refused = run_strata(["db", "downgrade"], env)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"downgrading {HEAD} to 0002 loses data (0003 drops the version marks" in refused.stderr
    assert schema_version.current_revision(create_engine(url)) == HEAD

    forced = run_strata(["db", "downgrade", "--force"], env)
    assert forced.returncode == 0 and f"downgraded from {HEAD} to 0002" in forced.stdout, forced.stderr
    write_kb_rows(url, with_vector=True)  # a row the next downgrade must keep
    back = run_strata(["db", "downgrade"], env)  # 0002 -> 0001 keeps every cached vector: no --force
    assert back.returncode == 0 and "downgraded from 0002 to 0001" in back.stdout, back.stderr

    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT encoder FROM strata_embedding_cache")).scalars().all() == ["enc"]
    assert run_strata(["db", "upgrade"], env).returncode == 0
    assert_kb_rows_kept(url, with_vector=True)
    engine.dispose()


@pytest.mark.slow
def test_db_wait_returns_at_once_on_head_and_times_out_on_an_empty_database(tmp_path: Path) -> None:
    with fresh_pg_database(migrate=False) as url:
        env = strata_env(tmp_path / "data", STRATA_DATABASE__URL=url)
        empty = run_strata(["db", "wait", "--timeout", "0.5", "--interval", "0.1"], env)
        assert empty.returncode == 1, empty.stdout + empty.stderr
        assert empty.stderr.strip().splitlines() == [
            f"strata db wait: timed out after 0.5 s: database schema is at none, strata needs {HEAD}: run `strata db "
            "upgrade`"
        ]
        assert empty.stdout.strip().splitlines() == [
            f"waiting: database schema is at none, strata needs {HEAD}: run `strata db upgrade`"
        ]

        assert run_strata(["db", "upgrade"], env).returncode == 0
        ready = run_strata(["db", "wait", "--timeout", "0"], env)
        assert (
            ready.returncode == 0 and ready.stdout.strip() == f"database schema is at {HEAD}: strata {HEAD} runs on it"
        )


@pytest.mark.slow
def test_db_wait_returns_once_another_process_upgrades(tmp_path: Path) -> None:
    with fresh_pg_database(migrate=False) as url:
        env = strata_env(tmp_path / "data", STRATA_DATABASE__URL=url)
        waiting = subprocess.Popen(
            [str(STRATA), "db", "wait", "--timeout", "120", "--interval", "0.2"],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert waiting.stdout is not None
            first = waiting.stdout.readline()  # it has seen the empty database before the upgrade starts
            assert first.startswith("waiting: database schema is at none"), first
            assert run_strata(["db", "upgrade"], env).returncode == 0
            out, err = waiting.communicate(timeout=120)
        finally:
            if waiting.poll() is None:
                waiting.kill()
        assert waiting.returncode == 0, err
        assert out.strip().splitlines() == [f"database schema is at {HEAD}: strata {HEAD} runs on it"]


@pytest.mark.slow
def test_db_wait_counts_an_unreachable_database_as_not_yet(tmp_path: Path) -> None:
    unreachable = "postgresql+psycopg://postgres@127.0.0.1:9/strata"  # the discard port: connection refused
    done = run_strata(
        ["db", "wait", "--timeout", "0.5", "--interval", "0.1"], strata_env(tmp_path, STRATA_DATABASE__URL=unreachable)
    )
    assert done.returncode == 1 and len(done.stdout.strip().splitlines()) == 1, done.stdout
    assert (
        "timed out after 0.5 s: cannot read the schema version of postgresql+psycopg://postgres@127.0.0.1:9/strata"
        in done.stderr
    )


def _documented_copy() -> list[str]:
    """The arguments of docs/deploy.md's ``strata db copy`` line (SQLite -> PostgreSQL), as written."""
    lines = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8").splitlines()
    (line,) = [line.strip() for line in lines if line.strip().startswith("strata db copy ")]
    return shlex.split(line)[1:]


@pytest.mark.slow
def test_db_copy_fills_a_fresh_postgresql_database_from_sqlite(tmp_path: Path) -> None:
    """The SQLite -> PostgreSQL move of docs/deploy.md, run as written: the target has no schema yet."""
    source = f"sqlite:///{tmp_path / 'data' / 'strata.sqlite3'}"  # the documented relative path, from tmp_path
    (tmp_path / "data").mkdir()
    schema_version.upgrade(create_engine(source))
    write_kb_rows(source, with_vector=True)
    with fresh_pg_database(migrate=False) as target:
        env = strata_env(tmp_path / "data", STRATA_DATABASE__URL=target)
        copy = [str(STRATA), *_documented_copy()]
        done = subprocess.run(copy, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "strata_chunks: 1 rows" in done.stdout and f"(schema {HEAD})" in done.stdout

        assert_kb_rows_kept(target, with_vector=True)

        again = subprocess.run(copy, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert again.returncode == 1 and "already holds rows in strata_" in again.stderr, again.stderr
