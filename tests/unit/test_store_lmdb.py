"""Caffe's data read as it is: the "lmdb" store (Datums, raw and encoded), the "imagelist" store
(ImageData's list), kRecordInput and kLMDBData over them, against what real Caffe read from
the same files (tests/fixtures/caffe/data, made by Caffe's convert_imageset)."""
import io
import os
import subprocess
import sys

import numpy as np
import pytest

from singa import HOME
from singa.errors import DataError
from singa.io.records import parse_record
from singa.io.store import count_records, open_store
from singa.proto import caffe_pb2, job_pb2

from gradcheck import make_layer

lmdb = pytest.importorskip("lmdb")
Image = pytest.importorskip("PIL.Image")

DATA = os.path.join(HOME, "tests", "fixtures", "caffe", "data")
TRAIN = job_pb2.kTrain


def caffe(name):
    return np.load(os.path.join(DATA, "caffe_out", f"{name}.npy"))


def read_all(backend, path, conf=None):
    """(images (N, C, H, W) float32, labels) of every record of a store."""
    xs, labels = [], []
    with open_store(backend, path, "read", conf) as store:
        for key, value in store:
            rec = parse_record(value, key)
            xs.append(np.frombuffer(rec.pixel, np.uint8).reshape(rec.shape))
            labels.append(rec.label)
    return np.stack(xs).astype(np.float32), np.array(labels)


def image_list(**fields):
    return job_pb2.StoreProto(root_folder=os.path.join(DATA, "images"), **fields)


@pytest.mark.parametrize("name, backend, path, conf", [
    ("raw", "lmdb", "raw_lmdb", None),                   # Datums of BGR bytes
    ("encoded", "lmdb", "encoded_lmdb", None),           # two PNG files, two JPEG files
    ("list", "imagelist", "list.txt", image_list()),
    ("list_resized", "imagelist", "list.txt", image_list(new_height=5, new_width=12)),
])
def test_records_are_what_caffes_data_layers_read(name, backend, path, conf):
    x, labels = read_all(backend, os.path.join(DATA, path), conf)
    np.testing.assert_array_equal(x, caffe(name))
    np.testing.assert_array_equal(labels, caffe(f"{name}_label"))


def write_lmdb(path, values):
    """An LMDB of `values` (bytes) under keys 00000000, 00000001, ... (convert_imageset's order)."""
    with lmdb.open(str(path), map_size=1 << 24) as env, env.begin(write=True) as txn:
        for i, value in enumerate(values):
            txn.put(b"%08d" % i, value)
    return str(path)


def datum(i, c=2, h=2, w=3, **fields):
    d = caffe_pb2.Datum(channels=c, height=h, width=w, label=i,
                        data=bytes(range(i, i + c * h * w)), **fields)
    return d.SerializeToString()


def record_input(path, conf="", backend="lmdb", seed=0):
    return make_layer(f'name: "data" type: kRecordInput store_conf {{ backend: "{backend}" '
                      f'path: "{path}" {conf} }}', [], seed=seed)


def test_shape_comes_from_the_first_datum_and_float_data_reads(tmp_path):
    floats = caffe_pb2.Datum(channels=1, height=1, width=3, label=7,
                             float_data=[0.5, -1, 2]).SerializeToString()
    path = write_lmdb(tmp_path / "db", [floats, floats])
    layer = record_input(path, "batchsize: 2")
    layer.compute_feature(TRAIN, [])
    assert layer.data.shape == (2, 1, 1, 3)
    np.testing.assert_array_equal(layer.data[0, 0, 0], [0.5, -1, 2])
    assert list(layer.aux_data) == [7, 7]
    assert count_records("lmdb", path) == 2


def test_reader_position_resumes_exactly_across_the_wrap(tmp_path):
    path = write_lmdb(tmp_path / "db", [datum(i) for i in range(5)])
    layer = record_input(path, "batchsize: 2 random_skip: 3", seed=4)
    batches = []
    for _ in range(2):
        layer.compute_feature(TRAIN, [])
    saved = layer.position()
    for _ in range(4):
        layer.compute_feature(TRAIN, [])
        batches.append((layer.data.copy(), layer.aux_data.copy()))
    again = record_input(path, "batchsize: 2 random_skip: 3", seed=99)
    again.seek(*saved)
    for x, labels in batches:
        again.compute_feature(TRAIN, [])
        np.testing.assert_array_equal(again.data, x)
        np.testing.assert_array_equal(again.aux_data, labels)


def test_random_skip_starts_at_a_drawn_record(tmp_path):
    path = write_lmdb(tmp_path / "db", [datum(i) for i in range(20)])
    firsts = set()
    for seed in range(12):
        layer = record_input(path, "batchsize: 1 random_skip: 19", seed=seed)
        layer.compute_feature(TRAIN, [])
        firsts.add(int(layer.aux_data[0]))
    assert len(firsts) > 3


def test_partitions_on_dim_0_keep_their_rows_of_each_batch(tmp_path):
    path = write_lmdb(tmp_path / "db", [datum(i) for i in range(6)])
    rows = []
    for k in range(2):
        layer = make_layer(f'name: "data" type: kRecordInput partition_dim: 0 num_partitions: 2 '
                           f'partition_id: {k} store_conf {{ backend: "lmdb" path: "{path}" '
                           f'batchsize: 4 }}', [])
        layer.compute_feature(TRAIN, [])
        rows.append(list(layer.aux_data))
    assert rows == [[0, 1], [2, 3]]


def test_lmdb_data_layer_runs_singa_confs_with_its_parsers(tmp_path):
    """SINGA's kLMDBData (lmdbdata_conf) feeding kRGBImage and kLabel, as 0.x confs wire it."""
    src = make_layer(f'name: "lmdb" type: kLMDBData lmdbdata_conf {{ path: "{DATA}/raw_lmdb" '
                     f'batchsize: 4 }}', [])
    rgb = make_layer('name: "rgb" type: kRGBImage rgbimage_conf { scale: 0.5 }', [src])
    label = make_layer('name: "label" type: kLabel', [src])
    for layer in (src, rgb, label):
        layer.compute_feature(job_pb2.kTest, [src] if layer is not src else [])
    np.testing.assert_array_equal(rgb.data, caffe("raw") * np.float32(0.5))
    np.testing.assert_array_equal(label.aux_data, caffe("raw_label"))


def test_a_shuffled_list_reads_every_image_once_a_pass_and_resumes_in_its_order():
    conf = image_list(shuffle=True)
    store = open_store("imagelist", os.path.join(DATA, "list.txt"), "read", conf)
    store.start(np.random.default_rng(5))
    passes, saved = [], None
    for p in range(4):
        keys = []
        for i in range(4):
            if p == 1 and i == 2:
                saved = store.tell()
            keys.append(store.read()[0])
        assert store.read() is None
        store.seek_to_first()
        passes.append(keys)
    assert all(sorted(k) == [b"img%d.png" % i for i in range(4)] for k in passes)
    assert len({tuple(k) for k in passes}) > 1
    again = open_store("imagelist", os.path.join(DATA, "list.txt"), "read", conf)
    again.seek(saved)
    rest = [again.read()[0] for _ in range(2)]
    assert again.read() is None
    again.seek_to_first()
    assert rest == passes[1][2:] and [again.read()[0] for _ in range(4)] == passes[2]
    assert count_records("imagelist", os.path.join(DATA, "list.txt")) == 4


def png(array, mode=None):
    buf = io.BytesIO()
    Image.fromarray(array, mode).save(buf, "PNG")
    return buf.getvalue()


def test_encoded_images_keep_opencvs_channels():
    from singa.io.images import decode_image
    rgba = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    np.testing.assert_array_equal(decode_image(png(rgba), "x"),
                                  rgba[:, :, [2, 1, 0, 3]].transpose(2, 0, 1))     # BGRA
    gray = np.arange(6, dtype=np.uint8).reshape(2, 3)
    assert decode_image(png(gray), "x").shape == (1, 2, 3)
    assert decode_image(png(gray), "x", is_color=True).shape == (3, 2, 3)
    assert decode_image(png(rgba[:, :, :3].copy()), "x", is_color=False).shape == (1, 2, 3)


def corrupt_lmdb(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "data.mdb").write_bytes(b"not an lmdb" * 1000)
    return str(tmp_path / "bad")


@pytest.mark.parametrize("make, message", [
    (corrupt_lmdb, r"bad: not a readable LMDB \("),
    (lambda t: write_lmdb(t / "db", [caffe_pb2.Datum(channels=2, height=2, width=3,
                                                     data=bytes(9)).SerializeToString()]),
     r"db: record '00000000' is a Datum of shape 2x2x3 holding 9 values$"),
    (lambda t: write_lmdb(t / "db", [b"\xff\xff\xff"]),
     r"db: record '00000000' is not a Caffe Datum \(3 bytes\)$"),
    (lambda t: write_lmdb(t / "db", [caffe_pb2.Datum(encoded=True, data=b"\x89PNG garbage")
                                     .SerializeToString()]),
     r"db: record '00000000': not an image Pillow decodes \("),
    (lambda t: str(t / "none"), r"none: no such LMDB$"),
])
def test_bad_lmdb_data_is_one_line_naming_the_file(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(DataError, match=message) as e:
        read_all("lmdb", path)
    assert "\n" not in str(e.value) and str(e.value).startswith(path)


def test_a_datum_of_another_shape_than_the_conf_names_the_lmdb(tmp_path):
    path = write_lmdb(tmp_path / "db", [datum(0), datum(1, c=1)])
    layer = record_input(path, "batchsize: 2 shape: 2 shape: 2 shape: 3")
    with pytest.raises(DataError, match=rf"^{path}: record '00000001' has 6 values, expected 12"):
        layer.compute_feature(TRAIN, [])


@pytest.mark.parametrize("lines, message", [
    ("a.png 0\n", r"cannot read image .*a.png: No such file"),
    ("b.png 1\n", r"b.png: not an image Pillow decodes"),
    ("a.png zero\n", r"list.txt:1: expected '<image path> <label>', got 'a.png zero'"),
])
def test_bad_image_lists_are_one_line(tmp_path, lines, message):
    (tmp_path / "b.png").write_bytes(b"not a png")
    (tmp_path / "list.txt").write_text(lines)
    with pytest.raises(DataError, match=message) as e:
        read_all("imagelist", str(tmp_path / "list.txt"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("datum, message", [
    (caffe_pb2.Datum(channels=-1, height=-2, width=3, data=bytes(6)),
     r"db: record '00000000' is a Datum of shape -1x-2x3 holding 6 values$"),
    (caffe_pb2.Datum(channels=-1, height=1, width=-2, float_data=[1, 2]),
     r"db: record '00000000' is a Datum of shape -1x1x-2 holding 2 values$"),
])
def test_a_datum_of_negative_sizes_is_refused_at_its_record(tmp_path, datum, message):
    """Found by fuzzing: sizes whose product is the count passed, and the layer said
    "store_conf.shape must list positive sizes, got []" without naming the LMDB."""
    path = write_lmdb(tmp_path / "db", [datum.SerializeToString()])
    with pytest.raises(DataError, match=message):
        record_input(path, "batchsize: 1")


def damaged_lmdb(tmp_path, edit):
    """A copy of the raw fixture LMDB after `edit(bytearray of its data.mdb)`."""
    with open(os.path.join(DATA, "raw_lmdb", "data.mdb"), "rb") as f:
        data = bytearray(f.read())
    edit(data)
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "data.mdb").write_bytes(data)
    return str(tmp_path / "db")


@pytest.mark.parametrize("cut", [4096 * 2 + 100, 4096 * 3 - 1])
def test_a_cut_lmdb_is_one_line_not_a_crash(tmp_path, cut):
    """Found by fuzzing: LMDB reads the pages its meta page counts from the mapped file as
    memory, and on a file cut short the process died of SIGBUS. Read in a child process,
    which the crash would kill."""
    path = damaged_lmdb(tmp_path, lambda d: d.__delitem__(slice(cut, None)))
    code = ("import sys; from singa.errors import run_command; from singa.io.store import "
            f"open_store; sys.exit(run_command(lambda: list(open_store('lmdb', {path!r}))))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HOME,
                       timeout=60)
    assert (p.returncode, p.stderr) == (2, f"{path}: a truncated LMDB ({cut} bytes; its pages "
                                          f"need 12288)\n")


def test_only_the_formats_opencv_reads_are_decoded(tmp_path, monkeypatch):
    """An encoded Datum in a format Caffe's OpenCV does not read is refused before Pillow
    loads it: Pillow reads EPS through Ghostscript, which runs the PostScript it holds."""
    from PIL import EpsImagePlugin

    def ghostscript(*args, **kwargs):
        raise AssertionError("Ghostscript ran")
    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", ghostscript)
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 2 2\nshowpage\n"
    path = write_lmdb(tmp_path / "db", [caffe_pb2.Datum(encoded=True, data=eps)
                                        .SerializeToString()])
    with pytest.raises(DataError, match=r"db: record '00000000': not an image Pillow decodes "
                                        r"\(cannot identify image file"):
        read_all("lmdb", path)


@pytest.mark.parametrize("backend, path, conf", [
    ("lmdb", "encoded_lmdb", None), ("imagelist", "list.txt", image_list())])
def test_a_batch_of_images_is_decoded_side_by_side_to_the_records_one_at_a_time(
        monkeypatch, backend, path, conf):
    from singa.io.decoders import Decoders
    batches, decode = [], Decoders.decode

    def watched(self, images):
        batches.append(len(images))
        return decode(self, images)
    with open_store(backend, os.path.join(DATA, path), "read", conf) as store:
        alone = [store.read() for _ in range(4)]
    monkeypatch.setattr(Decoders, "decode", watched)
    with open_store(backend, os.path.join(DATA, path), "read", conf) as store:
        assert store.read_many(5) == alone and store.read_many(3) == []
    assert batches == [4]


@pytest.mark.parametrize("backend, path, conf", [
    ("lmdb", "encoded_lmdb", None), ("imagelist", "list.txt", image_list()),
    ("imagelist", "list.txt", image_list(new_height=5, new_width=12))])
def test_a_batch_of_images_of_one_shape_comes_as_one_array_of_the_records_bytes(backend, path,
                                                                                conf):
    """A batch of encoded images of one shape (an LMDB's, an image list's) is one
    (n, C, H, W) uint8 array and its labels: the bytes and labels of the records read one
    at a time, across the wrap."""
    from singa.io.records import Samples
    from singa.io.store import read_columns
    path = os.path.join(DATA, path)
    with open_store(backend, path, "read", conf) as store:
        records = [parse_record(v, k) for k, v in iter(store.read, None)]
    with open_store(backend, path, "read", conf) as store:
        keys, values = read_columns(store, 7, path, backend)
    assert isinstance(values, Samples) and len(values.x) == len(keys) == 7
    for i, rec in enumerate(records + records[:3]):
        assert values.x[i].shape == tuple(rec.shape) and values.x[i].tobytes() == rec.pixel
        assert values.labels[i] == rec.label


def test_a_batch_of_images_of_several_shapes_comes_as_their_records(tmp_path):
    """With an image of another shape in the batch, the records themselves: the input layer
    names the odd one."""
    from singa.io.store import read_columns
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, "PNG")
    odd = caffe_pb2.Datum(encoded=True, data=buf.getvalue(), label=1).SerializeToString()
    with lmdb.open(os.path.join(DATA, "encoded_lmdb"), readonly=True, lock=False) as env, \
            env.begin() as txn:
        theirs = [v for _, v in txn.cursor()]
    mixed = write_lmdb(tmp_path / "db", theirs[:2] + [odd])
    with open_store("lmdb", mixed, "read") as store:
        keys, values = read_columns(store, 3, mixed, "lmdb")
    with open_store("lmdb", mixed, "read") as store:
        assert values == [v for _, v in store.read_many(3)]


def test_caffe_stores_read_the_next_batch_while_the_net_computes_and_resume_exactly(tmp_path):
    """The input layer reads batch k + 1 in its own thread after handing out batch k; its
    position stays that of the batches used, so a snapshot resumes at batch k + 1."""
    from singa.io import lmdbstore
    path = write_lmdb(tmp_path / "db", [datum(i) for i in range(7)])
    layer = record_input(path, "batchsize: 2")
    readers, read = [], lmdbstore.LMDBStore._read

    def watched(store, n):
        readers.append(__import__("threading").current_thread().name)
        return read(store, n)
    lmdbstore.LMDBStore._read = watched
    try:
        layer.compute_feature(TRAIN, [])
        layer._ahead.result()
        assert readers == ["MainThread", "read data_0"], readers
        assert layer.position() == (2, True)
        layer.compute_feature(TRAIN, [])
        saved, want = layer.position(), []
        for _ in range(4):
            layer.compute_feature(TRAIN, [])
            want.append(list(layer.aux_data))
    finally:
        lmdbstore.LMDBStore._read = read
    layer.close()
    assert saved == (4, True) and want == [[4, 5], [6, 0], [1, 2], [3, 4]]
    again = record_input(path, "batchsize: 2")
    again.seek(*saved)
    got = []
    for _ in range(4):
        again.compute_feature(TRAIN, [])
        got.append(list(again.aux_data))
    assert got == want
