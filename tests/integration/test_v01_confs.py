"""SINGA 0.1's confs (mnist/job-v0.1.0.conf, conv-v0.1.0.conf, cifar10/job-v0.1.0.conf, the rbm
chain rbm1..4-v0.1.0.conf + autoencoder-v0.1.0.conf) run, unmodified but for steps, frequencies,
batch size and paths: kShardData reads 0.1 shard folders written here the way 0.1's
create_shard wrote them, kMnist / kRGBImage / kLabel parse them, and the loss falls."""
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


def write_conf(tmp_path, conf, steps, edits, workspace="ws"):
    with open(os.path.join(CONFS, conf)) as f:
        text = f.read()
    for field, value in (("train_steps", steps), ("test_steps", 2), ("test_freq", steps),
                         ("disp_freq", steps // 4), ("workspace", f'"{tmp_path / workspace}"')):
        text, n = re.subn(rf"(?m)^(\s*{field}): ?\S+$", rf"\1: {value}", text)
        assert n == 1, f"{field} is not in {conf}"
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{workspace}.conf"
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


def mnist_shards(tmp_path):
    """{0.1 conf path: shard folder} for Fashion-MNIST fixture records."""
    write_shard(tmp_path / "train_shard", fixture_records("train-1000.bin"))
    write_shard(tmp_path / "test_shard", fixture_records("test-500.bin"))
    return {"examples/mnist/mnist_train_shard": str(tmp_path / "train_shard"),
            "examples/mnist/mnist_test_shard": str(tmp_path / "test_shard")}


def test_mnist_conv_v01_conf_trains_on_a_01_shard(tmp_path, run_driver):
    conf = write_conf(tmp_path, "mnist/conv-v0.1.0.conf", 40, mnist_shards(tmp_path))
    r = run_driver(conf)
    assert r.returncode == 0, r.stderr
    losses = train_losses(r.stderr)
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.05, losses


def test_rbm_v01_chain_pretrains_layer_by_layer_and_the_autoencoder_loads_all_four(tmp_path,
                                                                                   run_driver):
    """rbm<k> loads rbm<k-1>'s step file by 0.1's names (`w1`, no `0#`); each RBM's
    reconstruction error falls; the autoencoder loads all four files."""
    shards = mnist_shards(tmp_path)
    steps = 40
    for k in range(1, 6):
        name = f"rbm{k}" if k < 5 else "autoencoder"
        loads = range(1, k) if k == 5 else range(k - 1, k) if k > 1 else ()
        edits = dict(shards, **{f"examples/rbm/rbm{j}/checkpoint/step6000-worker0":
                                str(tmp_path / f"rbm{j}" / "checkpoint" / f"step{steps}-worker0")
                                for j in loads})
        if k == 5:
            edits["batchsize: 1000"] = "batchsize: 100"
        conf = write_conf(tmp_path, f"rbm/{name}-v0.1.0.conf", steps, edits, workspace=name)
        r = run_driver(conf)
        assert r.returncode == 0, r.stderr
        for j in loads:
            assert f"Load from checkpoint file {tmp_path}/rbm{j}/checkpoint/step{steps}-worker0" \
                in r.stderr, (name, r.stderr)
        if k < 5:
            errors = [float(x) for x in re.findall(r"Train @ step \d+  Squared Error = ([\d.]+)",
                                                   r.stderr)]
            assert len(errors) == 4 and errors[-1] < errors[0], (name, errors)
        else:
            assert "not in the checkpoint files" not in r.stderr, r.stderr
            losses = [float(x) for x in re.findall(r"Train @ step \d+  Loss = ([\d.]+)", r.stderr)]
            assert len(losses) == 4 and losses[-1] < losses[0], losses
