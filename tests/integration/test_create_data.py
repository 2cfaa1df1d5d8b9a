"""create_data.py on Debian's Fashion-MNIST gives the very bytes SINGA's create_data wrote."""
import os
import subprocess
import sys

import pytest

from singa import HOME
from singa.io.kvfile import KVFile

DATASET = "/usr/share/datasets/fashion-mnist"
FIXTURES = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "singa-0.3"))
SCRIPT = os.path.join("examples", "mnist", "create_data.py")

pytestmark = pytest.mark.skipif(
    not os.path.exists(f"{DATASET}/train-images-idx3-ubyte.gz"),
    reason="Debian dataset-fashion-mnist is not installed")


def _run(*args):
    # As a user would: from the repo root, with a plain interpreter and no PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=HOME, env=env,
                          capture_output=True, text=True, timeout=120)


def _tuples(path, first, last):
    with KVFile(path) as f:
        return [t for i, t in enumerate(f) if first <= i <= last]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("mnist")
    return out, _run("--dataset-dir", DATASET, "--out-dir", str(out))


def test_writes_both_shards_with_progress(prepared):
    out, proc = prepared
    assert proc.returncode == 0, proc.stderr
    assert "train_data.bin [##############################] 60000/60000" in proc.stderr
    assert "test_data.bin [##############################] 10000/10000" in proc.stderr
    assert sorted(os.listdir(out)) == ["test_data.bin", "train_data.bin"]
    assert KVFile(out / "train_data.bin").count() == 60000
    assert KVFile(out / "test_data.bin").count() == 10000


def test_train_records_5000_to_5999_equal_singas_shard(prepared):
    out, _ = prepared
    ours = _tuples(out / "train_data.bin", 5000, 5999)
    assert ours == list(KVFile(f"{FIXTURES}/train-1000.bin"))
    assert len(ours) == 1000


def test_test_records_5000_to_5499_equal_singas_shard(prepared):
    out, _ = prepared
    ours = _tuples(out / "test_data.bin", 5000, 5499)
    assert ours == list(KVFile(f"{FIXTURES}/test-500.bin"))
    assert len(ours) == 500


def test_complete_outputs_are_skipped_and_partial_ones_redone(prepared):
    out, _ = prepared
    train = out / "train_data.bin"
    test = out / "test_data.bin"
    mtime = train.stat().st_mtime_ns
    whole_test = test.read_bytes()
    test.write_bytes(whole_test[:-100])
    proc = _run("--dataset-dir", DATASET, "--out-dir", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "train_data.bin: complete, skipped" in proc.stderr
    assert train.stat().st_mtime_ns == mtime
    assert test.read_bytes() == whole_test


def test_three_argument_form_and_user_errors(tmp_path):
    out = tmp_path / "t.bin"
    proc = _run(f"{DATASET}/t10k-images-idx3-ubyte.gz", f"{DATASET}/t10k-labels-idx1-ubyte.gz",
                str(out))
    assert proc.returncode == 0, proc.stderr
    assert _tuples(out, 5000, 5499) == list(KVFile(f"{FIXTURES}/test-500.bin"))
    bad = _run(f"{DATASET}/t10k-images-idx3-ubyte.gz", f"{DATASET}/train-labels-idx1-ubyte.gz",
               str(tmp_path / "bad.bin"))
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "10000 images" in bad.stderr
    assert "60000 labels" in bad.stderr
    assert sorted(os.listdir(tmp_path)) == ["t.bin"]  # no half-written or temporary file
    missing = _run("--dataset-dir", str(tmp_path), "--out-dir", str(tmp_path))
    assert missing.returncode == 2 and str(tmp_path) in missing.stderr
