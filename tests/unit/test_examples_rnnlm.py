"""examples/rnnlm's user layers, loaded as a user's file: data windows end at "</s>", and the
embedding, hidden (BPTT over the window) and class-factored loss layers against formulas
written here and gradcheck."""
import os

import numpy as np
import pytest

import singa
from gradcheck import FORWARD, Source, check_gradients, make_layer
from singa import extensions
from singa.io.kvfile import KVFile

HERE = os.path.join(singa.HOME, "examples", "rnnlm")
rnnlm = extensions.load_proto(os.path.join(HERE, "rnnlm.proto"))
extensions.load_layers(os.path.join(HERE, "rnnlm.py"))


def words(rows, window):
    """A data-layer stand-in: rows [word, class, class_start, class_end] and its window."""
    src = Source(np.array(rows, np.float32), grad=False, name="data")
    src.window = window
    return src


# vocabulary of 6 words in 2 classes: words 0-2 class 0, words 3-5 class 1
ROWS = [[1, 0, 0, 3], [4, 1, 3, 6], [2, 0, 0, 3], [5, 1, 3, 6], [0, 0, 0, 3]]


def test_data_layer_windows_end_at_sentence_ends_and_carry_the_last_word(tmp_path):
    path = tmp_path / "words.bin"
    with KVFile(str(path), "create") as f:
        for i, w in enumerate([3, 4, 0, 5, 1, 2, 4, 0]):
            f.insert(b"%05d" % i, rnnlm.WordRecord(word_index=w, class_index=w % 2).SerializeToString())
    layer = make_layer(f'name: "data" user_type: "kData" [data_conf] {{ path: "{path}" '
                       f'max_window: 3 }}', [])
    seen = []
    for _ in range(4):
        layer.compute_feature(FORWARD, [])
        seen.append(layer.data[:layer.window + 1, 0].astype(int).tolist())
    # row 0 is the last word of the window before; a window stops after "</s>" (index 0)
    assert seen == [[3, 4, 0], [0, 5, 1, 2], [2, 4, 0], [0, 3, 4, 0]]


def test_embedding_rows_and_gradients():
    src = words(ROWS, 4)
    layer = make_layer('name: "e" user_type: "kEmbedding" [embedding_conf] { word_dim: 3 '
                       'vocab_size: 6 } param { name: "w" }', [src])
    layer.compute_feature(FORWARD, [src])
    np.testing.assert_array_equal(layer.data[:4], layer.params[0].data[[1, 4, 2, 5]])
    assert check_gradients(layer, [src], outputs=[(layer.data[:4], layer.grad[:4])]) == 18


def test_hidden_layer_recurrence_and_gradients():
    rng = np.random.default_rng(0)
    x = Source(rng.standard_normal((5, 3)).astype(np.float32))
    x.window = 4
    layer = make_layer('name: "h" user_type: "kHidden" param { name: "w" }', [x])
    layer.compute_feature(FORWARD, [x])
    w, h = layer.params[0].data.astype(np.float64), np.zeros(3)
    for t in range(4):
        h = 1 / (1 + np.exp(-(x.data[t] + (h @ w if t else 0))))
        np.testing.assert_allclose(layer.data[t], h, rtol=1e-5)
    assert check_gradients(layer, [x], outputs=[(layer.data[:4], layer.grad[:4])]) == 15 + 9


def test_loss_is_the_class_factored_softmax_and_its_gradients():
    rng = np.random.default_rng(1)
    h = Source(rng.standard_normal((5, 3)).astype(np.float32))
    h.window = 4
    data = words(ROWS, 4)
    layer = make_layer('name: "loss" user_type: "kLoss" [loss_conf] { nclass: 2 vocab_size: 6 } '
                       'param { name: "ww" } param { name: "wc" }', [h, data])
    layer.compute_feature(FORWARD, [h, data])
    ww, wc = (p.data.astype(np.float64) for p in layer.params)
    want = 0.0
    for t in range(4):
        wid, cid, start, end = ROWS[t + 1]
        pw = np.exp(ww[start:end] @ h.data[t]) / np.exp(ww[start:end] @ h.data[t]).sum()
        pc = np.exp(wc @ h.data[t]) / np.exp(wc @ h.data[t]).sum()
        want -= np.log(pw[wid - start] * pc[cid])
    assert layer.metrics(FORWARD) == pytest.approx({"loss": want / 4, "ppl": np.exp(want / 4)},
                                                   rel=1e-5)

    def objective():
        return layer.metrics(FORWARD)["loss"] * 4
    assert check_gradients(layer, [h, data], objective=objective) == 15 + 18 + 6
