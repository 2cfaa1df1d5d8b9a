"""Checkpoints cross between SINGA 0.3 and us both ways: SINGA's files load through
`checkpoint_path` and `-resume` and give SINGA's test numbers; ours decode as SINGA's BlobProtos."""
import os
import re
import shutil

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from singa import checkpoint

from conftest import FIXTURES

MLP_PARAMS = {"0#weight1": (64, 784), "0#bias1": (64,), "0#weight2": (10, 64), "0#bias2": (10,)}


def singa03_blobprotos():
    """SINGA 0.3's own BlobProtos (common.proto, Appendix A), without any field of ours."""
    f = descriptor_pb2.FileDescriptorProto(name="singa03_common.proto", package="singa03")
    blob = f.message_type.add(name="BlobProto")
    rep = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    t = descriptor_pb2.FieldDescriptorProto
    blob.field.add(name="shape", number=1, label=rep, type=t.TYPE_INT32)
    blob.field.add(name="data", number=2, label=rep, type=t.TYPE_FLOAT).options.packed = True
    blobs = f.message_type.add(name="BlobProtos")
    blobs.field.add(name="id", number=2, label=rep, type=t.TYPE_INT32)
    blobs.field.add(name="version", number=3, label=rep, type=t.TYPE_INT32)
    blobs.field.add(name="name", number=4, label=rep, type=t.TYPE_STRING)
    blobs.field.add(name="blob", number=5, label=rep, type=t.TYPE_MESSAGE,
                    type_name=".singa03.BlobProto")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("singa03.BlobProtos"))


def logged_tests(stderr):
    """[(step, loss line)] of every `Test @ step N` in a log, the loss line as printed."""
    lines = stderr.splitlines()
    return [(int(re.search(r"Test @ step (\d+)", a).group(1)), b.split("]", 1)[1].strip())
            for a, b in zip(lines, lines[1:]) if "Test @ step" in a]


@pytest.mark.parametrize("conf, ckpt, line", [
    ("job.conf", "run-1worker/step100-worker0", "Loss = 0.914131, accuracy = 0.670000"),
    ("job.conf", "run-1worker/step200-worker0", "Loss = 0.706795, accuracy = 0.748000"),
    ("cnn/job.conf", "cnn/step100-worker0", "Loss = 0.730350, accuracy = 0.734000"),
])
def test_singa_checkpoint_reproduces_singas_test_line(mlp_job, run_driver, conf, ckpt, line):
    job = mlp_job(conf=os.path.join(FIXTURES, conf),
                      checkpoint_path=[os.path.join(FIXTURES, ckpt)])
    r = run_driver(job, "-test")
    assert r.returncode == 0, r.stderr
    # the step of the file, like the training's `Test @ step N` that printed the same line
    assert logged_tests(r.stderr) == [(int(re.search(r"step(\d+)", ckpt).group(1)), line)]
    assert f"Load from checkpoint file {os.path.normpath(os.path.join(FIXTURES, ckpt))}" in r.stderr


def test_our_checkpoint_is_singas_blobprotos(mlp_job, run_driver, tmp_path):
    r = run_driver(mlp_job())
    assert r.returncode == 0, r.stderr
    plain = singa03_blobprotos()
    for step in (100, 200):
        path = tmp_path / "ws" / "checkpoint" / f"step{step}-worker0.bin"
        data = path.read_bytes()
        assert data[0] == 0x18          # SINGA's layout: the version entries come first
        msg = plain.FromString(data)
        assert list(msg.name) == list(MLP_PARAMS)
        assert [tuple(b.shape) for b in msg.blob] == list(MLP_PARAMS.values())
        # ours waits for the last update: 200 after 200 steps (SINGA's final file says 199)
        assert list(msg.version) == [step] * 4
        ours = checkpoint.CheckpointReader(str(path))
        for name, b in zip(msg.name, msg.blob):
            np.testing.assert_array_equal(np.array(b.data, np.float32).reshape(tuple(b.shape)),
                                          ours.param(name))
    # -test on our step100 file repeats, digit for digit, the training's `Test @ step 100`
    # (both read the whole test shard from its start)
    trained = dict(logged_tests(r.stderr))
    job = mlp_job("test", checkpoint_path=[str(tmp_path / "ws" / "checkpoint" / "step100-worker0")])
    t = run_driver(job, "-test")
    assert t.returncode == 0, t.stderr
    assert logged_tests(t.stderr) == [(100, trained[100])]


def test_singa_two_worker_snapshot_resumes(mlp_job, run_driver, tmp_path):
    folder = tmp_path / "ws" / "checkpoint"
    folder.mkdir(parents=True)
    for w in (0, 1):
        shutil.copy(os.path.join(FIXTURES, "run-2workers", f"step200-worker{w}"), folder)

    def two_workers(job):
        job.cluster.nworkers_per_group = 2
        job.cluster.nworkers_per_procs = 2
    r = run_driver(mlp_job(train_steps=260, edit=two_workers), "-resume")
    assert r.returncode == 0, r.stderr
    assert "Resume from step 200" in r.stderr
    final = checkpoint.CheckpointReader(str(folder / "step260-worker0.bin"))
    # SINGA's files hold versions 199; each of the 60 steps adds one update
    assert [v for *_, v in final.meta()] == [259] * 4
    assert final.names == list(MLP_PARAMS)
