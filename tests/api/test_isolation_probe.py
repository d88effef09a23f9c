"""Two tenants of one ``strata serve --workers 2`` with API keys, on the milvus-lite server, at the default isolation.

Tenant A uploads a document and reads, through ``/retrieve`` with ``explain``, the BM25 and dense scores of each
of its words; tenant B then uploads, in several requests, notes holding two of A's words. A's scores, result
ids and upload report read the same as before, and no key learns from the query cache (a hit, or a shared
computation) that another key asked a query. At the default level of a service with keys (a collection per kb)
this holds on Milvus standalone too: a collection's BM25 statistics are its own (docs/deploy.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.api.shared_service import (
    READ_ALL,
    TENANT_A_READ,
    TENANT_A_WRITE,
    TENANT_B_READ,
    TENANT_B_WRITE,
    shared_service,
)
from tests.support.stores import fresh_pg_database

pytestmark = pytest.mark.slow  # strata serve --workers N in a process of its own

A_DOC = "# Field notes\n\nnightjar quenvit Contoso merger wibblefrotz\n"
WORDS = ("nightjar", "Contoso", "quenvit", "merger", "wibblefrotz")
B_UPLOADS = 4


def probe(service: Any) -> dict[str, Any]:
    """A's view of its own kb: each word's evidence ids and BM25 and dense scores."""
    seen = {}
    for word in WORDS:
        answer = service.retrieve(word, "alpha", TENANT_A_READ, explain=True, rerank=False)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["meta"]["status"] == "ok", body["meta"]
        seen[word] = [
            (d["metadata"]["chunk_id"], d["metadata"]["trace"]["sparse_score"], d["metadata"]["trace"]["dense_score"])
            for d in body["docs"]
        ]
    return seen


@pytest.mark.milvus_server
def test_another_tenants_words_change_nothing_a_tenant_sees(tmp_path: Path, milvus_server_uri: str) -> None:
    with (
        fresh_pg_database() as pg_url,
        shared_service(
            tmp_path, milvus_server_uri, pg_url, workers=2, seed=False, STRATA_RETRIEVAL__CACHE_SIZE="0"
        ) as service,
    ):
        first = service.upload("alpha", {"notes.md": A_DOC}, key=TENANT_A_WRITE)
        assert first.status_code == 200 and first.json()["failed"] == 0, first.text
        before = probe(service)
        assert all(before[w] and before[w][0][1] for w in WORDS), before  # every word found by BM25 in A's document

        for n in range(B_UPLOADS):
            memos = {
                f"memo{n}-{i}.md": f"# Memo {n}.{i}\n\nThe nightjar team met Contoso about item {n * 10 + i}.\n"
                for i in range(3)
            }
            answer = service.upload("beta", memos, key=TENANT_B_WRITE)
            assert answer.status_code == 200 and answer.json()["failed"] == 0, answer.text
        b_view = service.retrieve("nightjar Contoso", "beta", TENANT_B_READ)
        assert b_view.status_code == 200 and b_view.json()["docs"], b_view.text  # B's words are indexed and found

        assert probe(service) == before
        again = service.upload(
            "alpha", {"more.md": "# More\n\nnightjar sightings by the merger desk.\n"}, key=TENANT_A_WRITE
        )
        report = again.json()
        assert (report["added"], report["failed"], report["embeddings_reused"]) == (1, 0, 0)
        assert not any("nightjar" in note or "Contoso" in note for note in report["notes"])


@pytest.mark.milvus_server
def test_the_query_cache_never_tells_a_key_what_another_key_asked(tmp_path: Path, milvus_server_uri: str) -> None:
    with fresh_pg_database() as pg_url, shared_service(tmp_path, milvus_server_uri, pg_url, workers=1) as service:
        asked = service.retrieve("when is the Fresnel lens polished", "alpha", TENANT_A_READ)
        assert asked.status_code == 200 and asked.json()["meta"]["cache"] == "miss", asked.text
        again = service.retrieve("when is the Fresnel lens polished", "alpha", TENANT_A_READ)
        assert again.json()["meta"]["cache"] == "hit"  # the cache works, for the key that asked
        other = service.retrieve("when is the Fresnel lens polished", "alpha", READ_ALL)
        assert other.status_code == 200 and other.json()["meta"]["cache"] == "miss", other.json()["meta"]
        assert [d["metadata"]["chunk_id"] for d in other.json()["docs"]] == [
            d["metadata"]["chunk_id"] for d in asked.json()["docs"]
        ]
