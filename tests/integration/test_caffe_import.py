"""bin/singa-import.sh caffe against outputs of real Caffe (tests/fixtures/caffe): forward
outputs layer by layer, `caffe test`'s accuracy and loss, Caffe's own resume from a
`.solverstate`, legacy V1 files, and one-line refusals."""
import os
import shutil
import subprocess

import lmdb
import numpy as np
import pytest
from google.protobuf import text_format

import singa
from singa import checkpoint
from singa.api import session
from singa.interop.caffe import importer, netdef
from singa.io import memory
from singa.io.caffe_blobs import CaffeFile
from singa.io.kvfile import KVFile
from singa.job import config
from singa.net.neuralnet import NeuralNet
from singa.proto import caffe_pb2, common_pb2, job_pb2

FX = os.path.join(singa.HOME, "tests", "fixtures", "caffe")
IMPORT = os.path.join(singa.HOME, "bin", "singa-import.sh")
TOL = 1e-5


def fx(*parts):
    return os.path.join(FX, *parts)


def run_import(*args):
    return subprocess.run([IMPORT, "caffe", *map(str, args)], capture_output=True, text=True)


def imported(out, *args):
    """The job.conf bin/singa-import.sh writes for `args` (the command must succeed)."""
    r = run_import(*args, "-o", out)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    return r.stdout


def write_kvfile(path, x, y):
    """Records as a user makes them for an imported job: pixel bytes for uint8 images, float
    data otherwise, with their labels."""
    with KVFile(str(path), "create") as f:
        for i in range(len(x)):
            rec = common_pb2.RecordProto(shape=x.shape[1:], label=int(y[i]))
            if x.dtype == np.uint8:
                rec.pixel = x[i].tobytes()
            else:
                rec.data.extend(x[i].ravel().tolist())
            f.insert(b"%08d" % i, rec.SerializeToString())


def solver(tmp_path, name):
    """The solver to import: the fixture's; for convnet a copy whose TEST data is Caffe's LMDB
    of raw Datums at `data/test_lmdb` beside its net, where the prototxt names it."""
    if name != "convnet":
        return fx(name, f"{name}_solver.prototxt")
    src = tmp_path / "convnet-src"
    (src / "data").mkdir(parents=True)
    for f in ("convnet_solver.prototxt", "convnet_train_test.prototxt"):
        shutil.copy(fx("convnet", f), src / f)
    shutil.copy(fx("convnet", "data", "mean.binaryproto"), src / "data" / "mean.binaryproto")
    x, y = np.load(fx("convnet", "data", "test_x.npy")), np.load(fx("convnet", "data", "test_y.npy"))
    with lmdb.open(str(src / "data" / "test_lmdb"), map_size=1 << 24) as env, \
            env.begin(write=True) as txn:
        for i in range(len(x)):
            d = caffe_pb2.Datum(channels=x.shape[1], height=x.shape[2], width=x.shape[3],
                                label=int(y[i]), data=x[i].tobytes())
            txn.put(b"%08d" % i, d.SerializeToString())
    return src / "convnet_solver.prototxt"


def feed(out, name, phases=("train", "test")):
    for phase in phases:
        x = np.load(fx(name, "data", f"{phase}_x.npy"))
        y = np.load(fx(name, "data", f"{phase}_y.npy"))
        write_kvfile(os.path.join(out, "data", f"data-{phase}.kvfile"), x, y)


def forward(conf, x):
    """{layer name: output} of the kTest net of job `conf` on the samples `x`, its params
    loaded from checkpoint_path (as session.predict does, keeping every layer)."""
    job = config.load_job(str(conf), check_paths=False)
    path = memory.register(np.ascontiguousarray(x, np.float32))
    try:
        net_conf = job_pb2.NetProto()
        net_conf.CopyFrom(job.neuralnet)
        for layer in net_conf.layer:
            if layer.type == job_pb2.kRecordInput:
                sc = layer.store_conf
                sc.backend, sc.path = "memory", path
                del sc.batchsize[:]
                sc.batchsize.append(len(x))
        net = NeuralNet(net_conf, job_pb2.kTest, np.random.default_rng(0))
        owners = {p.name: p for p in net.owner_params}
        _, loaded = checkpoint.load_checkpoint_path(job, owners)
        assert sorted(loaded) == sorted(owners)
        net.forward(job_pb2.kTest | job_pb2.kForward)
        return {layer.name.partition("#")[2] or layer.name: layer.data.copy()
                for layer in net.layers}
    finally:
        memory.release(path)


def max_diff_to_caffe(outputs, caffe_layers):
    """Largest |ours − Caffe's| over the layers both have; every Caffe layer but the input
    must be there."""
    worst = 0.0
    for name in caffe_layers.files:
        if name in ("data", "input"):
            continue
        assert name in outputs, f"no layer {name}"
        ours, theirs = outputs[name], caffe_layers[name]
        assert ours.size == theirs.size, name
        worst = max(worst, float(np.abs(ours.reshape(theirs.shape) - theirs).max()))
    return worst


# --- forward -------------------------------------------------------------------------------

@pytest.mark.parametrize("deploy, weights", [
    ("mlp/mlp_deploy.prototxt", "mlp/mlp_iter_40.caffemodel"),
    ("legacy/mlp_v1_deploy.prototxt", "legacy/mlp_v1.caffemodel"),
    ("legacy/mlp_v1_deploy_upgraded.prototxt", "legacy/mlp_v1_upgraded.caffemodel"),
    ("mlp/mlp_deploy.prototxt", "legacy/mlp_v1.caffemodel"),
    ("legacy/mlp_v1_deploy.prototxt", "mlp/mlp_iter_40.caffemodel"),
])
def test_mlp_forward_matches_caffe_layer_by_layer(tmp_path, deploy, weights):
    imported(tmp_path, fx(deploy), fx(weights))
    out = forward(tmp_path / "job.conf", np.load(fx("mlp", "input.npy")))
    worst = max_diff_to_caffe(out, np.load(fx("mlp", "layers.npz")))
    prob = np.abs(out["prob"] - np.load(fx("mlp", "prob.npy"))).max()
    print(f"{deploy} + {weights}: max |Δ| {worst:.3g} over layers, {prob:.3g} on prob")
    assert worst < TOL and prob < TOL


def test_convnet_forward_matches_caffe_layer_by_layer(tmp_path):
    """Stride-2 padded conv, ceil MAX and padded ceil AVE pooling, LRN, group conv,
    transposed InnerProduct, in-place ReLU and Dropout."""
    imported(tmp_path, fx("convnet", "convnet_deploy.prototxt"),
             fx("convnet", "convnet_iter_60.caffemodel"))
    out = forward(tmp_path / "job.conf", np.load(fx("convnet", "input.npy")))
    layers = np.load(fx("convnet", "layers.npz"))
    worst = max_diff_to_caffe(out, layers)
    print(f"convnet: max |Δ| {worst:.3g} over layers")
    assert worst < TOL
    assert out["pool1"].shape == (8, 12, 4, 4) and out["pool2"].shape == (8, 16, 3, 3)


def test_convnet_data_layer_transform_is_caffes(tmp_path):
    """Data + transform_param {scale 1/64, mean_file}: the records' pixels come out of our
    input layer as the data blob Caffe fed its net (input.npy), bit for bit."""
    imported(tmp_path, solver(tmp_path, "convnet"), fx("convnet", "convnet_iter_60.caffemodel"))
    job = config.load_job(str(tmp_path / "job.conf"), check_paths=False)
    net = NeuralNet(job.neuralnet, job_pb2.kTest, np.random.default_rng(0))
    data = next(layer for layer in net.layers if layer.conf.type == job_pb2.kRecordInput)
    data.compute_feature(job_pb2.kTest, [])
    caffe_input = np.load(fx("convnet", "input.npy"))
    assert np.array_equal(data.data[:8], caffe_input)


# --- caffe test ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, weights, accuracy, loss", [
    ("mlp", "mlp/mlp_iter_40.caffemodel", 0.75, 0.925811),
    ("mlp", "legacy/mlp_v1.caffemodel", 0.75, 0.925811),
    ("mlp", "legacy/mlp_v1_upgraded.caffemodel", 0.75, 0.925811),
    ("mlp", "mlp/mlp_iter_20.caffemodel", 0.42, 1.86083),
    ("convnet", "convnet/convnet_iter_60.caffemodel", 0.83125, 1.62963),
])
def test_test_reproduces_caffe_test(tmp_path, name, weights, accuracy, loss):
    """The solver's net, weights and the test data (a kvfile for HDF5's, Caffe's LMDB for
    convnet's): -test gives `caffe test`'s accuracy and loss (test_iter batches of the TEST
    data layer)."""
    imported(tmp_path, solver(tmp_path, name), fx(weights))
    if name == "mlp":
        feed(str(tmp_path), name, ("test",))   # the TRAIN data is not needed to test
    job = config.load_job(str(tmp_path / "job.conf"), check_paths=False)
    metrics = session.test(job)
    print(f"{weights}: {metrics}")
    assert metrics["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert metrics["loss"] == pytest.approx(loss, abs=1e-5)


def one_phase(net, out, phase):
    """Caffe's net `net` written to `out` without the layers only the other phase has (the
    other phase's data layer): the net of a user who runs only `phase`."""
    msg = netdef.read_net(str(net))
    keep = [layer for layer in msg.layer if netdef.in_net_state(layer, phase)]
    del msg.layer[:]
    msg.layer.extend(keep)
    with open(out, "w") as f:
        f.write(text_format.MessageToString(msg))


def solver_of_test_net(tmp_path, name):
    """solver(name) beside a copy of its net without the TRAIN data layer."""
    src = tmp_path / f"{name}-src"
    if name == "mlp":
        src.mkdir()
        shutil.copy(fx("mlp", "mlp_solver.prototxt"), src)
    else:
        solver(tmp_path, name)
    one_phase(fx(name, f"{name}_train_test.prototxt"), src / f"{name}_train_test.prototxt",
              netdef.TEST)
    return src / f"{name}_solver.prototxt"


@pytest.mark.parametrize("name, weights, accuracy, loss", [
    ("mlp", "mlp/mlp_iter_40.caffemodel", 0.75, 0.925811),
    ("convnet", "convnet/convnet_iter_60.caffemodel", 0.83125, 1.62963),
])
def test_test_only_net_reproduces_caffe_test(tmp_path, name, weights, accuracy, loss):
    """The train_test net without its TRAIN data layer, all `caffe test` needs: a test-only
    job (train_steps 0, test_iter batches) whose -test gives `caffe test`'s figures."""
    out = imported(tmp_path / "out", solver_of_test_net(tmp_path, name), fx(weights))
    assert "no TRAIN net (layer " in out and "test-only net: job.conf has train_steps 0 and " \
        "tests 4 batches; run bin/singa-run.sh -conf " in out
    if name == "mlp":
        feed(str(tmp_path / "out"), name, ("test",))
    job = config.load_job(str(tmp_path / "out" / "job.conf"), check_paths=False)
    assert (job.train_steps, job.test_steps) == (0, 4)
    assert not any(layer.include for layer in job.neuralnet.layer)
    metrics = session.test(job)
    print(f"test-only {name}: {metrics}")
    assert metrics["accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert metrics["loss"] == pytest.approx(loss, abs=1e-5)


def test_test_only_net_alone_tests_caffe_tests_default_iterations(tmp_path, run_driver):
    """No solver: `caffe test -model NET -weights W` runs 50 iterations, cycling the 4 test
    batches (HDF5Data starts its file again); the job's -test, as a user runs it, gives the
    mean of Caffe's own per-batch figures over those 50 batches."""
    one_phase(fx("mlp", "mlp_train_test.prototxt"), tmp_path / "net.prototxt", netdef.TEST)
    out = imported(tmp_path / "out", tmp_path / "net.prototxt", fx("mlp", "mlp_iter_40.caffemodel"))
    assert "tests 50 batches" in out
    feed(str(tmp_path / "out"), "mlp", ("test",))
    job = config.load_job(str(tmp_path / "out" / "job.conf"))
    assert (job.train_steps, job.test_steps) == (0, importer.CAFFE_TEST_ITERATIONS)
    batches = np.loadtxt(fx("mlp", "test_batches.txt"))[:, 1:]
    accuracy, loss = batches[np.arange(importer.CAFFE_TEST_ITERATIONS) % len(batches)].mean(0)
    r = run_driver(tmp_path / "out" / "job.conf", "-test")
    assert r.returncode == 0, r.stderr
    assert f"Loss = {loss:.6f}, accuracy = {accuracy:.6f}" in r.stderr


def test_driver_test_flag_prints_caffe_tests_figures(tmp_path, run_driver):
    """The job as a user runs it: `singa -conf DIR/job.conf -test` (ZooKeeper, the driver
    process) loads the imported snapshot and prints Caffe's figures."""
    imported(tmp_path, fx("mlp", "mlp_solver.prototxt"), fx("mlp", "mlp_iter_40.caffemodel"))
    feed(str(tmp_path), "mlp")
    r = run_driver(tmp_path / "job.conf", "-test")
    assert r.returncode == 0, r.stderr
    assert "Loss = 0.925811, accuracy = 0.750000" in r.stderr


def test_fine_tuning_loads_caffes_params_by_name(tmp_path):
    """A new top layer: training from the imported job's checkpoint_path loads ip1 from
    Caffe's weights and initialises only the new layer's params."""
    imported(tmp_path, fx("mlp", "mlp_solver.prototxt"), fx("mlp", "mlp_iter_40.caffemodel"))
    feed(str(tmp_path), "mlp")
    conf = (tmp_path / "job.conf").read_text()
    conf = conf.replace('"ip2', '"head').replace("test_freq: 20", "test_freq: 0")
    conf = conf.replace("train_steps: 40", "train_steps: 1").replace("checkpoint_freq: 20",
                                                                     "checkpoint_freq: 0")
    (tmp_path / "job.conf").write_text(conf)
    job = config.load_job(str(tmp_path / "job.conf"))
    session.train(job, progress=False)
    log = open(tmp_path / "mlp8x8.log").read()
    assert "Param 0#head_weight: freshly initialised" in log
    assert "Param 0#ip1_weight: freshly initialised" not in log
    # one SGD step from Caffe's ip1: close to it, not equal
    ip1 = checkpoint.CheckpointReader(str(tmp_path / "checkpoint" / "step1-worker0.bin"))
    with CaffeFile(fx("mlp", "mlp_iter_40.caffemodel")) as f:
        caffe = f.net()[1]["ip1"][0].values.reshape(64, 64)
        moved = np.abs(ip1.param("0#ip1_weight") - caffe).max()
    assert 0 < moved < 0.05


# --- resume ----------------------------------------------------------------------------------

def curve(path):
    rows = [line.split("\t") for line in open(path) if line.startswith("train\t")]
    return {int(k): (float(lr), float(loss)) for _, k, lr, loss in rows}


@pytest.mark.parametrize("train_only", [False, True])
def test_resume_from_solverstate_continues_like_caffe(tmp_path, train_only):
    """mlp_iter_20.solverstate (+ its learned_net): -resume starts at step 20 with Caffe's
    momentum history and rate; like `caffe train -snapshot` it reads the data from the start,
    so every loss of 20…39 and the final weights are those of Caffe's own resume. The net
    without its TEST data layer (`train_only`) is the TRAIN net alone: the same training."""
    solver_path = fx("mlp", "mlp_solver.prototxt")
    if train_only:
        (tmp_path / "src").mkdir()
        solver_path = shutil.copy(solver_path, tmp_path / "src")
        one_phase(fx("mlp", "mlp_train_test.prototxt"),
                  tmp_path / "src" / "mlp_train_test.prototxt", netdef.TRAIN)
    out = imported(tmp_path, solver_path, "-solverstate", fx("mlp", "mlp_iter_20.solverstate"))
    assert "data layers' positions" in out
    assert ("no TEST net (layer 'ip1' reads blob 'data'" in out) == train_only
    assert os.path.isfile(tmp_path / "checkpoint" / "step20-worker0.meta")
    feed(str(tmp_path), "mlp")
    job = config.load_job(str(tmp_path / "job.conf"))
    assert job.test_steps == (0 if train_only else 4)
    history = session.train(job, resume=True, progress=False)
    losses = dict((step, m["loss"]) for step, m in history["train"])
    caffe = curve(fx("mlp", "train_resumed_curve.txt"))
    assert sorted(losses) == sorted(caffe) == list(range(20, 40))
    assert losses[20] == pytest.approx(1.73531, abs=1e-5)
    for k, (_, loss) in caffe.items():
        assert losses[k] == pytest.approx(loss, abs=1e-5), k
    final = checkpoint.CheckpointReader(str(tmp_path / "checkpoint" / "step40-worker0.bin"))
    with CaffeFile(fx("mlp", "mlp_resumed_iter_40.caffemodel")) as f:
        _, blobs = f.net()
        worst = max(np.abs(final.param(f"0#{layer}_{role}").ravel() - blobs[layer][i].values).max()
                    for layer in ("ip1", "ip2") for i, role in enumerate(("weight", "bias")))
    print(f"resumed params at step 40 vs Caffe's mlp_resumed_iter_40: max |Δ| {worst:.3g}")
    assert worst < 1e-6


# --- refusals and bad input ------------------------------------------------------------------

def test_refusal_is_one_line_exit_2(tmp_path):
    net = tmp_path / "res.prototxt"
    net.write_text('name: "r" input: "data" input_dim: 1 input_dim: 3 input_dim: 4 '
                   'input_dim: 4\nlayer { name: "c" type: "Convolution" bottom: "data" '
                   'top: "c" convolution_param { num_output: 3 kernel_size: 1 } }\n'
                   'layer { name: "p" type: "PReLU" bottom: "c" top: "p" }\n')
    r = run_import(net, "-o", tmp_path / "out")
    assert r.returncode == 2
    assert r.stderr == f"{net}: layer 'p' of type PReLU has no SINGA equivalent\n"
    assert not os.path.exists(tmp_path / "out" / "job.conf")


def test_a_net_without_data_in_any_phase_is_one_line_exit_2(tmp_path):
    """The mlp without both data layers; and a test-only net with a solver state, which
    continues a training the net cannot do."""
    msg = netdef.read_net(fx("mlp", "mlp_train_test.prototxt"))
    keep = [layer for layer in msg.layer if layer.type != "HDF5Data"]
    del msg.layer[:]
    msg.layer.extend(keep)
    net = tmp_path / "nodata.prototxt"
    net.write_text(text_format.MessageToString(msg))
    r = run_import(net, fx("mlp", "mlp_iter_40.caffemodel"), "-o", tmp_path / "out")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"{net}: layer 'ip1' of type InnerProduct reads blob 'data', which no "
                        f"earlier layer writes in any phase\n")
    state = fx("mlp", "mlp_iter_20.solverstate")
    r = run_import(solver_of_test_net(tmp_path, "mlp"), "-solverstate", state,
                   "-o", tmp_path / "out")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"{state}: a solver state continues a training, but "
                        f"{tmp_path}/mlp-src/mlp_train_test.prototxt has no TRAIN net (see its "
                        f"data layers)\n")
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("top, layer, what", [
    ('input_param { shape { dim: 10000000 dim: 3 dim: 224 dim: 224 } }', "", "layer '0#data': "
     "an array of shape (10000000, 3, 224, 224) (float32) needs 6.02 TB"),
    ('input_param { shape { dim: 1 dim: 3 dim: 224 dim: 224 } }',
     'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
     'inner_product_param { num_output: 2000000000 } }',
     "param '0#ip_weight' of shape (2000000000, 150528): its values and gradient need 2.41 PB"),
])
def test_a_net_larger_than_memory_is_one_line_exit_2_and_nothing_written(tmp_path, top, layer,
                                                                         what):
    """Sizes far beyond any machine: a regression that allocated them would fail at once."""
    net = tmp_path / "huge.prototxt"
    net.write_text(f'name: "huge"\nlayer {{ name: "data" type: "Input" top: "data" {top} }}\n'
                   f'{layer}\n')
    r = run_import(net, "-o", tmp_path / "out")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"{net}: {what}, more than this machine's "), r.stderr
    assert r.stderr.endswith(" of memory\n") and r.stdout == ""
    assert not os.path.exists(tmp_path / "out")


def test_a_caffe_count_past_singas_int32_is_one_line_exit_2(tmp_path):
    """Caffe's num_output is uint32, SINGA's int32."""
    net = tmp_path / "wide.prototxt"
    net.write_text('name: "w" input: "data" input_shape { dim: 1 dim: 10 }\nlayer { name: "ip" '
                   'type: "InnerProduct" bottom: "data" top: "ip" '
                   'inner_product_param { num_output: 4000000001 } }\n')
    r = run_import(net, "-o", tmp_path / "out")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr == (f"{net}: layer 'ip' of type InnerProduct holds a value SINGA's conf "
                        f"cannot: Value out of range: 4000000001\n")
    assert not os.path.exists(tmp_path / "out")


def test_bad_files_are_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.caffemodel"
    bad.write_bytes(open(fx("mlp", "mlp_iter_40.caffemodel"), "rb").read()[:5000])
    r = run_import(fx("mlp", "mlp_deploy.prototxt"), bad, "-o", tmp_path / "out")
    assert r.returncode == 2 and str(bad) in r.stderr and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr
    text = tmp_path / "t.prototxt"
    text.write_text('name: "x"\nlayer { name: "a" typo: 1 }\n')
    r = run_import(text, "-o", tmp_path / "out")
    assert r.returncode == 2 and r.stderr.startswith(f"{text}:2:") and r.stderr.count("\n") == 1
