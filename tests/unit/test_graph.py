"""singa.net.graph: one sort for config and NeuralNet; names, sources and cycles, with file:line."""
import numpy as np
import pytest
from google.protobuf import text_format

from singa.errors import ConfigError
from singa.job import config
from singa.net.graph import sort
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2

RBM_JOB = """\
name: "rbm"
train_steps: 1
train_one_batch { alg: kCD }
updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }
neuralnet {
  layer { name: "data" type: kRecordInput
    store_conf { backend: "kvfile" path: "tests/fixtures/singa-0.3/train-1000.bin" batchsize: 4
                 shape: 784 std_value: 255 } }
  layer { name: "vis" type: kRBMVis srclayers: "hid" srclayers: "data" rbm_conf { hdim: 3 }
    param { name: "w" } param { name: "bv" } }
  layer { name: "hid" type: kRBMHid srclayers: "vis" rbm_conf { hdim: 3 }
    param { name: "w_" share_from: "w" } param { name: "bh" } }
}
cluster { workspace: "/tmp" }
"""


def layers(text):
    return list(text_format.Parse(text, job_pb2.NetProto()).layer)


def names(confs):
    return [c.name for c in confs]


def test_sort_is_breadth_first_in_conf_order():
    confs = layers("""
      layer { name: "c" srclayers: "a" srclayers: "b" }
      layer { name: "b" srclayers: "a" }
      layer { name: "a" }
    """)
    assert names(sort(confs)) == ["a", "b", "c"]


def test_rbm_vis_listing_its_hid_first_is_accepted_by_config_and_neuralnet():
    job = config.parse_job(RBM_JOB, "rbm.conf", check_paths=False)
    assert names(sort(job.neuralnet.layer)) == ["data", "vis", "hid"]
    net = NeuralNet(job.neuralnet, job_pb2.kTrain, np.random.default_rng(0))
    assert [layer.name for layer in net.layers] == ["0#data", "0#vis", "0#hid"]
    assert net.by_name["0#vis"].hid is net.by_name["0#hid"]


def test_a_layer_with_one_source_waits_for_it_even_on_a_two_way_edge():
    with pytest.raises(ConfigError, match=r"^srclayers form a cycle: a -> b -> a$"):
        sort(layers('layer { name: "a" srclayers: "b" } layer { name: "b" srclayers: "a" }'))


CYCLE = """\
layer { name: "d" }
layer { name: "x" srclayers: "a" }
layer { name: "a"
        srclayers: "d" srclayers: "c" }
layer { name: "b" srclayers: "a" }
layer { name: "c" srclayers: "b" }
"""


def lines(text):
    """line(k, field) of layer k in `text`: one layer a line, but layer 2 has its srclayers on the next."""
    starts = [i + 1 for i, s in enumerate(text.splitlines()) if s.startswith("layer")]
    return lambda k, field: starts[k] + (field == "srclayers" and k == 2)


def test_cycle_is_reported_from_the_layer_written_first_with_its_line():
    with pytest.raises(ConfigError) as e:
        sort(layers(CYCLE), "kTrain", path="f.conf", line=lines(CYCLE))
    assert str(e.value) == "f.conf:3: srclayers form a cycle: a -> b -> c -> a"


@pytest.mark.parametrize("edit, message", [
    (('name: "c"', 'name: "b"'), "f.conf:6: duplicate layer name 'b' in the kTrain net "
                                 "(also at line 5)"),
    (('"c" }', '"e" }'), "f.conf:4: layer 'a': srclayer 'e' names no layer"),
    (('"c" }', '"t" }'), "f.conf:4: layer 'a': srclayer 't' is not in the kTrain net"),
])
def test_names_are_checked_with_file_and_line(edit, message):
    text = CYCLE.replace(*edit)
    with pytest.raises(ConfigError) as e:
        sort(layers(text), "kTrain", everywhere={"t"}, path="f.conf", line=lines(text))
    assert str(e.value) == message


@pytest.mark.parametrize("edit, message", [
    ((), "srclayers form a cycle: a -> b -> c -> a"),
    (('name: "c"', 'name: "b"'), "duplicate layer name 'b'"),
    (('"c" }', '"e" }'), "layer 'a': srclayer 'e' names no layer"),
])
def test_neuralnet_reports_the_same_mistakes_without_a_file(edit, message):
    text = CYCLE.replace(*edit) if edit else CYCLE
    conf = text_format.Parse(text.replace("}", "type: kSTanh }"), job_pb2.NetProto())
    with pytest.raises(ConfigError) as e:
        NeuralNet(conf, job_pb2.kTrain, np.random.default_rng(0))
    assert str(e.value) == message
