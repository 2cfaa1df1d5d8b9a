"""NeuralNet::Create: phase filter, unrolling names, share_from, split layers, sharing."""
import numpy as np
import pytest
from google.protobuf import text_format

from singa.errors import ConfigError
from singa.net.neuralnet import NeuralNet, add_split_layers, filter_phase, unroll
from singa.proto import job_pb2

FIXTURE = "tests/fixtures/singa-0.3/train-1000.bin"

MLP = f"""
layer {{ name: "data" type: kRecordInput include: kTrain
  store_conf {{ backend: "kvfile" path: "{FIXTURE}" batchsize: 8 shape: 784 std_value: 255 }} }}
layer {{ name: "data" type: kRecordInput include: kTest
  store_conf {{ backend: "kvfile" path: "{FIXTURE}" batchsize: 4 shape: 784 std_value: 255 }} }}
layer {{ name: "ip1" type: kInnerProduct srclayers: "data" innerproduct_conf {{ num_output: 6 }}
  param {{ name: "w1" init {{ type: kGaussian std: 0.1 }} }}
  param {{ name: "b1" init {{ type: kConstant value: 0 }} }} }}
layer {{ name: "drop" type: kDropout srclayers: "ip1" exclude: kTest }}
layer {{ name: "ip2" type: kInnerProduct srclayers: "ip1" innerproduct_conf {{ num_output: 10 }}
  param {{ name: "w2" init {{ type: kGaussian std: 0.1 }} }}
  param {{ name: "b2" init {{ type: kConstant value: 0 }} }} }}
layer {{ name: "loss" type: kSoftmaxLoss srclayers: "ip2" srclayers: "data" }}
"""


def net_conf(text):
    return text_format.Parse(text, job_pb2.NetProto())


def make(text, phase=job_pb2.kTrain, **kw):
    net = NeuralNet(net_conf(text), phase, np.random.default_rng(0), **kw)
    for p in net.owner_params:
        p.init_values(np.random.default_rng(1))
    return net


def names(net):
    return [layer.name for layer in net.layers]


def test_train_net_has_prefixed_names_split_and_topological_order():
    net = make(MLP)
    assert names(net) == ["0#data", "0#ip1", "split(0#ip1)", "0#drop", "0#ip2", "0#loss"]
    assert [p.name for p in net.params] == ["0#w1", "0#b1", "0#w2", "0#b2"]
    assert [p.id for p in net.params] == [0, 1, 2, 3]
    assert [s.name for s in net.srclayers["0#ip2"]] == ["split(0#ip1)"]
    # the input layer feeds ip1 and the loss without a split layer (one-to-many)
    assert [s.name for s in net.srclayers["0#loss"]] == ["0#ip2", "0#data"]


def test_phase_filter_uses_include_and_exclude():
    net = make(MLP, job_pb2.kTest)
    assert names(net) == ["0#data", "0#ip1", "0#ip2", "0#loss"]
    assert net.layers[0].data.shape == (4, 784)


def test_test_net_shares_values_with_train_net():
    train = make(MLP)
    test = make(MLP, job_pb2.kTest, share_from=train, first_id=train.next_id)
    w_train = {p.name: p for p in train.params}["0#w1"]
    w_test = {p.name: p for p in test.params}["0#w1"]
    assert w_test.data is w_train.data
    assert test.owner_params == [] and w_test.owner == w_train.id != w_test.id


def test_forward_backward_changes_nothing_but_grads():
    net = make(MLP)
    net.forward(job_pb2.kTrain | job_pb2.kForward)
    for layer in reversed(net.layers):
        layer.compute_gradient(job_pb2.kTrain | job_pb2.kBackward, net.srclayers[layer.name])
    assert all(np.abs(p.grad).sum() > 0 for p in net.params)
    assert list(net.metrics(job_pb2.kTrain)) == ["0#loss"]


def test_data_parallel_copies_split_batch_and_share_partition_0():
    net = make(MLP, num_partitions=2)
    p0, p1 = net.partition(0), net.partition(1)
    assert p0.layers[0].name == "0#data@0" and p1.layers[0].name == "0#data@1"
    assert p0.layers[0].data.shape == (4, 784) == p1.layers[0].data.shape
    assert p1.owner_params == []
    assert [p.owner for p in p1.params] == [p.id for p in p0.params]
    assert all(a.data is b.data and a.grad is not b.grad for a, b in zip(p0.params, p1.params))


def test_user_share_from_resolves_to_unrolled_name():
    # a decoder sharing the encoder's weight transposed, as in SINGA's autoencoder.conf
    text = MLP.replace('layer {{ name: "ip2"'.replace("{{", "{"), 'layer { name: "dec" type: kInnerProduct '
                       'srclayers: "ip1" innerproduct_conf { num_output: 784 transpose: true } '
                       'param { name: "w1t" share_from: "w1" } '
                       'param { name: "bt" init { type: kConstant value: 0 } } }\nlayer { name: "ip2"')
    net = make(text)
    w1, w1t = (next(p for p in net.params if p.name == n) for n in ("0#w1", "0#w1t"))
    assert w1t.data is w1.data and w1t.grad is not w1.grad and not w1t.is_owner
    assert w1t.owner == w1.id


def test_share_from_naming_no_param_is_an_error():
    text = MLP.replace('param { name: "w2" init { type: kGaussian std: 0.1 } }',
                       'param { name: "w2" share_from: "nope" }')
    with pytest.raises(ConfigError, match="share_from 'nope'"):
        make(text)


def conf_layers(text):
    return list(net_conf(text).layer)


def test_unrolling_names_edges_and_param_sharing_like_test_unrolling_cc():
    layers = conf_layers("""
      layer { name: "data" unroll_len: 3 type: kDummy }
      layer { name: "embed" unroll_len: 3 srclayers: "data" type: kDummy
              param { name: "w" } }
      layer { name: "gru" unroll_len: 3 srclayers: "embed" type: kGRU
              param { name: "w_z_hx" } }
      layer { name: "loss" unroll_len: 3 srclayers: "gru" srclayers: "data" type: kDummy
              unroll_conn_type: kUnrollOneToOne unroll_conn_type: kUnrollOneToAll }
      layer { name: "first" unroll_len: 1 srclayers: "gru" type: kDummy
              unroll_conn_type: kUnrollFirstToLast }
    """)
    out = {c.name: c for c in unroll(layers)}
    assert list(out) == ["0#data", "1#data", "2#data", "0#embed", "1#embed", "2#embed",
                         "0#gru", "1#gru", "2#gru", "0#loss", "1#loss", "2#loss", "0#first"]
    assert list(out["1#embed"].srclayers) == ["1#data"]
    assert list(out["2#gru"].srclayers) == ["2#embed", "1#gru"]
    assert list(out["0#gru"].srclayers) == ["0#embed"]
    assert list(out["1#loss"].srclayers) == ["1#gru", "0#data", "1#data", "2#data"]
    assert list(out["0#first"].srclayers) == ["2#gru"]
    assert out["2#gru"].param[0].name == "2#w_z_hx"
    assert out["2#gru"].param[0].share_from == "0#w_z_hx"
    assert not out["0#gru"].param[0].share_from


def test_shift_connects_earlier_copies():
    layers = conf_layers("""
      layer { name: "a" unroll_len: 3 type: kDummy }
      layer { name: "b" unroll_len: 3 srclayers: "a" shift: 1 type: kDummy }
    """)
    out = {c.name: list(c.srclayers) for c in unroll(layers)}
    assert out["0#b"] == [] and out["1#b"] == ["0#a"] and out["2#b"] == ["1#a"]


def test_split_layer_goes_between_a_layer_and_its_several_destinations():
    layers = conf_layers("""
      layer { name: "a" type: kSTanh }
      layer { name: "b" srclayers: "a" type: kSTanh }
      layer { name: "c" srclayers: "a" type: kSTanh }
    """)
    out = add_split_layers(layers)
    assert [c.name for c in out] == ["a", "split(a)", "b", "c"]
    assert out[1].split_conf.num_splits == 2
    assert list(out[2].srclayers) == ["split(a)"] == list(out[3].srclayers)


def test_graph_json_has_nodes_with_shapes_and_links():
    import json
    g = json.loads(make(MLP).to_json())
    assert g["directed"] == 1
    assert g["nodes"][1]["label"] == "0#ip1 -- shape: 8 6"
    assert {"source": 0, "target": 1, "label": ""} in g["links"]


def test_net_defaults_copied_to_layers():
    net = net_conf("""
      unroll_len: 3 partition_dim: 1
      layer { name: "a" type: kSTanh }
      layer { name: "b" srclayers: "a" type: kSTanh }
      layer { name: "c" srclayers: "b" type: kSTanh }
      layer { name: "loss" srclayers: "c" type: kSTanh unroll_len: 1 }
    """)
    kept = filter_phase(net, job_pb2.kTrain)
    assert [layer.unroll_len for layer in kept] == [3, 3, 3, 1]
    assert [layer.partition_dim for layer in kept] == [1, 1, 1, 1]


def test_a_param_larger_than_memory_is_refused_naming_param_shape_and_bytes():
    with pytest.raises(ConfigError, match=r"^param '0#w1' of shape \(2000000000, 784\): its values "
                                          r"and gradient need 12\.5 TB, more than this machine's"):
        make(MLP.replace("num_output: 6", "num_output: 2000000000"))


def test_a_layer_array_that_cannot_be_allocated_is_a_config_error_naming_the_layer():
    with pytest.raises(ConfigError, match=r"^layer '0#data': .*TiB.*shape \(2000000000, 784\)"):
        make(MLP.replace("batchsize: 8", "batchsize: 2000000000"))


def test_an_array_beyond_any_address_is_refused_naming_its_layer():
    """A padding of 2^31 − 1 makes a (1, 1, 2^32, 2^32) array: numpy's ValueError ("array is
    too big") becomes the layer's BeyondMemory, as a MemoryError does."""
    from singa.device.footprint import BeyondMemory
    text = """
    layer { name: "x" type: kDummy dummy_conf { input: true shape: [1, 1, 2, 2] } }
    layer { name: "conv" type: kConvolution srclayers: "x"
      convolution_conf { num_filters: 1 kernel: 1 pad: 2147483647 }
      param { name: "w" } param { name: "b" } }"""
    with pytest.raises(BeyondMemory, match=r"^layer '0#conv': an array of its shapes would need "
                                           r"more bytes than a 64-bit address can hold$"):
        make(text)
