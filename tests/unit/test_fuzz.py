"""Fuzzing the readers of untrusted bytes (checkpoint files, kvfile and CSV shards, job confs):
any input gives a `singa.errors` error or a valid result, never another exception, a numpy
warning (an invalid cast), a hang or an allocation beyond the input's size (Python
allocations, measured with tracemalloc)."""
import os
import struct
import tracemalloc
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint_helpers import FIX
from gradcheck import make_layer
from singa import checkpoint, config, launch
from singa.comm import msg as m
from singa.comm import param_msg as pm
from singa.errors import SingaError
from singa.io.kvfile import KVFile
from singa.numerics import rng_state, set_rng_state
from singa.proto import job_pb2

# Deterministic (the same examples in every run) and bounded: the file runs in a few seconds.
FUZZ = settings(max_examples=150, deadline=2000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TRAIN = job_pb2.kTrain | job_pb2.kForward


def within_memory(fn, size, factor=64, slack=4 << 20):
    """Run fn() with warnings as errors; a SingaError must be one line; assert the peak of
    Python allocations stays below factor·size + slack."""
    tracemalloc.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                fn()
            except SingaError as e:
                assert "\n" not in str(e), str(e)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < factor * size + slack, f"{peak} bytes allocated for {size} bytes of input"


def read_checkpoint(path):
    """Open the file; if it is valid, its names are text, its values have their shapes and
    its RNG states restore."""
    r = checkpoint.CheckpointReader(path)
    for name, shape, _, _ in r.meta():
        assert isinstance(name, str) and r.param(name).shape == shape
    snap = r.snapshot_state()
    if snap is not None:
        assert all(isinstance(name, str) for name in snap.param_state)
        for st in snap.rng.values():
            set_rng_state(np.random.default_rng(), st)


def good_checkpoint():
    rng = np.random.default_rng(0)
    params = [("0#w", rng.standard_normal((3, 2)).astype(np.float32), 4),
              ("0#b", np.zeros(3, np.float32), 4)]
    state = checkpoint.SnapshotState(
        step=4, param_state={"0#w": [np.ones((3, 2), np.float32)]},
        rng={"train": rng_state(rng)}, reader={"train/data": (120, True)},
        metrics={"accuracy": 0.5})
    return params, state


@FUZZ
@given(data=st.binary(max_size=512))
def test_checkpoint_reader_on_arbitrary_bytes(tmp_path, data):
    path = tmp_path / "step4-worker0"
    path.write_bytes(data)
    within_memory(lambda: read_checkpoint(str(path)), len(data))


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
       cut=st.integers(0, 10**6), checksum=st.booleans())
def test_checkpoint_reader_on_damaged_files_with_and_without_a_valid_checksum(tmp_path, edits, cut,
                                                                              checksum):
    path = tmp_path / "step4-worker0.bin"
    checkpoint.write_file(str(path), *good_checkpoint())
    payload = bytearray(path.read_bytes()[:-6])
    for at, value in edits:
        payload[at % len(payload)] = value
    payload = payload[:len(payload) - cut % 16]
    trailer = b"\xb5\x13" + struct.pack("<I", zlib.crc32(payload)) if checksum else b""
    path.write_bytes(bytes(payload) + trailer)
    within_memory(lambda: read_checkpoint(str(path)), len(payload))


def read_kvfile(path):
    """Read every tuple; unless that raised, they make up the whole file."""
    with KVFile(path) as f:
        total = sum(16 + len(k) + len(v) for k, v in f)
    assert total == path.stat().st_size


@FUZZ
@given(data=st.binary(max_size=512) | st.lists(
    st.tuples(st.integers(0, 2**64 - 1) | st.integers(0, 40), st.binary(max_size=40)),
    max_size=6).map(lambda parts: b"".join(struct.pack("<Q", n) + b for n, b in parts)))
def test_kvfile_reader_on_arbitrary_bytes(tmp_path, data):
    path = tmp_path / "shard.bin"
    path.write_bytes(data)
    within_memory(lambda: read_kvfile(path), len(data))


@FUZZ
@given(data=st.binary(max_size=300) | st.lists(
    st.lists(st.sampled_from(["0", "1", "-2", "3.5", "1e3", "nan", "inf", "", " ", "x", "1e99999",
                              "\xff", "0x10", "1_0"]), max_size=5).map(",".join),
    max_size=8).map(lambda lines: "\n".join(lines).encode()))
def test_csv_reader_on_arbitrary_bytes(tmp_path, data):
    path = tmp_path / "data.csv"
    path.write_bytes(data)
    layer = make_layer(f'name: "data" type: kCSVInput store_conf {{ path: "{path}" batchsize: 2 '
                       f'shape: 3 }}', [])
    within_memory(lambda: layer.compute_feature(TRAIN, []), len(data))


CONF_WORDS = ["name:", '"x"', "train_steps:", "-1", "0", "7", "2147483648", "nan", "neuralnet",
              "layer", "{", "}", "<", ">", ":", "[", "]", ",", ";", "type:", "kInnerProduct",
              "innerproduct_conf", "num_output:", "cluster", "workspace:", '"ws"', "#",
              "\n", "updater", "base_lr:", "1e39", "'y'", '"\\', "[singa.x]", "model", "param"]


@FUZZ
@given(text=st.binary(max_size=300).map(lambda b: b.decode("latin-1"))
       | st.lists(st.sampled_from(CONF_WORDS), max_size=40).map(" ".join))
def test_conf_loader_on_arbitrary_text(tmp_path, text):
    path = tmp_path / "job.conf"
    path.write_bytes(text.encode("utf-8", "surrogateescape") if text.isascii() else
                     text.encode("latin-1"))
    within_memory(lambda: config.load_job(str(path), check_paths=False), len(text) + 1,
                  factor=1024)


def int_frames():
    """Frames a peer may send where a param message's int frame goes: bytes, or an int frame
    of arbitrary numbers."""
    return st.one_of(st.binary(max_size=64), st.lists(
        st.integers(-2**31, 2**31 - 1), max_size=12).map(lambda v: m.int_frame(tuple(v))))


@FUZZ
@given(head=int_frames(), rest=st.lists(st.binary(max_size=24), max_size=6))
def test_param_message_parsers_on_arbitrary_frames(head, rest):
    """A peer's bucket of updates, a server's answer, a stub's gathered answer: a ClusterError
    or the items, never another exception, and nothing allocated beyond the frames' size."""
    msg = m.Msg(0, 0, m.kUpdate, 0, 0, [head, *rest])
    size = len(head) + sum(map(len, rest))
    for parse in (pm.parse_update, pm.parse_slice_update, pm.parse_updated,
                  lambda x: pm.answered(x, 1), lambda x: pm.answered(x, None)):
        within_memory(lambda: parse(msg), size)


FIXTURE_JOB = os.path.join(FIX, "job.conf")


@pytest.mark.parametrize("position", ['name: "data" type: kRecordInput include: kTrain',
                                      'name: "ip1" type: kInnerProduct',
                                      'name: "sig1" type: kSigmoid',
                                      'name: "loss" type: kSoftmaxLoss'])
def test_any_layer_type_in_any_place_of_a_net_gives_one_line_or_a_net(tmp_path, position):
    """SINGA's fixture MLP with one layer's type replaced by each type (a type without its
    sources, a loss in the middle, params a type does not make): its train net is built, or a
    SingaError says why in one line; never another exception (no source: an IndexError in
    most layers' setup; the params of a layer whose type makes none: a KeyError)."""
    with open(FIXTURE_JOB) as f:
        text = f.read().replace("/tmp/singa-fixture-ws", str(tmp_path))
    kind = position.rsplit(" ", 1)[1] if "include" not in position else "kRecordInput"
    assert position in text
    for name in job_pb2.LayerType.keys():
        conf = text.replace(position, position.replace(kind, name))
        try:
            launch.build(config.parse_job(conf, FIXTURE_JOB))
        except SingaError as e:
            assert "\n" not in str(e), (name, str(e))
