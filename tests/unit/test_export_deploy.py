"""Reading a job's test net for export: which snapshot SNAPSHOT names, what becomes an op,
and the one-line refusals of the CLI (exit 2, no traceback)."""
import os
import stat

import numpy as np
import pytest
from google.protobuf import text_format

from export_helpers import fresh_snapshot
from singa.checkpoint.format import CheckpointReader, write_file
from singa.errors import CheckpointError
from singa.interop import deploy, exporter as cli
from singa.proto import caffe_pb2

LENET = "examples/mnist/conv.conf"


def stored(path):
    """{name: (values, version)} of a snapshot file."""
    r = CheckpointReader(path)
    return {n: (r.param(n), r.version(n)) for n in r.names}


def test_lenet_reads_as_a_sequence_of_ops(tmp_path):
    fresh_snapshot(LENET, tmp_path / "checkpoint")
    model = deploy.read(LENET, str(tmp_path))
    assert [(op.name, op.type, op.inputs) for op in model.ops] == [
        ("data", "Input", []), ("conv1", "Convolution", ["data"]),
        ("pool1", "Pooling", ["conv1"]), ("conv2", "Convolution", ["pool1"]),
        ("pool2", "Pooling", ["conv2"]), ("ip1", "InnerProduct", ["pool2"]),
        ("relu1", "ReLU", ["ip1"]), ("ip2", "InnerProduct", ["relu1"]),
        ("loss", "Softmax", ["ip2"])]      # the label source and the split are gone
    assert model.outputs == ["loss"] and model.step == 5
    assert model.inputs[0].shape == (100, 1, 28, 28)
    conv1 = model.ops[1]
    assert conv1.param_names == ["w1", "b1"] and conv1.params[0].shape == (20, 25)


def test_snapshot_is_a_file_a_folder_or_a_step(tmp_path):
    folder = tmp_path / "checkpoint"
    fresh_snapshot(LENET, folder, step=5, seed=1)
    fresh_snapshot(LENET, folder, step=9, seed=2)
    w1 = {}
    for what in (str(tmp_path), str(folder), str(folder / "step5"),
                 str(folder / "step5-worker0.bin")):
        w1[what] = deploy.read(LENET, what).ops[1].params[0]
    # a workspace and its checkpoint folder: the newest complete snapshot, as -resume
    assert deploy.read(LENET, str(tmp_path)).step == 9
    np.testing.assert_array_equal(w1[str(tmp_path)], w1[str(folder)])
    np.testing.assert_array_equal(w1[str(folder / "step5")], w1[str(folder / "step5-worker0.bin")])
    assert not np.array_equal(w1[str(tmp_path)], w1[str(folder / "step5")])


def test_the_newest_torn_snapshot_is_passed_over(tmp_path):
    folder = tmp_path / "checkpoint"
    fresh_snapshot(LENET, folder, step=5)
    fresh_snapshot(LENET, folder, step=9)
    with open(folder / "step9-worker0.bin", "r+b") as f:       # torn: cut short
        f.truncate(100)
    assert deploy.read(LENET, str(folder)).step == 5


def test_a_snapshot_of_two_workers_is_read_whole(tmp_path):
    """A model-partitioned snapshot: the pieces of each param in two worker files, joined."""
    fresh_snapshot(LENET, tmp_path / "one")
    whole = stored(str(tmp_path / "one" / "step5-worker0.bin"))
    folder = tmp_path / "two"
    os.makedirs(folder)
    for k in range(2):
        entries = []
        for name, (values, version) in whole.items():
            half = len(values) // 2
            entries.append((name, values[half * k:half * (k + 1) if k == 0 else None], version,
                            (0, k, 2)))
        write_file(str(folder / f"step5-worker{k}"), entries)
    model = deploy.read(LENET, str(folder / "step5-worker1.bin"))
    np.testing.assert_array_equal(model.ops[1].params[0], whole["0#w1"][0])


@pytest.mark.parametrize("snapshot, message", [
    ("nowhere", "{tmp}/nowhere: no such snapshot file or checkpoint folder"),
    ("empty", "{tmp}/empty: no complete snapshot"),
])
def test_a_missing_snapshot_is_one_line(tmp_path, capsys, snapshot, message):
    os.makedirs(tmp_path / "empty")
    out = tmp_path / "x.onnx"
    assert cli.main(["onnx", LENET, str(tmp_path / snapshot), "-o", str(out)]) == 2
    assert capsys.readouterr().err == f"singa-export: {message.format(tmp=tmp_path)}\n"
    assert not out.exists()


def test_a_snapshot_of_another_net_is_one_line(tmp_path, capsys):
    fresh_snapshot("examples/mnist/job.conf", tmp_path / "checkpoint")
    assert cli.main(["onnx", LENET, str(tmp_path), "-o", str(tmp_path / "x.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "step5-worker0.bin" in err and "0#w1" in err
    assert "has shape (784, 2500)" in err or "has shape (2500, 784)" in err


def test_a_snapshot_without_a_param_is_one_line(tmp_path):
    folder = tmp_path / "checkpoint"
    path = fresh_snapshot(LENET, folder)
    params = stored(path)
    os.unlink(path)
    write_file(str(folder / "step5-worker0"),
               [(n, v, ver) for n, (v, ver) in params.items() if n != "0#b3"])
    with pytest.raises(CheckpointError, match=r"step5-worker0.bin: no param 'b3' for "
                                              r"examples/mnist/conv.conf$"):
        deploy.read(LENET, str(folder))


def test_a_missing_conf_is_one_line(tmp_path, capsys):
    assert cli.main(["caffe", str(tmp_path / "job.conf"), str(tmp_path), "-o",
                     str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"singa-export: {tmp_path}/job.conf: no such job conf\n"


def test_an_unwritable_output_is_one_line_and_leaves_nothing(tmp_path, capsys):
    fresh_snapshot(LENET, tmp_path / "checkpoint")
    folder = tmp_path / "out"
    os.makedirs(folder)
    assert cli.main(["onnx", LENET, str(tmp_path), "-o", str(folder)]) == 2
    assert capsys.readouterr().err == f"singa-export: cannot write {folder}: is a folder\n"
    missing = tmp_path / "no" / "x.onnx"
    assert cli.main(["onnx", LENET, str(tmp_path), "-o", str(missing)]) == 2
    assert capsys.readouterr().err == \
        f"singa-export: cannot write {missing}: No such file or directory\n"
    assert os.listdir(folder) == [] and sorted(os.listdir(tmp_path)) == ["checkpoint", "out"]


def test_batch_sets_the_inputs_batch(tmp_path, capsys):
    fresh_snapshot(LENET, tmp_path / "checkpoint")
    assert cli.main(["caffe", LENET, str(tmp_path), "-o", str(tmp_path / "c"), "-batch", "3"]) == 0
    assert capsys.readouterr().out == (
        f"caffe: {tmp_path}/c/deploy.prototxt, {tmp_path}/c/model.caffemodel (step 5; inputs "
        f"data [1, 28, 28]; outputs loss)\n")
    deploy = text_format.Parse((tmp_path / "c" / "deploy.prototxt").read_text(),
                               caffe_pb2.NetParameter())
    assert list(deploy.layer[0].input_param.shape[0].dim) == [3, 1, 28, 28]


@pytest.mark.parametrize("args, message", [
    ([], "the following arguments are required: format, JOB.conf, SNAPSHOT, -o"),
    (["tflite", LENET, "s", "-o", "x"], "argument format: invalid choice: 'tflite'"),
    (["onnx", LENET, "s", "-o", "x", "-batch", "x"], "argument -batch: invalid int value: 'x'"),
    (["onnx", LENET, "s", "-o", "x", "extra"], "unrecognized arguments: extra")])
def test_a_command_line_mistake_is_one_line(capsys, args, message):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"singa-export: {message}") and err.count("\n") == 1
    assert "usage: singa-export" in err


@pytest.mark.parametrize("batch", ["0", "-1", str(2**31), str(10**23)])
def test_a_batch_out_of_range_is_one_line_and_writes_nothing(tmp_path, capsys, batch):
    fresh_snapshot(LENET, tmp_path / "checkpoint")
    for fmt, out in (("onnx", tmp_path / "m.onnx"), ("caffe", tmp_path / "c")):
        assert cli.main([fmt, LENET, str(tmp_path), "-o", str(out), "-batch", batch]) == 2
        assert capsys.readouterr().err == \
            f"singa-export: -batch {batch}: must be 1 to 2147483647\n"
    assert sorted(os.listdir(tmp_path)) == ["checkpoint"]


def test_an_output_that_is_no_regular_file_is_left_alone(tmp_path, capsys):
    """A FIFO (or a device such as /dev/full) named by -o: the rename replaced it with the
    model."""
    fresh_snapshot(LENET, tmp_path / "checkpoint")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert cli.main(["onnx", LENET, str(tmp_path), "-o", str(fifo)]) == 2
    assert capsys.readouterr().err == f"singa-export: cannot write {fifo}: is not a regular file\n"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "fifo"]
