"""Incremental planning (pure): which documents are added, updated, skipped or deleted, and as which version."""

from __future__ import annotations

from backend.indexing.plan import plan_changes
from backend.stores.sql import ACTIVE, PENDING, RETIRED, DocumentVersion
from backend.types import Section, SourceDocument


def _doc(doc_id: str, content_hash: str) -> SourceDocument:
    text = f"text of {doc_id}"
    return SourceDocument(doc_id, doc_id, text, (Section((), 0, len(text)),), content_hash=content_hash)


def _stored(doc_id: str, version: int, content_hash: str, status: str = ACTIVE) -> DocumentVersion:
    return DocumentVersion("kb", doc_id, version, doc_id, content_hash, status=status)


def test_first_run_writes_every_document_as_version_1() -> None:
    plan = plan_changes([_doc("a.md", "h1"), _doc("b.md", "h2")], [])

    assert [(p.doc.doc_id, p.version, p.previous) for p in plan.to_write] == [("a.md", 1, None), ("b.md", 1, None)]
    assert plan.unchanged == () and plan.to_delete == ()


def test_same_hash_is_unchanged_and_a_new_hash_is_the_next_version() -> None:
    stored = [_stored("same.md", 1, "h-same"), _stored("edited.md", 3, "h-old")]

    plan = plan_changes([_doc("same.md", "h-same"), _doc("edited.md", "h-new"), _doc("new.md", "h-n")], stored)

    assert [d.doc_id for d in plan.unchanged] == ["same.md"]
    written = {p.doc.doc_id: p for p in plan.to_write}
    assert set(written) == {"edited.md", "new.md"}
    assert written["edited.md"].version == 4
    assert written["edited.md"].previous == stored[1]
    assert (written["new.md"].version, written["new.md"].previous) == (1, None)


def test_next_version_skips_every_stored_version_not_only_the_active_one() -> None:
    # Leftovers of an interrupted run (retired 2, pending 5) must not be overwritten by the new version.
    stored = [
        _stored("doc.md", 2, "h2", RETIRED),
        _stored("doc.md", 3, "h3", ACTIVE),
        _stored("doc.md", 5, "h5", PENDING),
        _stored("orphan.md", 7, "h7", PENDING),
    ]

    plan = plan_changes([_doc("doc.md", "h-new"), _doc("orphan.md", "h7")], stored)

    by_id = {p.doc.doc_id: p for p in plan.to_write}
    assert by_id["doc.md"].version == 6 and by_id["doc.md"].previous == stored[1]
    # Only an active version with the same hash counts as indexed: a pending one is rewritten.
    assert by_id["orphan.md"].version == 8 and by_id["orphan.md"].previous is None
    assert plan.unchanged == ()


def test_missing_documents_are_deleted_only_with_delete_missing() -> None:
    stored = [_stored("kept.md", 1, "hk"), _stored("z-gone.md", 2, "hz"), _stored("a-gone.md", 1, "ha")]
    docs = [_doc("kept.md", "hk")]

    assert plan_changes(docs, stored).to_delete == ()

    plan = plan_changes(docs, stored, delete_missing=True)
    assert [(v.doc_id, v.version) for v in plan.to_delete] == [("a-gone.md", 1), ("z-gone.md", 2)]
    assert [d.doc_id for d in plan.unchanged] == ["kept.md"] and plan.to_write == ()


def test_delete_missing_ignores_versions_that_are_not_active() -> None:
    stored = [_stored("crashed.md", 1, "h", PENDING), _stored("old.md", 1, "h", RETIRED)]

    assert plan_changes([], stored, delete_missing=True).to_delete == ()


def test_rechunk_rewrites_unchanged_documents_as_new_versions() -> None:
    stored = [_stored("a.md", 1, "ha"), _stored("b.md", 4, "hb")]

    plan = plan_changes([_doc("a.md", "ha"), _doc("b.md", "hb")], stored, rechunk=True)

    assert plan.unchanged == ()
    assert [(p.doc.doc_id, p.version, p.previous.version if p.previous else None) for p in plan.to_write] == [
        ("a.md", 2, 1),
        ("b.md", 5, 4),
    ]


def test_an_empty_folder_plans_nothing() -> None:
    plan = plan_changes([], [])

    assert (plan.to_write, plan.unchanged, plan.to_delete) == ((), (), ())
