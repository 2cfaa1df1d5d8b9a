"""open_store: SINGA's test_store cases for both backends, positions, and bad backends/paths."""
import os

import numpy as np
import pytest

from singa.errors import DataError
from singa.io import memory
from singa.io.records import Samples, decode_batch
from singa.io.store import open_store, read_batch, read_columns, read_cyclic
from singa.proto import job_pb2

FIXTURES = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "singa-0.3"))


def _write_three(backend, path):
    store = open_store(backend, path, "create")
    store.write("001", "first tuple")
    store.write("002", "second tuple")
    store.flush()
    store.write("003", "third tuple")
    store.close()


@pytest.mark.parametrize("backend, first_key", [("textfile", b"0"), ("kvfile", b"001")])
def test_singa_store_write_read_seek_to_first(tmp_path, backend, first_key):
    path = tmp_path / "store"
    open_store(backend, path, "create").close()
    open_store(backend, path, "read").close()
    _write_three(backend, path)
    store = open_store(backend, path, "read")
    assert store.read() == (first_key, b"first tuple")
    assert store.read() is not None and store.read() is not None
    assert store.read() is None
    store.seek_to_first()
    assert store.read() == (first_key, b"first tuple")
    store.close()


def test_textfile_keys_are_line_numbers_and_lines_are_raw(tmp_path):
    path = tmp_path / "data.csv"
    path.write_bytes(b"12,3.2,1,14.1\n\n2,0.2,0,1.1")
    with open_store("textfile", path) as store:
        assert list(store) == [(b"0", b"12,3.2,1,14.1"), (b"1", b""), (b"2", b"2,0.2,0,1.1")]


def test_textfile_append_adds_lines(tmp_path):
    path = tmp_path / "out.csv"
    _write_three("textfile", path)
    with open_store("textfile", path, "append") as store:
        store.write("ignored", b"fourth")
    assert path.read_bytes() == b"first tuple\nsecond tuple\nthird tuple\nfourth\n"


@pytest.mark.parametrize("backend", ["textfile", "kvfile"])
def test_seek_to_tell_restores_position_and_key(tmp_path, backend):
    path = tmp_path / "store"
    with open_store(backend, path, "create") as store:
        for i in range(6):
            store.write(b"k%d" % i, b"value %d" % i)
    with open_store(backend, path) as store:
        store.read(), store.read()
        pos = store.tell()
        rest = list(store)
        store.seek_to_first()
        store.seek(pos)
        assert list(store) == rest
        assert rest[0][1] == b"value 2"
        if backend == "textfile":
            assert rest[0][0] == b"2"


def test_kvfile_store_reads_singa_shard():
    with open_store("kvfile", f"{FIXTURES}/test-500.bin") as store:
        keys = [k for k, _ in store]
    assert keys == [b"%08d" % i for i in range(5000, 5500)]


def test_unknown_backend_is_named():
    with pytest.raises(DataError, match="'leveldb'"):
        open_store("leveldb", "x", "read")


@pytest.mark.parametrize("backend", ["textfile", "kvfile"])
def test_missing_file_in_read_mode_names_path(tmp_path, backend):
    path = tmp_path / "absent.bin"
    with pytest.raises(DataError, match=str(path)):
        open_store(backend, path, "read")


@pytest.mark.parametrize("backend", ["textfile", "kvfile"])
def test_read_batch_wraps_around_as_reading_one_at_a_time_does(tmp_path, backend):
    path = tmp_path / "store"
    _write_three(backend, path)
    with open_store(backend, path) as a, open_store(backend, path) as b:
        one_by_one = [read_cyclic(a, path, backend) for _ in range(8)]
        assert read_batch(b, 2, path, backend) + read_batch(b, 6, path, backend) == one_by_one
        assert [v for _, v in one_by_one[2:5]] == [b"third tuple", b"first tuple", b"second tuple"]
        assert b.tell() == a.tell()


@pytest.mark.parametrize("backend", ["textfile", "kvfile"])
def test_read_batch_of_an_empty_store_names_it(tmp_path, backend):
    path = tmp_path / "store"
    open_store(backend, path, "create").close()
    with open_store(backend, path) as store:
        with pytest.raises(DataError, match=f"^{path}: the {backend} store is empty$"):
            read_batch(store, 3, path, backend)


@pytest.mark.parametrize("x, y, target_dim", [
    (np.arange(7 * 6, dtype=np.float64).reshape(7, 2, 3) / 7, np.arange(7) % 3, 0),
    (np.arange(7 * 6, dtype=np.uint8).reshape(7, 6), None, 0),
    (np.arange(7 * 6, dtype=np.float32).reshape(7, 6), np.linspace(0, 1, 14).reshape(7, 2), 2)])
def test_the_memory_stores_batches_as_arrays_decode_as_its_samples_one_by_one(x, y, target_dim):
    """`read_columns` of numpy data (a `Samples` of array views, across the wrap-around too)
    gives the keys, bits, labels and targets of `read_batch`'s samples one by one."""
    path = memory.register(x, y)
    conf = job_pb2.StoreProto(target_dim=target_dim)
    whole, columns = open_store("memory", path, conf=conf), open_store("memory", path, conf=conf)
    for n in (3, 5, 9):
        keys, values = zip(*read_batch(whole, n, path, "memory"))
        keys2, samples = read_columns(columns, n, path, "memory")
        assert list(keys2) == list(keys) and isinstance(samples, Samples)
        k = max(target_dim, 1)
        want = [np.empty((n, 6), np.float32), np.empty(n, np.int32), np.empty((n, k), np.float32)]
        got = [np.empty_like(a) for a in want]
        for out, items in ((want, list(values)), (got, samples)):
            decode_batch(items, 6, keys, out[0], out[1],
                         targets_out=out[2] if target_dim else None)
        for a, b in list(zip(want, got))[:3 if target_dim else 2]:
            assert a.tobytes() == b.tobytes()
    memory.release(path)
