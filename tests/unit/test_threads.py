"""The compute threads: every item run once, slots per thread, BLAS at one thread inside
`limit`, and products whose values do not depend on the thread count."""
import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from singa.device import threads


def blas_threads():
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_run_calls_every_item_once_with_a_slot_per_thread(n):
    seen, slots = [], {}
    lock = threading.Lock()

    def fn(i, slot):
        with lock:
            seen.append(i)
            slots.setdefault(slot, threading.get_ident())
            assert slots[slot] == threading.get_ident()     # a slot is one thread's

    with threads.limit(n):
        threads.run(fn, 17)
    assert sorted(seen) == list(range(17))
    assert set(slots) <= set(range(n))


def test_run_passes_on_an_exception():
    def fn(i, slot):
        if i == 5:
            raise ValueError("item 5")

    with threads.limit(2), pytest.raises(ValueError, match="item 5"):
        threads.run(fn, 9)


def test_limit_runs_blas_at_one_thread_and_restores_it():
    before = blas_threads()
    with threads.limit(2):
        assert set(blas_threads()) == {1}
        with threads.limit(3):
            assert set(blas_threads()) == {1}
    assert blas_threads() == before


def test_blas_threads_sets_and_restores_blas_even_after_an_error():
    before = blas_threads()
    with pytest.raises(ZeroDivisionError):
        with threads.blas_threads(2):
            assert set(blas_threads()) == {2}
            1 / 0
    assert blas_threads() == before


@pytest.mark.parametrize("shape", [(300, 200, 150), (40, 500, 900), (400, 30, 900), (3, 4, 5)])
def test_matmul_gives_the_same_bits_on_any_number_of_threads(shape):
    m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((k, m)).astype(np.float32).T     # a transposed view, as layers pass
    b = rng.standard_normal((k, n)).astype(np.float32)
    results = []
    for nthreads in (1, 2, 3):
        out = np.full((m, n), np.nan, np.float32)
        with threads.limit(nthreads):
            assert threads.matmul(a, b, out) is out
        results.append(out)
    np.testing.assert_allclose(results[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    for other in results[1:]:
        assert np.array_equal(results[0], other)


def test_scratch_makes_each_key_once():
    made = []
    scratch = threads.Scratch(lambda key: made.append(key) or np.zeros(key[1]))
    assert scratch[0, 3] is scratch[0, 3]
    scratch[1, 3]
    assert made == [(0, 3), (1, 3)]


def test_by_samples_covers_every_sample_once_in_chunks(monkeypatch):
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    y = np.zeros((10, 3, 4), np.float32)
    seen = []
    with threads.limit(2):
        threads.by_samples(lambda rows: seen.append(rows), y)
    assert len(seen) > 2
    assert sorted(i for rows in seen for i in range(10)[rows]) == list(range(10))


def test_by_samples_runs_a_small_blob_at_once_on_the_calling_thread():
    seen = []
    with threads.limit(2):
        threads.by_samples(lambda rows: seen.append((rows, threading.current_thread())),
                           np.zeros((10, 3), np.float32))
    assert seen == [(slice(0, 10), threading.current_thread())]
