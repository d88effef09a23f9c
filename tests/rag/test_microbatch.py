"""Micro-batching of concurrent work (query encodings, searches), with a fake that records its calls."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from strata.rag.microbatch import MicroBatcher


class RecordingEncoder:
    """Vector of a text = [len(text), its first char's code]; blocks while ``gate`` is closed."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.keys: list[object] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self._called = threading.Condition()

    def __call__(self, key: object, texts: list[str]) -> np.ndarray:
        with self._called:
            self.calls.append(list(texts))
            self.keys.append(key)
            self._called.notify_all()
        self.entered.set()
        self.gate.wait(10)
        if any(t == "bad" for t in texts):
            raise ValueError("cannot encode 'bad'")
        return np.array([[len(t), ord(t[0])] for t in texts], dtype=np.float32)

    def wait_for_calls(self, n: int, within_s: float = 10.0) -> bool:
        """Whether ``n`` calls have started (each then blocks while ``gate`` is closed), waiting up to ``within_s``."""
        with self._called:
            return self._called.wait_for(lambda: len(self.calls) >= n, timeout=within_s)


def vector(text: str) -> list[float]:
    return [float(len(text)), float(ord(text[0]))]


def test_one_caller_is_encoded_at_once_without_waiting_for_the_window() -> None:
    encoder = RecordingEncoder()
    batcher = MicroBatcher(encoder, window_s=3600.0)  # were the window applied, the result would be an hour away
    result = batcher.submit(None, ["alpha", "be"]).result(timeout=60)
    assert [v.tolist() for v in result] == [vector("alpha"), vector("be")]
    assert encoder.calls == [["alpha", "be"]]
    batcher.close()


def test_queries_arriving_while_the_encoder_is_busy_share_one_call() -> None:
    encoder = RecordingEncoder()
    batcher = MicroBatcher(encoder, window_s=0.0, max_batch=64)
    encoder.gate.clear()
    first = batcher.submit(None, ["q0"])
    second = batcher.submit(None, ["q1"])  # waits: one batch per key at a time
    assert encoder.entered.wait(5)  # the running batch is taken: what comes now queues
    waiting = [batcher.submit(None, [f"waiting {i}"]) for i in range(12)]
    encoder.gate.set()
    results = [f.result(timeout=10) for f in [first, second, *waiting]]
    assert [r[0].tolist() for r in results] == [vector(t) for t in ["q0", "q1"] + [f"waiting {i}" for i in range(12)]]
    assert len(encoder.calls) <= 3, encoder.calls  # 14 queries, at most 3 encoder calls
    assert sorted(len(c) for c in encoder.calls)[-1] >= 6


def test_a_batch_holds_at_most_max_batch_queries() -> None:
    encoder = RecordingEncoder()
    batcher = MicroBatcher(encoder, window_s=0.0, max_batch=4)
    encoder.gate.clear()
    blockers = [batcher.submit(None, ["x"]), batcher.submit(None, ["y"])]
    assert encoder.entered.wait(5)  # the running batch is taken: what comes now queues
    queued = [batcher.submit(None, [f"n{i}"]) for i in range(10)]
    encoder.gate.set()
    for future in blockers + queued:
        future.result(timeout=10)
    assert max(len(c) for c in encoder.calls) <= 4
    assert sum(len(c) for c in encoder.calls) == 12


def test_one_bad_query_fails_alone_not_the_queries_batched_with_it() -> None:
    encoder = RecordingEncoder()
    batcher = MicroBatcher(encoder, window_s=0.0)
    encoder.gate.clear()
    blockers = [batcher.submit(None, ["x"]), batcher.submit(None, ["y"])]
    assert encoder.entered.wait(5)  # the running batch is taken: what comes now queues
    good, bad, other = batcher.submit(None, ["good"]), batcher.submit(None, ["bad"]), batcher.submit(None, ["other"])
    encoder.gate.set()
    assert good.result(timeout=10)[0].tolist() == vector("good")
    assert other.result(timeout=10)[0].tolist() == vector("other")
    with pytest.raises(ValueError, match="cannot encode 'bad'"):
        bad.result(timeout=10)
    assert all(f.result(timeout=10) for f in blockers)


def test_many_threads_get_their_own_vectors() -> None:
    encoder = RecordingEncoder()
    batcher = MicroBatcher(encoder, window_s=0.002)
    texts = [f"{chr(0x4E00 + i)} query {i}" for i in range(200)]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda t: batcher.submit(None, [t]).result(timeout=30)[0].tolist(), texts))
    assert results == [vector(t) for t in texts]
    assert len(encoder.calls) < len(texts)


def test_closing_fails_what_is_still_queued_and_refuses_new_work() -> None:
    encoder = RecordingEncoder()
    batcher = MicroBatcher(encoder, window_s=0.0)
    encoder.gate.clear()
    running = batcher.submit(None, ["a"])
    assert encoder.entered.wait(5)  # the running batch is taken: what comes now queues
    queued = [batcher.submit(None, ["b"]), batcher.submit(None, ["c"])]
    batcher.close()
    for future in queued:
        with pytest.raises(RuntimeError, match="closed"):
            future.result(timeout=5)
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit(None, ["d"])
    encoder.gate.set()
    assert running.result(timeout=10)[0].tolist() == vector("a")


def test_only_requests_with_the_same_key_share_a_call() -> None:
    encoder = RecordingEncoder()
    batcher = MicroBatcher(encoder, window_s=0.0)
    encoder.gate.clear()
    blockers = [batcher.submit("x", ["x1"]), batcher.submit("y", ["y1"])]
    assert encoder.wait_for_calls(2)  # both workers are busy: what comes now queues
    dense = [batcher.submit("dense", [f"d{i}"]) for i in range(3)]
    sparse = [batcher.submit("sparse", [f"s{i}"]) for i in range(3)]
    encoder.gate.set()
    for future in blockers + dense + sparse:
        future.result(timeout=10)
    by_key = {key: texts for key, texts in zip(encoder.keys, encoder.calls) if key not in ("x", "y")}
    assert by_key == {"dense": ["d0", "d1", "d2"], "sparse": ["s0", "s1", "s2"]}


def test_a_result_count_that_does_not_match_fails_the_request() -> None:
    batcher = MicroBatcher(lambda key, items: items[:-1], window_s=0.0)
    with pytest.raises(ValueError, match="1 results for 2 items"):
        batcher.submit(None, ["a", "b"]).result(timeout=5)


def test_inline_when_idle_runs_a_lone_request_in_the_callers_thread_and_queues_the_rest() -> None:
    threads: list[str] = []
    gate, entered = threading.Event(), threading.Event()

    def run(key: object, items: list[str]) -> list[str]:
        threads.append(threading.current_thread().name)
        entered.set()
        gate.wait(10)
        return [item.upper() for item in items]

    batcher = MicroBatcher(run, window_s=0.0, inline_when_idle=True, name="search")
    with ThreadPoolExecutor(1) as pool:
        lone = pool.submit(lambda: (threading.current_thread().name, batcher.submit("k", ["a"]).result(timeout=10)))
        assert entered.wait(5)
        queued = [batcher.submit("k", [f"q{i}"]) for i in range(5)]  # the inline call is still running
        gate.set()
        caller, result = lone.result(timeout=10)
    assert result == ["A"] and threads[0] == caller
    assert [f.result(timeout=10) for f in queued] == [[f"Q{i}"] for i in range(5)]
    assert len(threads) == 2 and threads[1].startswith("search-")  # the five shared one call on a worker


def test_one_batch_per_key_at_a_time_and_other_keys_run_beside_it() -> None:
    encoder = RecordingEncoder()
    batcher = MicroBatcher(encoder, window_s=0.0)
    encoder.gate.clear()
    held = batcher.submit("slow", ["s0"])
    assert encoder.entered.wait(5)
    queued = [batcher.submit("slow", [f"s{i}"]) for i in range(1, 4)]
    other = batcher.submit("fast", ["f"])  # the second worker takes another key at once
    assert encoder.wait_for_calls(2) and not other.done()  # running beside it (the fake blocks every call)
    # the free worker passed over s1..s3, queued before "f": the same key waits for the running batch
    assert encoder.calls == [["s0"], ["f"]]
    encoder.gate.set()
    assert other.result(timeout=10)[0].tolist() == vector("f")
    assert [f.result(timeout=10)[0].tolist() for f in queued] == [vector(f"s{i}") for i in range(1, 4)]
    assert ["s1", "s2", "s3"] in encoder.calls and held.done()
