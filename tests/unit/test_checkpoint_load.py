"""checkpoint.load: checkpoint_path entries, params loaded by name from SINGA's files and ours."""
import os
import types

import numpy as np
import pytest

import singa
from checkpoint_helpers import FIX, FIX_NAMES, FIX_SHAPES, paths, snapshot
from singa import checkpoint as ckpt
from singa.api import session
from singa.checkpoint import format as ckpt_format
from singa.checkpoint import load as ckpt_load
from singa.errors import CheckpointError
from singa.job import config


def test_a_resume_reads_its_snapshot_once_from_verifying_to_loading(tmp_path, monkeypatch):
    """-resume verifies the newest snapshot (newest first, older ones unread) and the workers
    load from those parsed files, reading none again; nothing stays in memory afterwards."""
    job = config.load_job(os.path.join(FIX, "job.conf"), check_paths=False)
    for layer in job.neuralnet.layer:
        layer.store_conf.path = singa.resolve(layer.store_conf.path)
    job.cluster.workspace = str(tmp_path / "ws")
    job.train_steps, job.checkpoint_freq, job.test_steps, job.seed = 20, 10, 0, 3
    session.train(session.prepare(job), progress=False)
    loads, resumed = [], {}
    load = ckpt_format._load
    monkeypatch.setattr(ckpt_format, "_load", lambda path: loads.append(path) or load(path))
    load_params = ckpt_load.load_params

    def recording_load_params(files, params, **kw):
        loaded = load_params(files, params, **kw)
        resumed.update({name: (p.data.copy(), p.version) for name, p in params.items()})
        return loaded
    monkeypatch.setattr(ckpt_load, "load_params", recording_load_params)     # load_owned's
    job.train_steps = 25
    history = session.train(session.prepare(job), resume=True, progress=False)
    snapshot = str(tmp_path / "ws" / "checkpoint" / "step20-worker0.bin")
    assert loads == [snapshot]
    assert history["train"][0][0] == 20
    assert all(s.readers == {} for s in ckpt.list_snapshots(str(tmp_path / "ws" / "checkpoint")))
    r = ckpt.CheckpointReader(snapshot)                      # the values the workers resumed from
    assert sorted(resumed) == sorted(r.names)
    for name in r.names:
        np.testing.assert_array_equal(resumed[name][0], r.param(name))
        assert resumed[name][1] == r.version(name)


def test_resolve_latest_best_prefix_and_missing(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    snapshot(str(folder), 100, nworkers=2, metrics={"accuracy": 0.9})
    snapshot(str(folder), 200, nworkers=2, metrics={"accuracy": 0.5})
    ws = str(tmp_path)
    assert paths(["latest"], ws) == [
        ckpt.snapshot_file(str(folder), 200, 0), ckpt.snapshot_file(str(folder), 200, 1)]
    assert paths(["best"], ws)[0].endswith("step100-worker0.bin")
    assert paths([str(folder / "step100-worker0")], ws) == [str(folder / "step100-worker0.bin")]
    rel = os.path.relpath(f"{FIX}/run-1worker/step100-worker0", singa.HOME)
    assert paths([rel], ws) == [f"{FIX}/run-1worker/step100-worker0"]
    with pytest.raises(CheckpointError, match="not found: .*nope/step1-worker0"):
        paths([str(tmp_path / "nope/step1-worker0")], ws)
    os.unlink(ckpt.snapshot_file(str(folder), 100, 1))
    os.unlink(ckpt.snapshot_file(str(folder), 200, 1))
    with pytest.raises(CheckpointError, match="latest.*no complete snapshot in .*checkpoint"):
        paths(["latest"], ws)




def net_params(shapes):
    return {n: types.SimpleNamespace(data=np.zeros(s, np.float32), version=-1, partition=None)
            for n, s in shapes}


def test_load_params_from_singa_files_later_wins():
    ps = net_params(zip(FIX_NAMES + ["0#extra"], FIX_SHAPES + [(3,)]))
    keep = ps["0#weight1"].data
    log = []
    files = [f"{FIX}/run-1worker/step100-worker0", f"{FIX}/run-1worker/step200-worker0"]
    loaded = ckpt.load_params(files, ps, log.append)
    assert loaded == dict.fromkeys(FIX_NAMES, (files[1],))
    assert ps["0#weight1"].data is keep and ps["0#weight1"].version == 199
    np.testing.assert_array_equal(keep, ckpt.CheckpointReader(files[1]).param("0#weight1"))
    assert log[:2] == [f"Load from checkpoint file {f}" for f in files]
    assert "Param 0#extra: not in the checkpoint files" in log
    assert ps["0#extra"].version == -1


def test_load_params_matches_01_plain_names(tmp_path):
    path = ckpt.write_file(str(tmp_path / "step5-worker0.bin"),
                           [("w1", np.ones((4, 3)), 9), ("b1", np.ones(4), 9), ("0#b1", np.full(4, 2), 8)])
    ps = net_params([("0#w1", (4, 3)), ("0#b1", (4,))])
    assert ckpt.load_params([path], ps) == {"0#w1": (path,), "0#b1": (path,)}
    assert ps["0#w1"].version == 9 and ps["0#b1"].data.tolist() == [2, 2, 2, 2]


def test_load_params_shape_mismatch_names_param_shapes_and_file():
    ps = net_params([("0#weight1", (32, 784))])
    with pytest.raises(CheckpointError) as e:
        ckpt.load_params([f"{FIX}/run-1worker/step100-worker0"], ps)
    msg = str(e.value)
    assert "\n" not in msg
    for part in ("0#weight1", "(64, 784)", "(32, 784)", "run-1worker/step100-worker0"):
        assert part in msg


def test_a_continued_and_a_resumed_fit_read_their_snapshot_once(tmp_path, monkeypatch):
    """A second fit (from the params the first left) and fit(resume=True) of a new model each
    find and verify the newest snapshot once, check its params against a net set up on SHAPES
    (nothing allocated), and the workers load from those parsed files, reading none again."""
    from singa.api import resume
    from singa.device.footprint import SHAPES
    from singa.model import SGD, Cluster, Dense, Sequential
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 6)).astype(np.float32), rng.integers(0, 3, 64)

    def model():
        m = Sequential('mlp')
        m.add(Dense(8, activation='tanh'))
        m.add(Dense(3, activation='softmax'))
        m.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.1),
                  cluster=Cluster(str(tmp_path / "ws")))
        return m
    m = model()
    m.fit(x, y, nb_epoch=10, progress=False)
    loads, devices = [], []
    load = ckpt_format._load
    monkeypatch.setattr(ckpt_format, "_load", lambda path: loads.append(path) or load(path))
    net = resume.NeuralNet
    monkeypatch.setattr(resume, "NeuralNet",
                        lambda *a, **kw: devices.append(kw.get("device")) or net(*a, **kw))
    folder = tmp_path / "ws" / "checkpoint"
    assert m.fit(x, y, nb_epoch=5, progress=False).snapshots[-1][0] == 15
    assert loads == [str(folder / "step10-worker0.bin")]
    assert model().fit(x, y, nb_epoch=20, resume=True, progress=False).snapshots[-1][0] == 20
    assert loads == [str(folder / "step10-worker0.bin"), str(folder / "step15-worker0.bin")]
    assert devices == [SHAPES, SHAPES]
