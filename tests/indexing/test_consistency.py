"""The stores' consistency check (pure, with a leaf index that honours ``LeafCounter``)."""

from __future__ import annotations

from collections.abc import Sequence

from strata.indexing.chunking import chunk_id
from strata.indexing.consistency import check_leaves, probe_ids
from strata.types import DocumentVersion


def served(doc: str, version: int, leaves: int, status: str = "active") -> DocumentVersion:
    return DocumentVersion(
        kb_id="kb", doc_id=doc, version=version, source=doc, content_hash="h", status=status, leaf_count=leaves
    )


class Leaves:
    """A leaf index holding exactly ``ids``."""

    def __init__(self, ids: set[str]) -> None:
        self.ids = ids

    def count(self, kb_id: str) -> int:
        return len(self.ids)

    def present(self, kb_id: str, chunk_ids: Sequence[str]) -> set[str]:
        return self.ids & set(chunk_ids)


def leaf_ids(*versions: DocumentVersion) -> set[str]:
    return {chunk_id("kb", v.doc_id, v.version, 3, n) for v in versions for n in range(v.leaf_count)}


def test_a_collection_of_older_versions_with_as_many_leaves_is_named() -> None:
    now = [served("a.md", 2, 3), served("b.md", 5, 2), served("c.md", 1, 4)]
    older = [served("a.md", 1, 3), served("b.md", 4, 2), served("c.md", 1, 4)]
    check = check_leaves(Leaves(leaf_ids(*older)), "kb", [*now, served("a.md", 1, 3, "retired")])
    assert (check.expected, check.found, check.versions_probed, check.absent_count) == (9, 9, 3, 2)
    assert not check.consistent and check.absent == ("a.md v2", "b.md v5")
    assert "Milvus holds other versions" in check.difference() and "holds 9 leaves" not in check.difference()
    assert check_leaves(Leaves(leaf_ids(*now)), "kb", now).consistent


def test_an_empty_collection_is_a_count_and_no_talk_of_backups() -> None:
    check = check_leaves(Leaves(set()), "kb", [served("a.md", 1, 3)])
    assert (
        check.difference()
        == "Milvus holds 0 leaves where SQL serves 3; 1 of 1 served versions have no leaves in Milvus (a.md v1)"
    )


def test_at_most_the_given_number_of_versions_is_probed_spread_over_the_kb() -> None:
    versions = [served(f"d{n:04}.md", 1, 3) for n in range(2500)]
    docs = sorted({v.doc_id for v in probe_ids("kb", versions, 1000).values()})
    assert len(docs) <= 1000 and docs[0] == "d0000.md" and docs[-1] >= "d2490.md"
    assert len(probe_ids("kb", versions)) == 2 * 2500  # stats: every version, first and last leaf
    assert len(probe_ids("kb", [served("one.md", 1, 1)])) == 1  # one leaf: one id
