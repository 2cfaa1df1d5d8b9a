"""Split, Slice and Concate: blob routing per destination, and their gradients."""
import numpy as np
import pytest

from gradcheck import BACKWARD, FORWARD, Source, check_gradients, make_layer
from singa.errors import ConfigError


class Dst:
    """Stands for a destination layer: only its identity matters to a connection layer."""

    def __init__(self, name):
        self.name = name


def data(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_split_aliases_the_source_and_sums_destination_gradients():
    src = Source(data((3, 4)))
    layer = make_layer('name: "split" type: kSplit split_conf { num_splits: 3 }', [src])
    layer.compute_feature(FORWARD, [src])
    assert layer.data is src.data
    dsts = [Dst("a"), Dst("b"), Dst("c")]
    gs = [data((3, 4), seed=i) for i in range(3)]
    for dst, g in zip(dsts, gs):
        layer.grad_for(dst)[...] = g
    assert layer.grad_for(dsts[1]) is layer.grads[1]
    layer.compute_gradient(BACKWARD, [src])
    np.testing.assert_allclose(src.grad, gs[0] + gs[1] + gs[2], rtol=1e-6)


def test_split_gradients():
    src = Source(data((3, 4)))
    layer = make_layer('name: "split" type: kSplit split_conf { num_splits: 2 }', [src])
    outputs = [(layer.data, layer.grad_for(Dst(name))) for name in "ab"]
    check_gradients(layer, [src], outputs=outputs)


def test_split_rejects_more_destinations_than_num_splits():
    layer = make_layer('name: "split" type: kSplit split_conf { num_splits: 1 }',
                       [Source(data((2, 2)))])
    layer.grad_for(Dst("a"))
    with pytest.raises(ConfigError, match="layer 'split' has 1 num_splits .* extra one is 'b'"):
        layer.grad_for(Dst("b"))


@pytest.mark.parametrize("dim", [0, 1])
def test_slice_gives_each_destination_its_part_and_gathers_gradients(dim):
    src = Source(data((4, 6)))
    conf = f'name: "slice" type: kSlice slice_conf {{ slice_dim: {dim} num_slices: 2 }}'
    layer = make_layer(conf, [src])
    a, b = Dst("a"), Dst("b")
    layer.compute_feature(FORWARD, [src])
    parts = np.split(src.data, 2, axis=dim)
    np.testing.assert_array_equal(layer.data_for(a), parts[0])
    np.testing.assert_array_equal(layer.data_for(b), parts[1])
    layer.grad_for(a)[...] = 1
    layer.grad_for(b)[...] = 2
    layer.compute_gradient(BACKWARD, [src])
    np.testing.assert_array_equal(src.grad, np.concatenate([np.ones_like(parts[0]),
                                                            2 * np.ones_like(parts[1])], axis=dim))


def test_slice_gradients():
    src = Source(data((4, 6)))
    conf = 'name: "slice" type: kSlice slice_conf { slice_dim: 1 num_slices: 3 }'
    layer = make_layer(conf, [src])
    dsts = [Dst(name) for name in "abc"]
    check_gradients(layer, [src], outputs=[(layer.data_for(d), layer.grad_for(d)) for d in dsts])


def test_slice_rejects_an_uneven_cut():
    with pytest.raises(ConfigError, match="cannot cut source shape \\(4, 5\\) into 2 slices"):
        make_layer('name: "s" type: kSlice slice_conf { slice_dim: 1 num_slices: 2 }',
                   [Source(data((4, 5)))])


@pytest.mark.parametrize("dim", [0, 1])
def test_concate_values_and_gradients(dim):
    shapes = [(2, 3), (2, 3)]
    shapes[1] = (5, 3) if dim == 0 else (2, 4)
    srcs = [Source(data(shapes[0]), name="a"), Source(data(shapes[1], seed=1), name="b")]
    layer = make_layer(f'name: "cat" type: kConcate concate_conf {{ concate_dim: {dim} }}', srcs)
    layer.compute_feature(FORWARD, srcs)
    np.testing.assert_array_equal(layer.data, np.concatenate([s.data for s in srcs], axis=dim))
    check_gradients(layer, srcs)


def test_concate_rejects_mismatched_shapes():
    srcs = [Source(data((2, 3)), name="a"), Source(data((3, 4)), name="b")]
    with pytest.raises(ConfigError, match="source 'b' of shape \\(3, 4\\) does not concatenate"):
        make_layer('name: "cat" type: kConcate concate_conf { concate_dim: 1 }', srcs)
