"""Incremental planning (pure): which documents are added, updated, skipped or deleted, and as which version."""

from __future__ import annotations

from strata.indexing.plan import Scan, index_hash, plan_changes
from strata.types import ACTIVE, PENDING, RETIRED, DocumentVersion, Section, SourceDocument

ROOT = "/data/kb"
CHUNKING = "chunking-v1"


def _doc(doc_id: str, content_hash: str) -> SourceDocument:
    text = f"text of {doc_id}"
    return SourceDocument(doc_id, doc_id, text, (Section((), 0, len(text)),), content_hash=content_hash)


def _stored(doc_id: str, version: int, content_hash: str, status: str = ACTIVE, *, root: str = ROOT) -> DocumentVersion:
    """A stored version indexed from ``content_hash`` under ``CHUNKING``."""
    return DocumentVersion("kb", doc_id, version, doc_id, index_hash(content_hash, CHUNKING), status=status, root=root)


def _scan(docs: list[SourceDocument], **fields: object) -> Scan:
    base: dict[str, object] = {"roots": {d.doc_id: ROOT for d in docs}, "complete_roots": frozenset({ROOT})}
    return Scan(tuple(docs), **{**base, **fields})  # type: ignore[arg-type]


def plan_changes_of(docs: list[SourceDocument], stored: list[DocumentVersion], **options: object):  # noqa: ANN201
    scan_fields = {k: options.pop(k) for k in ("kept", "all_complete", "complete_roots") if k in options}
    return plan_changes(_scan(docs, **scan_fields), stored, chunking=options.pop("chunking", CHUNKING), **options)


def test_first_run_writes_every_document_as_version_1() -> None:
    plan = plan_changes_of([_doc("a.md", "h1"), _doc("b.md", "h2")], [])

    assert [(p.doc.doc_id, p.version, p.previous) for p in plan.to_write] == [("a.md", 1, None), ("b.md", 1, None)]
    assert plan.unchanged == () and plan.to_delete == ()


def test_same_hash_is_unchanged_and_a_new_hash_is_the_next_version() -> None:
    stored = [_stored("same.md", 1, "h-same"), _stored("edited.md", 3, "h-old")]

    plan = plan_changes_of([_doc("same.md", "h-same"), _doc("edited.md", "h-new"), _doc("new.md", "h-n")], stored)

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

    plan = plan_changes_of([_doc("doc.md", "h-new"), _doc("orphan.md", "h7")], stored)

    by_id = {p.doc.doc_id: p for p in plan.to_write}
    assert by_id["doc.md"].version == 6 and by_id["doc.md"].previous == stored[1]
    # Only an active version with the same hash counts as indexed: a pending one is rewritten.
    assert by_id["orphan.md"].version == 8 and by_id["orphan.md"].previous is None
    assert plan.unchanged == ()


def test_missing_documents_are_deleted_only_with_delete_missing() -> None:
    stored = [_stored("kept.md", 1, "hk"), _stored("z-gone.md", 2, "hz"), _stored("a-gone.md", 1, "ha")]
    docs = [_doc("kept.md", "hk")]

    assert plan_changes_of(docs, stored).to_delete == ()

    plan = plan_changes_of(docs, stored, delete_missing=True)
    assert [(v.doc_id, v.version) for v in plan.to_delete] == [("a-gone.md", 1), ("z-gone.md", 2)]
    assert [d.doc_id for d in plan.unchanged] == ["kept.md"] and plan.to_write == ()


def test_delete_missing_ignores_versions_that_are_not_active() -> None:
    stored = [_stored("crashed.md", 1, "h", PENDING), _stored("old.md", 1, "h", RETIRED)]

    assert plan_changes_of([], stored, delete_missing=True).to_delete == ()


def test_other_chunking_rewrites_unchanged_documents_as_new_versions() -> None:
    stored = [_stored("a.md", 1, "ha"), _stored("b.md", 4, "hb")]

    plan = plan_changes_of([_doc("a.md", "ha"), _doc("b.md", "hb")], stored, chunking="chunking-v2")

    assert plan.unchanged == ()
    assert [(p.doc.doc_id, p.version, p.previous.version if p.previous else None) for p in plan.to_write] == [
        ("a.md", 2, 1),
        ("b.md", 5, 4),
    ]


def test_a_document_rechunked_before_a_failure_is_not_rechunked_again() -> None:
    """Chunking is part of each version's hash: after a partial re-chunk only the failed documents remain."""
    stored = [
        DocumentVersion("kb", "done.md", 2, "done.md", index_hash("hd", "chunking-v2"), status=ACTIVE, root=ROOT),
        _stored("failed.md", 1, "hf"),  # still under the old chunking
    ]
    plan = plan_changes_of([_doc("done.md", "hd"), _doc("failed.md", "hf")], stored, chunking="chunking-v2")

    assert [d.doc_id for d in plan.unchanged] == ["done.md"]
    assert [p.doc.doc_id for p in plan.to_write] == ["failed.md"]


def test_versions_stored_before_chunking_was_hashed_count_only_while_the_kb_stamp_matches() -> None:
    legacy = [DocumentVersion("kb", "a.md", 1, "a.md", "ha", status=ACTIVE)]  # plain content hash

    assert [d.doc_id for d in plan_changes_of([_doc("a.md", "ha")], legacy, legacy_ok=True).unchanged] == ["a.md"]
    assert [p.doc.doc_id for p in plan_changes_of([_doc("a.md", "ha")], legacy, legacy_ok=False).to_write] == ["a.md"]


def test_force_rewrites_everything() -> None:
    plan = plan_changes_of([_doc("a.md", "ha")], [_stored("a.md", 1, "ha")], force=True)
    assert [(p.doc.doc_id, p.version) for p in plan.to_write] == [("a.md", 2)]


# -- what --delete-missing may delete ------------------------------------------------------


def test_a_missing_or_unreadable_root_deletes_nothing() -> None:
    stored = [_stored("a.md", 1, "ha"), _stored("b.md", 1, "hb")]
    assert (
        plan_changes_of([], stored, delete_missing=True, all_complete=False, complete_roots=frozenset()).to_delete == ()
    )
    assert plan_changes_of([_doc("a.md", "ha")], stored, delete_missing=True, all_complete=False).to_delete == ()


def test_only_documents_of_the_roots_read_are_deleted() -> None:
    stored = [_stored("mine.md", 1, "h1"), _stored("theirs.md", 1, "h2", root="/data/other")]
    plan = plan_changes_of([], stored, delete_missing=True)
    assert [v.doc_id for v in plan.to_delete] == ["mine.md"]


def test_a_file_that_failed_to_load_keeps_its_version() -> None:
    stored = [_stored("broken.md", 1, "h1"), _stored("custom-id", 1, "h2"), _stored("gone.md", 1, "h3")]
    stored[1] = DocumentVersion("kb", "custom-id", 1, "renamed.md", "x", status=ACTIVE, root=ROOT)
    plan = plan_changes_of([], stored, delete_missing=True, kept=frozenset({"broken.md", "renamed.md"}))
    assert [v.doc_id for v in plan.to_delete] == ["gone.md"]  # kept by doc id or by source


def test_documents_without_a_recorded_root_are_in_scope_of_a_whole_folder_run() -> None:
    legacy = [DocumentVersion("kb", "old.md", 1, "old.md", "h", status=ACTIVE)]
    assert [v.doc_id for v in plan_changes_of([], legacy, delete_missing=True).to_delete] == ["old.md"]
    # a run of single files reads no folder whole: nothing is in scope
    assert plan_changes_of([], legacy, delete_missing=True, complete_roots=frozenset()).to_delete == ()


def test_an_empty_folder_plans_nothing() -> None:
    plan = plan_changes_of([], [])

    assert (plan.to_write, plan.unchanged, plan.to_delete) == ((), (), ())


def test_an_unchanged_document_found_under_another_root_is_recorded_as_moved() -> None:
    stored = [_stored("a.md", 1, "ha", root="/old/place"), _stored("b.md", 1, "hb")]
    plan = plan_changes_of([_doc("a.md", "ha"), _doc("b.md", "hb")], stored)
    assert plan.moved == {"a.md": ROOT} and len(plan.unchanged) == 2
