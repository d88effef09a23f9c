"""Page builder of the ``zh-npm`` documentation dev set (eval/docs-dev/zh-npm/).

Source: the Chinese component documentation (``src/<component>/README_zh-CN.md``)
that ships inside the npm package ``zent`` 10.0.18 (Youzan's React UI library,
MIT, "Copyright 2016-present Youzan"). ``build`` fetches the pinned tarball with
``npm pack zent@10.0.18`` into ``work_dir``, checks its sha256 and copies each
chosen page into ``pages_dir`` as ``zent-<component>.md``, verbatim except:

- ``\\r\\n`` is written ``\\n`` (none of these pages has one);
- a page without a ``# `` title line (all but ``upload``: they open with a
  YAML front matter holding ``title`` and ``subtitle``, then a ``##``
  heading) gets a line ``# <title> <subtitle>`` built from that front
  matter and a blank line prepended; the front matter itself is kept as it
  is. ``upload`` has its own ``# Upload 文件上传`` and is copied unchanged.

Standard library only; deterministic.

    python scripts/docs_dev_sources/zh_npm.py      # or: python scripts/build_docs_dev.py pages --set zh-npm
"""

from __future__ import annotations

import hashlib
import pathlib
import re
import subprocess
import tarfile
import tempfile

PACKAGE = "zent"
VERSION = "10.0.18"
TARBALL = f"{PACKAGE}-{VERSION}.tgz"
SHA256 = "6a626940c414831decb8bebd652a72e0b331d563222fc3e640899ec9c8c77259"

# component folder under package/src/ -> page stem
PAGES = {
    "form": "zent-form",
    "date-picker": "zent-date-picker",
    "grid": "zent-grid",
    "cascader": "zent-cascader",
    "tabs": "zent-tabs",
    "sortable": "zent-sortable",
    "select": "zent-select",
    "transfer": "zent-transfer",
    "tree": "zent-tree",
    "popover": "zent-popover",
    "input": "zent-input",
    "upload": "zent-upload",
}

_FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.S)


def fetch(work_dir: pathlib.Path) -> pathlib.Path:
    """The pinned tarball in work_dir (``npm pack`` unless already there), its sha256 checked."""
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / TARBALL
    if not path.is_file():
        subprocess.run(
            ["npm", "pack", "--loglevel=error", f"{PACKAGE}@{VERSION}", "--pack-destination", str(work_dir)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SHA256:
        raise SystemExit(f"{path}: sha256 {digest}, expected {SHA256}")
    return path


def title_of(text: str, fallback: str) -> str:
    """``title subtitle`` from the page's front matter (zent's pages carry no ``# `` line)."""
    match = _FRONT_MATTER.match(text)
    fields: dict[str, str] = {}
    if match:
        for line in match.group(1).split("\n"):
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
    parts = [fields.get("title", fallback), fields.get("subtitle", "")]
    return " ".join(p for p in parts if p)


def build(pages_dir: pathlib.Path, work_dir: pathlib.Path) -> None:
    tarball = fetch(work_dir)
    pages_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, "r:gz") as tar:
        for component, stem in PAGES.items():
            member = tar.extractfile(f"package/src/{component}/README_zh-CN.md")
            assert member is not None, component
            text = member.read().decode("utf-8").replace("\r\n", "\n")
            if not any(line.startswith("# ") for line in text.split("\n")):
                # No "# " title line in the source: prepend one built from the front matter.
                text = f"# {title_of(text, component)}\n\n{text}"
            (pages_dir / f"{stem}.md").write_text(text, encoding="utf-8", newline="")
            print(f"zh-npm {stem}.md: {len(text)} characters")


if __name__ == "__main__":
    root = pathlib.Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        build(root / "eval" / "docs-dev" / "zh-npm" / "pages", pathlib.Path(tmp))
