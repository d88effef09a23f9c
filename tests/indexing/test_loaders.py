"""Loaders: each format from small files, normalization, and the errors a user sees."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import docx
import pytest
from pypdf import PdfReader, PdfWriter

from strata.errors import LoaderError
from strata.indexing.loaders import (
    SUPPORTED_SUFFIXES,
    is_supported,
    iter_source_files,
    load_document,
    normalize_text,
)
from tests.support.documents import pdf_bytes


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return path


# --- Markdown -----------------------------------------------------------------

AUTH_MD = """---
doc_id: auth-guide
title: 用户认证指南
module: auth
skill_points: 登录
score_points: [3, 密码重置]
updated: 2024-05-01
---
本文描述认证。

# 用户认证

## 功能规范

### 1. 登录流程

用户输入邮箱和密码。

```bash
# not a heading
```

### 2. 密码重置

Reset links expire after 30 minutes.

## 安全

两步验证。
"""


def test_markdown_front_matter_goes_to_metadata(tmp_path: Path) -> None:
    doc = load_document(_write(tmp_path / "docs" / "auth.md", AUTH_MD), root=tmp_path)
    assert doc.doc_id == "auth-guide"
    assert doc.source == "docs/auth.md"
    assert doc.metadata["module"] == "auth"
    assert doc.metadata["skill_points"] == ["登录"]
    assert doc.metadata["score_points"] == ["3", "密码重置"]
    assert doc.metadata["updated"] == "2024-05-01"
    assert doc.content_hash == hashlib.sha256((tmp_path / "docs" / "auth.md").read_bytes()).hexdigest()


def test_markdown_body_is_kept_as_written(tmp_path: Path) -> None:
    doc = load_document(_write(tmp_path / "auth.md", AUTH_MD))
    assert doc.text.startswith("本文描述认证。\n\n# 用户认证\n\n## 功能规范")
    assert "doc_id" not in doc.text
    assert "# not a heading" in doc.text


def test_markdown_heading_paths_and_tiling(tmp_path: Path) -> None:
    doc = load_document(_write(tmp_path / "auth.md", AUTH_MD))
    assert [s.heading_path for s in doc.sections] == [
        ("用户认证指南",),
        ("用户认证",),
        ("用户认证", "功能规范"),
        ("用户认证", "功能规范", "1. 登录流程"),
        ("用户认证", "功能规范", "2. 密码重置"),
        ("用户认证", "安全"),
    ]
    assert doc.sections[0].start == 0 and doc.sections[-1].end == len(doc.text)
    assert all(a.end == b.start for a, b in zip(doc.sections, doc.sections[1:]))
    login = doc.sections[3]
    assert doc.text[login.start : login.end].startswith("### 1. 登录流程")
    assert "# not a heading" in doc.text[login.start : login.end]


def test_markdown_without_front_matter_uses_the_relative_path(tmp_path: Path) -> None:
    doc = load_document(_write(tmp_path / "a" / "b.markdown", "intro\n\n# Title\n\nbody"), root=tmp_path)
    assert (doc.doc_id, doc.source, dict(doc.metadata)) == ("a/b.markdown", "a/b.markdown", {})
    assert [s.heading_path for s in doc.sections] == [(), ("Title",)]


def test_malformed_front_matter_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.md", "---\ntitle: [unclosed\n---\nbody\n")
    with pytest.raises(LoaderError, match="front matter"):
        load_document(path)


def test_front_matter_only_is_empty(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match="empty file"):
        load_document(_write(tmp_path / "fm.md", "---\ntitle: x\n---\n\n  \n"))


# --- normalization -------------------------------------------------------------


def test_normalization_rules() -> None:
    raw = "  e\u0301t\u00e9\r\nline\ttab\u00a0nbsp\u3000wide   \r\r\n\n\nnext  \n"
    assert normalize_text(raw) == "\u00e9t\u00e9\nline tab nbsp wide\n\nnext"


def test_loaded_text_is_nfc(tmp_path: Path) -> None:
    decomposed = unicodedata.normalize("NFD", "Café crème, 한국어")
    doc = load_document(_write(tmp_path / "nfc.txt", decomposed))
    assert doc.text == unicodedata.normalize("NFC", decomposed)


def test_plain_text_is_one_section_without_heading(tmp_path: Path) -> None:
    doc = load_document(_write(tmp_path / "notes.txt", "first paragraph\n\n\n\nsecond paragraph\n"))
    assert doc.text == "first paragraph\n\nsecond paragraph"
    assert [(s.heading_path, s.start, s.end) for s in doc.sections] == [((), 0, len(doc.text))]


def test_large_file_is_never_truncated(tmp_path: Path) -> None:
    text = "".join(f"句子{i}。" if i % 7 else f"Sentence {i}.\n" for i in range(40_000))[:200_000]
    doc = load_document(_write(tmp_path / "big.txt", text))
    assert doc.text == normalize_text(text)
    assert len(doc.text) >= 199_000


# --- HTML ----------------------------------------------------------------------


def test_html_blocks_headings_and_title(tmp_path: Path) -> None:
    html = (
        "<html><head><title>Strata  Help</title><style>p{color:red}</style></head><body>"
        "<p>Intro <b>bold</b>\n   text</p><h1>Search</h1><div>one</div><div>two</div>"
        "<h2>Filters</h2><ul><li>module</li><li>skill</li></ul><script>alert(1)</script>"
        "<h4>Small</h4><p>tail</p></body></html>"
    )
    doc = load_document(_write(tmp_path / "help.html", html))
    assert doc.metadata == {"title": "Strata Help"}
    assert doc.text == "Intro bold text\n\nSearch\n\none\ntwo\n\nFilters\n\nmodule\nskill\n\nSmall\n\ntail"
    assert [s.heading_path for s in doc.sections] == [("Strata Help",), ("Search",), ("Search", "Filters")]
    search = doc.sections[1]
    assert doc.text[search.start : search.end].startswith("Search\n")


# --- PDF -----------------------------------------------------------------------


def test_pdf_one_section_per_page(tmp_path: Path) -> None:
    path = _write(tmp_path / "manual.pdf", pdf_bytes(["First page text", "Second page text"], title="Manual"))
    doc = load_document(path)
    assert doc.text == "First page text\n\nSecond page text"
    assert [(s.heading_path, s.page) for s in doc.sections] == [(("Manual", "p. 1"), 1), (("Manual", "p. 2"), 2)]
    assert doc.metadata == {"title": "Manual", "pages": 2}


def test_pdf_pages_without_text_are_skipped_but_counted(tmp_path: Path) -> None:
    doc = load_document(_write(tmp_path / "m.pdf", pdf_bytes(["", "Only text"])))
    assert [(s.heading_path, s.page) for s in doc.sections] == [(("p. 2",), 2)]
    assert doc.metadata == {"pages": 2}


def test_scanned_pdf_has_no_text(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match="no text extracted"):
        load_document(_write(tmp_path / "scan.pdf", pdf_bytes(["", ""])))


def test_corrupt_pdf(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match="corrupt PDF"):
        load_document(_write(tmp_path / "broken.pdf", b"%PDF-1.4\nthis is not a pdf at all"))


def test_encrypted_pdf(tmp_path: Path) -> None:
    writer = PdfWriter(clone_from=PdfReader(_write(tmp_path / "plain.pdf", pdf_bytes(["secret text"]))))
    writer.encrypt(user_password="s3cret", algorithm="RC4-128")
    with open(tmp_path / "locked.pdf", "wb") as handle:
        writer.write(handle)
    with pytest.raises(LoaderError, match="corrupt PDF: encrypted"):
        load_document(tmp_path / "locked.pdf")


# --- DOCX ----------------------------------------------------------------------


def test_docx_headings_tables_and_properties(tmp_path: Path) -> None:
    document = docx.Document()
    document.core_properties.title = "运维手册"
    document.core_properties.author = "Ops Team"
    document.add_paragraph("Strata Ops", style="Title")
    document.add_paragraph("前言。")
    document.add_heading("备份", level=1)
    document.add_paragraph("每天备份一次。")
    document.add_heading("恢复", level=2)
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text = "RPO"
    table.rows[0].cells[1].text = "24h"
    document.add_heading("事故响应", level=1)
    document.add_paragraph("Page the on-call engineer.")
    document.save(tmp_path / "ops.docx")

    doc = load_document(tmp_path / "ops.docx")
    assert doc.metadata == {"title": "运维手册", "author": "Ops Team"}
    assert (
        doc.text
        == "Strata Ops\n前言。\n\n备份\n每天备份一次。\n\n恢复\nRPO\n24h\n\n事故响应\nPage the on-call engineer."
    )
    assert [s.heading_path for s in doc.sections] == [
        ("Strata Ops",),
        ("Strata Ops", "备份"),
        ("Strata Ops", "备份", "恢复"),
        ("Strata Ops", "事故响应"),
    ]


def test_corrupt_docx(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match="corrupt DOCX"):
        load_document(_write(tmp_path / "broken.docx", b"PK\x03\x04 truncated zip"))


# --- errors --------------------------------------------------------------------


def test_empty_file(tmp_path: Path) -> None:
    for name, content in (("empty.md", ""), ("blank.txt", " \n\t\r\n "), ("blank.html", "<p> </p>")):
        with pytest.raises(LoaderError, match="empty file"):
            load_document(_write(tmp_path / name, content))


@pytest.mark.parametrize("content", [b"abc\x00def", b"\xff\xfe\xfa not utf-8 \xc3\x28"])
def test_binary_file(tmp_path: Path, content: bytes) -> None:
    with pytest.raises(LoaderError, match="binary file"):
        load_document(_write(tmp_path / "blob.md", content))


def test_unsupported_suffix(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match=r"unsupported file type '\.xyz'"):
        load_document(_write(tmp_path / "data.xyz", "text"))


def test_file_outside_root(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match="outside the root"):
        load_document(_write(tmp_path / "a.txt", "x"), root=tmp_path / "elsewhere")


# --- discovery -----------------------------------------------------------------


def test_iter_source_files_walks_sorted_and_skips_hidden(tmp_path: Path) -> None:
    for name in ("b/2.md", "b/1.txt", "a.pdf", ".git/config", "b/.hidden.md", ".env", "c/data.xyz"):
        _write(tmp_path / "kb" / name, "x")
    extra = _write(tmp_path / "extra.md", "x")
    found = iter_source_files([tmp_path / "kb", extra, tmp_path / "kb" / "a.pdf"])
    assert [p.relative_to(tmp_path).as_posix() for p in found] == [
        "kb/a.pdf",
        "kb/b/1.txt",
        "kb/b/2.md",
        "kb/c/data.xyz",
        "extra.md",
    ]
    assert [is_supported(p) for p in found] == [True, True, True, False, True]


def test_iter_source_files_rejects_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match="no such file"):
        iter_source_files([tmp_path / "missing"])


def test_supported_suffixes() -> None:
    assert {".md", ".markdown", ".rst", ".txt", ".html", ".htm", ".pdf", ".docx"} == SUPPORTED_SUFFIXES
    assert is_supported(Path("READ.ME.MD"))


def test_files_parse_under_a_temporary_folder_too_long_for_a_unix_socket(tmp_path: Path) -> None:
    """Every file parses in a child of multiprocessing's forkserver, which listens on a Unix socket in a
    temporary folder: under a TMPDIR of 120 characters its address would pass Linux's 107-byte limit."""
    deep = tmp_path / ("t" * max(1, 120 - len(str(tmp_path))))
    deep.mkdir()
    (tmp_path / "doc.md").write_text("# Title\n\nA paragraph under a long temporary folder.\n", encoding="utf-8")
    script = "import sys\nfrom pathlib import Path\nfrom strata.indexing.loaders import load_document\nprint(load_document(Path(sys.argv[1])).text)\n"
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "doc.md")],
        env={**os.environ, "TMPDIR": str(deep)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert len(str(deep)) >= 120
    assert done.returncode == 0, done.stderr[-2000:]
    assert "A paragraph under a long temporary folder." in done.stdout
    assert list(deep.iterdir()) == []  # nothing of the parse was left there
