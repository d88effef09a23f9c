"""Made-up inputs: files written to a folder, small documents and queries, PDFs, YAML bombs, chunk trees."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path

from strata.types import Chunk


def write_files(folder: Path, files: Mapping[str, str | bytes | None]) -> Path:
    """Writes (str/bytes) or removes (None) files under ``folder``; returns ``folder``."""
    for name, content in files.items():
        path = folder / name
        if content is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return folder


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
    return folder


RESET_QUERY = "密码重置链接的有效期、使用次数和频率限制是什么？重置邮件从哪个地址发出，会写审计日志吗？"
"""A question examples/kb's password-reset section answers (kb ``demo``)."""

GARDEN_DOC = """---
title: Garden handbook
module: garden
skill_points: [soil, watering]
---
# Garden handbook

## Watering

Tomatoes need deep watering twice a week in summer. Water the soil, not the leaves, early in the morning.

## Soil

A loamy soil with compost keeps moisture. Test the pH every spring; tomatoes like 6.2 to 6.8.
"""
"""The handbook of kb ``garden``, the tests' second knowledge base beside examples/kb's ``demo``."""

GARDEN = "# Garden\n\n## Watering\n\nTomatoes need deep watering twice a week in summer, early in the morning.\n"


# A Sphinx page whose author broke two things docutils refuses: a grid table's right border, a title that
# skips a level; and an image directive without its argument. An unclosed "*" is only a docutils warning.
BROKEN_RST = """\
Lamp room
=========

The lamp burns paraffin.

+-----------+----------------+
| Lens      | Fresnel, first |
| Period    | 30 s           |
+-----------+

Wicks
-----

Trim the wick *before dusk.

Spare wicks
~~~~~~~~~~~

Kept in the store.

Gallery
=======

.. image::

Skipped level
~~~~~~~~~~~~~

The rail is loose.
"""

# A MkDocs page with markup left open: a snippet, an admonition and a tab with nothing indented under them,
# an admonition whose title's quote is never closed, and a snippet block without its closing marker.
BROKEN_MKDOCS = """\
# Installing

--8<-- "includes/proxy.md"

!!! warning

Uninstall the old tools first.

## Platforms

=== "Linux"

Run the installer.

!!! note "Before you start
    You need Python 3.11.

## Snippets

--8<--
includes/abbreviations.md
"""

BROKEN_RST_NOTES = (
    "docutils error at line 9: Malformed table. Right border not aligned or missing. "
    "(the table's lines are indexed as text, without its borders)",
    'docutils error at line 24: Error in "image" directive: 1 argument(s) required, 0 supplied. '
    "(that markup is not indexed)",
    "docutils error at line 26: Inconsistent title style: skip from level 1 to 3. "
    "(the title is indexed as text, not as a heading)",
)
"""The notes ``BROKEN_RST`` loads with, in order."""

BROKEN_MKDOCS_NOTES = (
    "unresolved snippet 'includes/proxy.md' (--8<--): not indexed (strata reads no other file)",
    "snippet block (--8<--) is never closed: its marker and the lines after it are kept as text",
    "admonition '!!! warning' has nothing indented under it: what follows is not part of it",
    "content tab '=== \"Linux\"' has nothing indented under it: what follows is not part of it",
    "'!!! note \"Before you start' is not a marker MkDocs reads (its title has no closing quote): kept as text",
)
"""The notes ``BROKEN_MKDOCS`` loads with, in order."""


def alias_bomb(levels: int) -> str:
    """Front matter of nested YAML aliases: ``levels`` (at most 9) levels of nine references each ("billion laughs")."""
    names = "abcdefghi"[:levels]
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"{name}: &{name} [" + ",".join([f"*{below}"] * 9) + "]" for below, name in itertools.pairwise(names)]
    return "---\n" + "\n".join(lines) + "\n---\n# Bomb\n\nThe body is harmless.\n"


def pdf_bytes(pages: list[str], title: str | None = None) -> bytes:
    """A minimal valid PDF: one Helvetica text line per page, xref offsets computed."""
    page_ids = [4 + 2 * i for i in range(len(pages))]
    objects = {
        1: "<< /Type /Catalog /Pages 2 0 R >>",
        2: f"<< /Type /Pages /Kids [{' '.join(f'{i} 0 R' for i in page_ids)}] /Count {len(pages)} >>",
        3: "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    }
    for page_id, text in zip(page_ids, pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET" if text else ""
        objects[page_id] = (
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {page_id + 1} 0 R >>"
        )
        objects[page_id + 1] = f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream"
    info_id = max(objects) + 1
    objects[info_id] = f"<< /Title ({title}) >>" if title else "<< >>"
    out, offsets = bytearray(b"%PDF-1.4\n"), {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += f"{number} 0 obj\n{objects[number]}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {info_id + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offsets[n]:010d} 00000 n \n" for n in range(1, info_id + 1)).encode()
    out += f"trailer\n<< /Size {info_id + 1} /Root 1 0 R /Info {info_id} 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def make_chunks(kb: str, doc: str, version: int, n_l2: int = 2, leaves_per_l2: int = 3) -> list[Chunk]:
    root = f"{kb}:{doc}:{version}:L1"
    out = [
        Chunk(
            root,
            kb,
            doc,
            version,
            1,
            None,
            root,
            0,
            "root text",
            "H",
            0,
            100,
            child_count=n_l2,
            metadata={"module": "m"},
        )
    ]
    for j in range(n_l2):
        l2 = f"{kb}:{doc}:{version}:L2:{j}"
        out.append(Chunk(l2, kb, doc, version, 2, root, root, j, f"l2 {j}", "H > S", 0, 50, child_count=leaves_per_l2))
        for i in range(leaves_per_l2):
            leaf = f"{kb}:{doc}:{version}:L3:{j}:{i}"
            out.append(
                Chunk(
                    leaf, kb, doc, version, 3, l2, root, j * leaves_per_l2 + i, f"leaf {j}.{i} 文本", "H > S", i, i + 1
                )
            )
    return out
