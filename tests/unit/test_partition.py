"""A net cut over 2 partitions: SINGA's connection and bridge layers, and the same maths as the whole net."""
import numpy as np
from google.protobuf import text_format

from gradcheck import BACKWARD, FORWARD, Source, check_gradients, make_layer
from singa.layers.base import Layer
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2

FIXTURE = "tests/fixtures/singa-0.3/train-1000.bin"

# data and loss cut the batch (dim 0), the InnerProducts and ReLU cut the features (dim 1)
MIXED = f"""
partition_dim: 1
layer {{ name: "data" type: kRecordInput partition_dim: 0
  store_conf {{ backend: "kvfile" path: "{FIXTURE}" batchsize: 8 shape: 784 std_value: 255 }} }}
layer {{ name: "ip1" type: kInnerProduct srclayers: "data" innerproduct_conf {{ num_output: 6 }}
  param {{ name: "w1" init {{ type: kGaussian std: 0.1 }} }}
  param {{ name: "b1" init {{ type: kGaussian std: 0.1 }} }} }}
layer {{ name: "relu" type: kReLU srclayers: "ip1" }}
layer {{ name: "ip2" type: kInnerProduct srclayers: "relu" innerproduct_conf {{ num_output: 10 }}
  param {{ name: "w2" init {{ type: kGaussian std: 0.1 }} }}
  param {{ name: "b2" init {{ type: kGaussian std: 0.1 }} }} }}
layer {{ name: "loss" type: kSoftmaxLoss srclayers: "ip2" srclayers: "data" partition_dim: 0 }}
"""


def make(text, parts):
    conf = text_format.Parse(text, job_pb2.NetProto())
    return NeuralNet(conf, job_pb2.kTrain, np.random.default_rng(0), None, parts)


class LocalChannel:
    """Bridge messages held in a dict: what a bridge sends, its peer receives."""

    def __init__(self):
        self.boxes = {}

    def send(self, layer, peer, kind, array):
        self.boxes[(peer.name, kind)] = array.copy()

    def receive(self, layer, kind, out):
        np.copyto(out, self.boxes.pop((layer.name, kind)))


def run_all_partitions(net):
    """Forward then backward over every partition's layers in the net's order, in one thread."""
    channel = LocalChannel()
    for layer in net.layers:
        layer.channel = channel
    for layer in net.layers:
        layer.compute_feature(FORWARD, net.srclayers[layer.name])
    for layer in reversed(net.layers):
        layer.compute_gradient(BACKWARD, net.srclayers[layer.name])
    assert channel.boxes == {}


def test_partitioned_graph_follows_singa_rules():
    net = make(MIXED, 2)
    types = {layer.name: layer.conf.type for layer in net.layers}
    parts = {layer.name: layer.partition_id for layer in net.layers}
    srcs = {name: [s.name for s in ss] for name, ss in net.srclayers.items()}
    # dim 0 -> a dim-1 InnerProduct (reads all): split + concate on the source's dim 0
    assert types["split(0#data)@1"] == job_pb2.kSplit
    assert net.by_name["concate(split(0#data))@0"].conf.concate_conf.concate_dim == 0
    assert srcs["concate(split(0#data))@0"] == [
        "split(0#data)@0", "bridge_dst(split(0#data)@1->concate(split(0#data))@0)"]
    assert srcs["bridge_dst(split(0#data)@1->concate(split(0#data))@0)"] == [
        "bridge_src(split(0#data)@1->concate(split(0#data))@0)"]
    assert parts["bridge_src(split(0#data)@1->concate(split(0#data))@0)"] == 1
    assert parts["bridge_dst(split(0#data)@1->concate(split(0#data))@0)"] == 0
    # dim 1 -> dim 1 ReLU (one to one): direct; dim 1 -> dim 1 InnerProduct: split + concate
    assert srcs["0#relu@1"] == ["0#ip1@1"]
    assert srcs["0#ip2@1"] == ["concate(split(0#relu))@1"]
    assert net.by_name["concate(split(0#relu))@1"].conf.concate_conf.concate_dim == 1
    # dim 1 -> dim 0 loss: slice on the loss's dim 0, concate on the source's dim 1
    assert net.by_name["slice(0#ip2)@0"].conf.slice_conf.slice_dim == 0
    assert net.by_name["concate(slice(0#ip2))@1"].conf.concate_conf.concate_dim == 1
    assert srcs["0#loss@1"] == ["concate(slice(0#ip2))@1", "0#data@1"]
    # every edge between partitions goes through a bridge pair
    for name, ss in net.srclayers.items():
        for s in ss:
            if s.partition_id != parts[name]:
                assert types[name] == job_pb2.kBridgeDst and s.conf.type == job_pb2.kBridgeSrc
    assert len([t for t in types.values() if t == job_pb2.kBridgeSrc]) == 6
    # shapes: each partition holds half the features of ip1/ip2 and half the batch of the loss
    assert net.by_name["0#ip1@0"].data.shape == (8, 3)
    assert net.by_name["0#loss@1"].data.shape == (4, 10)
    assert [(p.name, p.partition) for p in net.by_name["0#ip2@1"].params] == [
        ("0#w2", (0, 1, 2)), ("0#b2", (0, 1, 2))]
    # param ids are unique over the graph; each piece owns itself
    ids = [p.id for p in net.params]
    assert sorted(ids) == list(range(8)) and all(p.is_owner for p in net.params)


def test_dim0_copies_share_partition_0s_params():
    net = make(MIXED.replace("partition_dim: 1\n", ""), 2)
    w0, b0 = net.by_name["0#ip1@0"].params
    w1, b1 = net.by_name["0#ip1@1"].params
    assert w1.data is w0.data and w1.owner == w0.id and w1.partition is None
    assert w1.grad is not w0.grad
    assert [p.name for p in net.partition(1).owner_params] == []
    assert {layer.partition_id for layer in net.partition(1).layers} == {1}


def test_partitioned_net_computes_what_the_whole_net_computes():
    whole, cut = make(MIXED, 1), make(MIXED, 2)
    rng = np.random.default_rng(3)
    for p in whole.params:
        p.data[...] = rng.normal(0, 0.3, p.shape)
    for p in cut.params:
        axis, k, n = p.partition
        whole_p = next(q for q in whole.params if q.name == p.name)
        p.data[...] = np.array_split(whole_p.data, n, axis=axis)[k]
    whole.forward(FORWARD)
    for layer in reversed(whole.layers):
        layer.compute_gradient(BACKWARD, whole.srclayers[layer.name])
    run_all_partitions(cut)
    # the partitions read the batch's two halves: their losses average to the whole's
    losses = [cut.by_name[f"0#loss@{k}"].metrics(FORWARD)["Loss"] for k in (0, 1)]
    whole_loss = whole.by_name["0#loss"].metrics(FORWARD)["Loss"]
    assert abs(np.mean(losses) - whole_loss) < 1e-6
    # each half-batch loss is a mean over 4 rows: the pieces' gradients are twice the whole's
    for q in whole.params:
        pieces = [p for p in cut.params if p.name == q.name]
        joined = np.concatenate([p.grad for p in sorted(pieces, key=lambda p: p.partition[1])],
                                axis=pieces[0].partition[0])
        np.testing.assert_allclose(joined / 2, q.grad, rtol=1e-5, atol=1e-6, err_msg=q.name)


class BridgePair(Layer):
    """A BridgeSrc and its BridgeDst run as one layer (y = x) for the gradient checker."""

    def __init__(self, src):
        super().__init__(job_pb2.LayerProto(name="pair"))
        self.bsrc = make_layer('name: "bs" type: kBridgeSrc partition_id: 0', [src])
        self.bdst = make_layer('name: "bd" type: kBridgeDst partition_id: 1', [self.bsrc])
        self.bsrc.peer, self.bdst.peer = self.bdst, self.bsrc
        self.bsrc.channel = self.bdst.channel = LocalChannel()
        self.data, self.grad = self.bdst.data, self.bdst.grad

    def compute_feature(self, flag, srclayers):
        self.bsrc.compute_feature(flag, srclayers)
        self.bdst.compute_feature(flag, [self.bsrc])

    def compute_gradient(self, flag, srclayers):
        self.bdst.compute_gradient(flag, [self.bsrc])
        self.bsrc.compute_gradient(flag, srclayers)


def test_bridge_pair_carries_data_forward_and_gradient_back():
    src = Source(np.random.default_rng(0).standard_normal((3, 5)))
    pair = BridgePair(src)
    pair.compute_feature(FORWARD, [src])
    np.testing.assert_array_equal(pair.data, src.data)
    assert pair.data is not src.data
    assert check_gradients(pair, [src]) == 15


def test_slice_serves_each_partition_its_part_whatever_the_setup_order():
    src = Source(np.arange(8, dtype=np.float32).reshape(4, 2))
    layer = make_layer('name: "s" type: kSlice slice_conf { slice_dim: 0 num_slices: 2 }', [src])
    a, b = object(), object()
    layer.data_for(a)                       # a asked first during setup ...
    layer.order_destinations({b: 0, a: 1})  # ... but feeds partition 1
    layer.compute_feature(FORWARD, [src])
    np.testing.assert_array_equal(layer.data_for(a), src.data[2:])
    np.testing.assert_array_equal(layer.data_for(b), src.data[:2])


def test_features_fewer_than_the_partitions_are_a_one_line_error():
    """ip1's 6 outputs cut over 7 workers would leave one with none (its params empty, its
    Update never answered: the job hung)."""
    import pytest
    from singa.errors import ConfigError
    make(MIXED, 6)
    with pytest.raises(ConfigError, match=r"layer '0#ip1@\d': num_output 6 cannot be cut over 7 "
                                          r"workers \(partition_dim 1\)"):
        make(MIXED, 7)


def test_a_layer_that_cannot_run_on_part_of_its_features_is_refused_on_dim_1():
    """A whole net on partition_dim 1 would cut the loss: each part a softmax over half the
    classes (the job stopped at the first label out of that half)."""
    import pytest
    from singa.errors import ConfigError
    whole_dim1 = MIXED.replace("partition_dim: 0", "partition_dim: 1")
    with pytest.raises(ConfigError, match=r"layer 'data' \(kRecordInput\) cannot compute on a "
                                          r"part of its features \(partition_dim 1 over 2 "
                                          r"workers\); give it partition_dim: 0"):
        make(whole_dim1, 2)
    make(whole_dim1, 1)     # one worker cuts nothing
