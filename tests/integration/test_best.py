"""Best checkpoints: snapshots record the latest test and validation metrics with their steps;
checkpoint_on_improvement writes one whenever the monitored metric betters; retention spares
the top K by the same rule that `checkpoint_path: "best"` loads by. Jobs run in this process
(singa.session), SINGA's fixture MLP on its fixture data."""
import pytest

from conftest import fixture_proto
from singa import checkpoint, metrics, session
from singa.proto import job_pb2


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
    assert [s for s, _ in history.snapshots] == improved + [120]
    top2 = sorted(improved, key=lambda s: (-dict(curve)[s]["accuracy"], -s))[:2]
    left = [s.step for s in checkpoint.list_snapshots(str(tmp_path / "ws" / "checkpoint"))]
    assert left == sorted(set(top2) | {120})
    best_files = checkpoint.open_checkpoint_path(["best"], str(tmp_path / "ws"),
                                                 monitor="validation/accuracy")
    assert best_files[0].step == top2[0]
    assert best_files[0].metrics["validation/accuracy"] == \
        pytest.approx(dict(curve)[top2[0]]["accuracy"], rel=1e-6)
