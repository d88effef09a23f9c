"""The flat hybrid baseline beside ``strata eval``: what a hand-rolled Milvus script gets.

docs/evaluation.md §6's recipe for §8's reference rows, on its own Milvus Lite file, with no strata chunking,
indexing or retrieval code (only strata's encoder, so the dense route embeds as strata does):

- corpus: the Markdown documents ``strata eval`` indexes (``strata.evaluation.dataset.write_corpus``, under
  ``OUT/flat-baseline/corpus``), read here as text, front matter stripped;
- leaves: per section (a heading line ``#``..``######`` outside code fences starts a section; heading lines
  with no text between them stay together, so the ``# title`` line belongs to the first section with its
  ``## 段落 1`` heading), split on newlines and after ``。！？；`` (punctuation kept), greedily packed in order up
  to 128 characters (a newline between packed lines counts as one character, sentences of one line joined without
  a separator), a longer sentence cut into 128-character pieces; each stored with ``text``, ``doc_id`` and
  ``paragraph_id``. The English extension of the recipe: on an English corpus sentences also end after
  ``.``, ``!`` or ``?`` followed by whitespace (joined again with one space);
- bm25: Milvus's BM25 function on the VARCHAR ``text`` field, analyzer ``{"tokenizer": "jieba"}`` on a Chinese
  corpus and the ``standard`` analyzer on an English one (Chinese when CJK characters are at least 30% of the
  corpus's letters; the script prints which), ``SPARSE_INVERTED_INDEX`` / ``BM25``;
- dense: strata's configured encoder (``passage``/``query`` encodings, as ``strata eval``'s settings build it),
  HNSW / IP, M=16, efConstruction=200, search ef=64;
- hybrid: ``hybrid_search`` over the two routes, each ``limit=--route-limit`` (20), ``RRFRanker(60)``, final
  ``limit=k`` for k = 5 and 10; the leaves are returned as they are (no merge, no rerank).

The store is ``OUT/flat-baseline/milvus.db``, reused while ``manifest.json`` beside it names the same data file
(sha256) and recipe (``--rebuild`` builds it anew). It scores the same questions as ``strata eval``
(``--sample``, seed 13) with ``strata.evaluation.metrics``, so its row stands next to ``strata eval``'s::

    strata eval DATA --modes hybrid,hybrid+merge --out OUT [--sample N]
    python scripts/bench_flat_baseline.py DATA --out OUT [--sample N]

It does not need ``OUT/index`` (only the folder). Query vectors are computed first, so its latency columns leave
out query encoding (strata's rows include it). Milvus Lite reports BM25 scores negated; RRF uses ranks only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _bench import machine, quiet_logging
from strata.config import load_settings
from strata.encoders import tune_openmp
from strata.evaluation.dataset import PARAGRAPH_HEADING, load_squad, write_corpus
from strata.evaluation.metrics import Item, QueryOutcome, markdown_table, summarize
from strata.evaluation.runner import eval_settings, sampled_queries
from strata.resources import Resources

COLLECTION = "flat_baseline"
MAX_CHARS = 128
HNSW = {"M": 16, "efConstruction": 200}
SEARCH_EF = 64
RRF_K = 60
KS = (5, 10)
JIEBA = {"tokenizer": "jieba"}
STANDARD = {"type": "standard"}
CJK_SHARE = 0.3  # a corpus at least this share of whose letters are CJK is Chinese
RECIPE_VERSION = 1  # bump when the leaves or the collection change
INSERT_BATCH = 256
ENCODE_BATCH = 64
TIMEOUT_S = 600.0  # the loaded machine: the first search also loads the collection
# Milvus Lite's gRPC server answers pymilvus's keepalive pings with GOAWAY "too_many_pings", failing the call
# in flight (strata.stores.milvus_connection does the same); loopback needs no keepalive.
GRPC_OPTIONS = {"grpc.keepalive_time_ms": 2**31 - 1, "grpc.keepalive_permit_without_calls": 0}

_HEADING = re.compile(r"#{1,6}(?:\s|$)")
_FENCE = re.compile(r"\s*(```|~~~)")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_ZH_SENTENCE_END = re.compile(r"(?<=[。！？；])")
_EN_SENTENCE_END = re.compile(r"(?<=[。！？；])|(?<=[.!?])\s+")


@dataclass(frozen=True)
class Leaf:
    text: str
    doc_id: str
    paragraph_id: str


# -- leaves -----------------------------------------------------------------------------------------------------


def strip_front_matter(text: str) -> str:
    """The document text after ``write_corpus``'s YAML front matter (``---`` … ``---``)."""
    if text.startswith("---\n"):
        end = text.find("\n---\n", 4)
        if end >= 0:
            return text[end + len("\n---\n") :]
    return text


def sections(markdown: str) -> Iterator[tuple[int, list[str]]]:
    """(1-based paragraph number, lines) per section: a heading line starts one, unless the section so far holds
    only heading lines; ``## 段落 i`` lines (``article_markdown``'s) tell the paragraph."""
    paragraph, lines, has_body, fenced = 0, [], False, False
    for line in markdown.split("\n"):
        is_heading = not fenced and _HEADING.match(line) is not None
        if _FENCE.match(line):
            fenced = not fenced
        if is_heading and has_body:
            yield max(paragraph, 1), lines
            lines, has_body = [], False
        if is_heading and line.strip() == f"## {PARAGRAPH_HEADING} {paragraph + 1}":
            paragraph += 1
        lines.append(line)
        has_body = has_body or (not is_heading and bool(line.strip()))
    if lines:
        yield max(paragraph, 1), lines


def pieces(lines: Sequence[str], english: bool) -> Iterator[tuple[str, str]]:
    """(separator before it, piece): a section's sentences, longer ones cut into ``MAX_CHARS`` pieces."""
    splitter = _EN_SENTENCE_END if english else _ZH_SENTENCE_END
    for line in lines:
        separator = "\n"
        for sentence in splitter.split(line):
            sentence = sentence.strip()
            if not sentence:
                continue
            for start in range(0, len(sentence), MAX_CHARS):
                yield separator, sentence[start : start + MAX_CHARS]
                separator = " " if english else ""


def pack(section: Sequence[str], english: bool) -> list[str]:
    """Greedy packing in order up to ``MAX_CHARS`` characters."""
    packed: list[str] = []
    current = ""
    for separator, piece in pieces(section, english):
        if current and len(current) + len(separator) + len(piece) <= MAX_CHARS:
            current += separator + piece
            continue
        if current:
            packed.append(current)
        current = piece
    if current:
        packed.append(current)
    return packed


def document_leaves(markdown: str, doc_id: str, paragraph_ids: Sequence[str], english: bool) -> list[Leaf]:
    leaves = []
    for paragraph, lines in sections(markdown):
        paragraph_id = paragraph_ids[min(paragraph, len(paragraph_ids)) - 1] if paragraph_ids else ""
        leaves.extend(Leaf(text, doc_id, paragraph_id) for text in pack(lines, english))
    return leaves


def is_chinese(texts: Sequence[str]) -> tuple[bool, float]:
    letters = sum(sum(1 for c in text if c.isalpha()) for text in texts)
    cjk = sum(len(_CJK.findall(text)) for text in texts)
    share = cjk / letters if letters else 0.0
    return share >= CJK_SHARE, share


# -- the store --------------------------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def create_collection(client: Any, analyzer: dict[str, Any], dim: int) -> None:
    from pymilvus import DataType, Function, FunctionType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=True, enable_dynamic_field=False)
    schema.add_field("id", DataType.INT64, is_primary=True)
    schema.add_field("text", DataType.VARCHAR, max_length=4096, enable_analyzer=True, analyzer_params=analyzer)
    schema.add_field("doc_id", DataType.VARCHAR, max_length=2048)
    schema.add_field("paragraph_id", DataType.VARCHAR, max_length=2048)
    schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    schema.add_field("dense", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_function(
        Function(
            name="bm25", function_type=FunctionType.BM25, input_field_names=["text"], output_field_names=["sparse"]
        )
    )
    index = client.prepare_index_params()
    index.add_index(field_name="dense", index_type="HNSW", metric_type="IP", params={"params": HNSW})
    index.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25", params={})
    client.create_collection(COLLECTION, schema=schema, index_params=index, timeout=TIMEOUT_S)


def build(client: Any, leaves: Sequence[Leaf], encoder: Any, analyzer: dict[str, Any]) -> None:
    create_collection(client, analyzer, encoder.dim)
    started = time.perf_counter()
    for start in range(0, len(leaves), INSERT_BATCH):
        batch = leaves[start : start + INSERT_BATCH]
        vectors = []
        for at in range(0, len(batch), ENCODE_BATCH):
            vectors.extend(encoder.encode_passages([leaf.text for leaf in batch[at : at + ENCODE_BATCH]]))
        rows = [
            {"text": leaf.text, "doc_id": leaf.doc_id, "paragraph_id": leaf.paragraph_id, "dense": vector.tolist()}
            for leaf, vector in zip(batch, vectors)
        ]
        client.insert(COLLECTION, rows, timeout=TIMEOUT_S)
        done = start + len(batch)
        print(
            f"  {done}/{len(leaves)} leaves encoded and inserted ({time.perf_counter() - started:.0f} s)",
            file=sys.stderr,
        )
    client.flush(COLLECTION, timeout=TIMEOUT_S)  # unflushed rows make Lite's searches slow


def count(client: Any) -> int:
    return int(client.query(COLLECTION, filter="", output_fields=["count(*)"], timeout=TIMEOUT_S)[0]["count(*)"])


# -- main -------------------------------------------------------------------------------------------------------


def flat_outcomes(
    dataset: Path, out: Path, sample: int | None, route_limit: int = 20, rebuild: bool = False
) -> tuple[list[QueryOutcome], int, str]:
    """The baseline's (outcomes, leaves, system label) on ``dataset``'s sampled questions; its store under
    ``out/flat-baseline``, reused when built from the same data file and recipe (``rebuild``: anew)."""
    from pymilvus import AnnSearchRequest, MilvusClient, RRFRanker

    home = out / "flat-baseline"
    db, manifest_path = home / "milvus.db", home / "manifest.json"
    articles, _ = load_squad(dataset)
    names = write_corpus(articles, home / "corpus")
    paragraph_ids = {a.doc_id: [p.paragraph_id for p in a.paragraphs] for a in articles}
    documents = {
        doc_id: strip_front_matter((home / "corpus" / name).read_text(encoding="utf-8"))
        for name, doc_id in names.items()
    }
    chinese, share = is_chinese(list(documents.values()))
    analyzer = JIEBA if chinese else STANDARD
    print(
        f"corpus: {len(documents)} documents, CJK {share:.1%} of letters: "
        + ("Chinese, jieba analyzer" if chinese else "English, standard analyzer, sentences also end at . ! ?")
    )
    leaves = [
        leaf
        for doc_id, text in documents.items()
        for leaf in document_leaves(text, doc_id, paragraph_ids[doc_id], not chinese)
    ]

    resources = Resources(eval_settings(load_settings(), home / "strata"))  # only its encoder: strata's, as eval's
    try:
        encoder = resources.encoder
        manifest = {
            "data_sha256": sha256(dataset),
            "recipe": {
                "version": RECIPE_VERSION,
                "max_chars": MAX_CHARS,
                "english_sentences": not chinese,
                "analyzer": analyzer,
                "encoder": encoder.name,
                "dim": encoder.dim,
                "hnsw": HNSW,
            },
        }
        built = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else None
        reuse = (
            not rebuild
            and db.exists()
            and built is not None
            and all(built.get(key) == value for key, value in manifest.items())
        )
        if not reuse:
            manifest_path.unlink(missing_ok=True)
            if db.is_dir():
                shutil.rmtree(db)
            else:
                db.unlink(missing_ok=True)
        queries, total = sampled_queries(dataset, sample)
        started = time.perf_counter()
        vectors = encoder.encode_queries([q.question for q in queries])
        print(f"{len(queries)} question vectors in {time.perf_counter() - started:.1f} s")

        client = MilvusClient(uri=str(db), dedicated=True, grpc_options=GRPC_OPTIONS)
        try:
            started = time.perf_counter()
            if reuse:
                print(f"reusing {db} (built from the same data file and recipe)")
                client.load_collection(COLLECTION, timeout=TIMEOUT_S)  # a reopened collection is not loaded
            else:
                print(f"building {db}: {len(leaves)} leaves")
                build(client, leaves, encoder, analyzer)
                client.load_collection(COLLECTION, timeout=TIMEOUT_S)
            stored = count(client)
            if stored != len(leaves):
                raise SystemExit(f"{db} holds {stored} leaves, the recipe makes {len(leaves)}: run with --rebuild")
            if not reuse:
                manifest_path.write_text(json.dumps({**manifest, "leaves": stored}, indent=2) + "\n", encoding="utf-8")
            print(f"store ready in {time.perf_counter() - started:.1f} s")

            def search(vector: Any, question: str, k: int) -> tuple[tuple[Item, ...], float]:
                requests = [
                    AnnSearchRequest([vector.tolist()], "dense", {"params": {"ef": SEARCH_EF}}, route_limit),
                    AnnSearchRequest([question], "sparse", {}, route_limit),
                ]
                started = time.perf_counter()
                hits = client.hybrid_search(
                    COLLECTION,
                    requests,
                    RRFRanker(RRF_K),
                    limit=k,
                    output_fields=["text", "doc_id", "paragraph_id"],
                    timeout=TIMEOUT_S,
                )[0]
                elapsed = (time.perf_counter() - started) * 1000
                return tuple(Item(text=h["entity"]["text"], doc_id=str(h["entity"]["doc_id"])) for h in hits), elapsed

            for query, vector in list(zip(queries, vectors))[:5]:
                search(vector, query.question, max(KS))  # warm-up
            outcomes = []
            for query, vector in zip(queries, vectors):
                (at_5, ms_5), (at_10, ms_10) = (search(vector, query.question, k) for k in KS)
                outcomes.append(QueryOutcome(query.query_id, query.doc_id, query.answers, at_5, at_10, ms_5, ms_10))
        finally:
            client.close()
    finally:
        resources.close()
    print(f"{len(queries)} of {total} questions; {len(leaves)} leaves; latency without query encoding")
    return (
        outcomes,
        len(leaves),
        f"flat hybrid (§8 recipe: {MAX_CHARS}-char leaves, hybrid_search RRF {RRF_K}, routes {route_limit})",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path, help="the SQuAD-style file `strata eval` read")
    parser.add_argument(
        "--out", type=Path, required=True, help="the `strata eval --out` folder (writes flat-baseline/)"
    )
    parser.add_argument("--sample", type=int, help="questions to sample (seed 13), as `strata eval --sample`")
    parser.add_argument("--route-limit", type=int, default=20)
    parser.add_argument("--rebuild", action="store_true", help="build the baseline's Milvus file anew")
    args = parser.parse_args()
    tune_openmp()
    quiet_logging()
    outcomes, _, system = flat_outcomes(args.dataset, args.out, args.sample, args.route_limit, args.rebuild)
    print(machine())
    print(markdown_table({system: summarize(outcomes)}))


if __name__ == "__main__":
    main()
