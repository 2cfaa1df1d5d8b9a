"""singa.model's fit, evaluate and predict running jobs: resume of a rebuilt model, data of
each phase, the fit signature, conf models, numpy against kvfile, Ctrl-C, no ZooKeeper, and
what reaches stderr."""
import inspect
import os
import re
import signal
import subprocess
import textwrap
import time
import warnings

import numpy as np
import pytest

import singa
from conftest import FIXTURES, PYTHON, scaled_records
from singa import checkpoint
from singa.errors import CheckpointError
from singa.model import SGD, Cluster, Data, Dense, Model, Sequential
from singa.proto import job_pb2

TRAIN = os.path.join(FIXTURES, "train-1000.bin")
TEST = os.path.join(FIXTURES, "test-500.bin")
ENV = dict(os.environ, PYTHONPATH=singa.HOME)     # this checkout's package in subprocesses
GLOG_LINE = re.compile(r"(?m)^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} ")



@pytest.fixture(scope="module")
def train():
    return scaled_records(TRAIN)


@pytest.fixture(scope="module")
def test():
    return scaled_records(TEST)


def mlp(workspace, hidden=(16,), data=None):
    """A small MLP on 784 inputs (from the Data layer `data` when given), its names generated
    (w1, b1, ...), as a notebook cell builds it."""
    m = Sequential('mlp')
    if data is not None:
        m.add(data)
    for dim in hidden:
        m.add(Dense(dim, init='uniform', activation='tanh'))
    m.add(Dense(10, init='uniform', activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.05, momentum=0.9),
              cluster=Cluster(str(workspace)))
    return m


def params(path):
    r = checkpoint.CheckpointReader(str(path))
    return {name: r.param(name) for name in r.names}


def test_a_rebuilt_model_resumes_bit_exactly_as_an_uninterrupted_fit(tmp_path, train):
    """A notebook cell re-run: the model built again in this process continues its own
    snapshot (same generated names), and ends where 40 uninterrupted steps end."""
    x, y = train
    kw = dict(batch_size=50, checkpoint_freq=20, seed=3, progress=False)
    mlp(tmp_path / "ws").fit(x, y, nb_epoch=20, **kw)
    Dense(7)        # other layers built in between (another model, a cell run once)
    again = mlp(tmp_path / "ws")
    h = again.fit(x, y, nb_epoch=40, resume=True, **kw)
    assert h["train"][0][0] == 20                            # continued, from step 20
    whole = mlp(tmp_path / "whole")
    whole.fit(x, y, nb_epoch=40, **kw)
    ours, ref = params(again.last_checkpoint_path), params(whole.last_checkpoint_path)
    assert again.last_checkpoint_path.endswith("step40-worker0.bin")
    assert sorted(ours) == sorted(ref) == ['0#b1', '0#b2', '0#w1', '0#w2']
    for name in ref:
        np.testing.assert_array_equal(ours[name], ref[name])


def test_a_resume_from_another_nets_snapshot_is_one_line_and_keeps_the_snapshot(tmp_path,
                                                                                 train):
    x, y = train
    mlp(tmp_path / "ws").fit(x, y, nb_epoch=20, batch_size=50, seed=3, progress=False)
    snap = tmp_path / "ws" / "checkpoint" / "step20-worker0.bin"
    before = snap.read_bytes()
    other = mlp(tmp_path / "ws", hidden=(16, 8))          # w3, b3 are in no snapshot
    with pytest.raises(CheckpointError, match=r"lacks 2 of the 6 params of 'mlp' \(0#w3, "
                                              r"0#b3\): it is another net's") as e:
        other.fit(x, y, nb_epoch=40, batch_size=50, seed=3, progress=False, resume=True)
    assert "\n" not in str(e.value)
    assert snap.read_bytes() == before
    assert sorted(os.listdir(snap.parent)) == ["step20-worker0.bin", "step20-worker0.meta"]


def test_a_data_layer_of_the_train_phase_serves_as_test_and_validation_data(tmp_path, train,
                                                                            test):
    """Data(x=...) keeps its default phase 'train' when given as test_data, validate_data or
    to evaluate: each is used in the phase it is given for, the caller's layer untouched."""
    x, y = train
    m = mlp(tmp_path / "ws")
    held_out = Data(x=test[0], y=test[1], batch_size=100)
    h = m.fit(Data(x=x, y=y, batch_size=50), nb_epoch=20, with_test=True, test_data=held_out,
              validate_data=held_out, test_freq=10, test_steps=2, validate_freq=10,
              validate_steps=3, seed=1, progress=False)
    assert [s for s, _ in h["test"]] == [0, 10, 20]
    assert [s for s, _ in h["validation"]] == [0, 10, 20]
    assert set(h.last("validation")) == {"loss", "accuracy"}
    assert list(held_out.layer.include) == [job_pb2.kTrain]
    result = m.evaluate(held_out, test_steps=5)
    assert set(result) == {"loss", "accuracy"} and 0 <= result["accuracy"] <= 1


def test_validate_data_fills_the_history_validation(tmp_path, train, test):
    x, y = train
    h = mlp(tmp_path / "ws").fit(x, y, nb_epoch=30, batch_size=50, validate_data=test,
                                 validate_freq=10, seed=2, progress=False)
    assert [s for s, _ in h["validation"]] == [0, 10, 20, 30]
    assert h["test"] == []
    losses = [v["loss"] for _, v in h["validation"]]
    assert all(isinstance(v, float) for v in losses) and losses[-1] < losses[0]


def test_fit_takes_the_issues_signature_and_positional_nb_epoch(tmp_path, train):
    sig = inspect.signature(Model.fit)
    names = list(sig.parameters)[1:11]
    assert names == ["data_or_x", "y", "nb_epoch", "batch_size", "with_test", "test_steps",
                     "test_freq", "disp_freq", "checkpoint_freq", "resume"]
    assert all(sig.parameters[n].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for n in names)
    for name in ("alg", "test_data", "validate_data", "verbose", "progress"):
        assert sig.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
    x, y = train
    m = mlp(tmp_path / "ws")
    h = m.fit(x, y, 30, 50, disp_freq=5, checkpoint_freq=15, seed=1, progress=False)
    assert [s for s, _ in h["train"]] == [0, 5, 10, 15, 20, 25]
    assert [s for s, _ in h.snapshots] == [0, 15, 30]
    # SINGA's keywords: data=, alg=
    h = mlp(tmp_path / "ws2").fit(data=Data(x=x, y=y), alg='bp', nb_epoch=10, seed=1,
                                  progress=False)
    assert h.snapshots[-1][0] == 10


def test_with_test_and_no_test_data_is_singas_test_later_and_quiet(tmp_path, train, capfd):
    x, y = train
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        h = mlp(tmp_path / "ws").fit(x, y, nb_epoch=10, with_test=True, seed=1,
                                     progress=False)
    assert h["test"] == []
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_a_model_from_a_conf_fits_evaluates_and_predicts(tmp_path, fixture_job, test):
    conf = fixture_job(edits={"train_steps: 200": "train_steps: 40",
                              "test_freq: 100": "test_freq: 20",
                              "tests/fixtures/singa-0.3/": FIXTURES + "/"})
    m = Model.from_conf(str(conf))
    h = m.fit(progress=False)
    assert [s for s, _ in h["test"]] == [0, 20, 40] and h.snapshots[-1][0] == 40
    assert m.last_checkpoint_path == str(tmp_path / "ws" / "checkpoint" / "step40-worker0.bin")
    result = m.evaluate(test_steps=5)
    assert set(result) == {"loss", "accuracy"} and result["accuracy"] > 0.3
    raw = test[0][:7] * np.float32(255)     # predict applies the test layer's std_value 255
    p = m.predict(raw)
    assert p.shape == (7, 10) and np.allclose(p.sum(axis=1), 1, atol=1e-5)


def test_numpy_samples_through_fit_give_the_kvfile_losses(tmp_path, train):
    """fit(x, y) on the samples of a kvfile (scaled as its std_value 255 scales them) and the
    kvfile through a Data layer: the same losses and params with the same seed."""
    kv = mlp(tmp_path / "kv", data=Data(load='recordinput', path=TRAIN, backend='kvfile',
                                        batchsize=50, shape=784, std_value=255))
    runs = [kv.fit(nb_epoch=60, disp_freq=10, seed=7, progress=False),
            mlp(tmp_path / "np").fit(*train, nb_epoch=60, batch_size=50, disp_freq=10, seed=7,
                                     progress=False)]
    assert [s for s, _ in runs[0]["train"]] == list(range(0, 60, 10))
    assert runs[0]["train"] == runs[1]["train"]
    assert runs[0]["train"][-1][1]["loss"] < runs[0]["train"][0][1]["loss"]
    a, b = (params(h.snapshots[-1][1]) for h in runs)
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


FIT_SCRIPT = textwrap.dedent("""
    import sys
    events = []
    def audit(event, args):
        if event in ("socket.connect", "subprocess.Popen", "os.fork", "os.exec", "os.posix_spawn"):
            events.append((event, repr(args)[:80]))
    sys.addaudithook(audit)
    import numpy as np
    from singa.model import *
    rng = np.random.default_rng(0)
    x = rng.random((200, 20), dtype=np.float32)
    y = (x[:, 0] > 0.5).astype(np.int32)
    m = Sequential('tiny')
    m.add(Dense(8, init='uniform', activation='tanh'))
    m.add(Dense(2, init='uniform', activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.1), cluster=Cluster('ws'))
    h = m.fit(x, y, nb_epoch=30, batch_size=20, with_test=True, test_data=(x, y),
              test_freq=10, progress=False)
    print("EVALUATE", sorted(m.evaluate(x, y, test_steps=2)))
    print("PREDICT", m.predict(x[:3]).shape)
    print("TESTS", [s for s, _ in h['test']])
    print("EVENTS", events)
""")


def test_a_one_process_fit_opens_no_connection_and_starts_no_process(tmp_path):
    """Model.fit, evaluate and predict in a process with an audit hook: no socket connects
    (no ZooKeeper), no process starts (no Java)."""
    run = subprocess.run([PYTHON, "-c", FIT_SCRIPT], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env=ENV)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "EVENTS []" in lines, run.stdout
    assert "EVALUATE ['accuracy', 'loss']" in lines and "PREDICT (3, 2)" in lines
    assert "TESTS [0, 10, 20, 30]" in lines
    assert (tmp_path / "ws" / "checkpoint" / "step30-worker0.bin").is_file()
    assert not GLOG_LINE.search(run.stderr), run.stderr


INTERRUPTED = textwrap.dedent("""
    import signal, sys, time
    import numpy as np
    from singa.model import *
    got = []
    def on_int(signum, frame):
        got.append(time.time())
    def on_term(signum, frame):
        pass
    signal.signal(signal.SIGINT, on_int)
    signal.signal(signal.SIGTERM, on_term)
    rng = np.random.default_rng(0)
    x = rng.random((500, 784), dtype=np.float32)
    y = rng.integers(0, 10, 500).astype(np.int32)
    m = Sequential('long')
    m.add(Dense(256, init='uniform', activation='tanh'))
    m.add(Dense(10, init='uniform', activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.01), cluster=Cluster('ws'))
    h = m.fit(x, y, nb_epoch=10**6, batch_size=50, checkpoint_freq=20, progress=False)
    print("STOPPED", got[0], h.snapshots[-1][0], flush=True)
    print("HANDLERS", signal.getsignal(signal.SIGINT) is on_int,
          signal.getsignal(signal.SIGTERM) is on_term, flush=True)
""")


def test_sigint_during_fit_stops_it_in_seconds_and_restores_both_handlers(tmp_path):
    """The caller's own SIGINT handler gets the signal once fit has stopped after a snapshot
    (fit then returns, saying so in a line); both of the caller's handlers are back; the stop
    takes a second or two (the bound asserted is loose: the machine is shared)."""
    proc = subprocess.Popen([PYTHON, "-c", INTERRUPTED], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=ENV)
    deadline = time.monotonic() + 120
    while not (tmp_path / "ws" / "checkpoint" / "step40-worker0.bin").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    stopped = next(line.split() for line in out.splitlines() if line.startswith("STOPPED"))
    latency = float(stopped[1]) - sent
    print(f"SIGINT to stopped: {latency:.2f} s")
    assert 0 <= latency < 10, out
    assert "HANDLERS True True" in out.splitlines()
    assert "singa: SIGINT: a snapshot in a step or two, then the job stops" in err.splitlines()
    snap = checkpoint.latest_snapshot(str(tmp_path / "ws" / "checkpoint"))
    assert snap.complete and snap.step >= 40 and snap.step == int(stopped[2])
    assert (f"singa: fit stopped by SIGINT at step {snap.step}: the model holds the params of "
            f"step {snap.step}, and fit(...) again continues from them") in err.splitlines()
    assert not GLOG_LINE.search(err), err


CTRL_C = textwrap.dedent("""
    import signal
    import numpy as np
    # a terminal's Ctrl-C (a run in the background inherits SIGINT ignored, which fit keeps)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from singa import checkpoint
    from singa.model import *
    rng = np.random.default_rng(0)
    x = rng.random((500, 784), dtype=np.float32)
    y = rng.integers(0, 10, 500).astype(np.int32)
    m = Sequential('long')
    m.add(Dense(64, init='uniform', activation='tanh'))
    m.add(Dense(10, init='uniform', activation='softmax'))
    m.compile(loss='categorical_crossentropy', optimizer=SGD(lr=0.01), cluster=Cluster('ws'))
    print("READY", flush=True)
    try:
        m.fit(x, y, nb_epoch=10**6, batch_size=50, checkpoint_freq=0, disp_freq=50,
              progress=False)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
    print("KEPT", m.last_checkpoint_path, flush=True)
    print("PREDICT", m.predict(x[:3]).shape, flush=True)
    h = m.fit(x, y, nb_epoch=10, batch_size=50, progress=False, disp_freq=1)
    print("AGAIN", h['train'][0][0], h['train'][-1][0], flush=True)
""")


def test_ctrl_c_in_fit_keeps_the_params_it_trained_and_a_second_fit_continues(tmp_path):
    """Keras keeps the weights a KeyboardInterrupt leaves: fit snapshots the step it stops
    at, raises KeyboardInterrupt, and the model predicts with those params; a plain fit then
    continues from that step (not step 0, over the interrupted run's snapshots)."""
    proc = subprocess.Popen([PYTHON, "-c", CTRL_C], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=ENV)
    log = tmp_path / "ws" / "long.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and "Train @ step 100 " in log.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    lines = out.splitlines()
    assert "INTERRUPTED" in lines, out
    kept = next(line.split()[1] for line in lines if line.startswith("KEPT"))
    step = checkpoint.parse_step_worker(os.path.basename(kept))[0]
    assert step >= 100 and os.path.isfile(kept), out
    assert "PREDICT (3, 10)" in lines
    assert f"AGAIN {step} {step + 9}" in lines, out


def test_warnings_reach_stderr_as_plain_lines_not_glog(tmp_path, train, capfd):
    """A second fit in one workspace warns that it writes over the first's snapshots: one
    `singa: ...` line, no glog-format line; INFO stays in the job log."""
    x, y = train
    for _ in range(2):
        mlp(tmp_path / "ws").fit(x, y, nb_epoch=10, seed=1, progress=False)
    err = capfd.readouterr().err
    assert not GLOG_LINE.search(err), err
    lines = [line for line in err.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith(f"singa: {tmp_path / 'ws' / 'checkpoint'} "
                                                   f"holds snapshots of an earlier run"), err
    assert GLOG_LINE.search((tmp_path / "ws" / "mlp.log").read_text())


def test_a_resume_continues_the_newest_run_of_the_workspace(tmp_path, train):
    """The notebook's second "Run All": a fresh fit to step 20 over an earlier run's snapshots
    up to step 50; fit(resume=True) continues the fresh run at 20, not the earlier one's 50
    (which left "nothing to train")."""
    mlp(tmp_path / "ws").fit(*train, nb_epoch=50, checkpoint_freq=10, progress=False)
    mlp(tmp_path / "ws").fit(*train, nb_epoch=20, checkpoint_freq=10, progress=False)
    h = mlp(tmp_path / "ws").fit(*train, nb_epoch=40, disp_freq=10, resume=True,
                                 progress=False)
    assert [s for s, _ in h["train"]] == [20, 30]
