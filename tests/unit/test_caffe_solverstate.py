"""singa.interop.caffe.solverstate: Caffe's solver as SINGA's updater and rate, its history negated."""
import os

import numpy as np
import pytest
from google.protobuf import text_format

import singa
from singa.interop.caffe.netdef import read_net, read_text
from singa.interop.caffe.solverstate import job_fields, snapshot_state
from singa.interop.caffe.translate import Refused, translate
from singa.io.caffe_blobs import CaffeFile
from singa.proto import caffe_pb2, job_pb2
from singa.train.updater import create_updater

FX = os.path.join(singa.HOME, "tests", "fixtures", "caffe")


def solver(name):
    return read_text(os.path.join(FX, name, f"{name}_solver.prototxt"),
                     caffe_pb2.SolverParameter())


def job_of(s, path="s.prototxt"):
    job = job_pb2.JobProto()
    job_fields(job, s, path)
    return job


def curve(name):
    rows = [line.split("\t") for line in open(os.path.join(FX, name, "train_curve.txt"))
            if line.startswith("train\t")]
    return [(int(k), float(lr)) for _, k, lr, _ in rows]


@pytest.mark.parametrize("name", ["mlp", "convnet"])
def test_rate_of_every_iteration_is_caffes(name):
    """mlp: inv (gamma 0.01, power 0.5); convnet: multistep (20, 45, gamma 0.5). The rates
    Caffe logged (6 significant digits) for iterations 0… come out of SINGA's generator."""
    job = job_of(solver(name))
    gen = create_updater(job.updater).lr_gen
    rates = {k: gen(k) for k in range(job.train_steps)}
    for k, lr in curve(name):
        assert rates[k] == pytest.approx(lr, rel=5e-6), k


def test_job_fields_of_the_mlp_solver():
    job = job_of(solver("mlp"))
    u = job.updater
    assert (u.type, u.momentum, u.weight_decay) == (job_pb2.kSGD, pytest.approx(0.9),
                                                    pytest.approx(0.001))
    assert u.learning_rate.type == job_pb2.kInverse
    assert (job.train_steps, job.test_steps, job.test_freq, job.disp_freq,
            job.checkpoint_freq, job.seed) == (40, 4, 20, 1, 20, 4242)


def test_multistep_resumes_at_current_step():
    """convnet_iter_30.solverstate: current_step 1, so the rate is 0.025 until 45, then
    0.0125, from a generator that starts at step 30 (SINGA's lr_index)."""
    job = job_of(solver("convnet"))
    with CaffeFile(os.path.join(FX, "convnet", "convnet_iter_30.solverstate")) as f:
        state, _ = f.solver_state()
    assert (state.iter, state.current_step) == (30, 1)
    gen = create_updater(job.updater).lr_gen
    gen.set_index(state.current_step)
    assert [gen(k) for k in range(30, 60)] == [pytest.approx(0.025)] * 15 + \
        [pytest.approx(0.0125)] * 15


@pytest.mark.parametrize("policy, extra, lrs", [
    ("fixed", "", [0.1, 0.1]),
    ("step", "gamma: 0.5 stepsize: 3", [0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025]),
    ("exp", "gamma: 0.9", [0.1 * 0.9 ** k for k in range(5)]),
    ("poly", "power: 1 max_iter: 10", [0.1 * (1 - k / 10) for k in range(10)]),
])
def test_policies(policy, extra, lrs):
    s = text_format.Parse(f'base_lr: 0.1 lr_policy: "{policy}" {extra}',
                          caffe_pb2.SolverParameter())
    gen = create_updater(job_of(s).updater).lr_gen
    assert [gen(k) for k in range(len(lrs))] == [pytest.approx(v, rel=1e-6) for v in lrs]


@pytest.mark.parametrize("text, why", [
    ('type: "Adam"', "solver type Adam"),
    ('type: "RMSProp"', "solver type RMSProp"),
    ('lr_policy: "sigmoid"', 'lr_policy "sigmoid"'),
    ('lr_policy: "poly" power: 2', 'lr_policy "poly" with power 2'),
    ('clip_gradients: 10', "clip_gradients"),
    ('iter_size: 2', "iter_size 2"),
    ('regularization_type: "L1"', "regularization_type L1"),
])
def test_refusals(text, why):
    policy = "" if "lr_policy" in text else 'lr_policy: "fixed"'
    s = text_format.Parse(f'base_lr: 0.1 {policy} {text}', caffe_pb2.SolverParameter())
    with pytest.raises(Refused) as e:
        job_of(s, "sol.prototxt")
    assert str(e.value).startswith("sol.prototxt: ") and why in str(e.value)


def test_history_is_negated_for_sgd():
    net = read_net(os.path.join(FX, "mlp", "mlp_train_test.prototxt"))
    with CaffeFile(os.path.join(FX, "mlp", "mlp_iter_20.caffemodel")) as m, \
            CaffeFile(os.path.join(FX, "mlp", "mlp_iter_20.solverstate")) as s:
        _, blobs = m.net()
        state, history = s.solver_state()
        t = translate(net, "n", blobs, "w")
        snap = snapshot_state(state, history, t.params, job_pb2.kSGD, "s")
        assert (snap.step, snap.lr_index) == (20, 0)
        assert list(snap.param_state) == [
            "0#ip1_weight", "0#ip1_bias", "0#ip2_weight", "0#ip2_bias"]
        for p, h in zip(t.params, history):
            (buf,) = snap.param_state[p.stored]
            assert buf.shape == p.shape and np.array_equal(buf.ravel(), -h.values)
        nesterov = snapshot_state(state, history, t.params, job_pb2.kNesterov, "s")
        assert np.array_equal(nesterov.param_state["0#ip2_bias"][0], history[3].values)
