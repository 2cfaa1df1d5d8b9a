"""checkpoint.state: what a bit-exact resume needs round-trips through a file, and a malformed
state is refused when the file is opened."""
import struct
import zlib

import numpy as np
import pytest

from checkpoint_helpers import params, state, values_and_versions
from singa import checkpoint as ckpt
from singa.errors import CheckpointError
from singa.net.numerics import set_rng_state
from singa.proto import common_pb2


def test_round_trip_values_versions_and_state(tmp_path):
    st = state(metrics={"accuracy": 0.75, "loss": 0.5})
    path = ckpt.write_file(str(tmp_path / "step5-worker0"), params(), st)
    assert path.endswith("step5-worker0.bin")
    r = ckpt.CheckpointReader(str(tmp_path / "step5-worker0"))   # by prefix
    assert r.verified and r.step == 5 and r.nworkers == 1
    for name, a, v in params():
        got, version = values_and_versions(r)[name]
        np.testing.assert_array_equal(got, a)
        assert version == v
    s = r.snapshot_state()
    assert (s.step, s.lr_index, s.reader) == (5, 2, {"data": (1234, True)})
    np.testing.assert_array_equal(s.param_state["0#w1"][0], np.full((4, 3), 0.5))
    assert s.metrics == {"accuracy": pytest.approx(0.75), "loss": pytest.approx(0.5)}
    restored = np.random.default_rng()
    set_rng_state(restored, s.rng["worker0"])
    expected = np.random.default_rng(42)
    expected.standard_normal(3)
    assert restored.standard_normal(5).tolist() == expected.standard_normal(5).tolist()


def test_bad_updater_state_is_refused_at_open(tmp_path):
    msg = common_pb2.BlobProtos(step=1)
    msg.param_state.add(name="0#w1").buffer.add(shape=[1000, 1000], data=[1.0])
    path = tmp_path / "step1-worker0.bin"
    payload = msg.SerializeToString()
    path.write_bytes(payload + b"\xb5\x13" + struct.pack("<I", zlib.crc32(payload)))
    with pytest.raises(CheckpointError, match=r"updater state 0 of 0#w1 has shape \(1000, 1000\) but 1 values"):
        ckpt.CheckpointReader(str(path))


@pytest.mark.parametrize("damage, what", [
    (lambda st: st.rng["worker0"].update(bit_generator="MT19937"),
     "RNG state of worker0 is for 'MT19937', not PCG64"),
    (lambda st: st.rng["worker0"].update(has_uint32=7), "RNG state of worker0 is not a PCG64 state"),
    (lambda st: st.param_state.update({"0#w1": [np.zeros((3, 3), np.float32)]}),
     r"updater state 0 of 0#w1 has shape \(3, 3\), the param \(4, 3\)"),
    (lambda st: st.param_state.update({"0#nope": [np.zeros(2, np.float32)]}),
     "updater state of 0#nope, a param the file does not hold")],
    ids=["RNG type", "RNG has_uint32", "updater state shape", "updater state of no param"])
def test_a_checksummed_file_with_malformed_state_is_a_checkpoint_error(tmp_path, damage, what):
    st = state()
    damage(st)
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"), params(), st)
    with pytest.raises(CheckpointError, match=f"step5-worker0.bin: {what}"):
        ckpt.CheckpointReader(path)
