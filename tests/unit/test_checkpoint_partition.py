"""Snapshots of model-partitioned params: pieces joined across worker files and cut anew."""
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

import singa
from checkpoint_helpers import values_and_versions
from singa import checkpoint as ckpt
from singa.errors import CheckpointError
from singa.layers.param import Param
from singa.proto import common_pb2, job_pb2

FIX = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "singa-0.3"))
SINGA_STEP200 = f"{FIX}/run-1worker/step200-worker0"


def param(name, shape, partition=None):
    p = Param(job_pb2.ParamProto(name=name))
    p.setup(shape)
    p.data[...] = np.nan
    p.partition = partition
    return p


def pieces_of(name, shape, parts):
    """Params of `shape` cut by rows into `parts` pieces, as the NeuralNet makes them."""
    return [param(name, (len(range(*singa.layers.param.cut(shape[0], parts, k))),) + shape[1:],
                  (0, k, parts)) for k in range(parts)]


def singa_file(path, entries):
    """A file as SINGA 0.3 writes it: [(name, values, version)], no checksum, no suffix."""
    msg = common_pb2.BlobProtos()
    for name, a, version in entries:
        msg.version.append(version)
        msg.name.append(name)
        msg.blob.add(shape=a.shape).data.extend(a.ravel().tolist())
    with open(path, "wb") as f:
        f.write(msg.SerializeToString())


@pytest.fixture
def singa_partitioned(tmp_path):
    """SINGA's 2-worker snapshot of the fixture's MLP with ip1 on partition_dim 1: rows of
    0#weight1 and 0#bias1 split between the worker files under one name; ip2 (partition 0's)
    whole in worker 0's file."""
    whole = values_and_versions(ckpt.CheckpointReader(SINGA_STEP200))
    folder = tmp_path / "ws" / "checkpoint"
    folder.mkdir(parents=True)
    w1, b1 = whole["0#weight1"][0], whole["0#bias1"][0]
    singa_file(folder / "step200-worker0", [("0#weight1", w1[:32], 199), ("0#bias1", b1[:32], 199),
                                            ("0#weight2", whole["0#weight2"][0], 199),
                                            ("0#bias2", whole["0#bias2"][0], 199)])
    singa_file(folder / "step200-worker1", [("0#weight1", w1[32:], 198), ("0#bias1", b1[32:], 198)])
    return folder, {n: a for n, (a, _) in whole.items()}


def test_singa_partitioned_snapshot_resumes_into_one_worker_joined_in_worker_order(
        singa_partitioned):
    folder, whole = singa_partitioned
    snap = ckpt.latest_snapshot(str(folder), nworkers=1)
    assert snap.complete and sorted(snap.readers) == [0, 1]
    ps = {n: param(n, a.shape) for n, a in whole.items()}
    log = []
    loaded = ckpt.load_params(ckpt.open_checkpoint_path(["latest"], str(folder.parent), nworkers=1),
                              ps, log.append)
    for n, a in whole.items():
        np.testing.assert_array_equal(ps[n].data, a)
    assert loaded["0#weight1"] == (f"{folder}/step200-worker0", f"{folder}/step200-worker1")
    assert ps["0#weight1"].version == 198 and ps["0#weight2"].version == 199   # the older piece
    assert (f"Param 0#weight1: joined from {folder}/step200-worker0 [0:32] + "
            f"{folder}/step200-worker1 [32:64]") in log
    assert f"Param 0#weight2: loaded from {folder}/step200-worker0" in log


@pytest.mark.parametrize("parts", [2, 3])
def test_singa_pieces_recut_for_two_and_three_workers(singa_partitioned, parts):
    folder, whole = singa_partitioned
    log = []
    for p in pieces_of("0#weight1", (64, 784), parts):
        ckpt.load_params([str(folder / "step200-worker0"), str(folder / "step200-worker1")],
                         {p.name: p}, log.append)
        np.testing.assert_array_equal(p.data,
                                      np.array_split(whole["0#weight1"], parts)[p.partition[1]])
    assert log[-1].endswith(f"[32:64], rows {64 - 64 // parts}:64")


def test_singa_pieces_of_a_transposed_weight_join_along_columns(tmp_path):
    w = np.arange(60, dtype=np.float32).reshape(6, 10)
    singa_file(tmp_path / "step1-worker0", [("0#w", w[:, :5], 1)])
    singa_file(tmp_path / "step1-worker1", [("0#w", w[:, 5:], 1)])
    p = param("0#w", (6, 10))
    ckpt.load_params(sorted(map(str, tmp_path.iterdir())), {"0#w": p})
    np.testing.assert_array_equal(p.data, w)


def write_pieces(folder, parts, rng=np.random.default_rng(3)):
    """Our snapshot of `parts` workers: 0#w (10, 6) and 0#b (10,) cut by rows, each piece with
    a momentum buffer; returns the wholes and the buffers' whole."""
    w = rng.standard_normal((10, 6)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    hist = rng.standard_normal((10, 6)).astype(np.float32)
    for k, (wk, bk, hk) in enumerate(zip(np.array_split(w, parts), np.array_split(b, parts),
                                         np.array_split(hist, parts))):
        state = ckpt.SnapshotState(step=30, nworkers=parts, param_state={"0#w": [hk]})
        ckpt.write_file(ckpt.snapshot_file(str(folder), 30, k),
                        [("0#w", wk, 30, (0, k, parts)), ("0#b", bk, 30, (0, k, parts))], state)
    return w, b, hist


@pytest.mark.parametrize("parts", [1, 3])
def test_two_piece_snapshot_loads_into_any_number_of_pieces(tmp_path, parts):
    w, b, hist = write_pieces(tmp_path, 2)
    snap = ckpt.latest_snapshot(str(tmp_path), nworkers=parts)
    assert snap.complete and sorted(snap.readers) == [0, 1]
    for k in range(parts):
        cut = (0, k, parts) if parts > 1 else None
        ps = {"0#w": param("0#w", np.array_split(w, parts)[k].shape, cut),
              "0#b": param("0#b", np.array_split(b, parts)[k].shape, cut)}
        ckpt.load_params(snap.readers.values(), ps)
        np.testing.assert_array_equal(ps["0#w"].data, np.array_split(w, parts)[k])
        np.testing.assert_array_equal(ps["0#b"].data, np.array_split(b, parts)[k])
        (buf,) = ckpt.updater_state(snap, ps["0#w"])
        np.testing.assert_array_equal(buf, np.array_split(hist, parts)[k])
        assert ckpt.updater_state(snap, ps["0#b"]) == []


def test_row_pieces_cut_anew_by_columns(tmp_path):
    w, _, hist = write_pieces(tmp_path, 2)
    snap = ckpt.latest_snapshot(str(tmp_path))
    for k in range(4):
        cols = np.array_split(w, 4, axis=1)[k]
        p = param("0#w", cols.shape, (1, k, 4))
        ckpt.load_params(snap.readers.values(), {"0#w": p})
        np.testing.assert_array_equal(p.data, cols)
        np.testing.assert_array_equal(ckpt.updater_state(snap, p)[0],
                                      np.array_split(hist, 4, axis=1)[k])


def test_pieces_are_recorded_in_the_file_and_its_meta(tmp_path):
    write_pieces(tmp_path, 2)
    r = ckpt.CheckpointReader(ckpt.snapshot_file(str(tmp_path), 30, 1))
    assert r.piece("0#w") == (0, 1, 2) and r.shape("0#w") == (5, 6)
    meta = ckpt.read_meta(ckpt.meta_path(r.path))
    assert meta["pieces"] == {"0#w": (0, 1, 2), "0#b": (0, 1, 2)}
    singa_part = common_pb2.BlobProtos.FromString(open(r.path, "rb").read())   # what SINGA reads
    assert list(singa_part.name) == ["0#w", "0#b"] and list(singa_part.blob[0].shape) == [5, 6]


def test_a_piece_record_that_names_no_param_is_refused(tmp_path):
    msg = common_pb2.BlobProtos(version=[1], name=["0#w"], step=1)
    msg.blob.add(shape=[2, 2]).data.extend([1, 2, 3, 4])
    msg.piece.add(name="0#v", axis=0, k=0, parts=2)
    payload = msg.SerializeToString()
    (tmp_path / "x.bin").write_bytes(payload + b"\xb5\x13" + struct.pack("<I", zlib.crc32(payload)))
    with pytest.raises(CheckpointError, match="bad partition piece record of param 0#v"):
        ckpt.CheckpointReader(str(tmp_path / "x.bin"))


@pytest.mark.parametrize("files, target, message", [
    (["step30-worker0.bin"], param("0#w", (10, 6)),
     r"step30-worker0.bin: param 0#w: the files hold pieces \[0\] of 2, not all"),
    (["step30-worker0.bin", "step30-worker1.bin"], param("0#w", (12, 6)),
     r"param 0#w joins into shape \(10, 6\), the net expects \(12, 6\)"),
    (["step30-worker0.bin", "step30-worker1.bin"], param("0#w", (4, 6), (0, 0, 2)),
     r"param 0#w joins into shape \(10, 6\), the net expects \(4, 6\) as piece 0 of 2 "
     r"along axis 0"),
])
def test_pieces_that_do_not_make_the_param_are_one_line_errors(tmp_path, files, target, message):
    write_pieces(tmp_path, 2)
    with pytest.raises(CheckpointError, match=message) as e:
        ckpt.load_params([str(tmp_path / f) for f in files], {"0#w": target})
    assert "\n" not in str(e.value)


def test_singa_pieces_that_join_along_no_axis_name_files_param_and_shapes(tmp_path):
    singa_file(tmp_path / "step1-worker0", [("0#w", np.ones((5, 6), np.float32), 1)])
    singa_file(tmp_path / "step1-worker1", [("0#w", np.ones((4, 5), np.float32), 1)])
    with pytest.raises(CheckpointError) as e:
        ckpt.load_params(sorted(map(str, tmp_path.iterdir())), {"0#w": param("0#w", (10, 6))})
    assert str(e.value) == (f"checkpoint {tmp_path}/step1-worker0 (5, 6), {tmp_path}/step1-worker1 "
                            f"(4, 5): param 0#w: pieces join into (10, 6) along no axis")


def test_one_singa_piece_is_never_taken_for_the_whole(singa_partitioned):
    folder, _ = singa_partitioned
    with pytest.raises(CheckpointError, match=r"param 0#weight1 has shape \(32, 784\), the net "
                                              r"expects \(64, 784\)"):
        ckpt.load_params([str(folder / "step200-worker1")],
                         {"0#weight1": param("0#weight1", (64, 784))})


def test_equal_singa_pieces_without_a_target_are_ambiguous_unless_an_axis_is_preferred(tmp_path):
    singa_file(tmp_path / "step1-worker0", [("0#w", np.zeros((5, 6), np.float32), 1)])
    singa_file(tmp_path / "step1-worker1", [("0#w", np.ones((5, 6), np.float32), 1)])
    entries = [(ckpt.CheckpointReader(str(p)), "0#w") for p in sorted(tmp_path.iterdir())]
    with pytest.raises(CheckpointError, match=r"along axes \[0, 1\] alike \(ambiguous\)"):
        ckpt.Joined("0#w", entries)
    assert ckpt.Joined("0#w", entries, prefer=1).shape == (5, 12)


def test_files_of_one_snapshot_are_one_source_and_later_sources_win(tmp_path, singa_partitioned):
    folder, whole = singa_partitioned
    other = ckpt.write_file(str(tmp_path / "other.bin"), [("0#bias2", np.full(10, 7.0), 5)])
    files = [str(folder / "step200-worker0"), other, str(folder / "step200-worker1")]
    ps = {n: param(n, a.shape) for n, a in whole.items()}
    ckpt.load_params(files, ps)
    np.testing.assert_array_equal(ps["0#weight1"].data, whole["0#weight1"])   # joined
    assert ps["0#bias2"].data.tolist() == [7.0] * 10 and ps["0#bias2"].version == 5


def cli(*args):
    return subprocess.run([sys.executable, "-m", "singa.checkpoint", *args], cwd=singa.HOME,
                          capture_output=True, text=True, timeout=60)


def test_cli_show_names_each_piece(tmp_path, singa_partitioned):
    write_pieces(tmp_path, 2)
    out = cli("show", ckpt.snapshot_file(str(tmp_path), 30, 1))
    assert out.returncode == 0
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if "#" in line}
    assert rows["0#w"][1:7] == ["(5,", "6)", "float32", "30", "1/2", "axis"]
    folder, _ = singa_partitioned
    out = cli("show", str(folder / "step200-worker0"))
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if "#" in line}
    assert out.returncode == 0 and rows["0#weight1"][5] == "0/2" and rows["0#weight2"][5] == "-"


def test_cli_merge_writes_a_one_worker_snapshot_singa_reads(tmp_path, singa_partitioned):
    folder, whole = singa_partitioned
    out_dir = tmp_path / "merged"
    out_dir.mkdir()
    out = cli("merge", str(folder / "step200-worker1"), str(out_dir))
    assert out.returncode == 0, out.stderr
    assert "0#weight1  (64, 784)  joined from 2 pieces along axis 0" in out.stdout
    merged = out_dir / "step200-worker0.bin"
    singa_view = common_pb2.BlobProtos.FromString(merged.read_bytes())
    assert list(singa_view.name) == list(whole)
    r = ckpt.CheckpointReader(str(merged))
    for n, a in whole.items():
        np.testing.assert_array_equal(r.param(n), a)
    assert ckpt.latest_snapshot(str(out_dir)).files == {0: str(merged)}


def test_cli_merge_mistakes_exit_2_with_one_line(tmp_path, singa_partitioned):
    folder, _ = singa_partitioned
    for args, what in [((str(folder / "step200-worker0"), str(folder)),
                        "would be a file of the snapshot"),
                       ((str(tmp_path / "nope.bin"), str(tmp_path)), "not a snapshot file")]:
        out = cli("merge", *args)
        assert out.returncode == 2 and what in out.stderr
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_a_huge_recorded_piece_count_is_one_line_error(tmp_path):
    ckpt.write_file(str(tmp_path / "step1-worker0.bin"),
                    [("0#w", np.ones((2, 2)), 1, (0, 0, 2**31 - 1))])
    with pytest.raises(CheckpointError, match=r"pieces \[0\] of 2147483647, not all"):
        ckpt.load_params([str(tmp_path / "step1-worker0.bin")], {"0#w": param("0#w", (2, 2))})
