"""Files built to hurt the indexer: YAML bombs, oversized front matter, legacy encodings, entries that are no files,
small .docx files of millions of paragraphs or hundreds of MB inflated, parses that run too long or grow too large.

Each fails its own file with a reason the user can act on; none stops the walk or costs unbounded memory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from strata.config import ChunkingSettings
from strata.errors import IndexingStoppedError, LoaderError
from strata.indexing.chunking import chunk_document
from strata.indexing.loaders import LoaderLimits, load_document, walk_folder
from strata.indexing.loaders._markdown import FRONT_MATTER_MAX_BYTES
from strata.indexing.report import IndexReport
from strata.indexing.scan import scan_paths
from tests.hostile_documents import empty_paragraphs_docx, zip_bomb_docx
from tests.support.documents import alias_bomb, pdf_bytes, write_files
from tests.support.processes import run_strata, strata_env

# The default bounds (STRATA_INDEXING__*), as the messages print them
MAX_ELEMENTS = r"STRATA_INDEXING__MAX_ELEMENTS \(100,000\)"
MAX_DECOMPRESSED = r"STRATA_INDEXING__MAX_DECOMPRESSED_BYTES \(268,435,456\)"


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def test_front_matter_aliases_are_refused_before_they_expand(tmp_path: Path) -> None:
    # Six levels expand to 9**6 strings: small enough for this process, should a regression expand them.
    path = _write(tmp_path / "bomb.md", alias_bomb(6))

    with pytest.raises(LoaderError, match=r"YAML alias \(\*a at line 3\)"):
        load_document(path)


def test_front_matter_over_the_size_limit_fails_the_file(tmp_path: Path) -> None:
    description = "word " * (FRONT_MATTER_MAX_BYTES // 5 + 100)
    path = _write(tmp_path / "big.md", f"---\ntitle: Big\ndescription: {description}\n---\n# Big\n\nBody.\n")

    with pytest.raises(LoaderError, match=f"front matter is \\d+ bytes, over the limit of {FRONT_MATTER_MAX_BYTES}"):
        load_document(path)


def test_deeply_nested_front_matter_fails_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "deep.md", "---\na: " + "[" * 5000 + "]" * 5000 + "\n---\nBody.\n")

    with pytest.raises(LoaderError, match="nested too deeply"):
        load_document(path)


def test_a_large_front_matter_field_stays_on_the_document_not_on_every_chunk(tmp_path: Path) -> None:
    description = "A very long description. " * 800  # 20 KB: within the front-matter limit
    body = "\n\n".join(f"## Part {n}\n\n" + f"Sentence {n} about tides and harbours. " * 40 for n in range(6))
    front = f"---\ntitle: Tides\nmodule: ocean\nskill_points: [tides]\ndescription: {description}\n---\n"
    doc = load_document(_write(tmp_path / "tides.md", front + "# Tides\n\n" + body), root=tmp_path)

    chunks = chunk_document(doc, kb_id="kb", version=1, settings=ChunkingSettings())

    assert doc.metadata["description"] == description.strip()
    assert len(chunks) > 3
    for chunk in chunks:
        assert "description" not in chunk.metadata
        assert {k: chunk.metadata[k] for k in ("title", "module", "skill_points", "source")} == {
            "title": "Tides",
            "module": "ocean",
            "skill_points": ["tides"],
            "source": "tides.md",
        }


@pytest.mark.parametrize(
    ("text", "codec", "named"),
    [
        ("# 安装指南\n\n运行安装程序并按照步骤操作。数据库需要先初始化，然后启动服务。\n", "gbk", "GB18030"),
        ("# 安裝指南\n\n運行安裝程序並按照步驟操作。資料庫需要先初始化，然後啟動服務。\n", "big5", "BIG5"),
        ("# インストール\n\nインストーラを実行して手順に従ってください。\n", "shift_jis", "SHIFT_JIS"),
        ("# 설치 안내\n\n설치 프로그램을 실행하고 단계를 따르십시오.\n", "euc_kr", "EUC-KR"),
        ("Café au lait, crème brûlée et naïveté.\n", "cp1252", "WINDOWS-1252"),
    ],
)
def test_a_legacy_encoding_is_named_not_called_binary(tmp_path: Path, text: str, codec: str, named: str) -> None:
    path = _write(tmp_path / "legacy.md", text.encode(codec))

    with pytest.raises(LoaderError) as failure:
        load_document(path)

    reason = str(failure.value)
    assert reason.startswith(f"not UTF-8 text: it looks like {named} ")
    assert f"iconv -f {named} -t UTF-8" in reason and "binary" not in reason


def test_bytes_that_no_encoding_explains_are_still_binary(tmp_path: Path) -> None:
    path = _write(tmp_path / "noise.txt", bytes(range(128, 256)) * 8)

    with pytest.raises(LoaderError, match=r"binary file \(not UTF-8 text\)"):
        load_document(path)


def test_the_walk_accounts_for_entries_that_are_not_files(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    _write(docs / "good.md", "# Good\n\nFine.\n")
    (docs / "gone.md").symlink_to("missing.md")
    (docs / "loop.md").symlink_to("loop.md")
    os.mkfifo(docs / "pipe.md")
    (docs / "elsewhere").symlink_to(tmp_path, target_is_directory=True)

    walk = walk_folder(docs)

    assert walk.files == [docs / "good.md"] and walk.errors == []
    assert dict(walk.unreadable) == {
        docs / "gone.md": "dangling symlink (its target missing.md does not exist)",
        docs / "loop.md": "symlink loop (it never reaches a file)",
        docs / "pipe.md": "not a regular file (a FIFO)",
    }
    assert walk.skipped == [(docs / "elsewhere", "symlink to a folder (not followed)")]


def test_unreadable_entries_are_failures_kept_from_deletion(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    _write(docs / "good.md", "# Good\n\nFine.\n")
    (docs / "sub").mkdir()
    (docs / "sub" / "gone.md").symlink_to("missing.md")
    os.mkfifo(docs / "pipe.png")  # a type strata does not index anyway: skipped with its reason, not failed
    os.mkfifo(tmp_path / "alone.md")
    report = IndexReport(kb="kb")

    scan = scan_paths([docs, tmp_path / "alone.md"], report)

    assert [d.source for d in scan.docs] == ["good.md"]
    # pipe.png is kept too: an entry that is not a file now may be a folder that is not there (an unmounted share)
    assert scan.kept == {"sub/gone.md", "pipe.png", "alone.md"} and scan.all_complete
    assert {Path(f["source"]).name: f["reason"] for f in report.failures} == {
        "gone.md": "dangling symlink (its target missing.md does not exist) (its indexed version, if any, is kept)",
        "alone.md": "not a regular file (a FIFO) (its indexed version, if any, is kept)",
    }
    assert report.skipped == [{"source": str(docs / "pipe.png"), "reason": "not a regular file (a FIFO)"}]


def test_load_document_never_blocks_on_a_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.md")  # a FIFO put in a file's place after the walk: opening it must not wait
    script = (
        "import sys\nfrom strata.errors import LoaderError\nfrom strata.indexing.loaders import load_document\n"
        "try:\n    load_document(__import__('pathlib').Path(sys.argv[1]))\nexcept LoaderError as exc:\n    print(exc)\n"
    )

    # A process of its own, with a hang guard: a blocked open() cannot be interrupted in this one.
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "pipe.md")], capture_output=True, text=True, timeout=60
    )

    assert done.stdout.strip() == "not a regular file (a FIFO)", done.stderr


# --- documents that cost far more than their size -------------------------------------------------------------------


def test_a_docx_of_two_million_empty_paragraphs_fails_with_the_count(tmp_path: Path) -> None:
    path = _write(tmp_path / "empty.docx", empty_paragraphs_docx(2_000_000))  # about 25 KB

    with pytest.raises(LoaderError, match=f"^docx has 2,000,001 paragraphs, more than {MAX_ELEMENTS}$"):
        load_document(path)


def test_a_docx_zip_bomb_fails_before_it_is_inflated(tmp_path: Path) -> None:
    path = _write(tmp_path / "bomb.docx", zip_bomb_docx(300))
    assert path.stat().st_size < 1024 * 1024

    with pytest.raises(
        LoaderError, match=f"^docx decompresses to ([0-9,]+) bytes, more than {MAX_DECOMPRESSED}$"
    ) as failed:
        load_document(path)
    inflated = re.search(r"to ([0-9,]+) bytes", str(failed.value)).group(1)  # type: ignore[union-attr]
    assert int(inflated.replace(",", "")) > 300 * 1024 * 1024


@pytest.mark.parametrize(
    ("name", "content", "counted"),
    [
        ("report.pdf", pdf_bytes(["one", "two", "three", "four"]), "PDF has 4 pages"),
        ("page.html", "<html><body>" + "<p>x</p>" * 5 + "</body></html>", "HTML has 7 tags"),
        ("notes.md", "".join(f"# Part {n}\n\nText.\n\n" for n in range(4)), "Markdown has 4 sections"),
        ("table.docx", empty_paragraphs_docx(3), "docx has 4 paragraphs"),
    ],
)
def test_every_format_counts_its_elements(tmp_path: Path, name: str, content: str | bytes, counted: str) -> None:
    path = _write(tmp_path / name, content)

    with pytest.raises(LoaderError, match=f"^{counted}, more than STRATA_INDEXING__MAX_ELEMENTS \\(3\\)$"):
        load_document(path, limits=LoaderLimits(max_elements=3))
    assert load_document(path, limits=LoaderLimits(max_elements=10)).text


def test_a_file_larger_than_the_bound_is_not_read(tmp_path: Path) -> None:
    path = _write(tmp_path / "big.txt", "word " * 1000)

    with pytest.raises(
        LoaderError, match=r"^the file is 5,000 bytes, more than STRATA_INDEXING__MAX_DECOMPRESSED_BYTES \(4,096\)$"
    ):
        load_document(path, limits=LoaderLimits(max_decompressed_bytes=4096))


def test_a_parse_running_past_its_time_is_killed(tmp_path: Path) -> None:
    # Two million paragraphs allowed: python-docx would take minutes over them
    path = _write(tmp_path / "long.docx", empty_paragraphs_docx(2_000_000))
    limits = LoaderLimits(max_elements=10_000_000, parse_timeout_s=1)

    with pytest.raises(
        LoaderError, match=r"^parsing took longer than STRATA_INDEXING__PARSE_TIMEOUT_S \(1 s\) and was stopped$"
    ):
        load_document(path, limits=limits)


def test_a_parse_growing_past_its_memory_fails_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "large.docx", empty_paragraphs_docx(2_000_000))  # an XML tree of hundreds of MB
    limits = LoaderLimits(max_elements=10_000_000, parse_max_memory_bytes=64 * 1024 * 1024)

    with pytest.raises(
        LoaderError,
        match=r"^parsing needed more memory than STRATA_INDEXING__PARSE_MAX_MEMORY_BYTES \(67,108,864 bytes\)$",
    ):
        load_document(path, limits=limits)


def test_a_stopped_run_reads_no_more_files(tmp_path: Path) -> None:
    stop = threading.Event()
    stop.set()

    with pytest.raises(IndexingStoppedError, match="shutting down"):
        load_document(_write(tmp_path / "a.docx", empty_paragraphs_docx(1)), stop=stop)


def test_strata_index_fails_the_hostile_files_with_their_reasons_and_indexes_the_rest(tmp_path: Path) -> None:
    docs = write_files(
        tmp_path / "docs",
        {
            "harbour.md": "# Harbour\n\nThe harbour gates open at dawn and close at dusk.\n",
            "empty.docx": empty_paragraphs_docx(2_000_000),
            "bomb.docx": zip_bomb_docx(300),
        },
    )

    done = run_strata(["index", str(docs), "--kb", "hostile"], strata_env(tmp_path / "data"), timeout=600)

    assert done.returncode == 1 and "1 added" in done.stdout and "2 failed" in done.stdout, done.stdout + done.stderr
    assert (
        f"FAILED {docs / 'empty.docx'}: docx has 2,000,001 paragraphs, more than STRATA_INDEXING__MAX_ELEMENTS (100,000)"
        in done.stdout
    )
    assert re.search(
        f"FAILED {re.escape(str(docs / 'bomb.docx'))}: docx decompresses to [0-9,]+ bytes, more than {MAX_DECOMPRESSED}",
        done.stdout,
    )
