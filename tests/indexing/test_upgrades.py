"""A release does not re-version unchanged documents, in either direction of an upgrade.

A kb of five documents is indexed in-process (Milvus Lite and SQLite under ``tmp_path``), then made to look
as another release left it: its versions hashed and its kb stamped under the signature the releases before
this one computed (the chunker's revision and the settings together), or stamped by a newer chunker
revision. One file is changed; the next run updates that one and keeps the four others, unless the
chunks a version holds are not the ones this chunker makes (then that document is written again).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from strata.config import ChunkingSettings
from strata.indexing.chunking import CHUNKER_REVISION
from strata.indexing.pipeline import Indexer
from strata.indexing.plan import index_hash
from strata.indexing.upgrades import legacy_signature, settings_signature, stamp
from strata.resources import Resources
from strata.stores.sql_schema import chunks, documents
from tests.support.stores import make_settings, opened, own_db, with_parts

pytestmark = [pytest.mark.integration, pytest.mark.cost(40)]

KB = "upgraded"
NAMES = ("a", "b", "c", "d", "e")


def _page(name: str) -> str:
    return f"---\nmodule: harbour{name}\n---\n# Doc {name}\n\nThe ferry {name} leaves at dawn.\n\n## Part\n\nMore on {name}.\n"


def _as_another_release_left_it(resources: Resources, kb_stamp: str, hash_under: str | None) -> None:
    """The kb stamped ``kb_stamp``; with ``hash_under``, every version hashed under that signature."""
    store = resources.documents
    store.kbs.set_chunking(KB, kb_stamp)
    if hash_under is None:
        return
    with store.engine.begin() as conn:
        for version in store.versions.of_kb(KB):
            raw = _raw_hash(resources, version.doc_id)
            conn.execute(
                update(documents)
                .where(documents.c.kb_id == KB, documents.c.doc_id == version.doc_id)
                .values(content_hash=index_hash(raw, hash_under))
            )


def _raw_hash(resources: Resources, doc_id: str) -> str:
    import hashlib

    return hashlib.sha256(_page(doc_id.removesuffix(".md")).encode()).hexdigest()


def _run(resources: Resources, docs: Path) -> tuple[int, int, int]:
    report = Indexer(resources).index_paths([docs], kb_id=KB)
    assert report.failed == 0, report.failures
    return report.added, report.updated, report.unchanged


@pytest.fixture
def kb(tmp_path: Path, memo_encoder: Any) -> Any:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in NAMES:
        (docs / f"{name}.md").write_text(_page(name), encoding="utf-8")
    settings = make_settings(tmp_path, own_db(tmp_path / "db"), redis_url=None)
    with opened(settings, memo_encoder) as resources:
        assert _run(resources, docs) == (5, 0, 0)
        yield resources, docs


def test_the_legacy_signature_is_the_one_earlier_releases_recorded() -> None:
    # strata.indexing.pipeline.chunking_signature(ChunkingSettings()) of the release before this one (revision 2)
    assert legacy_signature(ChunkingSettings(), 2) == "a23b3e400f44232a"


@pytest.mark.parametrize("revision", range(1, CHUNKER_REVISION + 1))
def test_a_kb_of_an_older_release_is_not_re_versioned(kb: Any, revision: int) -> None:
    resources, docs = kb
    settings = resources.settings.chunking
    old = legacy_signature(settings, revision)
    _as_another_release_left_it(resources, old, hash_under=old)
    (docs / "a.md").write_text(_page("a") + "\nThe quay was painted.\n", encoding="utf-8")
    assert _run(resources, docs) == (0, 1, 4)
    hashes = {v.doc_id: v.content_hash for v in resources.documents.versions.of_kb(KB) if v.status == "active"}
    assert hashes["b.md"] == index_hash(_raw_hash(resources, "b.md"), settings_signature(settings))  # rehashed
    assert resources.documents.kbs.get_kb(KB).chunking == stamp(settings)
    assert _run(resources, docs) == (0, 0, 5)


def test_a_kb_of_a_newer_chunker_revision_is_not_re_versioned(kb: Any) -> None:
    resources, docs = kb
    _as_another_release_left_it(resources, f"{settings_signature(resources.settings.chunking)}/r99", None)
    (docs / "c.md").write_text(_page("c") + "\nThe quay was painted.\n", encoding="utf-8")
    assert _run(resources, docs) == (0, 1, 4)
    assert resources.documents.kbs.get_kb(KB).chunking == stamp(resources.settings.chunking)


def test_a_document_whose_chunks_another_revision_cut_otherwise_is_written_again(kb: Any) -> None:
    resources, docs = kb
    old = legacy_signature(resources.settings.chunking, 1)
    _as_another_release_left_it(resources, old, hash_under=old)
    with resources.documents.engine.begin() as conn:  # the old chunker cut d.md's last leaf one character short
        leaf = conn.execute(
            chunks.select().where(chunks.c.kb_id == KB, chunks.c.doc_id == "d.md", chunks.c.level == 3)
        ).first()
        assert leaf is not None
        conn.execute(update(chunks).where(chunks.c.chunk_id == leaf.chunk_id).values(text=leaf.text[:-1]))
    assert _run(resources, docs) == (0, 1, 4)
    active = {v.doc_id: v.version for v in resources.documents.versions.of_kb(KB) if v.status == "active"}
    assert active == {"a.md": 1, "b.md": 1, "c.md": 1, "d.md": 2, "e.md": 1}


def test_changed_chunking_settings_still_re_chunk_every_document(kb: Any, tmp_path: Path, memo_encoder: Any) -> None:
    resources, docs = kb
    changed = resources.settings.model_copy(
        update={"chunking": resources.settings.chunking.model_copy(update={"contextualize": False})}
    )
    engine = with_parts(resources, settings=changed, encoder=memo_encoder)
    assert _run(engine, docs) == (0, 5, 0)
