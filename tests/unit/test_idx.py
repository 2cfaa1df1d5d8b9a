"""read_idx: raw and gzip IDX (detected by magic bytes), and every way a file can be wrong."""
import gzip
import os
import struct

import numpy as np
import pytest

from singa.errors import DataError
from singa.io.idx import read_idx

IMAGES = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
LABELS = np.array([7, 2], np.uint8)


def _images_bytes(images=IMAGES):
    return struct.pack(">iiii", 2051, *images.shape) + images.tobytes()


def _labels_bytes(labels=LABELS):
    return struct.pack(">ii", 2049, len(labels)) + labels.tobytes()


@pytest.mark.parametrize("compress", [False, True])
def test_reads_images_and_labels(tmp_path, compress):
    for name, data, want in (("img", _images_bytes(), IMAGES), ("lab", _labels_bytes(), LABELS)):
        path = tmp_path / name  # no extension: gzip is known by its magic bytes
        path.write_bytes(gzip.compress(data) if compress else data)
        got = read_idx(path)
        assert got.dtype == np.uint8 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("compress", [False, True])
def test_bad_magic_names_file(tmp_path, compress):
    path = tmp_path / "bad.idx"
    data = struct.pack(">ii", 2050, 1) + b"\0"
    path.write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(DataError, match=rf"{path}: bad IDX magic 2050"):
        read_idx(path)


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("keep, what", [(2, "truncated IDX header"), (10, "truncated IDX header"),
                                        (20, "truncated"), (-1, "truncated")])
def test_truncated_names_file(tmp_path, compress, keep, what):
    path = tmp_path / "short.idx"
    data = _images_bytes()[:keep]
    path.write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(DataError, match=rf"{path}: {what}"):
        read_idx(path)


@pytest.mark.parametrize("compress", [False, True])
def test_trailing_bytes_are_a_size_mismatch(tmp_path, compress):
    path = tmp_path / "long.idx"
    data = _labels_bytes() + b"\1"
    path.write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(DataError, match=rf"{path}: size mismatch"):
        read_idx(path)


def test_hostile_header_in_gzip_does_not_allocate_the_claimed_size(tmp_path):
    path = tmp_path / "huge.gz"
    path.write_bytes(gzip.compress(struct.pack(">iiii", 2051, 2**31 - 1, 2**15, 2**15) + b"x"))
    with pytest.raises(DataError, match="truncated"):
        read_idx(path)


def test_corrupt_gzip_and_missing_file_name_the_file(tmp_path):
    path = tmp_path / "corrupt.gz"
    path.write_bytes(gzip.compress(_labels_bytes())[:-12] + b"\xff" * 4)
    with pytest.raises(DataError, match=str(path)):
        read_idx(path)
    with pytest.raises(DataError, match=str(tmp_path / "absent")):
        read_idx(tmp_path / "absent")


def test_reads_debian_fashion_mnist_labels():
    path = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
    if not os.path.exists(path):
        pytest.skip("Debian dataset-fashion-mnist is not installed")
    labels = read_idx(path)
    assert labels.shape == (10000,) and np.bincount(labels).tolist() == [1000] * 10
