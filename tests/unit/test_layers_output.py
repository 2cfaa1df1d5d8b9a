"""ArgSort and Accuracy: SINGA's top-k order (ties: higher index first) and the display string."""
import numpy as np
import pytest

from gradcheck import FORWARD, Source, make_layer
from singa.errors import ConfigError
from singa.proto import job_pb2


def test_argsort_gives_top_k_indices_descending_with_ties_to_the_higher_index():
    src = Source(np.array([[0.1, 0.9, 0.5, 0.9], [3, 2, 1, 0]]))
    layer = make_layer('name: "top" type: kArgSort argsort_conf { topk: 3 }', [src])
    layer.compute_feature(job_pb2.kTest, [src])
    assert layer.data.dtype == np.float32
    np.testing.assert_array_equal(layer.data, [[3, 1, 2], [0, 1, 2]])


def test_argsort_rejects_topk_beyond_the_row():
    with pytest.raises(ConfigError, match="topk 5 must be in \\[1, 4\\]"):
        make_layer('name: "top" type: kArgSort argsort_conf { topk: 5 }',
                   [Source(np.zeros((2, 4)))])


def test_accuracy_accumulates_hits_and_resets_on_display():
    scores = Source(np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]]))
    labels = Source(np.zeros((2, 1)), labels=[2, 0], grad=False)
    layer = make_layer('name: "acc" type: kAccuracy argsort_conf { topk: 2 }', [scores, labels])
    layer.compute_feature(FORWARD, [scores, labels])
    labels.aux_data[...] = [1, 2]
    layer.compute_feature(FORWARD, [scores, labels])
    assert layer.metrics(FORWARD) == {"accuracy": 0.75}
    assert layer.metrics(FORWARD) == {}


def output_layer(kind, path, src, store=""):
    return make_layer(f'name: "out" type: {kind} store_conf {{ path: "{path}" {store} }}', [src])


def test_csv_output_appends_label_and_values_per_instance_across_batches(tmp_path):
    path = tmp_path / "out.csv"
    src = Source(np.array([[1.5, -2.25, 0], [1 / 3, 1e6, -1e-7]]), labels=[3, 0])
    layer = output_layer("kCSVOutput", path, src)
    layer.compute_feature(job_pb2.kTest, [src])
    src.aux_data[...] = [7, 8]
    layer.compute_feature(job_pb2.kTest, [src])
    assert path.read_text().splitlines() == [
        "3,1.500000,-2.250000,0.000000", "0,0.333333,1000000.000000,-0.000000",
        "7,1.500000,-2.250000,0.000000", "8,0.333333,1000000.000000,-0.000000"]


def test_csv_output_without_labels_writes_values_only(tmp_path):
    path = tmp_path / "out.csv"
    src = Source(np.array([[[2.0], [4.0]]]))
    output_layer("kCSVOutput", path, src).compute_feature(job_pb2.kTest, [src])
    assert path.read_text() == "2.000000,4.000000\n"


def test_csv_output_refuses_a_binary_backend(tmp_path):
    with pytest.raises(ConfigError, match="layer 'out': kCSVOutput writes text; store_conf.backend"
                                          " must be \"textfile\" or unset, not 'kvfile'"):
        output_layer("kCSVOutput", tmp_path / "o", Source(np.zeros((1, 2))), 'backend: "kvfile"')


def test_record_output_writes_a_record_per_instance_keyed_by_a_counter(tmp_path):
    from singa.io.kvfile import KVFile
    from singa.proto import common_pb2
    path = tmp_path / "out.bin"
    x = np.random.default_rng(0).standard_normal((3, 2, 2)).astype(np.float32)
    src = Source(x, labels=[4, 5, 6])
    layer = output_layer("kRecordOutput", path, src, 'backend: "kvfile"')
    layer.compute_feature(job_pb2.kTest, [src])
    layer.compute_feature(job_pb2.kTest, [src])
    with KVFile(str(path), "read") as f:
        tuples = list(f)
    assert [k for k, _ in tuples] == [b"0", b"1", b"2", b"3", b"4", b"5"]
    for i, (_, value) in enumerate(tuples):
        rec = common_pb2.RecordProto.FromString(value)
        assert rec.label == 4 + i % 3
        assert np.array_equal(np.array(rec.data, np.float32), x[i % 3].ravel())


@pytest.mark.parametrize("store, field", [('path: "p"', "backend"), ('backend: "kvfile"', "path")])
def test_record_output_needs_backend_and_path(store, field):
    with pytest.raises(ConfigError, match=f"layer 'out': store_conf.{field} is not set"):
        make_layer(f'name: "out" type: kRecordOutput store_conf {{ {store} }}',
                   [Source(np.zeros((1, 2)))])
