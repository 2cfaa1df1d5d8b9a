"""Fuzzing the readers of untrusted bytes (checkpoint files, kvfile and CSV shards, job confs,
Caffe's weights, solver states, mean files and Datums):
any input gives a `singa.errors` error or a valid result, never another exception, a numpy
warning (an invalid cast), a hang or an allocation beyond the input's size (Python
allocations, measured with tracemalloc)."""
import contextlib
import io
import math
import os
import struct
import tempfile
import tracemalloc
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpoint_helpers import FIX
from gradcheck import make_layer
from singa import HOME, checkpoint
from singa.cluster import launch
from singa.comm import msg as m
from singa.comm import param_msg as pm
from singa.errors import SingaError
from singa.interop.caffe.importer import main as caffe_import
from singa.io.caffe_blobs import CaffeFile, read_blob_file
from singa.io.kvfile import KVFile
from singa.io.lmdbstore import datum_record
from singa.job import config
from singa.net.numerics import rng_state, set_rng_state
from singa.proto import caffe_pb2, common_pb2, job_pb2

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


CAFFE = os.path.join(HOME, "tests", "fixtures", "caffe")


def damage(data, edits, cut):
    """`data` with bytes set at `edits` (positions taken modulo its length) and `cut` bytes cut
    from its end."""
    data = bytearray(data)
    for at, value in edits:
        data[at % len(data)] = value
    return bytes(data[:len(data) - cut % len(data)])


def import_leaves_one_line_or_a_job(tmp_path, argv):
    """The import command on `argv` + -o: exit 0, or 2 with one line and no file written."""
    out = tempfile.mkdtemp(dir=tmp_path)
    err = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("error")
        code = caffe_import(argv + ["-o", out])
    assert code == 0 or (code == 2 and err.getvalue().count("\n") == 1), err.getvalue()
    if code:
        assert not any(files for _, _, files in os.walk(out)), err.getvalue()


def damaged_fixture(tmp_path, name, edits, cut, edit=None):
    """The path of a copy of fixture `name` (a NetParameter or SolverState) after `edit` of its
    message, `edits` of its bytes and `cut` bytes cut from its end (mostly a few)."""
    cls = caffe_pb2.SolverState if name.endswith(".solverstate") else caffe_pb2.NetParameter
    with open(os.path.join(CAFFE, name), "rb") as f:
        msg = cls.FromString(f.read())
    if edit is not None:
        edit(msg)
    path = tmp_path / os.path.basename(name)
    path.write_bytes(damage(msg.SerializeToString(), edits, cut % 64 if cut % 3 else cut))
    return str(path)


def fuzz_edits():
    return st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=6)


WEIGHTS = ["mlp/mlp_iter_40.caffemodel", "legacy/mlp_v1.caffemodel",
           "convnet/convnet_iter_30.solverstate", "mlp/mlp_iter_20.solverstate"]


@FUZZ
@given(edits=fuzz_edits(), cut=st.integers(0, 10**6), name=st.sampled_from(WEIGHTS))
def test_caffe_files_on_damaged_bytes(tmp_path, edits, cut, name):
    """A `.caffemodel` (V2, V1) or `.solverstate` with bytes changed and its end cut: read, or
    one line naming the file, within memory."""
    path = damaged_fixture(tmp_path, name, edits, cut)

    def read():
        with CaffeFile(path) as f:
            f.solver_state() if name.endswith(".solverstate") else f.net()
    within_memory(read, os.path.getsize(path))


# the import builds and writes a whole job: fewer examples keep it to a few seconds
FUZZ_IMPORT = settings(FUZZ, max_examples=40)


@FUZZ_IMPORT
@given(edits=fuzz_edits(), cut=st.integers(0, 10**6), drop=st.sampled_from(["", "ip1", "ip2"]))
def test_caffe_import_on_damaged_weights(tmp_path, edits, cut, drop):
    """The mlp's weights without a layer of the net, bytes changed, its end cut: the import
    writes a job or says why in one line, leaving no file."""
    def edit(net):
        if drop:
            del net.layer[[layer.name for layer in net.layer].index(drop)]
    path = damaged_fixture(tmp_path, "mlp/mlp_iter_40.caffemodel", edits, cut, edit)
    import_leaves_one_line_or_a_job(
        tmp_path, ["caffe", os.path.join(CAFFE, "mlp", "mlp_deploy.prototxt"), path])


@FUZZ_IMPORT
@given(edits=fuzz_edits(), cut=st.integers(0, 10**6), history=st.integers(-1, 8))
def test_caffe_import_on_damaged_solver_states(tmp_path, edits, cut, history):
    """The convnet's `.solverstate`, a history blob dropped (or none), bytes changed, its end
    cut: a job and snapshot, or one line and no file (the mean image's neither)."""
    def edit(state):
        if 0 <= history < len(state.history):
            del state.history[history]
    path = damaged_fixture(tmp_path, "convnet/convnet_iter_30.solverstate", edits, cut, edit)
    import_leaves_one_line_or_a_job(
        tmp_path, ["caffe", os.path.join(CAFFE, "convnet", "convnet_solver.prototxt"),
                   os.path.join(CAFFE, "convnet", "convnet_iter_30.caffemodel"),
                   "-solverstate", path])


DIMS = st.sampled_from([0, 1, 2, 3, 6, -1, -6, 2**31 - 1, -2**31, 2**40, 2**63 - 1, -2**63])
VALUES = st.lists(st.sampled_from([0.5, -2.0, 3e38, float("nan"), float("inf")]), max_size=8)


@FUZZ
@given(shape=st.none() | st.lists(DIMS, max_size=4),
       legacy=st.lists(DIMS.filter(lambda d: -2**31 <= d < 2**31), max_size=4),
       data=VALUES, doubles=st.lists(st.sampled_from([1.0, 1e300, -1e300]), max_size=4))
def test_caffe_blob_files_on_any_shape_and_values(tmp_path, shape, legacy, data, doubles):
    """A mean `.binaryproto` of any shape (or legacy dims) and values: a Blob whose shape holds
    its finite float32 values, or one line naming the file."""
    blob = caffe_pb2.BlobProto(data=data, double_data=doubles,
                               **dict(zip(("num", "channels", "height", "width"), legacy)))
    if shape is not None:
        blob.shape.dim.extend(shape)
    path = tmp_path / "mean.binaryproto"
    path.write_bytes(blob.SerializeToString())

    def read():
        b = read_blob_file(str(path))
        assert math.prod(b.shape) == b.values.size and min(b.shape, default=0) >= 0
        assert b.values.dtype == np.float32 and np.isfinite(b.values).all()
    within_memory(read, len(blob.SerializeToString()))


@FUZZ
@given(sizes=st.lists(st.sampled_from([0, 1, 2, 3, -1, -2, 2**31 - 1, -2**31]), min_size=3,
                      max_size=3),
       fit=st.booleans(), data=st.binary(max_size=12), floats=VALUES,
       label=st.integers(-2**31, 2**31 - 1))
def test_lmdb_datums_of_any_sizes(sizes, fit, data, floats, label):
    """A Caffe Datum of any channels/height/width, bytes or floats (`fit`: as many bytes as
    the sizes' product, sign aside): a record of positive sizes that hold its values, or one
    line naming the LMDB and the record."""
    if fit and abs(math.prod(sizes)) <= 64:
        data = bytes(abs(math.prod(sizes)))
    d = caffe_pb2.Datum(channels=sizes[0], height=sizes[1], width=sizes[2], data=data,
                        float_data=floats, label=label)

    def read():
        rec = common_pb2.RecordProto.FromString(datum_record(d.SerializeToString(), b"k", "db"))
        assert min(rec.shape) > 0 and math.prod(rec.shape) == len(rec.pixel or rec.data)
    within_memory(read, d.ByteSize())
