"""checkpoint.format: SINGA's file layout byte for byte, checksums, the crash-safe writer, torn
and hostile files."""
import os
import struct
import threading
import time
import zlib

import numpy as np
import pytest

from checkpoint_helpers import (EXAMPLE, EXAMPLE_PARAMS, FIX, FIX_NAMES, FIX_SHAPES, cli, params,
                                state, values_and_versions)
from singa import checkpoint as ckpt
from singa.errors import CheckpointError
from singa.net.numerics import rng_state
from singa.proto import common_pb2


def test_reads_singa_03_checkpoint_fixture():
    r = ckpt.CheckpointReader(f"{FIX}/run-1worker/step100-worker0")
    assert r.names == FIX_NAMES
    assert [m[1] for m in r.meta()] == FIX_SHAPES
    assert {v for _, (a, v) in values_and_versions(r).items()} == {100}
    assert r.param("0#weight1").dtype == np.float32 and r.param("0#weight1").shape == (64, 784)
    assert not r.verified and r.snapshot_state() is None and r.step == 100
    r2 = ckpt.CheckpointReader(f"{FIX}/run-1worker/step200-worker0")
    assert [m[3] for m in r2.meta()] == [199] * 4


def test_bytes_match_reference_example_plus_crc_trailer(tmp_path):
    path = ckpt.write_file(str(tmp_path / "step1-worker0.bin"), EXAMPLE_PARAMS)
    data = open(path, "rb").read()
    assert data[:-6] == EXAMPLE
    assert data[-6:] == b"\xb5\x13" + struct.pack("<I", zlib.crc32(EXAMPLE))


def test_ours_decodes_as_singa_blobprotos(tmp_path):
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"), params(), state())
    msg = common_pb2.BlobProtos.FromString(open(path, "rb").read())
    assert list(msg.name) == ["0#w1", "0#b1"] and list(msg.version) == [7, 7]
    assert list(msg.blob[0].shape) == [4, 3]
    np.testing.assert_array_equal(np.array(msg.blob[1].data, np.float32), params()[1][1])
    # SINGA's part comes first and is exactly what a SINGA-only message serializes to.
    singa_only = common_pb2.BlobProtos(version=msg.version, name=msg.name, blob=msg.blob)
    assert open(path, "rb").read().startswith(singa_only.SerializeToString())


def reference_bytes(params, st):
    """What protobuf serializes for the same snapshot (the format before values were streamed;
    a 0-d value is stored with shape (1,), as np.ascontiguousarray gives it)."""
    msg = common_pb2.BlobProtos()
    for name, a, version in params:
        msg.version.append(version)
        msg.name.append(name)
        msg.blob.add(shape=np.ascontiguousarray(a).shape).data.extend(np.ascontiguousarray(a, np.float32).ravel().tolist())
    msg.step, msg.nworkers, msg.lr_index = st.step, st.nworkers, st.lr_index
    if st.evaluated:
        msg.evaluated = True
    for name, buffers in st.param_state.items():
        ps = msg.param_state.add(name=name)
        for b in buffers:
            ps.buffer.add(shape=b.shape).data.extend(np.asarray(b, np.float32).ravel().tolist())
    for name, s in st.rng.items():
        msg.rng.add(name=name, **s)
    for name, (offset, skipped) in st.reader.items():
        msg.reader.add(name=name, offset=offset, skipped=skipped)
    msg.metric_name.extend(st.metrics)
    msg.metric_value.extend(st.metrics.values())
    payload = msg.SerializeToString()
    return payload + b"\xb5\x13" + struct.pack("<I", zlib.crc32(payload))


def odd_params():
    """Params of every shape kind: float64 input, a non-contiguous view, 0-d, empty, 3-d."""
    big = np.arange(6 * 5, dtype=np.float64).reshape(6, 5) / 7
    return params() + [("0#f64", big, 3), ("0#view", big.T[::2].astype(np.float32).T, 4),
                       ("0#scalar", np.float32(2.5), 0), ("0#empty", np.zeros((0, 3)), 1),
                       ("0#cube", np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4), 200)]


@pytest.mark.parametrize("evaluated", [True, False])
def test_file_bytes_equal_protobuf_serialization_with_every_field(tmp_path, evaluated):
    st = state(metrics={"accuracy": 0.75, "loss": 0.5}, evaluated=evaluated)
    st.param_state = {"0#w1": [np.full((4, 3), 0.5, np.float32), np.arange(12.).reshape(4, 3)],
                      "0#b1": [], "0#empty": [np.zeros((0, 3), np.float32)]}
    st.rng["test"] = rng_state(np.random.default_rng(7))
    st.reader["test/data"] = (0, False)
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"), odd_params(), st)
    assert open(path, "rb").read() == reference_bytes(odd_params(), st)
    r = ckpt.CheckpointReader(path)
    s = r.snapshot_state()
    assert r.verified and (s.step, s.evaluated, s.rng, s.reader) == (5, evaluated, st.rng, st.reader)
    assert sorted(s.param_state) == sorted(st.param_state) and s.param_state["0#b1"] == []
    for name, a, _ in odd_params():
        np.testing.assert_array_equal(r.param(name), np.asarray(a, np.float32))
    np.testing.assert_array_equal(s.param_state["0#w1"][1], np.arange(12.).reshape(4, 3))
    assert ckpt.read_meta(ckpt.meta_path(path))["bytes"] == os.path.getsize(path)


def test_worker_file_without_params_equals_protobuf_serialization(tmp_path):
    path = ckpt.write_file(str(tmp_path / "step5-worker1.bin"), [], state(nworkers=2))
    assert open(path, "rb").read() == reference_bytes([], state(nworkers=2))


def test_checksum_matches_file_while_a_param_changes_during_the_write(tmp_path):
    a = np.zeros(1 << 20, np.float32)
    stop = []

    def scribble():       # a server thread updating the param in place
        while not stop:
            np.add(a, 1, out=a)
    t = threading.Thread(target=scribble)
    t.start()
    try:
        for i in range(3):
            ckpt.write_file(str(tmp_path / f"step{i}-worker0.bin"), [("0#w", a, i)])
    finally:
        stop.append(True)
        t.join()
    for i in range(3):
        assert ckpt.CheckpointReader(str(tmp_path / f"step{i}-worker0.bin")).verified


def unusual_encoding(data):
    """The same BlobProtos, each blob's floats unpacked and after its shape, blobs first."""
    msg = common_pb2.BlobProtos.FromString(data)
    out = bytearray()
    for b in msg.blob:
        body = b"".join(b"\x15" + struct.pack("<f", v) for v in b.data)
        body += b"".join(b"\x08" + bytes([d]) for d in b.shape)
        out += b"\x2a" + bytes([len(body)]) + body
    msg.ClearField("blob")
    return bytes(out) + msg.SerializeToString()


def test_unusual_encodings_read_as_protobuf_reads_them(tmp_path):
    data = open(ckpt.write_file(str(tmp_path / "a.bin"), params()), "rb").read()[:-6]
    odd = unusual_encoding(data)
    assert odd != data and common_pb2.BlobProtos.FromString(odd) == common_pb2.BlobProtos.FromString(data)
    path = tmp_path / "step1-worker0"
    path.write_bytes(odd)
    r = ckpt.CheckpointReader(str(path))
    assert not r.verified and r.meta() == [("0#w1", (4, 3), "float32", 7), ("0#b1", (4,), "float32", 7)]
    for name, a, _ in params():
        np.testing.assert_array_equal(r.param(name), a)


def test_param_values_are_private_copies(tmp_path):
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"), params(), state())
    r = ckpt.CheckpointReader(path)
    w = r.param("0#w1")
    w += 1                                   # writable, and not the reader's bytes
    np.testing.assert_array_equal(r.param("0#w1"), params()[0][1])
    r.snapshot_state().param_state["0#w1"][0][:] = 0
    assert r.snapshot_state().param_state["0#w1"][0][0, 0] == 0.5


def test_writer_api_by_prefix(tmp_path):
    with ckpt.CheckpointWriter(str(tmp_path / "step3-worker0")) as w:
        w.write("0#w1", np.ones((2, 2)), 3)
        w.set_snapshot_state(ckpt.SnapshotState(step=3))
    assert ckpt.CheckpointReader(w.path).param("0#w1").tolist() == [[1, 1], [1, 1]]
    with pytest.raises(ValueError, match="twice"):
        w.write("0#w1", np.ones(1), 3)


def test_failed_write_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"), params(version=1))
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space left")))
    with pytest.raises(CheckpointError, match="step5-worker0.bin: No space left"):
        ckpt.write_file(path, params(version=2))
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["step5-worker0.bin", "step5-worker0.meta"]
    assert ckpt.CheckpointReader(path).version("0#w1") == 1


def test_failed_meta_write_leaves_old_files_and_no_temp(tmp_path, monkeypatch):
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"), params(version=1))
    calls = []

    def fsync(fd):        # the data file's fsync passes, the .meta's fails
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(5, "Input/output error")
    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(CheckpointError, match="step5-worker0.bin: Input/output error"):
        ckpt.write_file(path, params(version=2))
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["step5-worker0.bin", "step5-worker0.meta"]
    assert ckpt.CheckpointReader(path).version("0#w1") == 1


def test_exception_inside_writer_block_writes_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with ckpt.CheckpointWriter(str(tmp_path / "step1-worker0")) as w:
            w.write("0#w1", np.ones(2), 1)
            raise RuntimeError("worker died")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("with_meta", [True, False])
def test_bit_flip_is_detected(tmp_path, with_meta):
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"), params(), state())
    if not with_meta:
        os.unlink(ckpt.meta_path(path))
    data = bytearray(open(path, "rb").read())
    data[40] ^= 0x04   # inside the first blob's floats: still parses
    open(path, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match="step5-worker0.bin: bad checksum"):
        ckpt.CheckpointReader(path)


@pytest.mark.parametrize("with_meta", [True, False])
@pytest.mark.parametrize("eighth", range(1, 8))
def test_truncation_is_detected(tmp_path, with_meta, eighth):
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"), params(), state())
    if not with_meta:
        os.unlink(ckpt.meta_path(path))
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) * eighth // 8])
    with pytest.raises(CheckpointError, match="step5-worker0.bin: .*(truncated|corrupt|pair up)"):
        ckpt.CheckpointReader(path)


@pytest.mark.parametrize("eighth", range(1, 8))
def test_truncated_singa_file_is_detected(tmp_path, eighth):
    data = open(f"{FIX}/cnn/step100-worker0", "rb").read()
    path = tmp_path / "step100-worker0"
    path.write_bytes(data[:len(data) * eighth // 8])
    with pytest.raises(CheckpointError, match="step100-worker0: "):
        ckpt.CheckpointReader(str(path))


def test_hostile_files_fail_fast_with_checkpoint_error(tmp_path):
    path = str(tmp_path / "evil")
    huge_blob = common_pb2.BlobProtos(name=["x"], version=[1])
    huge_blob.blob.add(shape=[1 << 30, 1 << 30])
    cases = [b"\x2a\xff\xff\xff\xff\x07" + b"\0" * 10,          # blob of declared length 2 GiB
             b"\x22\xff\xff\xff\xff\x0f",                        # name longer than the file
             huge_blob.SerializeToString(),                      # shape of 2^60 values, no data
             b"\xff" * 64, b"\x0b" * 50,                         # garbage, unmatched groups
             ]
    start = time.monotonic()
    for data in cases:
        open(path, "wb").write(data)
        with pytest.raises(CheckpointError, match="evil"):
            ckpt.CheckpointReader(path)
    assert time.monotonic() - start < 1


def test_random_damage_only_ever_raises_checkpoint_error(tmp_path):
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"), params(), state())
    os.unlink(ckpt.meta_path(path))
    good = open(path, "rb").read()
    rng = np.random.default_rng(0)
    for _ in range(300):
        data = bytearray(good)
        for i in rng.integers(0, len(data), rng.integers(1, 4)):
            data[i] = rng.integers(0, 256)
        open(path, "wb").write(bytes(data))
        try:
            ckpt.CheckpointReader(path)
        except CheckpointError:
            pass


def test_file_over_2gib_is_refused_without_reading(tmp_path):
    path = tmp_path / "step1-worker0.bin"
    with open(path, "wb") as f:
        f.truncate(ckpt.MAX_FILE_BYTES + 1)    # sparse: no disk used
    with pytest.raises(CheckpointError, match="more than the 2 GiB"):
        ckpt.CheckpointReader(str(path))


def singa_file_with_name(path, name):
    """A SINGA-style file (no checksum) holding one param named by the raw bytes `name`."""
    msg = common_pb2.BlobProtos(version=[1])
    msg.blob.add(shape=[2], data=[1.0, 2.0])
    path.write_bytes(msg.SerializeToString() + b"\x22" + bytes([len(name)]) + name)
    return str(path)


def test_a_param_name_that_is_not_utf8_is_a_checkpoint_error(tmp_path):
    path = singa_file_with_name(tmp_path / "step1-worker0", b"\xff\xfeA")
    with pytest.raises(CheckpointError, match=r"step1-worker0: name b'\\xff\\xfeA' is not UTF-8 text$"):
        ckpt.CheckpointReader(path)
    good = singa_file_with_name(tmp_path / "step2-worker0", b"A")
    for args in (("show", path), ("diff", good, path)):
        out = cli(*args)
        assert (out.returncode, out.stdout) == (2, "") and "Traceback" not in out.stderr
        assert out.stderr.count("\n") == 1 and "is not UTF-8 text" in out.stderr
