"""singa.model (SINGA 0.3's tool/python/singa/model.py): the JobProto a Python model builds, and
conf and Python as one thing (to_conf / from_conf)."""
import glob
import os
import re

import pytest

import singa
from singa import naming
from singa.errors import ConfigError
from singa.job import config
from singa.model import (RBM, SGD, AdaGrad, Autoencoder, Cluster, Data, Dense, Dropout, Energy,
                        Model, Parameter, Sequential)
from singa.proto import job_pb2

EXAMPLE_CONFS = sorted(glob.glob(os.path.join(singa.HOME, "examples", "*", "*.conf")))


@pytest.fixture(autouse=True)
def fresh_names():
    naming.reset_names()


@pytest.mark.parametrize("path", EXAMPLE_CONFS, ids=lambda p: os.path.relpath(p, singa.HOME))
def test_every_example_conf_round_trips_through_from_conf_and_to_conf(path):
    own = {}      # rnnlm's data_conf is its own proto extension, given as singa-run.sh's flags
    if path.endswith(os.path.join("rnnlm", "job.conf")):
        own = {"user_proto": [os.path.join(os.path.dirname(path), "rnnlm.proto")],
               "user_layers": [os.path.join(os.path.dirname(path), "rnnlm.py")]}
    job = config.load_job(path, check_paths=False, **own)
    for field, paths in own.items():
        getattr(job, field).extend(paths)
    model = Model.from_conf(path, **own)
    assert model.jobconf == job
    again = config.parse_job(model.to_conf(), path, check_paths=False)
    assert again == config.absolute_paths(job, os.getcwd())   # as the Python API reads them


def test_from_conf_resolves_relative_paths_against_the_current_directory(tmp_path, monkeypatch):
    text = open(os.path.join(singa.HOME, "examples", "mnist", "job.conf")).read()
    (tmp_path / "mine.conf").write_text(text.replace("train_steps: 1000", "train_steps: 7"))
    monkeypatch.chdir(tmp_path)
    assert Model.from_conf("mine.conf").jobconf.train_steps == 7
    with pytest.raises(ConfigError, match="nothing.conf"):
        Model.from_conf("nothing.conf")


@pytest.mark.parametrize("old, new, what", [
    ("num_output: 2500", "num_output: 2000000000",
     r"param '0#w1' of shape \(2000000000, 784\): its values and gradient need 12\.5 TB"),
    ("batchsize: 64", "batchsize: 1000000000",
     r"layer '0#data': an array of shape \(1000000000, 784\) \(float32\) needs 3\.14 TB"),
])
def test_from_conf_refuses_a_net_larger_than_memory_naming_the_file_and_the_param_or_layer(
        tmp_path, old, new, what):
    """Sizes far beyond any machine: a regression that allocated them would fail at once."""
    text = open(os.path.join(singa.HOME, "examples", "mnist", "job.conf")).read()
    assert old in text
    conf = tmp_path / "huge.conf"
    conf.write_text(text.replace(old, new))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(conf))}: {what}, more than this "
                                          rf"machine's .* of memory$"):
        Model.from_conf(str(conf))


def test_compile_turns_the_softmax_into_the_loss_and_the_data_layer_feeds_the_label():
    m = Sequential('net')
    m.add(Data(load='recordinput', phase='train', path='x.bin', batchsize=8, shape=4))
    m.add(Dense(3, activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=AdaGrad(lr=0.1), cluster=Cluster('ws'))
    layers = {ly.name: ly for ly in config.parse_job(m.to_conf(), check_paths=False,
                                                    check_layers=True).neuralnet.layer}
    dense, data = [n for n in layers if n.startswith('layer')], 'data0'
    loss = [ly for ly in layers.values() if ly.type == job_pb2.kSoftmaxLoss]
    assert len(loss) == 1 and list(loss[0].srclayers) == [dense[0], data]
    assert m.jobconf.updater.type == job_pb2.kAdaGrad


def test_autoencoder_ties_the_decoder_to_the_encoder_and_rbms_stack_under_rbmvis():
    m = Sequential('ae')
    m.add(Data(load='recordinput', phase='train', path='x.bin', batchsize=8, shape=784))
    m.add(Autoencoder([16, 4], out_dim=784, activation='sigmoid', param_share=True))
    m.compile(loss='mean_squared_error', optimizer=AdaGrad(lr=0.01), cluster=Cluster('ws'))
    net = config.parse_job(m.to_conf(), check_paths=False).neuralnet
    dense = [ly for ly in net.layer if ly.type == job_pb2.kInnerProduct]
    assert [ly.innerproduct_conf.num_output for ly in dense] == [16, 4, 16, 784]
    assert [ly.param[0].share_from for ly in dense] == ['', '', 'w2', 'w1']
    assert [ly.innerproduct_conf.transpose for ly in dense] == [False, False, True, True]
    assert net.layer[-1].type == job_pb2.kEuclideanLoss

    naming.reset_names()
    e = Energy('rbm2')
    e.add(Data(load='recordinput', phase='train', path='x.bin', batchsize=8, shape=784))
    e.add(RBM([16, 8], w_std=0.1, b_wd=0))
    e.compile(optimizer=SGD(lr=0.1), cluster=Cluster('ws'))
    net = config.parse_job(e.to_conf(), check_paths=False).neuralnet
    types = [ly.type for ly in net.layer]
    assert types == [job_pb2.kRecordInput, job_pb2.kInnerProduct, job_pb2.kActivation,
                     job_pb2.kRBMVis, job_pb2.kRBMHid]
    vis, hid = net.layer[3], net.layer[4]
    assert list(vis.srclayers) == [net.layer[2].name, hid.name] and hid.rbm_conf.hdim == 8
    assert [p.name for p in net.layer[1].param] == ['w1', 'b12']   # rbm1's, as rbm2.conf's
    assert not net.layer[1].param[0].HasField('init')


@pytest.mark.parametrize("kwargs, message", [
    ({"nb_epoch": 0}, "nb_epoch"), ({"nb_epoch": -3}, "nb_epoch"), ({"nb_epoch": 2.5}, "nb_epoch"),
    ({"nb_epoch": 5, "not_a_field": 1}, "not_a_field"),
    ({"nb_epoch": 5, "device": "gpu0"}, "device must list GPU ids"),
    ({"nb_epoch": 2**40}, r"positive int below 2\^31, got 1099511627776"),
    ({"nb_epoch": 5, "batch_size": 1.5},
     r"^batchsize 1.5: not a value of StoreProto.batchsize \("),
    ({"nb_epoch": 5, "test_steps": 1.5}, r"^test_steps 1.5: not a value of JobProto.test_steps"),
])
def test_fit_refuses_bad_arguments_in_one_line(kwargs, message, tmp_path):
    m = Sequential('net')
    m.add(Data(load='recordinput', phase='train', path='x.bin', batchsize=8, shape=4))
    m.add(Dense(3, activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=SGD(), cluster=Cluster(str(tmp_path)))
    with pytest.raises(ConfigError, match=message):
        m.fit(**kwargs)


def test_compile_evaluate_and_predict_say_what_is_missing(tmp_path):
    m = Sequential('net')
    with pytest.raises(ConfigError, match="optimizer"):
        m.compile(cluster=Cluster('ws'))
    with pytest.raises(ConfigError, match="workspace"):
        Cluster()
    with pytest.raises(ConfigError, match="loss 'hinge'"):
        m.compile(loss='hinge', optimizer=SGD(), cluster=Cluster('ws'))
    m.add(Data(load='recordinput', phase='test', path='x.bin', batchsize=8, shape=4))
    m.add(Dense(3, activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=SGD(), cluster=Cluster(str(tmp_path)))
    with pytest.raises(ConfigError, match="fit the model first or give checkpoint_path"):
        m.evaluate()
    with pytest.raises(ConfigError, match="lr_type 'cosine'"):
        SGD(lr_type='cosine')


def build_mlp(data_first):
    """A model as a notebook cell or SINGA script builds it (its data layer made before the
    model, as SINGA's scripts do, or added after)."""
    data = Data(load='recordinput', phase='train', path='x.bin', batchsize=8, shape=4) \
        if data_first else None
    m = Sequential('net')
    m.add(data or Data(load='recordinput', phase='train', path='x.bin', batchsize=8, shape=4))
    m.add(Dense(5, activation='tanh'))
    m.add(Dropout())
    m.add(Dense(3, w_param=Parameter(init='uniform'), activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=SGD(), cluster=Cluster('ws'))
    return m.to_conf()


@pytest.mark.parametrize("data_first", [True, False])
def test_a_model_built_again_in_one_process_gets_the_names_of_a_fresh_process(data_first):
    """Generated names count from the model's construction, and from zero again after a
    compile: a cell re-run (or the next model) names its layers and params as SINGA's
    helper did in a fresh process, so fit(resume=True) finds them in the snapshot."""
    first = build_mlp(data_first)
    assert 'name: "data0"' in first and 'name: "w1"' in first and 'name: "b2"' in first
    assert build_mlp(data_first) == first
    Dense(7)                    # layers built in between: another model, a cell run once
    Parameter()
    Sequential('other').add(Dense(4))
    assert build_mlp(data_first) == first
