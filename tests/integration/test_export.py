"""bin/singa-export.sh as a user runs it: SINGA 0.3's own trained checkpoints, a snapshot our
driver wrote after a few training steps and the MNIST MLP, exported to ONNX and Caffe (and
imported back) and run on real data."""
import importlib.util
import os
import re
import subprocess

import numpy as np
import pytest

import singa
from singa.checkpoint.format import write_file
from singa.interop import deploy
from singa.io.records import decode_batch
from singa.io.store import open_store

ort = pytest.importorskip("onnxruntime")

EXPORT = os.path.join(singa.HOME, "bin", "singa-export.sh")
FIXTURES = os.path.join(singa.HOME, "tests", "fixtures", "singa-0.3")


def export(*args, cwd=None):
    return subprocess.run([EXPORT, *map(str, args)], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def records(n=500, shape=(784,)):
    """The first n records of SINGA's fixture test-500.bin, scaled as its confs (std 255)."""
    values = []
    with open_store("kvfile", os.path.join(FIXTURES, "test-500.bin")) as store:
        while len(values) < n and (kv := store.read()) is not None:
            values.append(kv[1])
    x, labels = decode_batch(values, int(np.prod(shape)))
    return (x / np.float32(255)).reshape((n,) + shape), labels


@pytest.mark.parametrize("conf, snapshot, shape, accuracy, loss", [
    # SINGA 0.3's own checkpoints and the test lines it logged for them (5 batches of 100)
    ("cnn/job.conf", "cnn", (1, 28, 28), 0.758, 0.703733),
    ("job.conf", "run-1worker/step100-worker0", (784,), 0.670, 0.914131),
])
def test_singas_own_checkpoints_in_onnxruntime_give_singas_test_line(conf, snapshot, shape,
                                                                      accuracy, loss, tmp_path):
    out = tmp_path / "model.onnx"
    r = export("onnx", os.path.join(FIXTURES, conf), os.path.join(FIXTURES, snapshot), "-o", out)
    assert r.returncode == 0, r.stderr
    x, labels = records(shape=shape)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    p = sess.run(None, {"data": x})[0].astype(np.float64)
    got_loss = -np.log(np.maximum(p[np.arange(len(p)), labels], np.finfo(np.float32).tiny))
    assert np.mean(p.argmax(axis=1) == labels) == pytest.approx(accuracy, abs=1e-9)
    assert got_loss.mean() == pytest.approx(loss, abs=1e-4)


def test_a_trained_snapshot_exports_to_onnx_and_caffe(fixture_job, run_driver, tmp_path):
    """Our driver trains SINGA's fixture cnn 20 steps; the workspace's newest snapshot goes to
    ONNX (onnxruntime = our forward on real records) and to Caffe (imported back: the same
    params, bit for bit)."""
    with open(os.path.join(FIXTURES, "cnn", "job.conf")) as f:
        text = f.read()
    ws = tmp_path / "ws"
    conf = tmp_path / "cnn.conf"
    conf.write_text(text.replace("/tmp/singa-fixture-cnn-ws", str(ws))
                    .replace("train_steps: 200", "train_steps: 20")
                    .replace("checkpoint_freq: 100", "checkpoint_freq: 10")
                    .replace("test_freq: 100", "test_freq: 0")
                    .replace('"tests/fixtures', f'"{singa.HOME}/tests/fixtures'))
    r = run_driver(conf)
    assert r.returncode == 0, r.stderr
    assert {"step10-worker0.bin", "step20-worker0.bin"} <= set(os.listdir(ws / "checkpoint"))

    r = export("onnx", conf, ws, "-o", tmp_path / "cnn.onnx", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "step 20" in r.stdout
    model = deploy.read(str(conf), str(ws))
    x, _ = records(n=100, shape=(1, 28, 28))
    ours = model.forward({"data": x})["loss"]
    sess = ort.InferenceSession(str(tmp_path / "cnn.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"data": x})[0]
    diff = np.abs(got - ours).max()
    print("trained cnn: max |onnxruntime − ours|", diff)
    assert diff < 1e-5

    r = export("caffe", conf, ws / "checkpoint" / "step10", "-o", tmp_path / "caffe")
    assert r.returncode == 0, r.stderr
    imported = subprocess.run([os.path.join(singa.HOME, "bin", "singa-import.sh"), "caffe",
                               tmp_path / "caffe" / "deploy.prototxt",
                               tmp_path / "caffe" / "model.caffemodel", "-o", tmp_path / "back"],
                              capture_output=True, text=True, timeout=300, cwd=singa.HOME)
    assert imported.returncode == 0, imported.stderr
    at10 = deploy.read(str(conf), str(ws / "checkpoint" / "step10"))
    back = deploy.read(str(tmp_path / "back" / "job.conf"), str(tmp_path / "back"))
    for a, b in zip([op for op in at10.ops if op.params], [op for op in back.ops if op.params]):
        for u, v in zip(a.params, b.params):
            assert np.array_equal(u, v), a.name


def test_the_mnist_mlp_goes_to_caffe_and_back_the_same(tmp_path):
    """bin/singa-export.sh caffe, then bin/singa-import.sh, on the MNIST MLP
    (`examples/mnist/job.conf`: STanh, written to Caffe as Power, TanH, Power) with seeded
    values: the imported job has a kSTanh where the conf has one, every param comes back bit
    for bit and on real MNIST records the imported net gives our outputs within 1e-6."""
    spec = importlib.util.spec_from_file_location("exported_nets", os.path.join(
        singa.HOME, "tests", "fixtures", "caffe", "exported", "make", "nets.py"))
    nets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nets)
    with open(os.path.join(singa.HOME, "examples", "mnist", "job.conf")) as f:
        text = re.sub(r"batchsize: *\d+", "batchsize: 100", f.read())
    conf = tmp_path / "job.conf"
    conf.write_text(text)
    (tmp_path / "checkpoint").mkdir()
    write_file(str(tmp_path / "checkpoint" / "step1-worker0"),
               [(n, v, 1) for n, v in nets.snapshot_values(str(conf), 11, {})])

    r = export("caffe", conf, tmp_path, "-o", tmp_path / "caffe")
    assert r.returncode == 0, r.stderr
    imported = subprocess.run([os.path.join(singa.HOME, "bin", "singa-import.sh"), "caffe",
                               tmp_path / "caffe" / "deploy.prototxt",
                               tmp_path / "caffe" / "model.caffemodel", "-o", tmp_path / "back"],
                              capture_output=True, text=True, timeout=300, cwd=singa.HOME)
    assert imported.returncode == 0, imported.stderr
    ours = deploy.read(str(conf), str(tmp_path))
    back = deploy.read(str(tmp_path / "back" / "job.conf"), str(tmp_path / "back"))
    assert [(op.name, op.type) for op in ours.ops] == [(op.name, op.type) for op in back.ops]
    assert sum(op.type == "STanh" for op in back.ops) == 5
    for a, b in zip(ours.ops, back.ops):
        for u, v in zip(a.params, b.params):
            assert u.shape == v.shape and np.array_equal(u, v), a.name
    x, _ = records(n=100)
    want, got = ours.forward({"data": x}), back.forward({"data": x})
    diff = max(np.abs(got[op.name] - want[op.name]).max() for op in ours.ops)
    print("MNIST MLP through Caffe and back: max |imported − ours|", diff)
    assert diff <= 1e-6


@pytest.mark.parametrize("args, line", [
    (["onnx", "{cnn}/job.conf", "{tmp}/none", "-o", "{tmp}/x.onnx"],
     "singa-export: {tmp}/none: no such snapshot file or checkpoint folder"),
    (["caffe", "{cnn}/job.conf", "{fx}/run-1worker", "-o", "{tmp}/c"],
     "singa-export: {fx}/run-1worker/step200-worker0: no param 'cw1' for {cnn}/job.conf "
     "(3 more missing)"),
    (["onnx", "{rbm}", "{cnn}", "-o", "{tmp}/x.onnx"],
     "singa-export: {rbm}: layer 'RBMVis' (kRBMVis) has no ONNX equivalent"),
])
def test_bad_input_is_one_line_and_exit_2(args, line, tmp_path):
    fill = dict(tmp=tmp_path, cnn=os.path.join(FIXTURES, "cnn"), fx=FIXTURES,
                rbm=os.path.join(singa.HOME, "examples", "rbm", "rbm1.conf"))
    r = export(*[a.format(**fill) for a in args])
    assert r.returncode == 2
    assert r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr == line.format(**fill) + "\n"
