"""checkpoint.meta: the `.meta` text beside each snapshot file describes its params."""
import os

from checkpoint_helpers import params, state
from singa import checkpoint as ckpt


def test_meta_file_describes_params(tmp_path):
    recorded = {"test/loss": 1.5, "test/squared error": 2.25, "test@step": 5.0}
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"), params(), state(metrics=recorded))
    assert ckpt.meta_path(path) == str(tmp_path / "step5-worker0.meta")
    meta = ckpt.read_meta(ckpt.meta_path(path))
    r = ckpt.CheckpointReader(path)
    assert meta["params"] == r.meta() == [("0#w1", (4, 3), "float32", 7), ("0#b1", (4,), "float32", 7)]
    assert (meta["step"], meta["nworkers"], meta["bytes"], meta["metrics"]) == (
        5, 1, os.path.getsize(path), recorded)
    assert "param\t0#w1\t4,3\tfloat32\t7" in open(ckpt.meta_path(path)).read().splitlines()
