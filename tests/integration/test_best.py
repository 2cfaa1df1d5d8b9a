"""Best checkpoints: snapshots record the latest test and validation metrics with their steps;
checkpoint_on_improvement writes one whenever the monitored metric betters; retention spares
the top K by the same rule that `checkpoint_path: "best"` loads by. Jobs run in this process
(singa.api.session), SINGA's fixture MLP on its fixture data."""
import os
import re
import subprocess

import pytest

import singa
from conftest import PYTHON, fixture_proto
from singa import checkpoint
from singa.api import session
from singa.errors import ConfigError
from singa.layers.base import register
from singa.layers.neuron import SigmoidLayer
from singa.proto import job_pb2
from singa.watch import metrics


@register("kUndeclaredSigmoid")
class UndeclaredSigmoid(SigmoidLayer):
    """A user layer that does not declare its METRICS: the conf check cannot know them."""
    METRICS = None


def test_a_snapshot_records_the_latest_test_so_best_exists_without_checkpoint_freq(tmp_path):
    """SINGA's MNIST conf tests every 60 steps and has no checkpoint_freq: the one snapshot,
    of the last step, records the last test's metrics and step, and "best" loads it."""
    job = fixture_proto(tmp_path / "ws", train_steps=50, test_freq=20, checkpoint_freq=0, seed=2)
    session.train(session.prepare(job), progress=False)
    (snap,) = checkpoint.list_snapshots(str(tmp_path / "ws" / "checkpoint"))
    rows = [r for r in metrics.read_rows(str(tmp_path / "ws" / "metrics.csv"))
            if r["phase"] == "test" and r["step"] == 40]
    assert snap.step == 50 and snap.metrics["test@step"] == 40
    recorded = {k: v for k, v in snap.metrics.items() if k.startswith("test/")}
    assert recorded == {f"test/{r['metric']}": pytest.approx(r["value"], rel=1e-6) for r in rows}
    (best,) = checkpoint.open_checkpoint_path(["best"], str(tmp_path / "ws"))
    assert best.step == 50
    job.checkpoint_path.append("best")
    job.train_steps = 0
    assert set(session.test(session.prepare(job))) == {"loss", "accuracy"}


def test_on_improvement_snapshots_and_top_k_retention_by_validation_accuracy(tmp_path):
    job = fixture_proto(tmp_path / "ws", train_steps=120, test_steps=0, checkpoint_freq=0,
                      validate_steps=5, validate_freq=10, seed=5, checkpoint_keep_newest=1,
                      checkpoint_keep_best="validation/accuracy", checkpoint_keep_best_k=2,
                      checkpoint_on_improvement=True)
    job.neuralnet.layer[1].include[:] = [job_pb2.kVal]
    job.updater.learning_rate.base_lr = 0.5     # a noisy curve: it falls back at times
    history = session.train(session.prepare(job), progress=False)
    curve = history["validation"]
    best, improved = -1.0, []
    for step, values in curve:
        if values["accuracy"] > best:
            best, improved = values["accuracy"], improved + [step]
    assert len(improved) < len(curve)              # the curve did fall back at times
    log = (tmp_path / "ws" / f"{job.name}.log").read_text()
    written = [int(s) for s in re.findall(r"checkpoint to .*/step(\d+)-worker0\.bin", log)]
    assert written == improved + [120]
    top2 = sorted(improved, key=lambda s: (-dict(curve)[s]["accuracy"], -s))[:2]
    left = [s.step for s in checkpoint.list_snapshots(str(tmp_path / "ws" / "checkpoint"))]
    assert left == sorted(set(top2) | {120})
    assert [s for s, _ in history.snapshots] == left    # what retention kept
    best_files = checkpoint.open_checkpoint_path(["best"], str(tmp_path / "ws"),
                                                 monitor="validation/accuracy")
    assert best_files[0].step == top2[0]
    assert best_files[0].metrics["validation/accuracy"] == \
        pytest.approx(dict(curve)[top2[0]]["accuracy"], rel=1e-6)


def test_check_refuses_a_monitor_the_rnnlm_layers_do_not_produce(tmp_path):
    """rnnlm's user layers declare their METRICS (the loss layer's loss and ppl, the others
    none), so -check knows what its validation net produces: a typo is one line, exit 2."""
    (tmp_path / "hostfile").write_text("localhost\n")
    (tmp_path / "singa.conf").write_text('zookeeper_host: "127.0.0.1:1"\n')   # never asked
    with open(os.path.join(singa.HOME, "examples", "rnnlm", "job.conf")) as f:
        text = f.read()
    for monitor, rc in (("validation/pp", 2), ("validation/ppl", 0)):
        conf = tmp_path / "rnnlm.conf"
        conf.write_text(text.replace("validate_steps:683\n", "validate_steps:683\n"
                                     f'checkpoint_keep_best: "{monitor}"\n', 1))
        r = subprocess.run([PYTHON, "-m", "singa.driver", "-conf", str(conf), "-check",
                            "-user_proto", "rnnlm.proto", "-user_layers", "rnnlm.py",
                            "-singa_conf", str(tmp_path / "singa.conf")],
                           cwd=os.path.join(singa.HOME, "examples", "rnnlm"),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == rc, r.stderr
        if rc:
            line = text.splitlines().index("validate_steps:683") + 2
            assert r.stderr == (f'singa: {conf}:{line}: checkpoint_keep_best "{monitor}": the '
                                f"validation net's layers produce loss, ppl\n")


def test_a_monitor_no_layer_produced_stops_the_job_at_its_first_test(tmp_path):
    """A user layer without METRICS leaves the conf check blind; the first test tells: one
    line naming the field and what the layers produced, before any snapshot."""
    job = fixture_proto(tmp_path / "ws", train_steps=40, test_freq=20, seed=2,
                        checkpoint_keep_best="test/acc")
    sig = job.neuralnet.layer[3]
    sig.ClearField("type")
    sig.user_type = "kUndeclaredSigmoid"
    job = session.prepare(job)          # the conf check cannot tell
    with pytest.raises(ConfigError) as e:
        session.train(job, progress=False)
    assert str(e.value) == ('checkpoint_keep_best "test/acc": the test net\'s layers produce '
                            'accuracy, loss')
    assert not checkpoint.list_snapshots(str(tmp_path / "ws" / "checkpoint"))
    assert [r["phase"] for r in metrics.read_rows(str(tmp_path / "ws" / "metrics.csv"))] == []


def test_best_for_test_follows_the_jobs_own_monitor_lower_loss_is_better(tmp_path):
    """-test with `checkpoint_path: "best"` loads the snapshot of the lowest recorded test
    loss when the job monitors "loss", whatever accuracy says."""
    job = fixture_proto(tmp_path / "ws", train_steps=100, test_freq=10, checkpoint_freq=10,
                        seed=5, checkpoint_keep_best="loss")
    job.updater.learning_rate.base_lr = 0.5     # a noisy curve
    history = session.train(session.prepare(job), progress=False)
    losses = {s: v["loss"] for s, v in history["test"] if s % 10 == 0}
    want = min(losses, key=lambda s: (losses[s], -s))
    job.checkpoint_path.append("best")
    job.train_steps = 0
    session.test(session.prepare(job))
    text = (tmp_path / "ws" / f"{job.name}.log").read_text()
    assert re.findall(r"\] Test @ step (\d+)", text)[-1] == str(want), (losses, text[-2000:])
    assert [r["value"] for r in metrics.read_rows(str(tmp_path / "ws" / "metrics.csv"))
            if r["step"] == want and r["metric"] == "loss"][-1] == pytest.approx(losses[want],
                                                                                 rel=1e-5)


def test_on_improvement_after_a_resume_snapshots_as_the_unbroken_run(tmp_path):
    """The best so far travels in the snapshot. With a learning rate of 0 every test (the
    whole test set) gives the same loss, so after step 0 nothing improves: a run resumed at
    step 45 writes no snapshot at its first test, step 50, either (the worker seeded its best
    from the resumed snapshot after dropping it, so that test always counted as better)."""
    def run(ws, steps, resume=False):
        job = fixture_proto(ws, train_steps=steps, test_freq=10, checkpoint_freq=0, seed=5,
                            checkpoint_keep_best="test/loss", checkpoint_on_improvement=True)
        job.updater.learning_rate.base_lr = 0
        session.train(session.prepare(job), resume=resume, progress=False)
        return [s.step for s in checkpoint.list_snapshots(str(ws / "checkpoint"))]
    assert run(tmp_path / "a", 80) == [0, 80]
    assert run(tmp_path / "b", 45) == [0, 45]
    assert run(tmp_path / "b", 80, resume=True) == [0, 45, 80]
