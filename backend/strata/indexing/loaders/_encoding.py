"""Naming the legacy encoding of a text file that is not UTF-8, for its failure reason.

strata indexes UTF-8 only and does not decode a guess: a wrong guess would
index mojibake without a word, while a failure that names the encoding (and
the ``iconv`` command that converts the file) is fixed once by the user.

The guess is a strict decode with each candidate codec, kept when at least
90% of its non-ASCII characters are ones that text in that encoding is mostly
made of: for the CJK codecs, characters in the rows of the code table that
hold punctuation, kana or Hangul and the first (most frequent) level of
ideographs; for Windows-1252, typographic punctuation and accented letters
inside words. A mis-decode lands in the other rows (GBK read as Big5 gives
second-level ideographs, Big5 read as GBK kana and Greek), so the rows tell
GB18030 from Big5 where both decode. The best candidate wins; ties go to the
first listed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

_CONFIDENT = 0.9


class _Candidate(NamedTuple):
    codec: str
    label: str  # what the failure reason calls it (also the iconv name, up to the first space)
    plausible: Callable[[str, int], bool]  # (decoded text, index of a non-ASCII character) -> typical of it


def _lead_byte_in(codec: str, leads: frozenset[int]) -> Callable[[str, int], bool]:
    def plausible(text: str, i: int) -> bool:
        encoded = text[i].encode(codec)
        return len(encoded) == 2 and encoded[0] in leads

    return plausible


def _rows(*spans: tuple[int, int]) -> frozenset[int]:
    return frozenset(b for first, last in spans for b in range(first, last + 1))


_WESTERN_PUNCTUATION = frozenset("‘’‚“”„–—…•€«»°§©®™·")


def _western(text: str, i: int) -> bool:
    if text[i] in _WESTERN_PUNCTUATION:
        return True
    if not text[i].isalpha():
        return False
    neighbours = text[max(i - 1, 0) : i] + text[i + 1 : i + 2]
    return any(c.isascii() and c.isalpha() for c in neighbours)


_CANDIDATES = (
    # EUC-KR rows: punctuation 0xA1-0xA3, Hangul syllables 0xB0-0xC8. First: its rows are a subset of GB2312's
    # level 1, so Korean text also reads as plausible GB18030, while Chinese text reaches past 0xC8.
    _Candidate("euc_kr", "EUC-KR (Korean)", _lead_byte_in("euc_kr", _rows((0xA1, 0xA3), (0xB0, 0xC8)))),
    # GB2312 rows: punctuation 0xA1-0xA3, level-1 hanzi 0xB0-0xD7
    _Candidate(
        "gb18030", "GB18030 (Simplified Chinese, GBK)", _lead_byte_in("gb18030", _rows((0xA1, 0xA3), (0xB0, 0xD7)))
    ),
    # Big5 rows: punctuation 0xA1-0xA3, level-1 hanzi 0xA4-0xC6
    _Candidate("big5", "BIG5 (Traditional Chinese)", _lead_byte_in("big5", _rows((0xA1, 0xC6)))),
    # Shift_JIS rows: punctuation and kana 0x81-0x83, level-1 kanji 0x88-0x98
    _Candidate("shift_jis", "SHIFT_JIS (Japanese)", _lead_byte_in("shift_jis", _rows((0x81, 0x83), (0x88, 0x98)))),
    _Candidate("cp1252", "WINDOWS-1252 (Western European, Latin-1)", _western),
)


def guess_encoding(raw: bytes) -> str | None:
    """The label of the legacy encoding ``raw`` most plausibly is (e.g. ``"GB18030 (Simplified Chinese, GBK)"``), or None."""
    best: tuple[float, str] | None = None
    for candidate in _CANDIDATES:
        try:
            text = raw.decode(candidate.codec)
        except UnicodeDecodeError:
            continue
        wide = [i for i, c in enumerate(text) if not c.isascii()]
        if not wide:
            continue
        share = sum(candidate.plausible(text, i) for i in wide) / len(wide)
        if share >= _CONFIDENT and (best is None or share > best[0]):
            best = (share, candidate.label)
    return best[1] if best else None
