"""Build the documentation dev set (eval/docs-dev/, issue 36) from its sources.

Two steps, both reproducible:

``pages``
    Writes the page files, one Markdown file per documentation page:

    - ``eval/docs-dev/zh/pages/NAME.SECTION.md``: Chinese manual pages of
      Debian's ``manpages-zh`` (GFDL-1.2+), read from ``/usr/share/man/zh_CN/``
      (``apt-get install manpages-zh``; the set was built from 1.6.4.0-1).
      Each page is rendered by groff (``groff -k -t -Tutf8 -man``: tables by tbl, no hyphenation,
      2,000-column lines so that paragraphs stay on one line, no bold or
      underline) and turned into Markdown by ``man_to_markdown``: the page's
      sections (``.SH``, flush left in groff's output) become ``##`` headings,
      its subsections (``.SS``, indented three columns) ``###`` headings, every
      other line is kept with its indentation removed. The groff header and
      footer lines are dropped, and so are a table's ruling lines (only box-drawing
      characters); the title is ``# name(section)``.
    - ``eval/docs-dev/en/pages/PACKAGE-NAME.md``: Markdown pages of the
      ``docs/`` folder of PyPI source distributions (``click`` 8.5.1,
      BSD-3-Clause; ``attrs`` 26.1.0, MIT), fetched with
      ``pip download --no-deps --no-binary :all: PACKAGE==VERSION`` and copied
      verbatim (line endings normalised to ``\\n``).

``questions``
    Reads the hand-written questions (``eval/docs-dev/SET/questions.yaml``:
    a list of ``{page, question, answer[, after]}``; ``after`` is a string of
    the page that the answer follows, to pick one of several occurrences) and
    writes the SQuAD-style set ``eval/docs-dev/SET/docs_dev_SET.json`` that
    ``strata eval`` reads: one article per page (``id`` = the page file's
    stem, ``title`` = the page's ``#`` title), one paragraph whose ``context``
    is the whole page file, and its questions with ``answer_start``.

    Every set folder of eval/docs-dev with a ``questions.yaml`` is a set; its language is its name up to the
    first ``-`` (``zh``, ``en``, ``zh-npm``, ``en-rst``, ...). ``format: "rst"`` marks an article whose page
    is a ``.rst`` file: it is indexed as reStructuredText (``strata.evaluation.dataset.write_corpus``).

The sets after ``zh`` and ``en`` each have their own page builder,
``scripts/docs_dev_sources/<set>.py`` (``-`` written ``_``), with ``build(pages_dir, work_dir)``; their
sources, versions, digests and licences are in ``eval/docs-dev/<set>/SOURCE.md``.

    python scripts/build_docs_dev.py pages [--set NAME ...] [--sdist-dir DIR]
    python scripts/build_docs_dev.py questions [--set NAME ...]
    python scripts/check_docs_dev.py [--set NAME ...]   # the rules, see its docstring
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "docs_dev_sources"))  # the builders' shared download
from _pinned import pinned_sdist

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "eval" / "docs-dev"
MAN_ROOT = Path("/usr/share/man/zh_CN")

# (section folder, file stem): long Chinese pages with real section structure.
ZH_PAGES = [
    ("man1", "systemctl.1"),
    ("man8", "tcpdump.8"),
    ("man1", "psql.1"),
    ("man1", "ftp.1"),
    ("man1", "systemd.1"),
    ("man1", "ssh.1"),
    ("man1", "man.1"),
    ("man1", "ld.1"),
    ("man5", "proc.5"),
    ("man1", "journalctl.1"),
    ("man1", "tar.1"),
    ("man1", "grep.1"),
    ("man1", "find.1"),
    ("man1", "bzip2.1"),
    ("man1", "gzip.1"),
    ("man7", "file-hierarchy.7"),
    ("man1", "vim.1"),
    ("man7", "regex.7"),
]

# (package, version, path inside the sdist's top folder)
EN_PAGES = [
    ("click", "8.5.1", "docs/options.md"),
    ("click", "8.5.1", "docs/commands.md"),
    ("click", "8.5.1", "docs/advanced.md"),
    ("click", "8.5.1", "docs/complex.md"),
    ("click", "8.5.1", "docs/utils.md"),
    ("click", "8.5.1", "docs/commands-and-groups.md"),
    ("click", "8.5.1", "docs/faqs.md"),
    ("click", "8.5.1", "docs/shell-completion.md"),
    ("click", "8.5.1", "docs/documentation.md"),
    ("click", "8.5.1", "docs/parameter-types.md"),
    ("click", "8.5.1", "docs/testing.md"),
    ("attrs", "26.1.0", "docs/examples.md"),
    ("attrs", "26.1.0", "docs/init.md"),
    ("attrs", "26.1.0", "docs/why.md"),
    ("attrs", "26.1.0", "docs/extending.md"),
    ("attrs", "26.1.0", "docs/names.md"),
    ("attrs", "26.1.0", "docs/hashing.md"),
]

# The sdists the set was built from; a different file is refused.
SDIST_SHA256 = {
    ("click", "8.5.1"): "9bbfada76703fd1d784b83eea012e3e8c6a001a876543ef104fa56aaaeb072b4",
    ("attrs", "26.1.0"): "d03ceb89cb322a8fd706d4fb91940737b6642aa36998fe130a9bc96c985eff32",
}

GROFF = ["groff", "-k", "-t", "-Tutf8", "-man", "-P-cbou", "-rLL=2000n", "-rHY=0", "-rcR=1"]


_TABLE_RULE = re.compile(r"[\u2500-\u257f ]+")


def render_man(path: Path) -> str:
    """groff's plain-text rendering of a gzipped manual page."""
    source = gzip.decompress(path.read_bytes())
    result = subprocess.run(GROFF, input=source, capture_output=True, check=True, timeout=120)
    return result.stdout.decode("utf-8")


def man_to_markdown(rendered: str, title: str) -> str:
    """Markdown with the page's own sections as headings (see the module docstring)."""
    lines = [line.rstrip() for line in rendered.split("\n")]
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if filled:  # groff's running header and footer
        lines[filled[0]] = ""
        lines[filled[-1]] = ""
    out: list[str] = []
    for line in lines:
        text = line.strip()
        if not text:
            out.append("")
            continue
        if _TABLE_RULE.fullmatch(text):
            continue  # a table's ruling line (tbl's box drawing): no words, only noise for a retriever
        indent = len(line) - len(line.lstrip(" "))
        text = re.sub(r"(?<=\S) {2,}(?=\S)", " ", text)
        if indent == 0:
            out += ["", f"## {text}", ""]
        elif indent == 3:
            out += ["", f"### {text}", ""]
        else:
            if text.startswith("#"):
                text = "\\" + text  # a shell comment or prompt, not a heading
            out.append(text)
    body = re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()
    return f"# {title}\n\n{body}\n"


def build_zh() -> None:
    folder = OUT / "zh" / "pages"
    folder.mkdir(parents=True, exist_ok=True)
    for section, stem in ZH_PAGES:
        path = MAN_ROOT / section / f"{stem}.gz"
        if not path.is_file():
            sys.exit(f"{path} is missing: apt-get install manpages-zh")
        name, number = stem.rsplit(".", 1)
        markdown = man_to_markdown(render_man(path), f"{name}({number})")
        (folder / f"{stem}.md").write_text(markdown, encoding="utf-8", newline="")
        print(f"zh {stem}: {len(markdown)} characters")


def fetch_sdist(package: str, version: str, into: Path) -> Path:
    archive = f"{package}-{version}.tar.gz"
    return pinned_sdist(package, version, archive, SDIST_SHA256[(package, version)], into)


def build_en(sdist_dir: Path) -> None:
    folder = OUT / "en" / "pages"
    folder.mkdir(parents=True, exist_ok=True)
    for package, version, inner in EN_PAGES:
        archive = fetch_sdist(package, version, sdist_dir)
        with tarfile.open(archive) as tar:
            member = tar.extractfile(f"{package}-{version}/{inner}")
            assert member is not None, inner
            text = member.read().decode("utf-8").replace("\r\n", "\n")
        name = f"{package}-{Path(inner).stem}.md"
        (folder / name).write_text(text, encoding="utf-8", newline="")
        print(f"en {name}: {len(text)} characters")


def page_title(text: str, fallback: str) -> str:
    for line in text.split("\n"):
        if line.startswith("# "):
            return line[2:].strip()
    return fallback


def rst_title(text: str, fallback: str) -> str:
    """An rst page's title: its first section title, as strata's rst loader reads it."""
    from strata.indexing.loaders._rst import parse_rst

    sections = parse_rst(text.encode("utf-8")).sections
    return next((s.heading_path[0] for s in sections if s.heading_path), fallback)


def sets(base: Path = OUT) -> list[str]:
    """The dev set's sets: every folder of eval/docs-dev holding a questions.yaml (zh, en, zh-npm, ...)."""
    return sorted(p.parent.name for p in base.glob("*/questions.yaml"))


def language(name: str) -> str:
    """A set's language: its name up to the first ``-`` (``zh-rst`` -> ``zh``)."""
    return name.split("-", 1)[0]


def page_files(folder: Path) -> dict[str, Path]:
    """A set's page files by stem: ``pages/*.md`` and ``pages/*.rst`` (an rst page is indexed as rst)."""
    return {p.stem: p for p in sorted([*folder.glob("*.md"), *folder.glob("*.rst")])}


def build_questions(name: str) -> None:
    """The SQuAD-style file of one set from its pages and questions.yaml."""
    base = OUT / name
    files = page_files(base / "pages")
    pages = {stem: path.read_text(encoding="utf-8") for stem, path in files.items()}
    entries = yaml.safe_load((base / "questions.yaml").read_text(encoding="utf-8")) or []
    qas: dict[str, list[dict]] = {stem: [] for stem in pages}
    errors = []
    for n, entry in enumerate(entries):
        page, answer = entry["page"], str(entry["answer"])
        if page not in pages:
            errors.append(f"#{n}: no page {page!r}")
            continue
        text = pages[page]
        start = 0
        if entry.get("after"):
            anchor = text.find(str(entry["after"]))
            if anchor < 0:
                errors.append(f"#{n}: anchor {entry['after']!r} not in {page}")
                continue
            start = anchor
        position = text.find(answer, start)
        if position < 0:
            errors.append(f"#{n}: answer {answer!r} not in {page}")
            continue
        qas[page].append(
            {
                "id": f"{name}-{n:04d}",
                "question": str(entry["question"]),
                "answers": [{"text": answer, "answer_start": position}],
            }
        )
    if errors:
        sys.exit("\n".join(errors))
    data = []
    for stem, text in pages.items():
        rst = files[stem].suffix == ".rst"
        article: dict = {"title": rst_title(text, stem) if rst else page_title(text, stem), "id": stem}
        if rst:
            article["format"] = "rst"
        article["paragraphs"] = [{"id": f"{stem}_0", "context": text, "qas": qas[stem]}]
        data.append(article)
    target = base / f"docs_dev_{name}.json"
    payload = {"version": "docs-dev-1", "language": language(name), "data": data}
    target.write_text(json.dumps(payload, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{target.relative_to(ROOT)}: {len(pages)} pages, {len(entries)} questions")


def build_source_pages(name: str, work_dir: Path) -> None:
    """A newer set's pages from its own builder, ``scripts/docs_dev_sources/<name with _>.py``'s ``build``."""
    path = ROOT / "scripts" / "docs_dev_sources" / f"{name.replace('-', '_')}.py"
    spec = importlib.util.spec_from_file_location(f"docs_dev_source_{path.stem}", path)
    if spec is None or spec.loader is None or not path.is_file():
        sys.exit(f"no page builder {path.relative_to(ROOT)} for set {name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a builder's dataclasses look their module up there
    spec.loader.exec_module(module)
    folder = OUT / name / "pages"
    folder.mkdir(parents=True, exist_ok=True)
    module.build(folder, work_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    pages = sub.add_parser("pages", help="write the page files from their sources")
    pages.add_argument(
        "--sdist-dir",
        type=Path,
        default=None,
        help="folder holding (or receiving) the downloaded archives; a temporary one by default",
    )
    pages.add_argument("--set", dest="names", action="append", help="a set (zh, en, zh-npm, ...); every set by default")
    questions = sub.add_parser("questions", help="write docs_dev_SET.json from pages + questions.yaml")
    questions.add_argument("--set", dest="names", action="append", help="a set; every set by default")
    args = parser.parse_args()
    names = args.names or sets()
    if args.step == "questions":
        for name in names:
            build_questions(name)
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = args.sdist_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in names:
            if name == "zh":
                build_zh()
            elif name == "en":
                build_en(work)
            else:
                build_source_pages(name, work)


if __name__ == "__main__":
    main()
