"""SINGA 0.1's confs (mnist/job-v0.1.0.conf, cifar10/job-v0.1.0.conf) run, unmodified but for
steps, frequencies, batch size and paths: kShardData reads 0.1 shard folders written here the
way 0.1's create_shard wrote them, kMnist / kRGBImage / kLabel parse them, and the loss falls."""
import os
import re

import numpy as np

import singa
from conftest import FIXTURES
from singa.io.kvfile import KVFile
from singa.proto import common_pb2

CONFS = os.path.join(singa.HOME, "tests", "fixtures", "confs")


def write_shard(folder, records):
    """folder/shard.dat: Record{image = r} per RecordProto r, keys "%05d" (0.1's create_shard)."""
    folder.mkdir()
    with KVFile(str(folder / "shard.dat"), "create") as f:
        for i, rec in enumerate(records):
            f.insert(b"%05d" % i, common_pb2.Record(image=rec).SerializeToString())


def fixture_records(name):
    with KVFile(os.path.join(FIXTURES, name)) as f:
        return [common_pb2.RecordProto.FromString(v) for _, v in f]


def write_conf(tmp_path, conf, steps, edits):
    with open(os.path.join(CONFS, conf)) as f:
        text = f.read()
    for field, value in (("train_steps", steps), ("test_steps", 2), ("test_freq", steps),
                         ("disp_freq", steps // 4), ("workspace", f'"{tmp_path / "ws"}"')):
        text, n = re.subn(rf"(?m)^(\s*{field}): ?\S+$", rf"\1: {value}", text)
        assert n == 1, f"{field} is not in {conf}"
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "job.conf"
    path.write_text(text)
    return path


def train_losses(stderr):
    return [float(x) for x in re.findall(r"Train @ step \d+  Loss = ([\d.]+)", stderr)]


def test_mnist_mlp_v01_conf_trains_on_a_01_shard(tmp_path, run_driver):
    write_shard(tmp_path / "train_shard", fixture_records("train-1000.bin"))
    write_shard(tmp_path / "test_shard", fixture_records("test-500.bin"))
    conf = write_conf(tmp_path, "mnist/job-v0.1.0.conf", 40, {
        "examples/mnist/mnist_train_shard": str(tmp_path / "train_shard"),
        "examples/mnist/mnist_test_shard": str(tmp_path / "test_shard"),
        "batchsize: 1000": "batchsize: 100"})
    r = run_driver(conf)
    assert r.returncode == 0, r.stderr
    losses = train_losses(r.stderr)
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.05, losses
    assert re.search(r"Test @ step 0\n.*   Loss = [\d.]+, accuracy = [\d.]+", r.stderr)


def test_cifar10_v01_conf_trains_on_a_01_shard_with_a_01_mean_file(tmp_path, run_driver):
    rng = np.random.default_rng(0)
    colours = rng.integers(40, 216, (10, 3))

    def records(n):
        labels = rng.integers(0, 10, n)
        pixels = np.clip(colours[labels][:, :, None] + rng.integers(-40, 40, (n, 3, 1024)), 0, 255)
        return [common_pb2.RecordProto(shape=[3, 32, 32], label=int(k),
                                       pixel=p.astype(np.uint8).tobytes())
                for k, p in zip(labels, pixels)]

    train = records(300)
    write_shard(tmp_path / "train_shard", train)
    write_shard(tmp_path / "test_shard", records(100))
    mean = np.mean([np.frombuffer(r.pixel, np.uint8) for r in train], axis=0, dtype=np.float32)
    # 0.1's create_shard writes the mean as a bare serialized record, not a kvfile
    (tmp_path / "image_mean.bin").write_bytes(
        common_pb2.RecordProto(shape=[3, 32, 32], data=mean).SerializeToString())
    conf = write_conf(tmp_path, "cifar10/job-v0.1.0.conf", 40, {
        "examples/cifar10/cifar10_train_shard": str(tmp_path / "train_shard"),
        "examples/cifar10/cifar10_test_shard": str(tmp_path / "test_shard"),
        "examples/cifar10/image_mean.bin": str(tmp_path / "image_mean.bin")})
    r = run_driver(conf)
    assert r.returncode == 0, r.stderr
    losses = train_losses(r.stderr)
    # 0.1's conf has no momentum: the loss falls slowly but steadily (by 0.005 to 0.008 in
    # trial runs)
    assert len(losses) == 4 and losses == sorted(losses, reverse=True), losses
    assert losses[-1] < losses[0] - 0.002, losses
