"""KVFile: SINGA's byte layout and test_kvfile cases, SINGA's shards, torn and hostile files."""
import os
import struct

import pytest

from singa.errors import DataError
from singa.io.kvfile import KVFile

FIXTURES = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "singa-0.3"))
KEYS = [b"firstkey", b"secondkey", b"3key", b"key4", b"key5"]
TUPLES = [b"firsttuple", b"2th-tuple", b"thridtuple", b"tuple4", b"tuple5"]


def test_first_tuple_has_singas_exact_bytes(tmp_path):
    path = tmp_path / "kv.bin"
    with KVFile(path, "create") as f:
        assert f.insert("firstkey", "firsttuple")
    assert path.read_bytes() == bytes.fromhex(
        "0800000000000000 6669727374 6b6579 0a00000000000000 66697273747475706c65"
        .replace(" ", ""))


def test_singa_create_append_count_read(tmp_path):
    path = tmp_path / "kvfile.bin"
    f = KVFile(path, "create", capacity=50)
    for k, v in zip(KEYS[:3], TUPLES[:3]):
        assert f.insert(k, v)
    f.flush()
    f.close()
    with KVFile(path, "append", capacity=50) as f:
        assert f.insert(KEYS[3], TUPLES[3]) and f.insert(KEYS[4], TUPLES[4])
    f = KVFile(path, "read", capacity=50)
    assert f.count() == 5
    assert [f.read() for _ in range(5)] == list(zip(KEYS, TUPLES))
    assert f.read() is None
    f.seek_to_first()
    assert f.read() == (KEYS[0], TUPLES[0])
    f.close()


def test_insert_rejects_empty_value_and_append_rejects_known_key(tmp_path):
    path = tmp_path / "kv.bin"
    with KVFile(path, "create") as f:
        assert not f.insert(b"k", b"")
        assert f.insert(b"k", b"v")
        assert f.insert(b"k", b"w")  # SINGA does not track keys in create mode
    with KVFile(path, "append") as f:
        assert not f.insert(b"k", b"x")
        assert f.insert(b"j", b"x")
        assert not f.insert(b"j", b"y")
    assert list(KVFile(path)) == [(b"k", b"v"), (b"k", b"w"), (b"j", b"x")]


def test_tell_and_seek_resume_reading_mid_file(tmp_path):
    path = tmp_path / "kv.bin"
    with KVFile(path, "create", capacity=20) as f:
        for i in range(10):
            f.insert(b"%d" % i, b"v%d" % i)
    with KVFile(path) as f:
        f.read(), f.read()
        pos = f.tell()
        assert pos == 2 * (16 + 1 + 2)
        rest = list(f)
        f.seek(pos)
        assert list(f) == rest and rest[0] == (b"2", b"v2")


def test_reads_singa_mnist_shards():
    with KVFile(f"{FIXTURES}/train-1000.bin") as f:
        tuples = list(f)
        assert f.count() == 1000
    assert [k for k, _ in tuples] == [b"%08d" % i for i in range(5000, 6000)]
    assert all(len(v) == 793 and v.startswith(b"\x08\x1c\x08\x1c\x10") for _, v in tuples)
    with KVFile(f"{FIXTURES}/test-500.bin") as f:
        assert f.count() == 500


def test_read_falls_back_to_shard_folder(tmp_path):
    with KVFile(tmp_path / "shard.dat", "create") as f:
        f.insert(b"a", b"b")
    with KVFile(tmp_path) as f:
        assert f.read() == (b"a", b"b")
    with KVFile(tmp_path, "append") as f:
        f.insert(b"c", b"d")
    assert KVFile(tmp_path / "shard.dat").count() == 2


@pytest.mark.parametrize("cut, why", [(3, "3 bytes, less than a key length"),
                                      (8, "its key length 4 points past the end"),
                                      (20, "its value length 6 points past the end"),
                                      (25, "its value length 6 points past the end")])
def test_truncated_last_tuple_names_offset_and_tuples_read_and_append_cuts_it(tmp_path, cut, why):
    path = tmp_path / "kv.bin"
    with KVFile(path, "create") as f:
        f.insert(b"key1", b"value1")
        f.insert(b"key2", b"value2")
    whole = path.read_bytes()
    first = 16 + 4 + 6
    path.write_bytes(whole[:first + cut])
    with KVFile(path) as f:
        assert f.read() == (b"key1", b"value1")
        with pytest.raises(DataError) as e:
            f.read()
        assert str(e.value) == (f"{path}: the tuple at byte {first} is cut short ({why} of the "
                                f"{first + cut}-byte file); 1 whole tuple before it: truncated or corrupt")
        assert f.tell() == first
        assert f.count() == 1
    with KVFile(path, "append") as f:
        f.insert(b"key3", b"value3")
    assert list(KVFile(path)) == [(b"key1", b"value1"), (b"key3", b"value3")]


def test_value_length_past_the_end_mid_file_names_file_and_offset(tmp_path):
    path = tmp_path / "kv.bin"
    with KVFile(path, "create") as f:
        for i in range(2000):
            f.insert(b"%04d" % i, b"v" * 10)
    data = bytearray(path.read_bytes())
    tuple_bytes = 16 + 4 + 10
    at = 10 * tuple_bytes + 8 + 4                   # tuple 10's value length
    data[at:at + 8] = struct.pack("<Q", 2**40)
    path.write_bytes(bytes(data))
    with KVFile(path) as f:
        assert [f.read()[0] for _ in range(10)] == [b"%04d" % i for i in range(10)]
        with pytest.raises(DataError, match=rf"^{path}: the tuple at byte 300 is cut short \(its "
                                            rf"value length 1099511627776 points past the end of the "
                                            rf"60000-byte file\); 10 whole tuples before it"):
            f.read()


@pytest.mark.parametrize("where", ["key", "value"])
def test_hostile_length_prefix_is_an_error_not_an_allocation(tmp_path, where):
    path = tmp_path / "kv.bin"
    huge = struct.pack("<Q", 2**63 - 1)
    if where == "key":
        path.write_bytes(huge + b"abc")
    else:
        path.write_bytes(struct.pack("<Q", 1) + b"k" + huge + b"abc")
    with KVFile(path) as f:
        with pytest.raises(DataError, match=f"the tuple at byte 0 is cut short .its {where} length"):
            f.read()
        assert f.count() == 0


def test_large_tuple_beyond_capacity_is_written(tmp_path):
    path = tmp_path / "kv.bin"
    with KVFile(path, "create", capacity=16) as f:
        f.insert(b"a", b"1")
        f.insert(b"big", b"x" * 100)
        f.insert(b"b", b"2")
        assert f.tell() == 3 * 16 + 1 + 1 + 3 + 100 + 1 + 1
    assert list(KVFile(path)) == [(b"a", b"1"), (b"big", b"x" * 100), (b"b", b"2")]


def test_create_truncates_and_missing_read_names_path(tmp_path):
    path = tmp_path / "kv.bin"
    path.write_bytes(b"junk")
    KVFile(path, "create").close()
    assert os.path.getsize(path) == 0
    with pytest.raises(DataError, match=str(tmp_path / "nope.bin")):
        KVFile(tmp_path / "nope.bin")
    with pytest.raises(DataError, match="cannot open"):
        KVFile(tmp_path / "no-dir" / "kv.bin", "create")


def _numbered(path, sizes):
    """A kvfile of tuples (b"%d" % i, b"v" * size) and the byte offset where each starts."""
    offsets = [0]
    with KVFile(path, "create") as f:
        for i, size in enumerate(sizes):
            f.insert(b"%d" % i, b"v" * size)
            offsets.append(offsets[-1] + 16 + len(b"%d" % i) + size)
    return [(b"%d" % i, b"v" * size) for i, size in enumerate(sizes)], offsets


def test_read_many_cuts_tuples_across_chunks_and_tells_the_next_unconsumed(tmp_path, monkeypatch):
    monkeypatch.setattr("singa.io.kvfile.CHUNK", 40)   # tuples straddle chunks; one outgrows one
    tuples, offsets = _numbered(tmp_path / "kv.bin", [3, 30, 100, 1, 7, 25, 2])
    with KVFile(tmp_path / "kv.bin") as f:
        assert f.read_many(2) == tuples[:2] and f.tell() == offsets[2]
        assert f.read() == tuples[2] and f.tell() == offsets[3]
        assert f.read_many(10) == tuples[3:] and f.tell() == offsets[7]
        assert f.read_many(3) == [] and f.read() is None
        f.seek(offsets[4])
        assert f.read_many(2) == tuples[4:6]


def test_read_many_stops_at_a_tuple_cut_short_and_stays_there(tmp_path):
    tuples, offsets = _numbered(tmp_path / "kv.bin", [5, 5, 5])
    path = tmp_path / "kv.bin"
    path.write_bytes(path.read_bytes()[:offsets[2] + 20])
    with KVFile(path) as f:
        with pytest.raises(DataError) as e:
            f.read_many(3)
        assert str(e.value) == (f"{path}: the tuple at byte {offsets[2]} is cut short (its value "
                                f"length 5 points past the end of the {offsets[2] + 20}-byte "
                                f"file); 2 whole tuples before it: truncated or corrupt")
        assert f.tell() == offsets[2]


def test_a_reader_at_the_end_sees_tuples_appended_later(tmp_path):
    path = tmp_path / "kv.bin"
    tuples, offsets = _numbered(path, [4, 4])
    with KVFile(path) as f:
        assert f.read_many(5) == tuples and f.read() is None
        with KVFile(path, "append") as w:
            w.insert(b"2", b"late")
        assert f.read_many(5) == [(b"2", b"late")] and f.tell() == offsets[2] + 16 + 1 + 4
