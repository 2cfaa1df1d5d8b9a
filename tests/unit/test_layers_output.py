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
    assert layer.to_string(FORWARD) == "accuracy = 0.750000"
    assert layer.to_string(FORWARD) == ""
