"""Recurrent layers: CharRNN, OneHot, RNNLabel, RNNDummy, Embedding, GRU, CharRNNOutput; values
against formulas written here, gradients by gradcheck."""
import numpy as np
import pytest

from gradcheck import BACKWARD, FORWARD, Source, check_gradients, make_layer
from singa.errors import ConfigError, DataError
from singa.proto import job_pb2

TEST = job_pb2.kTest | job_pb2.kForward


def params(n):
    return " ".join(f'param {{ name: "p{i}" }}' for i in range(n))


@pytest.fixture
def text(tmp_path):
    """A 26-character text over the vocabulary "abc \\n" (indices 0..4)."""
    (tmp_path / "vocab.txt").write_bytes(b"abc \n")
    (tmp_path / "input.txt").write_bytes(b"abc cab\nbca acb\nab ba ca \n")
    return tmp_path


def char_rnn(path, batchsize=2, unroll_len=3):
    return make_layer(f'name: "data" type: kCharRNN char_rnn_conf {{ path: "{path}/input.txt" '
                      f'vocab_path: "{path}/vocab.txt" batchsize: {batchsize} '
                      f'unroll_len: {unroll_len} }}', [])


def test_char_rnn_fills_unroll_len_plus_one_blobs_of_each_stream(text):
    layer = char_rnn(text)
    chars = (text / "input.txt").read_bytes()
    index = {c: i for i, c in enumerate(b"abc \n")}
    assert layer.one_to_many and len(layer.datavec) == 4
    # 26 // 2 = 13 characters per stream; offset 12 reads past the end of stream 1: it wraps
    for offset in (0, 3, 6, 9, 12, 0):
        layer.compute_feature(FORWARD, [])
        for l, got in enumerate(layer.datavec):
            want = [index[chars[(s * 13 + offset + l) % 26]] for s in range(2)]
            assert got.tolist() == want, (offset, l)
    assert layer.position() == (3, True)


def test_char_rnn_rejects_a_character_missing_from_the_vocabulary(text):
    (text / "input.txt").write_bytes(b"abcab cab\nxa")
    with pytest.raises(DataError, match=r"input.txt: character b'x' at offset 10 is not in .*vocab"):
        char_rnn(text)


def test_char_rnn_rejects_a_vocabulary_listing_a_character_twice(text):
    (text / "vocab.txt").write_bytes(b"abca")
    with pytest.raises(DataError, match=r"vocab.txt: character b'a' at offset 3 is listed twice"):
        char_rnn(text)


def test_char_rnn_needs_streams_longer_than_unroll_len(text):
    with pytest.raises(DataError, match="26 characters are too few for 4 streams of more than 6"):
        char_rnn(text, batchsize=4, unroll_len=6)


def test_onehot_and_rnn_label_read_their_unrolled_blob(text):
    data = char_rnn(text)
    data.compute_feature(FORWARD, [])
    onehot = make_layer('name: "1#onehot" unroll_index: 1 type: kOneHot '
                        'onehot_conf { vocab_size: 6 }', [data])
    label = make_layer('name: "1#label" unroll_index: 1 type: kRNNLabel', [data])
    onehot.compute_feature(FORWARD, [data])
    label.compute_feature(FORWARD, [data])
    want = np.eye(6, dtype=np.float32)[data.datavec[1].astype(int)]
    np.testing.assert_array_equal(onehot.data, want)
    assert label.aux_data.dtype == np.int32 and label.data is None
    np.testing.assert_array_equal(label.aux_data, data.datavec[2])


def test_an_unrolled_copy_beyond_the_blobs_names_both_layers(text):
    data = char_rnn(text)
    with pytest.raises(ConfigError, match=r"layer '3#label' reads blob 4 of 'data', which has 4"):
        make_layer('name: "3#label" unroll_index: 3 type: kRNNLabel', [data])


def test_onehot_index_outside_vocab_size_is_a_data_error():
    src = Source(np.array([1, 7], np.float32), grad=False)
    layer = make_layer('name: "oh" type: kOneHot onehot_conf { vocab_size: 5 }', [src])
    with pytest.raises(DataError, match=r"layer 'oh': index 7 from 'src' is outside \[0, 5\)"):
        layer.compute_feature(FORWARD, [src])


def test_rnn_dummy_draws_integers_in_low_high_without_a_source():
    layer = make_layer('name: "d" type: kRNNDummy rnn_dummy_conf { shape: 2 shape: 3 '
                       'integer: true low: 2 high: 6 dynamic_srclayer: "argsort" }', [])
    assert layer.dynamic_srclayer == "0#argsort"
    seen = set()
    for _ in range(20):
        layer.compute_feature(TEST, [])
        assert layer.data.shape == (2, 3) and layer.data.dtype == np.float32
        seen |= set(layer.data.ravel().tolist())
    assert seen == {2.0, 3.0, 4.0, 5.0}


def test_rnn_dummy_with_a_source_is_that_source():
    a, b = Source(np.ones((1, 1)), name="a"), Source(np.zeros((1, 1)), name="b")
    layer = make_layer('name: "d" type: kRNNDummy', [a])
    assert layer.data is a.data and layer.dynamic_srclayer is None
    layer.compute_feature(TEST, [b])
    assert layer.data is b.data


def test_rnn_dummy_without_source_or_range_is_refused():
    with pytest.raises(ConfigError, match="layer 'd': without a srclayer, rnn_dummy_conf needs a "
                                          "positive shape and low < high"):
        make_layer('name: "d" type: kRNNDummy rnn_dummy_conf { shape: 1 low: 3 high: 3 }', [])


EMBEDDING = 'name: "e" type: kEmbedding embedding_conf { vocab_size: 5 feature_dim: 3 } ' + params(1)


def test_embedding_rows_are_the_indexed_rows_of_w():
    src = Source(np.array([3, 0, 3], np.float32), grad=False)
    layer = make_layer(EMBEDDING, [src])
    assert layer.params[0].shape == (5, 3)
    layer.compute_feature(FORWARD, [src])
    w = layer.params[0].data
    np.testing.assert_array_equal(layer.data, np.stack([w[3], w[0], w[3]]))


def test_embedding_gradients_add_repeated_rows():
    src = Source(np.array([3, 0, 3, 1], np.float32), grad=False)
    layer = make_layer(EMBEDDING, [src])
    assert check_gradients(layer, [src]) == 15
    layer.compute_gradient(BACKWARD | job_pb2.kAggGrad, [src])
    np.testing.assert_allclose(layer.params[0].grad[3], 2 * (layer.grad[0] + layer.grad[2]),
                               rtol=1e-6)


def gru_reference(x, h, w, bias):
    """GRU in float64 with the gates stacked: [z r] = σ([x h]·[Wx Wh]ᵀ + b), c, h' as Cho et al."""
    x, h = x.astype(np.float64), h.astype(np.float64)
    wzx, wrx, wcx, wzh, wrh, wch = (p.astype(np.float64) for p in w)
    b = [np.zeros(len(wzh))] * 3 if bias is None else [v.astype(np.float64) for v in bias]
    xh = np.concatenate([x, h], axis=1)
    zr = 1 / (1 + np.exp(-(xh @ np.concatenate([np.concatenate([wzx, wzh], 1),
                                                np.concatenate([wrx, wrh], 1)]).T
                           + np.concatenate(b[:2]))))
    z, r = np.split(zr, 2, axis=1)
    c = np.tanh(x @ wcx.T + b[2] + r * (h @ wch.T))
    return (1 - z) * c + z * h


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_gru_forward_matches_the_stacked_gate_formula(bias, with_state):
    rng = np.random.default_rng(3)
    x = Source(rng.standard_normal((3, 2, 3)).astype(np.float32))
    h = Source(rng.standard_normal((3, 4)).astype(np.float32))
    srcs = [x, h] if with_state else [x]
    layer = make_layer('name: "g" type: kGRU gru_conf { dim_hidden: 4 } ' + params(9 if bias else 6),
                       srcs)
    shapes = [p.shape for p in layer.params]
    assert shapes[:6] == [(4, 6)] * 3 + [(4, 4)] * 3 and shapes[6:] == ([(4,)] * 3 if bias else [])
    layer.compute_feature(FORWARD, srcs)
    want = gru_reference(x.data.reshape(3, 6), h.data if with_state else np.zeros((3, 4)),
                         [p.data for p in layer.params[:6]],
                         [p.data for p in layer.params[6:]] if bias else None)
    np.testing.assert_allclose(layer.data, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bias", [True, False])
def test_gru_gradients_to_input_state_and_params(bias):
    rng = np.random.default_rng(4)
    x = Source(rng.standard_normal((3, 5)).astype(np.float32))
    h = Source(0.5 * rng.standard_normal((3, 4)).astype(np.float32))
    layer = make_layer('name: "g" type: kGRU gru_conf { dim_hidden: 4 } ' + params(9 if bias else 6),
                       [x, h])
    assert check_gradients(layer, [x, h]) == 15 + 12 + 3 * 20 + 3 * 16 + (12 if bias else 0)


def test_gru_aggregates_param_grads_with_kagggrad():
    x = Source(np.random.default_rng(5).standard_normal((2, 3)).astype(np.float32))
    layer = make_layer('name: "g" type: kGRU gru_conf { dim_hidden: 2 } ' + params(9), [x])
    layer.compute_feature(FORWARD, [x])
    layer.grad[...] = 1
    layer.compute_gradient(BACKWARD, [x])
    once = [p.grad.copy() for p in layer.params]
    layer.compute_gradient(BACKWARD | job_pb2.kAggGrad, [x])
    for p, g in zip(layer.params, once):
        np.testing.assert_allclose(p.grad, 2 * g, rtol=1e-6)


def test_gru_refuses_a_state_of_the_wrong_shape():
    x, h = Source(np.zeros((2, 3))), Source(np.zeros((2, 5)), name="prev")
    with pytest.raises(ConfigError, match=r"state source 'prev' has shape \(2, 5\), expected \(2, 4\)"):
        make_layer('name: "g" type: kGRU gru_conf { dim_hidden: 4 } ' + params(6), [x, h])


def test_gru_needs_six_param_entries():
    with pytest.raises(ConfigError, match="layer 'g' needs 6 param entries"):
        make_layer('name: "g" type: kGRU gru_conf { dim_hidden: 4 } ' + params(3),
                   [Source(np.zeros((2, 3)))])


def test_char_rnn_output_prints_the_vocabulary_characters(text, capsysbinary):
    src = Source(np.array([[2], [0], [3], [4]], np.float32), grad=False)
    layer = make_layer(f'name: "out" type: kCharRNNOutput char_rnn_conf {{ '
                       f'vocab_path: "{text}/vocab.txt" }}', [src])
    layer.compute_feature(TEST, [src])
    assert capsysbinary.readouterr().out == b"ca \n"
    src.data[0] = 5
    with pytest.raises(DataError, match="layer 'out': index 5 is outside the 5 characters"):
        layer.compute_feature(TEST, [src])
