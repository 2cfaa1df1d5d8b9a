"""singa.interop.caffe.importer: what an import writes (job.conf, snapshot and .meta, data files) and how
the command line is read."""
import os
import warnings

import numpy as np
import pytest

import singa
from singa.checkpoint import CheckpointReader, read_meta
from singa.interop.caffe.importer import import_caffe, main
from singa.io.caffe_blobs import CaffeFile
from singa.io.kvfile import KVFile
from singa.job import config
from singa.proto import caffe_pb2, common_pb2, job_pb2

FX = os.path.join(singa.HOME, "tests", "fixtures", "caffe")


def test_convnet_solverstate_import(tmp_path):
    """convnet_iter_30: step 30, multistep index 1, SGD history negated in SINGA's shapes,
    the mean image as a kvfile, and a job.conf that parses."""
    lines = []
    conf = import_caffe(os.path.join(FX, "convnet", "convnet_solver.prototxt"), str(tmp_path),
                        solverstate=os.path.join(FX, "convnet", "convnet_iter_30.solverstate"),
                        print=lines.append)
    assert any("data layers' positions" in line for line in lines)
    job = config.load_job(conf, check_paths=False)
    assert job.checkpoint_path[0] == str(tmp_path / "checkpoint" / "step30-worker0.bin")
    assert job.updater.learning_rate.type == job_pb2.kFixedStep
    r = CheckpointReader(job.checkpoint_path[0])
    assert r.verified and r.step == 30
    snap = r.snapshot_state()
    assert snap.lr_index == 1
    meta = read_meta(str(tmp_path / "checkpoint" / "step30-worker0.meta"))
    assert [(n, s) for n, s, _, _ in meta["params"]] == [
        ("0#conv1_weight", (12, 147)), ("0#conv1_bias", (12,)), ("0#conv2_weight", (16, 54)),
        ("0#conv2_bias", (16,)), ("0#ip1_weight", (144, 32)), ("0#ip1_bias", (32,)),
        ("0#ip2_weight", (8, 32)), ("0#ip2_bias", (8,))]
    assert {v for _, _, _, v in meta["params"]} == {30}
    with CaffeFile(os.path.join(FX, "convnet", "convnet_iter_30.solverstate")) as f:
        _, history = f.solver_state()
        for (name, shape, _, _), h in zip(meta["params"], history):
            (buf,) = snap.param_state[name]
            assert np.array_equal(buf, -h.values.reshape(shape))
    with KVFile(str(tmp_path / "data" / "mean.kvfile")) as f:
        key, value = f.read()
    rec = common_pb2.RecordProto.FromString(value)
    assert list(rec.shape) == [3, 20, 20]
    assert np.array_equal(np.float32(rec.data),
                          np.load(os.path.join(FX, "convnet", "data", "mean.npy")).ravel())


def test_weights_only_give_a_step0_snapshot_with_state(tmp_path):
    import_caffe(os.path.join(FX, "mlp", "mlp_deploy.prototxt"), str(tmp_path),
                 weights=os.path.join(FX, "mlp", "mlp_iter_40.caffemodel"), print=lambda s: None)
    r = CheckpointReader(str(tmp_path / "checkpoint" / "step0-worker0.bin"))
    assert r.step == 0 and r.snapshot_state().param_state == {}
    assert r.names == ["0#ip1_weight", "0#ip1_bias", "0#ip2_weight", "0#ip2_bias"]


@pytest.mark.parametrize("argv, msg", [
    ([], "usage: singa-import.sh caffe"),
    (["onnx", "x"], "invalid choice: 'onnx'"),
    (["caffe", "n.prototxt"], "arguments are required: -o; usage:"),
    (["caffe", "n.prototxt", "-o"], "argument -o: expected one argument"),
    (["caffe", "n.prototxt", "-x", "1", "-o", "d"], "unrecognized arguments: -x"),
    (["caffe", "n.prototxt", "-input_shape", "3,a", "-o", "d"],
     "argument -input_shape: give positive sizes C,H,W, not '3,a'"),
])
def test_command_line_mistakes_are_one_line(capsys, argv, msg):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1


def test_solverstate_needs_a_solver(tmp_path, capsys):
    assert main(["caffe", os.path.join(FX, "mlp", "mlp_train_test.prototxt"), "-solverstate",
                 os.path.join(FX, "mlp", "mlp_iter_20.solverstate"), "-o", str(tmp_path)]) == 2
    assert "needs its solver" in capsys.readouterr().err


@pytest.mark.parametrize("extra, msg", [
    ([], "mlp_deploy.prototxt: -fold-bn needs the weights (WEIGHTS.caffemodel)"),
    (["-solver", os.path.join(FX, "mlp", "mlp_solver.prototxt"), "-solverstate",
      os.path.join(FX, "mlp", "mlp_iter_20.solverstate")],
     "mlp_iter_20.solverstate: -fold-bn makes an inference net; it does not go with "
     "-solverstate"),
])
def test_fold_bn_needs_weights_and_no_solver_state(tmp_path, capsys, extra, msg):
    assert main(["caffe", os.path.join(FX, "mlp", "mlp_deploy.prototxt"), "-fold-bn", *extra,
                 "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1


def files_under(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder)
                  for d, _, names in os.walk(folder) for f in names)


def damaged(path, to, edit):
    """The Caffe binary file `path` (NetParameter or SolverState) after `edit(message)`."""
    cls = caffe_pb2.SolverState if path.endswith(".solverstate") else caffe_pb2.NetParameter
    with open(path, "rb") as f:
        msg = cls.FromString(f.read())
    edit(msg)
    to.write_bytes(msg.SerializeToString())
    return str(to)


def without_layer(name):
    def edit(net):
        del net.layer[[layer.name for layer in net.layer].index(name)]
    return edit


def negative_variance(net):
    bn = next(layer for layer in net.layer if layer.type == "BatchNorm")
    bn.blobs[1].data[0] = -1


@pytest.mark.parametrize("net, weights, edit, extra, msg", [
    ("zoo/resnet50_deploy.prototxt", "zoo/caffe/resnet50_deploy/model.caffemodel",
     negative_variance, ["-fold-bn"], "w.caffemodel: folding BatchNorm 'bn_conv1' into 'conv1' "
     "gives values that are not finite (a variance below -eps, or beyond float32)"),
    ("zoo/resnet50_deploy.prototxt", "zoo/caffe/resnet50_deploy/model.caffemodel",
     without_layer("conv1"), ["-fold-bn"], "w.caffemodel: no weights for layer 'conv1', which "
     "-fold-bn would fold BatchNorm 'bn_conv1' into"),
])
def test_weights_that_do_not_fit_the_net_are_one_line(tmp_path, capsys, net, weights, edit,
                                                      extra, msg):
    """Found by fuzzing: a BatchNorm whose variance is below -eps folded into nan weights; a
    folded Convolution without weights stopped the import in a TypeError."""
    w = damaged(os.path.join(FX, weights), tmp_path / "w.caffemodel", edit)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["caffe", os.path.join(FX, net), w, *extra, "-o",
                     str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"{msg}\n") and err.count("\n") == 1
    assert files_under(tmp_path / "out") == []


@pytest.mark.parametrize("edit, msg", [
    (lambda s: s.history.pop(), "s.solverstate: 7 history blobs for the net's 8 learnable params"),
    (lambda s: setattr(s, "iter", -2), "s.solverstate: iteration -2 is negative"),
    (lambda s: setattr(s, "current_step", 9), "s.solverstate: current_step 9: kFixedStep "
     "learning-rate index 9 is outside the 3 steps of fixedstep_conf"),
])
def test_a_refused_solver_state_leaves_no_file(tmp_path, capsys, edit, msg):
    """Found by fuzzing: the mean image's data/mean.kvfile was written before the solver state
    was checked, and stayed when it was refused; a multistep position past the solver's steps
    was refused only when the job resumed."""
    state = damaged(os.path.join(FX, "convnet", "convnet_iter_30.solverstate"),
                    tmp_path / "s.solverstate", edit)
    assert main(["caffe", os.path.join(FX, "convnet", "convnet_solver.prototxt"),
                 os.path.join(FX, "convnet", "convnet_iter_30.caffemodel"), "-solverstate", state,
                 "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"{msg}\n") and err.count("\n") == 1
    assert files_under(tmp_path / "out") == []


def test_weights_without_a_layer_leave_its_params_to_their_fillers(tmp_path, capsys):
    """Caffe's CopyTrainedLayersFrom, as fine-tuning a renamed layer uses it: the snapshot
    holds the other layers' params, the job starts that layer's from its fillers, as an
    import without weights does (found by fuzzing: a KeyError as the snapshot was written)."""
    net = os.path.join(FX, "mlp", "mlp_train_test.prototxt")
    w = damaged(os.path.join(FX, "mlp", "mlp_iter_40.caffemodel"), tmp_path / "w.caffemodel",
                without_layer("ip2"))
    assert main(["caffe", net, w, "-o", str(tmp_path / "out")]) == 0
    assert f"{w}: no weights for layer 'ip2': its params start from their fillers, as in " \
           f"Caffe\n" in capsys.readouterr().out
    job = config.load_job(str(tmp_path / "out" / "job.conf"), check_paths=False)
    assert CheckpointReader(job.checkpoint_path[0]).names == ["0#ip1_weight", "0#ip1_bias"]
    fresh = config.load_job(import_caffe(net, str(tmp_path / "fresh"), input_shape=(64,),
                                         print=lambda s: None), check_paths=False)
    ip2 = [[p for layer in j.neuralnet.layer if layer.name == "ip2" for p in layer.param]
           for j in (job, fresh)]
    assert ip2[0] == ip2[1] and ip2[0][0].init.type == job_pb2.kUniformSqrtFanIn


def test_a_solver_state_needs_the_weights_of_every_layer(tmp_path, capsys):
    w = damaged(os.path.join(FX, "mlp", "mlp_iter_20.caffemodel"), tmp_path / "w.caffemodel",
                without_layer("ip2"))
    assert main(["caffe", os.path.join(FX, "mlp", "mlp_solver.prototxt"), w, "-solverstate",
                 os.path.join(FX, "mlp", "mlp_iter_20.solverstate"),
                 "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"mlp_iter_20.solverstate: a solver state continues the training of "
                        f"its weights, but {w} has none for layer 'ip2'\n")
    assert err.count("\n") == 1 and files_under(tmp_path / "out") == []
