"""The hierarchical chunker: examples a reader can check by eye, then properties."""

from __future__ import annotations

import itertools
import re
from collections import defaultdict
from collections.abc import Sequence

from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from strata.config import ChunkingSettings
from strata.indexing.chunking import chunk_document, chunk_id
from strata.types import Chunk, Section, SourceDocument

DEFAULTS = ChunkingSettings()
_HEADING_LINE = re.compile(r"^(#{1,6}) (.+)$", re.MULTILINE)


def _markdown_doc(text: str, metadata: dict | None = None) -> SourceDocument:
    """A document whose sections are its ``#`` lines, as the Markdown loader makes them."""
    starts, paths, stack = [0], [()], []
    for match in _HEADING_LINE.finditer(text):
        level, title = len(match.group(1)), match.group(2).strip()
        stack = [(lv, t) for lv, t in stack if lv < level] + [(level, title)]
        starts.append(match.start())
        paths.append(tuple(t for _, t in stack))
    ends = [*starts[1:], len(text)]
    sections = tuple(Section(p, s, e) for p, s, e in zip(paths, starts, ends) if s < e)
    return SourceDocument("doc-1", "docs/doc.md", text, sections, metadata or {"module": "auth"})


def _chunk(doc: SourceDocument, chunking: ChunkingSettings = DEFAULTS) -> list[Chunk]:
    return chunk_document(doc, kb_id="kb", version=1, settings=chunking)


def _levels(chunks: Sequence[Chunk]) -> dict[int, list[Chunk]]:
    by_level: dict[int, list[Chunk]] = defaultdict(list)
    for chunk in chunks:
        by_level[chunk.level].append(chunk)
    return by_level


def _children(chunks: Sequence[Chunk]) -> dict[str, list[Chunk]]:
    children: dict[str, list[Chunk]] = defaultdict(list)
    for chunk in chunks:
        if chunk.parent_id is not None:
            children[chunk.parent_id].append(chunk)
    return children


# --- examples ------------------------------------------------------------------


def test_cmrc_shape_joins_the_title_to_the_first_paragraph() -> None:
    paragraph = "北京是中华人民共和国的首都，也是全国的政治和文化中心。" * 40
    doc = _markdown_doc(f"# 标题\n\n## 段落 1\n\n{paragraph}")
    by_level = _levels(_chunk(doc))
    assert len(by_level[1]) == 1
    l1 = by_level[1][0]
    assert l1.text.startswith("# 标题\n\n## 段落 1\n\n北京")
    assert l1.heading_path == "标题 > 段落 1"
    assert len(by_level[2]) > 1 and len(by_level[3]) > len(by_level[2])
    assert all(len(c.text) <= DEFAULTS.l3_max_chars for c in by_level[3])


def test_heading_only_sections_join_the_following_section() -> None:
    doc = _markdown_doc(
        "# 用户认证\n\n## 功能规范\n\n### 1. 登录流程\n\n用户输入邮箱和密码。\n\n### 2. 注销\n\n点击退出。"
    )
    l1s = _levels(_chunk(doc))[1]
    assert [(c.heading_path, c.text) for c in l1s] == [
        ("用户认证 > 功能规范 > 1. 登录流程", "# 用户认证\n\n## 功能规范\n\n### 1. 登录流程\n\n用户输入邮箱和密码。"),
        ("用户认证 > 功能规范 > 2. 注销", "### 2. 注销\n\n点击退出。"),
    ]


def test_a_trailing_heading_only_section_stays() -> None:
    l1s = _levels(_chunk(_markdown_doc("# A\n\ntext.\n\n# B")))[1]
    assert [(c.heading_path, c.text) for c in l1s] == [("A", "# A\n\ntext."), ("B", "# B")]


def test_l1_never_crosses_a_section_with_text() -> None:
    doc = _markdown_doc("# One\n\nalpha.\n\n# Two\n\nbeta.")
    assert [c.text for c in _levels(_chunk(doc))[1]] == ["# One\n\nalpha.", "# Two\n\nbeta."]


def test_small_parents_get_exactly_one_child_with_the_same_span() -> None:
    chunks = _chunk(_markdown_doc("# Title\n\nOne short sentence."))
    assert [(c.level, c.char_start, c.char_end, c.child_count) for c in chunks] == [
        (1, 0, 28, 1),
        (2, 0, 28, 1),
        (3, 0, 28, 0),
    ]


def test_english_sentences_split_on_punctuation_followed_by_space() -> None:
    text = "Version 1.2 is out. It fixes login; it also adds 2FA! Ready? Yes."
    chunking = ChunkingSettings(l1_max_chars=128, l2_max_chars=32, l3_max_chars=20)
    leaves = [c.text for c in _levels(_chunk(_markdown_doc(text), chunking))[3]]
    assert leaves == ["Version 1.2 is out.", "It fixes login;", "it also adds 2FA!", "Ready? Yes."]


def test_chinese_and_mixed_sentences() -> None:
    text = "登录失败五次后账号锁定。请联系 admin@strata-notes.example 解锁！Reset links expire in 30 minutes. 链接只能使用一次。"
    chunking = ChunkingSettings(l1_max_chars=128, l2_max_chars=64, l3_max_chars=40)
    leaves = [c.text for c in _levels(_chunk(_markdown_doc(text), chunking))[3]]
    assert leaves == [
        "登录失败五次后账号锁定。",
        "请联系 admin@strata-notes.example 解锁！",
        "Reset links expire in 30 minutes.",
        "链接只能使用一次。",
    ]


def test_an_overlong_sentence_is_cut_after_a_late_comma() -> None:
    text = "甲" * 15 + "，" + "乙" * 30 + "。"
    leaves = [c.text for c in _levels(_chunk(_markdown_doc(text), ChunkingSettings(l3_max_chars=20)))[3]]
    assert leaves[0] == "甲" * 15 + "，"
    assert "".join(leaves) == text
    assert all(len(leaf) <= 20 for leaf in leaves)


def test_an_overlong_word_is_cut_hard() -> None:
    leaves = [c.text for c in _levels(_chunk(_markdown_doc("x" * 50), ChunkingSettings(l3_max_chars=16)))[3]]
    assert leaves == ["x" * 16, "x" * 16, "x" * 16, "x" * 2]


def test_records_are_filled() -> None:
    doc = _markdown_doc("# 计费\n\n## 退款\n\n退款在七个工作日内到账。", metadata={"module": "billing"})
    l1, l2, l3 = _chunk(doc)
    assert (l1.parent_id, l1.root_id, l1.child_count) == (None, l1.chunk_id, 1)
    assert (l2.parent_id, l2.root_id, l3.parent_id, l3.root_id) == (l1.chunk_id, l1.chunk_id, l2.chunk_id, l1.chunk_id)
    assert l3.heading_path == "计费 > 退款"
    assert dict(l3.metadata) == {"module": "billing", "source": "docs/doc.md"}
    assert (l3.kb_id, l3.doc_id, l3.version, l3.ordinal) == ("kb", "doc-1", 1, 0)


def test_pdf_pages_reach_the_chunk_metadata() -> None:
    text = "First page.\n\nSecond page."
    sections = (Section(("p. 1",), 0, 13, page=1), Section(("p. 2",), 13, len(text), page=2))
    chunks = _chunk(SourceDocument("m.pdf", "m.pdf", text, sections, {"pages": 2}))
    assert [(c.level, c.text, c.heading_path, c.metadata["page"]) for c in chunks if c.level == 1] == [
        (1, "First page.", "p. 1", 1),
        (1, "Second page.", "p. 2", 2),
    ]


def test_empty_document_has_no_chunks() -> None:
    assert _chunk(SourceDocument("e", "e.txt", "", ())) == []
    assert _chunk(SourceDocument("e", "e.txt", " \n\n ", ())) == []


def test_chunk_ids_are_deterministic_and_field_sensitive() -> None:
    base = chunk_id("kb", "doc", 1, 3, 0)
    assert re.fullmatch(r"[0-9a-f]{32}", base)
    assert base == chunk_id("kb", "doc", 1, 3, 0)
    variants = [("kb2", "doc", 1, 3, 0), ("kb", "doc2", 1, 3, 0), ("kb", "doc", 2, 3, 0), ("kb", "doc", 1, 2, 0)]
    assert len({base, *(chunk_id(*v) for v in variants), chunk_id("kb", "doc", 1, 3, 1)}) == 6
    assert chunk_id("ab", "c", 1, 1, 0) != chunk_id("a", "bc", 1, 1, 0)


OVERLAP_TEXT = "One two. Three four. Five six. Seven eight. Nine ten."


def test_overlap_starts_at_an_earlier_sentence() -> None:
    chunking = ChunkingSettings(l1_max_chars=64, l2_max_chars=64, l3_max_chars=26, l3_overlap=12)
    leaves = [c.text for c in _levels(_chunk(_markdown_doc(OVERLAP_TEXT), chunking))[3]]
    assert leaves == [
        "One two. Three four.",
        "Three four. Five six.",
        "Five six. Seven eight.",
        "Seven eight. Nine ten.",
    ]


def test_overlap_falls_back_to_a_word_start_when_no_sentence_fits() -> None:
    chunking = ChunkingSettings(l1_max_chars=64, l2_max_chars=64, l3_max_chars=24, l3_overlap=11)
    leaves = [c.text for c in _levels(_chunk(_markdown_doc(OVERLAP_TEXT), chunking))[3]]
    assert leaves[-1] == "eight. Nine ten."  # "Seven eight." is 12 chars: longer than the overlap


def test_chunks_come_level_by_level() -> None:
    chunks = _chunk(_markdown_doc("# A\n\n" + "Sentence here. " * 300))
    assert [c.level for c in chunks] == sorted(c.level for c in chunks)


# --- properties ----------------------------------------------------------------

_CJK = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可也你"
_LATIN = "abcdefghijklmnopqrstuvwxyz0123456789ABC"
_PUNCT = "。，！？；….,!?;、 "
_words = st.one_of(
    st.text(alphabet=_CJK, min_size=1, max_size=30),
    st.text(alphabet=_LATIN, min_size=1, max_size=14),
    st.text(alphabet=_LATIN + _CJK, min_size=1, max_size=50),
)
_sentence = st.builds(
    lambda words, seps, end: "".join(w + s for w, s in zip(words, seps)) + end,
    st.lists(_words, min_size=1, max_size=8),
    st.lists(st.sampled_from([" ", "", "，", ", ", "、"]), min_size=8, max_size=8),
    st.sampled_from(["。", "！", "？", "；", "…", ".", "!", "?", ";", "", "”。", '."']),
)
_paragraph = st.builds(
    lambda sentences, seps: "".join(s + sep for s, sep in zip(sentences, seps)).strip(" "),
    st.lists(_sentence, min_size=1, max_size=10),
    st.lists(st.sampled_from([" ", "", "\n", "  "]), min_size=10, max_size=10),
)
_heading = st.builds(lambda level, title: "#" * level + " " + title, st.integers(1, 6), _words)
_block = st.one_of(_paragraph, _heading)
_markdown = st.builds(
    lambda blocks, seps, lead: lead + "".join(b + s for b, s in zip(blocks, seps)),
    st.lists(_block, min_size=1, max_size=14),
    st.lists(st.sampled_from(["\n", "\n\n", "\n\n\n", " \n\n", "\n \n"]), min_size=14, max_size=14),
    st.sampled_from(["", "\n", "  "]),
)


@st.composite
def _chunking(draw: st.DrawFn, overlap: bool) -> ChunkingSettings:
    l3 = draw(st.integers(8, 60))
    l2 = draw(st.integers(max(l3, 16), 200))
    l1 = draw(st.integers(l2, 500))
    overlaps = [draw(st.integers(0, size // 2 - 1)) if overlap else 0 for size in (l1, l2, l3)]
    return ChunkingSettings(
        l1_max_chars=l1,
        l2_max_chars=l2,
        l3_max_chars=l3,
        l1_overlap=overlaps[0],
        l2_overlap=overlaps[1],
        l3_overlap=overlaps[2],
    )


def _max_chars(chunking: ChunkingSettings, level: int) -> int:
    return getattr(chunking, f"l{level}_max_chars")


def _check_records(doc: SourceDocument, chunks: Sequence[Chunk], chunking: ChunkingSettings) -> None:
    by_id = {c.chunk_id: c for c in chunks}
    assert len(by_id) == len(chunks), "ids are unique"
    for level, level_chunks in _levels(chunks).items():
        assert [c.ordinal for c in level_chunks] == list(range(len(level_chunks)))
        for c in level_chunks:
            assert c.chunk_id == chunk_id("kb", doc.doc_id, 1, level, c.ordinal)
            assert c.text == doc.text[c.char_start : c.char_end]
            assert 0 < c.char_end - c.char_start <= _max_chars(chunking, level)
            assert not c.text[0].isspace() and not c.text[-1].isspace()
            assert c.metadata["source"] == doc.source
    for c in chunks:
        parent = by_id.get(c.parent_id) if c.parent_id else None
        if c.level == 1:
            assert c.parent_id is None and c.root_id == c.chunk_id
        else:
            assert parent is not None and parent.level == c.level - 1, "exactly one parent, one level up"
            assert parent.char_start <= c.char_start and c.char_end <= parent.char_end
            assert (c.root_id, c.heading_path) == (parent.root_id, parent.heading_path)


def _check_family(doc: SourceDocument, chunks: Sequence[Chunk], chunking: ChunkingSettings) -> None:
    children = _children(chunks)
    for parent in chunks:
        kids = children.get(parent.chunk_id, [])
        assert parent.child_count == len(kids)
        assert (len(kids) == 0) == (parent.level == 3)
        if not kids:
            continue
        assert (kids[0].char_start, kids[-1].char_end) == (parent.char_start, parent.char_end)
        overlap = getattr(chunking, f"l{kids[0].level}_overlap")
        for before, after in itertools.pairwise(kids):
            assert after.char_start > before.char_start and after.char_end > before.char_end
            if after.char_start >= before.char_end:
                assert doc.text[before.char_end : after.char_start].strip() == "", "gaps are whitespace"
            else:
                assert before.char_end - after.char_start <= overlap
        if overlap == 0:
            rebuilt = "".join(k.text + doc.text[k.char_end : n.char_start] for k, n in itertools.pairwise(kids))
            assert rebuilt + kids[-1].text == parent.text


def _check_document_cover(doc: SourceDocument, chunks: Sequence[Chunk]) -> None:
    """L1s cover every non-whitespace character and cross only heading-only sections."""
    l1s = _levels(chunks)[1]
    covered = [False] * len(doc.text)
    for c in l1s:
        covered[c.char_start : c.char_end] = [True] * (c.char_end - c.char_start)
        for section in doc.sections:
            if c.char_start < section.start < c.char_end:
                # From the start of the L1's first line: an overlapping L1 may start mid-line.
                lead = doc.text[doc.text.rfind("\n", 0, c.char_start) + 1 : section.start]
                assert all(line.startswith("#") for line in lead.split("\n") if line.strip()), lead
    assert all(covered[i] or ch.isspace() for i, ch in enumerate(doc.text))


@hypothesis_settings(max_examples=150, deadline=None)
@given(text=_markdown, chunking=_chunking(overlap=False))
def test_chunk_invariants(text: str, chunking: ChunkingSettings) -> None:
    doc = _markdown_doc(text)
    chunks = _chunk(doc, chunking)
    assert chunks == _chunk(doc, chunking), "deterministic"
    assert [c.level for c in chunks] == sorted(c.level for c in chunks)
    _check_records(doc, chunks, chunking)
    _check_family(doc, chunks, chunking)
    _check_document_cover(doc, chunks)


@hypothesis_settings(max_examples=100, deadline=None)
@given(text=_markdown, chunking=_chunking(overlap=True))
def test_chunk_invariants_with_overlap(text: str, chunking: ChunkingSettings) -> None:
    doc = _markdown_doc(text)
    chunks = _chunk(doc, chunking)
    assert chunks == _chunk(doc, chunking)
    _check_records(doc, chunks, chunking)
    _check_family(doc, chunks, chunking)
    _check_document_cover(doc, chunks)


@hypothesis_settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=_CJK + _LATIN + _PUNCT + "\n\t#", max_size=800), chunking=_chunking(overlap=True))
def test_unstructured_text_without_sections(text: str, chunking: ChunkingSettings) -> None:
    doc = SourceDocument("raw", "raw.txt", text, ())
    chunks = _chunk(doc, chunking)
    assert (chunks == []) == (text.strip() == "")
    _check_records(doc, chunks, chunking)
    _check_family(doc, chunks, chunking)
    assert all(c.heading_path == "" for c in chunks)


# --- blocks: paragraphs, code, tables and definitions stay whole where they can -------------------


def _leaves(text: str) -> list[str]:
    return [c.text for c in _chunk(_markdown_doc(text)) if c.level == 3]


def test_a_term_and_its_definition_start_a_leaf_rather_than_ending_the_previous_one() -> None:
    intro = "选项的说明如下，每个选项占一行，说明写在它的下一行，选项之间空一行。" * 2  # 66 characters
    text = (
        f"# 手册\n\n{intro}\n\n--no-wall\n在执行 halt、poweroff、reboot 动作前，不发送警告消息。\n\n"
        "--global\n表示在全局用户单元目录上操作。\n"
    )

    leaves = _leaves(text)

    assert "--no-wall\n在执行 halt、poweroff、reboot 动作前，不发送警告消息。" in leaves[1]
    assert not any(leaf.endswith("--no-wall") for leaf in leaves)


def test_a_fenced_code_block_with_blank_lines_is_one_leaf_when_it_fits() -> None:
    code = "```python\nimport strata\n\nresult = strata.retrieve_documents('q')\n```"  # 70 characters
    prose = "Call it from your own code as below; the result carries the documents and the meta record."
    leaves = _leaves(f"# Guide\n\n{prose}\n\n{code}\n\nThat is all it takes.\n")

    holding = [leaf for leaf in leaves if "strata" in leaf and "```" in leaf]
    assert len(holding) == 1 and code in holding[0]  # whole, in one leaf (with the short line after it)
    assert leaves[0].endswith(prose)  # the paragraph before it ends its own leaf


def test_a_code_block_longer_than_a_leaf_is_split_at_its_own_lines() -> None:
    lines = [f"value_{n} = compute_something_long({n}, option=True)" for n in range(8)]  # 47 characters each
    code = "```python\n" + "\n".join(lines) + "\n```"
    leaves = _leaves(f"# Guide\n\nA short opening line.\n\n{code}\n")

    body = [leaf for leaf in leaves if "value_" in leaf]
    assert len(body) > 1
    for leaf in body:  # every piece is whole lines of the block (the first after the short line before it)
        assert all(
            line in (*lines, "```python", "```", "# Guide", "A short opening line.", "") for line in leaf.splitlines()
        )


def test_a_table_that_fits_is_one_leaf() -> None:
    table = "| key | meaning |\n|---|---|\n| ttl | minutes a link lives |\n| rate | requests per hour |"
    prose = "The settings of the reset link are these, each with what it means for the user who asks."
    leaves = _leaves(f"# Settings\n\n{prose}\n\n{table}\n")

    assert table in leaves


def test_an_indented_body_after_a_blank_line_belongs_to_the_block_before_it() -> None:
    body = "Note: Keys\n\n    Keys are hashed at rest and shown once."
    prose = "Create a key for each team that reads the service, and keep it in your secret store."
    leaves = _leaves(f"# Keys\n\n{prose}\n\n{body}\n")

    assert body in leaves


def test_a_heading_line_is_not_left_alone_in_a_leaf_before_a_long_paragraph() -> None:
    paragraph = "密码重置链接的有效期为三十分钟，从邮件发出时开始计算，超过之后需要重新申请。" * 4
    leaves = _leaves(f"# 账号\n\n## 密码重置\n\n{paragraph}\n")

    assert leaves[0].startswith("# 账号\n\n## 密码重置\n\n密码重置链接")


def test_a_cmrc_paragraph_is_cut_as_before_blocks() -> None:
    """One paragraph under its heading: no block boundary inside it, so the packing is the sentence packing."""
    paragraph = "".join(f"第{n}句话讲述了一件事情，并且稍微长一点。" for n in range(30))
    chunks = _chunk(_markdown_doc(f"# 标题\n\n## 段落 1\n\n{paragraph}"))
    leaves = [c for c in chunks if c.level == 3]

    assert all(len(leaf.text) <= DEFAULTS.l3_max_chars for leaf in leaves)
    assert "".join(leaf.text.replace("\n", "") for leaf in leaves).endswith(paragraph)
    sentence = re.compile(r"[^。]*。")
    for leaf, after in itertools.pairwise(leaves[1:]):  # greedy within a parent: the next sentence did not fit
        if leaf.parent_id == after.parent_id:
            assert len(leaf.text) + len(sentence.match(after.text).group()) > DEFAULTS.l3_max_chars  # type: ignore[union-attr]
