"""Checkpoint files: SINGA compatibility, checksums, torn/hostile files, snapshots, retention, CLI."""
import logging
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import types
import zlib

import numpy as np
import pytest

import singa
from singa import checkpoint as ckpt
from singa.checkpoint import format as ckpt_format
from singa import runtime
from singa.errors import CheckpointError
from singa.proto import common_pb2, job_pb2

FIX = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "singa-0.3"))
FIX_NAMES = ["0#weight1", "0#bias1", "0#weight2", "0#bias2"]
FIX_SHAPES = [(64, 784), (64,), (10, 64), (10,)]

# SINGA's layout: two params, versions 100, as SINGA (and python protobuf) serialize them.
EXAMPLE = bytes.fromhex(
    "18 64 18 64  22 04 30 23 77 31  22 04 30 23 62 31"
    "2a 1e 08 02 08 03 12 18 cdcccc3d cdcc4c3e 9a99993e cdcccc3e 0000003f 9a99193f"
    "2a 0c 08 02 12 08 0000803f 000080bf")
EXAMPLE_PARAMS = [("0#w1", np.array([[.1, .2, .3], [.4, .5, .6]], np.float32), 100),
                  ("0#b1", np.array([1, -1], np.float32), 100)]


def params(seed=0, version=7):
    rng = np.random.default_rng(seed)
    return [("0#w1", rng.standard_normal((4, 3)).astype(np.float32), version),
            ("0#b1", rng.standard_normal(4).astype(np.float32), version)]


def state(step=5, nworkers=1, **kw):
    rng = np.random.default_rng(42)
    rng.standard_normal(3)
    return ckpt.SnapshotState(
        step=step, nworkers=nworkers, lr_index=2,
        param_state={"0#w1": [np.full((4, 3), 0.5, np.float32)]},
        rng={"worker0": rng.bit_generator.state}, reader={"data": (1234, True)}, **kw)


def snapshot(folder, step, nworkers=1, metrics=None, workers=None):
    """Files of workers 0..nworkers-1 (or `workers`); worker 0 holds the params and their
    updater state, as in a data-parallel run."""
    for w in (range(nworkers) if workers is None else workers):
        st = state(step, nworkers, metrics=dict(metrics or {}))
        if w:
            st.param_state = {}
        ckpt.write_file(ckpt.snapshot_file(folder, step, w), params(step) if w == 0 else [], st)


# --- SINGA's own files ------------------------------------------------------------------------

def test_reads_singa_03_checkpoint_fixture():
    r = ckpt.CheckpointReader(f"{FIX}/run-1worker/step100-worker0")
    assert r.names == FIX_NAMES
    assert [m[1] for m in r.meta()] == FIX_SHAPES
    assert {v for _, (a, v) in r.params().items()} == {100}
    assert r.param("0#weight1").dtype == np.float32 and r.param("0#weight1").shape == (64, 784)
    assert not r.verified and r.state is None and r.step == 100
    r2 = ckpt.CheckpointReader(f"{FIX}/run-1worker/step200-worker0")
    assert [m[3] for m in r2.meta()] == [199] * 4


def test_singa_two_worker_snapshot_with_empty_file_is_complete():
    (snap,) = ckpt.list_snapshots(f"{FIX}/run-2workers")
    assert (snap.step, snap.complete, snap.nworkers_expected, snap.verified) == (200, True, 2, False)
    assert sorted(snap.files) == [0, 1]
    assert ckpt.CheckpointReader(snap.files[1]).names == []


def test_latest_of_singa_run_is_newest_step():
    assert ckpt.latest_snapshot(f"{FIX}/run-1worker").step == 200


# --- format -----------------------------------------------------------------------------------

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
        msg.rng.add(name=name, bit_generator=s["bit_generator"],
                    state=s["state"]["state"].to_bytes(16, "little"),
                    inc=s["state"]["inc"].to_bytes(16, "little"),
                    has_uint32=s["has_uint32"], uinteger=s["uinteger"])
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
    st.rng["test"] = np.random.default_rng(7).bit_generator.state
    st.reader["test/data"] = (0, False)
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"), odd_params(), st)
    assert open(path, "rb").read() == reference_bytes(odd_params(), st)
    r = ckpt.CheckpointReader(path)
    s = r.state
    assert r.verified and (s.step, s.evaluated, s.rng, s.reader) == (5, evaluated, st.rng, st.reader)
    assert sorted(s.param_state) == sorted(st.param_state) and s.param_state["0#b1"] == []
    for name, a, _ in odd_params():
        np.testing.assert_array_equal(r.param(name), np.asarray(a, np.float32))
    np.testing.assert_array_equal(r.state.param_state["0#w1"][1], np.arange(12.).reshape(4, 3))
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
    r.state.param_state["0#w1"][0][:] = 0
    assert r.state.param_state["0#w1"][0][0, 0] == 0.5


def test_the_chosen_snapshot_is_read_once_from_verifying_to_loading(tmp_path, monkeypatch):
    ws = tmp_path / "ws"
    folder = str(ws / "checkpoint")
    os.makedirs(folder)
    snapshot(folder, 100)
    snapshot(folder, 200)
    loads = []
    load = ckpt_format._load
    monkeypatch.setattr(ckpt_format, "_load", lambda path: loads.append(path) or load(path))
    snap = ckpt.latest_snapshot(folder)
    assert snap.step == 200 and loads == [snap.files[0]]     # newest first, older unread
    files = ckpt.open_checkpoint_path([snap.files[0]], str(ws), snapshot=snap)
    assert files == [snap.readers[0]] and files[0].state.step == 200
    ps = net_params([("0#w1", (4, 3)), ("0#b1", (4,))])
    ckpt.load_params(files, ps)
    assert len(loads) == 1                                   # no second read
    np.testing.assert_array_equal(ps["0#w1"].data, params(200)[0][1])
    assert ckpt.open_checkpoint_path(["latest"], str(ws))[0].state.step == 200
    assert len(loads) == 2                                   # no snapshot passed: read again
    assert all(s.readers == {} for s in ckpt.list_snapshots(folder))   # none kept in memory


def test_round_trip_values_versions_and_state(tmp_path):
    st = state(metrics={"accuracy": 0.75, "loss": 0.5})
    path = ckpt.write_file(str(tmp_path / "step5-worker0"), params(), st)
    assert path.endswith("step5-worker0.bin")
    r = ckpt.CheckpointReader(str(tmp_path / "step5-worker0"))   # by prefix
    assert r.verified and r.step == 5 and r.nworkers == 1
    for name, a, v in params():
        got, version = r.params()[name]
        np.testing.assert_array_equal(got, a)
        assert version == v
    s = r.state
    assert (s.step, s.lr_index, s.reader) == (5, 2, {"data": (1234, True)})
    np.testing.assert_array_equal(s.param_state["0#w1"][0], np.full((4, 3), 0.5))
    assert s.metrics == {"accuracy": pytest.approx(0.75), "loss": pytest.approx(0.5)}
    restored = np.random.default_rng()
    restored.bit_generator.state = s.rng["worker0"]
    expected = np.random.default_rng(42)
    expected.standard_normal(3)
    assert restored.standard_normal(5).tolist() == expected.standard_normal(5).tolist()


def test_meta_file_describes_params(tmp_path):
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"), params(), state(metrics={"loss": 1.5}))
    assert ckpt.meta_path(path) == str(tmp_path / "step5-worker0.meta")
    meta = ckpt.read_meta(ckpt.meta_path(path))
    r = ckpt.CheckpointReader(path)
    assert meta["params"] == r.meta() == [("0#w1", (4, 3), "float32", 7), ("0#b1", (4,), "float32", 7)]
    assert (meta["step"], meta["nworkers"], meta["bytes"], meta["metrics"]) == (
        5, 1, os.path.getsize(path), {"loss": 1.5})
    assert "param\t0#w1\t4,3\tfloat32\t7" in open(ckpt.meta_path(path)).read().splitlines()


def test_writer_api_by_prefix(tmp_path):
    with ckpt.CheckpointWriter(str(tmp_path / "step3-worker0")) as w:
        w.write("0#w1", np.ones((2, 2)), 3)
        w.set_state(ckpt.SnapshotState(step=3))
    assert ckpt.CheckpointReader(w.path).param("0#w1").tolist() == [[1, 1], [1, 1]]
    with pytest.raises(ValueError, match="twice"):
        w.write("0#w1", np.ones(1), 3)


# --- crash-safety and damaged files -----------------------------------------------------------

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


def test_bad_updater_state_is_refused_at_open(tmp_path):
    msg = common_pb2.BlobProtos(step=1)
    msg.param_state.add(name="0#w1").buffer.add(shape=[1000, 1000], data=[1.0])
    path = tmp_path / "step1-worker0.bin"
    payload = msg.SerializeToString()
    path.write_bytes(payload + b"\xb5\x13" + struct.pack("<I", zlib.crc32(payload)))
    with pytest.raises(CheckpointError, match=r"updater state 0 of 0#w1 has shape \(1000, 1000\) but 1 values"):
        ckpt.CheckpointReader(str(path))


def test_singa_file_beside_ours_of_same_step(tmp_path):
    shutil.copy(f"{FIX}/run-1worker/step100-worker0", tmp_path)
    ckpt.write_file(ckpt.snapshot_file(str(tmp_path), 100, 0), params(), state(100))
    assert ckpt.CheckpointReader(str(tmp_path / "step100-worker0")).names == FIX_NAMES
    (snap,) = ckpt.list_snapshots(str(tmp_path))
    assert snap.complete and snap.files == {0: str(tmp_path / "step100-worker0.bin")}


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


# --- snapshots --------------------------------------------------------------------------------

def test_parse_step_worker_is_strict():
    assert ckpt.parse_step_worker("/a/step100-worker0") == (100, 0)
    assert ckpt.parse_step_worker("step7-worker3.bin") == (7, 3)
    for name in (".step5-worker0.bin.tmp-123", "step5-worker0.meta", "step5-worker0~",
                 "step5-worker0.bin.swp", "backup-step5-worker0", "step5-worker0.bin.orig"):
        assert ckpt.parse_step_worker(name) is None, name


def test_latest_falls_back_past_missing_worker_and_torn_file(tmp_path):
    folder = str(tmp_path)
    snapshot(folder, 100, nworkers=2)
    snapshot(folder, 200, nworkers=2, workers=[0])             # worker 1's file never written
    snapshot(folder, 300, nworkers=2)
    torn = ckpt.snapshot_file(folder, 300, 1)
    data = open(torn, "rb").read()
    open(torn, "wb").write(data[:len(data) // 2])
    open(tmp_path / ".step400-worker0.bin.tmp-123", "wb").write(b"\x18")   # killed mid-write
    snaps = ckpt.list_snapshots(folder)
    assert [(s.step, s.complete) for s in snaps] == [(100, True), (200, False), (300, False)]
    log = []
    latest = ckpt.latest_snapshot(folder, log=log.append)
    assert latest.step == 100 and latest.verified and sorted(latest.files) == [0, 1]
    assert any("step300-worker1.bin: truncated" in m for m in log)
    assert any("step200-worker1.bin: missing" in m for m in log)


def test_empty_worker0_file_is_torn(tmp_path):
    open(tmp_path / "step100-worker0", "wb").close()
    (snap,) = ckpt.list_snapshots(str(tmp_path))
    assert not snap.complete and "empty" in snap.problems[0]


def test_file_recording_another_step_makes_snapshot_incomplete(tmp_path):
    snapshot(str(tmp_path), 100)
    shutil.copy(ckpt.snapshot_file(str(tmp_path), 100, 0), ckpt.snapshot_file(str(tmp_path), 200, 0))
    snaps = ckpt.list_snapshots(str(tmp_path))
    assert [(s.step, s.complete) for s in snaps] == [(100, True), (200, False)]
    assert "records step 100" in snaps[1].problems[0]


def test_best_snapshot_by_accuracy_and_loss(tmp_path):
    folder = str(tmp_path)
    for step, acc, loss in [(100, 0.6, 0.9), (200, 0.8, 0.7), (300, 0.7, 0.6)]:
        snapshot(folder, step, metrics={"accuracy": acc, "Loss": loss})
    assert ckpt.best_snapshot(folder, "accuracy").step == 200
    assert ckpt.best_snapshot(folder, "loss").step == 300
    assert ckpt.best_snapshot(folder).step == 200
    assert ckpt.best_snapshot(f"{FIX}/run-1worker") is None


def test_prune_keeps_newest_best_and_foreign_over_the_whole_folder(tmp_path):
    folder = str(tmp_path)
    for step, acc in [(100, 0.5), (200, 0.9), (300, 0.6), (400, 0.7), (500, 0.8), (600, 0.1)]:
        snapshot(folder, step, metrics={"accuracy": acc})
    snapshot(folder, 700, nworkers=2, workers=[0])             # newest, still being written
    shutil.copy(f"{FIX}/run-1worker/step100-worker0", folder + "/step50-worker0")   # not ours
    deleted = ckpt.prune(folder, keep_newest=2, keep_best="accuracy")
    assert sorted(os.path.basename(p) for p in deleted) == [
        "step100-worker0.bin", "step100-worker0.meta", "step300-worker0.bin",
        "step300-worker0.meta", "step400-worker0.bin", "step400-worker0.meta"]
    assert [s.step for s in ckpt.list_snapshots(folder)] == [50, 200, 500, 600, 700]
    assert ckpt.prune(folder, keep_newest=0) == []


@pytest.mark.parametrize("metric, lower", [
    ("loss", True), ("Loss", True), ("ppl", True), ("se", True), ("squared error", True),
    ("top1 error", True), ("accuracy", False), ("precision", False), ("recall", False)])
def test_lower_is_better_for_loss_perplexity_squared_error_and_any_error(metric, lower):
    assert ckpt.lower_is_better(metric) is lower


def test_best_ranks_by_the_monitor_phase_and_direction(tmp_path):
    """ppl goes down; a validation monitor reads the validation metrics; files of before the
    phases were recorded hold their test metrics under bare names."""
    folder = str(tmp_path)
    snapshot(folder, 100, metrics={"test/ppl": 90.0, "validation/accuracy": 0.7, "test@step": 100})
    snapshot(folder, 200, metrics={"test/ppl": 60.0, "validation/accuracy": 0.6, "test@step": 200})
    snapshot(folder, 300, metrics={"test/ppl": 75.0, "validation/accuracy": 0.8, "test@step": 300})
    snapshot(folder, 400, metrics={"accuracy": 0.9, "ppl": 80.0})          # an older file
    assert ckpt.best_snapshot(folder, "ppl").step == 200
    assert ckpt.best_snapshot(folder, "test/ppl").step == 200
    assert ckpt.best_snapshot(folder, "validation/accuracy").step == 300
    assert ckpt.best_snapshot(folder, "accuracy").step == 400
    assert ckpt.best_snapshot(folder, "validation/loss") is None
    assert [s.step for s in ckpt.ranked(ckpt.list_snapshots(folder), "ppl")] == [200, 300, 400, 100]


def test_open_best_and_prune_agree_on_the_monitor(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    for step, ppl in [(100, 90.0), (200, 60.0), (300, 75.0), (400, 80.0), (500, 85.0)]:
        snapshot(str(folder), step, metrics={"test/ppl": ppl})
    (best,) = ckpt.open_checkpoint_path(["best"], str(tmp_path), monitor="ppl")
    assert best.step == 200
    deleted = ckpt.prune(str(folder), keep_newest=1, keep_best="ppl", keep_best_k=2)
    assert [s.step for s in ckpt.list_snapshots(str(folder))] == [200, 300, 500]
    assert len(deleted) == 4
    with pytest.raises(CheckpointError, match="no complete snapshot recording "
                                                  "validation/accuracy"):
        ckpt.open_checkpoint_path(["best"], str(tmp_path), monitor="validation/accuracy")


def test_prune_never_deletes_newest_complete(tmp_path):
    snapshot(str(tmp_path), 100)
    snapshot(str(tmp_path), 200)
    assert ckpt.prune(str(tmp_path), keep_newest=1) == [
        ckpt.snapshot_file(str(tmp_path), 100, 0), str(tmp_path / "step100-worker0.meta")]
    assert ckpt.prune(str(tmp_path), keep_newest=1) == []


# --- checkpoint_path and loading --------------------------------------------------------------

def test_resolve_latest_best_prefix_and_missing(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    snapshot(str(folder), 100, nworkers=2, metrics={"accuracy": 0.9})
    snapshot(str(folder), 200, nworkers=2, metrics={"accuracy": 0.5})
    ws = str(tmp_path)
    assert paths(["latest"], ws) == [
        ckpt.snapshot_file(str(folder), 200, 0), ckpt.snapshot_file(str(folder), 200, 1)]
    assert paths(["best"], ws)[0].endswith("step100-worker0.bin")
    assert paths([str(folder / "step100-worker0")], ws) == [str(folder / "step100-worker0.bin")]
    rel = os.path.relpath(f"{FIX}/run-1worker/step100-worker0", singa.HOME)
    assert paths([rel], ws) == [f"{FIX}/run-1worker/step100-worker0"]
    with pytest.raises(CheckpointError, match="not found: .*nope/step1-worker0"):
        paths([str(tmp_path / "nope/step1-worker0")], ws)
    os.unlink(ckpt.snapshot_file(str(folder), 100, 1))
    os.unlink(ckpt.snapshot_file(str(folder), 200, 1))
    with pytest.raises(CheckpointError, match="latest.*no complete snapshot in .*checkpoint"):
        paths(["latest"], ws)


def paths(entries, workspace, **kw):
    return [r.path for r in ckpt.open_checkpoint_path(entries, workspace, **kw)]


def net_params(shapes):
    return {n: types.SimpleNamespace(data=np.zeros(s, np.float32), version=-1, partition=None)
            for n, s in shapes}


def test_load_params_from_singa_files_later_wins():
    ps = net_params(zip(FIX_NAMES + ["0#extra"], FIX_SHAPES + [(3,)]))
    keep = ps["0#weight1"].data
    log = []
    files = [f"{FIX}/run-1worker/step100-worker0", f"{FIX}/run-1worker/step200-worker0"]
    loaded = ckpt.load_params(files, ps, log.append)
    assert loaded == dict.fromkeys(FIX_NAMES, (files[1],))
    assert ps["0#weight1"].data is keep and ps["0#weight1"].version == 199
    np.testing.assert_array_equal(keep, ckpt.CheckpointReader(files[1]).param("0#weight1"))
    assert log[:2] == [f"Load from checkpoint file {f}" for f in files]
    assert "Param 0#extra: not in the checkpoint files" in log
    assert ps["0#extra"].version == -1


def test_load_params_matches_01_plain_names(tmp_path):
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"),
                           [("w1", np.ones((4, 3)), 9), ("b1", np.ones(4), 9), ("0#b1", np.full(4, 2), 8)])
    ps = net_params([("0#w1", (4, 3)), ("0#b1", (4,))])
    assert ckpt.load_params([path], ps) == {"0#w1": (path,), "0#b1": (path,)}
    assert ps["0#w1"].version == 9 and ps["0#b1"].data.tolist() == [2, 2, 2, 2]


def test_load_params_shape_mismatch_names_param_shapes_and_file():
    ps = net_params([("0#weight1", (32, 784))])
    with pytest.raises(CheckpointError) as e:
        ckpt.load_params([f"{FIX}/run-1worker/step100-worker0"], ps)
    msg = str(e.value)
    assert "\n" not in msg
    for part in ("0#weight1", "(64, 784)", "(32, 784)", "run-1worker/step100-worker0"):
        assert part in msg


# --- command line -----------------------------------------------------------------------------

def cli(*args):
    return subprocess.run([sys.executable, "-m", "singa.checkpoint", *args], cwd=singa.HOME,
                          capture_output=True, text=True, timeout=60)


def test_cli_ls_show_diff(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    snapshot(str(folder), 100, metrics={"accuracy": 0.9, "loss": 0.3})
    snapshot(str(folder), 200, metrics={"accuracy": 0.8, "loss": 0.2})
    out = cli("ls", str(tmp_path))
    assert out.returncode == 0
    assert "latest: step200" in out.stdout and "best by test/accuracy: step100 (0.9)" in out.stdout
    assert "best by test/loss: step200 (0.2)" in out.stdout and "accuracy=0.9" in out.stdout
    assert "step100  worker ids [0]  complete" in out.stdout
    out = cli("show", f"{FIX}/run-1worker/step200-worker0")
    assert out.returncode == 0 and "unverified (SINGA)" in out.stdout
    assert any(line.split()[:5] == ["0#weight1", "(64,", "784)", "float32", "199"]
               for line in out.stdout.splitlines())
    a, b = ckpt.snapshot_file(str(folder), 100, 0), ckpt.snapshot_file(str(folder), 200, 0)
    same = cli("diff", a, a)
    assert same.returncode == 0 and same.stdout.count("same") == 2
    differ = cli("diff", a, f"{FIX}/run-1worker/step100-worker0")
    assert differ.returncode == 1 and "only in a" in differ.stdout and "only in b" in differ.stdout
    assert "max abs diff" in cli("diff", a, b).stdout


def test_cli_output_cut_short_by_its_reader_is_no_traceback(tmp_path):
    big = tmp_path / "big"
    ckpt.write_file(str(big), [(f"p{i}", np.zeros(3, np.float32), 1) for i in range(20000)])
    r = subprocess.run(f"{sys.executable} -m singa.checkpoint show {big}.bin | head -1",
                       shell=True, cwd=singa.HOME, capture_output=True, text=True, timeout=60)
    assert r.stdout == f"file {big}.bin\n" and r.stderr == ""


def test_cli_user_error_is_one_line_exit_2(tmp_path):
    out = cli("show", str(tmp_path / "missing"))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "missing" in out.stderr


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    alive = f".step6-worker0.bin.tmp-{os.getpid()}"
    dead = [".step5-worker0.bin.tmp-999999999", ".step5-worker0.meta.tmp-999999999"]
    kept = [alive, "step5-worker0.bin", "notes.tmp-1"]
    for n in dead + kept:
        (tmp_path / n).write_bytes(b"x")
    assert sorted(ckpt.remove_stale_temporaries(str(tmp_path))) == sorted(dead)
    assert sorted(os.listdir(tmp_path)) == sorted(kept)
    assert ckpt.remove_stale_temporaries(str(tmp_path / "missing")) == []


# --- hostile names, counts and states (issue 10) ----------------------------------------------

def test_a_huge_worker_id_costs_one_problem_line_not_one_per_missing_file(tmp_path):
    shutil.copy(f"{FIX}/run-1worker/step100-worker0", tmp_path)
    open(tmp_path / "step100-worker1000000", "wb").close()
    (snap,) = ckpt.list_snapshots(str(tmp_path))
    assert not snap.complete and snap.problems == [
        f"{tmp_path}/step100-worker1.bin: missing (the snapshot has 1000001 worker files; "
        f"999998 more are missing)"]


def test_a_recorded_worker_count_costs_one_problem_line(tmp_path):
    snapshot(str(tmp_path), 100, nworkers=10**6, workers=[0])
    for nworkers in (None, 1):
        (snap,) = ckpt.list_snapshots(str(tmp_path), nworkers)
        assert snap.problems == [f"{tmp_path}/step100-worker1.bin: missing (the snapshot has "
                                 f"1000000 worker files; 999998 more are missing)"]


def test_worker_ids_beyond_the_jobs_cluster_are_ignored_with_a_warning(tmp_path):
    snapshot(str(tmp_path), 100)
    open(tmp_path / "step100-worker2000000000", "wb").close()
    open(tmp_path / "step500-worker2000000000", "wb").close()
    log = []
    snap = ckpt.latest_snapshot(str(tmp_path), nworkers=1, log=log.append)
    assert snap.step == 100 and snap.complete and list(snap.files) == [0]
    assert log == [f"Ignoring checkpoint file {tmp_path}/step{s}-worker2000000000: worker "
                   f"2000000000 is beyond the job's 1 workers" for s in (100, 500)]
    ws = tmp_path / "ws"
    shutil.copytree(tmp_path, ws / "checkpoint", ignore=shutil.ignore_patterns("ws"))
    assert paths(["latest"], str(ws), nworkers=1) == [
        ckpt.snapshot_file(str(ws / "checkpoint"), 100, 0)]


def test_resume_ignores_files_beyond_the_jobs_workers(tmp_path, caplog):
    snapshot(str(tmp_path), 100)
    open(tmp_path / "step500-worker1000000", "wb").close()
    job = job_pb2.JobProto()
    job.cluster.nworkers_per_group = 1
    assert runtime.resume_from(job, str(tmp_path)).files == {
        0: ckpt.snapshot_file(str(tmp_path), 100, 0)}
    assert job.step == 100
    assert [r.message for r in caplog.records if r.levelno == logging.WARNING] == [
        f"Ignoring checkpoint file {tmp_path}/step500-worker1000000: worker 1000000 is beyond "
        f"the job's 1 workers"]


def test_a_step_beyond_the_last_a_job_can_reach_is_one_problem_line(tmp_path):
    for step in (100, 99999999999, int("9" * 30)):
        shutil.copy(f"{FIX}/run-1worker/step100-worker0", tmp_path / f"step{step}-worker0")
    job = job_pb2.JobProto()
    assert runtime.resume_from(job, str(tmp_path)).files == {0: str(tmp_path / "step100-worker0")}
    assert job.step == 100
    out = cli("ls", str(tmp_path))
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert "step99999999999  worker ids [0]  INCOMPLETE\n    step99999999999: a step beyond 2147483647, " \
           "the last a job can reach\n" in out.stdout
    assert "latest: step100\n" in out.stdout


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


@pytest.mark.parametrize("damage, what", [
    (lambda st: st.rng["worker0"].update(bit_generator="MT19937"),
     "RNG state of worker0 is for 'MT19937', not PCG64"),
    (lambda st: st.rng["worker0"].update(has_uint32=7), "RNG state of worker0 is not a PCG64 state"),
    (lambda st: st.param_state.update({"0#w1": [np.zeros((3, 3), np.float32)]}),
     r"updater state 0 of 0#w1 has shape \(3, 3\), the param \(4, 3\)"),
    (lambda st: st.param_state.update({"0#nope": [np.zeros(2, np.float32)]}),
     "updater state of 0#nope, a param the file does not hold")],
    ids=["RNG type", "RNG has_uint32", "updater state shape", "updater state of no param"])
def test_a_checksummed_file_with_malformed_state_is_a_checkpoint_error(tmp_path, damage, what):
    st = state()
    damage(st)
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"), params(), st)
    with pytest.raises(CheckpointError, match=f"step5-worker0.bin: {what}"):
        ckpt.CheckpointReader(path)
