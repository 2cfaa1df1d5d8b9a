"""examples/cifar10's scripts: create_data.py writes SINGA's records, keys and mean image for
CIFAR-format batches written here; fashion_to_cifar.py packs grey images into that layout."""
import importlib.util
import os

import numpy as np
import pytest

import singa
from singa.errors import DataError
from singa.io.kvfile import KVFile
from singa.io.protowire import varint

HERE = os.path.join(singa.HOME, "examples", "cifar10")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


create_data = load("create_data")
fashion_to_cifar = load("fashion_to_cifar")


def write_batches(folder, sizes=(3, 2, 1, 2, 3, 2), seed=0):
    """data_batch_1..5.bin and test_batch.bin of random records; returns their (label, pixels)."""
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    batches = []
    for name, n in zip(names, sizes):
        records = rng.integers(0, 256, (n, 3073), dtype=np.uint8)
        records[:, 0] = rng.integers(0, 10, n)
        (folder / name).write_bytes(records.tobytes())
        batches.append(records)
    return batches


def record_bytes(label, pixels):
    """RecordProto{shape: 3, 32, 32; label; pixel} assembled by hand from protobuf's wire format."""
    return (b"\x08\x03\x08\x20\x08\x20" + b"\x10" + varint(label)
            + b"\x1a" + varint(len(pixels)) + pixels)


def test_create_data_writes_singas_records_keys_and_mean(tmp_path):
    batches = write_batches(tmp_path)
    create_data.create_data(str(tmp_path), str(tmp_path))
    train = np.concatenate(batches[:5])
    with KVFile(str(tmp_path / "train_data.bin")) as f:
        tuples = list(f)
    assert [k for k, _ in tuples] == [b"%05d" % i for i in range(11)]
    assert [v for _, v in tuples] == [record_bytes(int(r[0]), r[1:].tobytes()) for r in train]
    with KVFile(str(tmp_path / "test_data.bin")) as f:
        assert [k for k, _ in f] == [b"00000", b"00001"]
    with KVFile(str(tmp_path / "image_mean.bin")) as f:
        (key, value), = list(f)
    assert key == b"mean"
    mean = [sum(int(r[1 + i]) for r in train) / 11 for i in range(3072)]
    floats = np.frombuffer(value[-4 * 3072:], "<f4")
    assert value[:6] == b"\x08\x03\x08\x20\x08\x20" and value[6:9] == b"\x22\x80\x60"
    np.testing.assert_allclose(floats, mean, rtol=1e-6)


def test_create_data_reads_labels_as_signed_chars_like_singa(tmp_path):
    batches = write_batches(tmp_path)
    batches[0][0, 0] = 200
    (tmp_path / "data_batch_1.bin").write_bytes(batches[0].tobytes())
    create_data.create_data(str(tmp_path), str(tmp_path))
    with KVFile(str(tmp_path / "train_data.bin")) as f:
        _, value = next(iter(f))
    assert value == record_bytes(200 - 256, batches[0][0, 1:].tobytes())


def test_create_data_keeps_outputs_newer_than_its_inputs(tmp_path, capsys):
    write_batches(tmp_path)
    create_data.create_data(str(tmp_path), str(tmp_path))
    before = os.path.getmtime(tmp_path / "train_data.bin")
    create_data.create_data(str(tmp_path), str(tmp_path))
    assert os.path.getmtime(tmp_path / "train_data.bin") == before
    assert "kept" in capsys.readouterr().err


def test_create_data_names_a_truncated_batch(tmp_path):
    write_batches(tmp_path)
    with open(tmp_path / "data_batch_3.bin", "ab") as f:
        f.write(b"\0" * 10)
    with pytest.raises(DataError, match=r"data_batch_3.bin: 3083 bytes is not a whole number of "
                                        r"CIFAR-10 records \(3073 bytes each\)"):
        create_data.create_data(str(tmp_path), str(tmp_path))
    assert not list(tmp_path.glob("*.tmp*"))


def test_create_data_names_a_missing_batch(tmp_path):
    write_batches(tmp_path)
    os.remove(tmp_path / "test_batch.bin")
    assert create_data.main([str(tmp_path)]) == 2


def test_fashion_images_are_padded_and_replicated_into_rgb_planes():
    images = np.random.default_rng(0).integers(1, 256, (2, 28, 28), dtype=np.uint8)
    records = fashion_to_cifar.cifar_records(images, np.array([3, 9], np.uint8))
    assert records.shape == (2, 3073) and list(records[:, 0]) == [3, 9]
    for i in range(2):
        planes = records[i, 1:].reshape(3, 32, 32)
        for c in range(3):
            assert planes[c, 2:30, 2:30].tolist() == images[i].tolist()
            border = planes[c].copy()
            border[2:30, 2:30] = 0
            assert not border.any()
