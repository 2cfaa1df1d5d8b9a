"""checkpoint.snapshots: complete snapshots, latest and best (one ranking rule), retention,
temporaries, hostile names and counts."""
import logging
import os
import shutil

import pytest

from checkpoint_helpers import FIX, FIX_NAMES, cli, params, paths, snapshot, state
from singa import checkpoint as ckpt
from singa.errors import CheckpointError
from singa.proto import job_pb2
from singa.train import runtime


def test_singa_two_worker_snapshot_with_empty_file_is_complete():
    (snap,) = ckpt.list_snapshots(f"{FIX}/run-2workers")
    assert (snap.step, snap.complete, snap.nworkers_expected, snap.verified) == (200, True, 2, False)
    assert sorted(snap.files) == [0, 1]
    assert ckpt.CheckpointReader(snap.files[1]).names == []


def test_latest_of_singa_run_is_newest_step():
    assert ckpt.latest_snapshot(f"{FIX}/run-1worker").step == 200


def test_singa_file_beside_ours_of_same_step(tmp_path):
    shutil.copy(f"{FIX}/run-1worker/step100-worker0", tmp_path)
    ckpt.write_file(ckpt.snapshot_file(str(tmp_path), 100, 0), params(), state(100))
    assert ckpt.CheckpointReader(str(tmp_path / "step100-worker0")).names == FIX_NAMES
    (snap,) = ckpt.list_snapshots(str(tmp_path))
    assert snap.complete and snap.files == {0: str(tmp_path / "step100-worker0.bin")}


def test_parse_step_worker_is_strict():
    assert ckpt.parse_step_worker("/a/step100-worker0") == (100, 0)
    assert ckpt.parse_step_worker("step7-worker3.bin") == (7, 3)
    for name in (".step5-worker0.bin.tmp-123", "step5-worker0.meta", "step5-worker0~",
                 "step5-worker0.bin.swp", "backup-step5-worker0", "step5-worker0.bin.orig"):
        assert ckpt.parse_step_worker(name) is None, name


def test_latest_falls_back_past_missing_worker_and_torn_file(tmp_path):
    folder = str(tmp_path)
    snapshot(folder, 100, nworkers=2)
    snapshot(folder, 200, nworkers=2, workers=[0])             # worker 1's file never written
    snapshot(folder, 300, nworkers=2)
    torn = ckpt.snapshot_file(folder, 300, 1)
    data = open(torn, "rb").read()
    open(torn, "wb").write(data[:len(data) // 2])
    open(tmp_path / ".step400-worker0.bin.tmp-123", "wb").write(b"\x18")   # killed mid-write
    snaps = ckpt.list_snapshots(folder)
    assert [(s.step, s.complete) for s in snaps] == [(100, True), (200, False), (300, False)]
    log = []
    latest = ckpt.latest_snapshot(folder, log=log.append)
    assert latest.step == 100 and latest.verified and sorted(latest.files) == [0, 1]
    assert any("step300-worker1.bin: truncated" in m for m in log)
    assert any("step200-worker1.bin: missing" in m for m in log)


def test_empty_worker0_file_is_torn(tmp_path):
    open(tmp_path / "step100-worker0", "wb").close()
    (snap,) = ckpt.list_snapshots(str(tmp_path))
    assert not snap.complete and "empty" in snap.problems[0]


def test_file_recording_another_step_makes_snapshot_incomplete(tmp_path):
    snapshot(str(tmp_path), 100)
    shutil.copy(ckpt.snapshot_file(str(tmp_path), 100, 0), ckpt.snapshot_file(str(tmp_path), 200, 0))
    snaps = ckpt.list_snapshots(str(tmp_path))
    assert [(s.step, s.complete) for s in snaps] == [(100, True), (200, False)]
    assert "records step 100" in snaps[1].problems[0]


def test_best_snapshot_by_accuracy_and_loss(tmp_path):
    folder = str(tmp_path)
    for step, acc, loss in [(100, 0.6, 0.9), (200, 0.8, 0.7), (300, 0.7, 0.6)]:
        snapshot(folder, step, metrics={"accuracy": acc, "Loss": loss})
    assert ckpt.best_snapshot(folder, "accuracy").step == 200
    assert ckpt.best_snapshot(folder, "loss").step == 300
    assert ckpt.best_snapshot(folder).step == 200
    assert ckpt.best_snapshot(f"{FIX}/run-1worker") is None


def test_prune_keeps_newest_best_and_foreign_over_the_whole_folder(tmp_path):
    folder = str(tmp_path)
    for step, acc in [(100, 0.5), (200, 0.9), (300, 0.6), (400, 0.7), (500, 0.8), (600, 0.1)]:
        snapshot(folder, step, metrics={"accuracy": acc})
    snapshot(folder, 700, nworkers=2, workers=[0])             # newest, still being written
    shutil.copy(f"{FIX}/run-1worker/step100-worker0", folder + "/step50-worker0")   # not ours
    deleted = ckpt.prune(folder, keep_newest=2, keep_best="accuracy")
    assert sorted(os.path.basename(p) for p in deleted) == [
        "step100-worker0.bin", "step100-worker0.meta", "step300-worker0.bin",
        "step300-worker0.meta", "step400-worker0.bin", "step400-worker0.meta"]
    assert [s.step for s in ckpt.list_snapshots(folder)] == [50, 200, 500, 600, 700]
    assert ckpt.prune(folder, keep_newest=0) == []


@pytest.mark.parametrize("metric, lower", [
    ("loss", True), ("Loss", True), ("ppl", True), ("se", True), ("squared error", True),
    ("top1 error", True), ("accuracy", False), ("precision", False), ("recall", False)])
def test_lower_is_better_for_loss_perplexity_squared_error_and_any_error(metric, lower):
    assert ckpt.lower_is_better(metric) is lower


def test_best_ranks_by_the_monitor_phase_and_direction(tmp_path):
    """ppl goes down; a validation monitor reads the validation metrics; files of before the
    phases were recorded hold their test metrics under bare names."""
    folder = str(tmp_path)
    snapshot(folder, 100, metrics={"test/ppl": 90.0, "validation/accuracy": 0.7, "test@step": 100})
    snapshot(folder, 200, metrics={"test/ppl": 60.0, "validation/accuracy": 0.6, "test@step": 200})
    snapshot(folder, 300, metrics={"test/ppl": 75.0, "validation/accuracy": 0.8, "test@step": 300})
    snapshot(folder, 400, metrics={"accuracy": 0.9, "ppl": 80.0})          # an older file
    assert ckpt.best_snapshot(folder, "ppl").step == 200
    assert ckpt.best_snapshot(folder, "test/ppl").step == 200
    assert ckpt.best_snapshot(folder, "validation/accuracy").step == 300
    assert ckpt.best_snapshot(folder, "accuracy").step == 400
    assert ckpt.best_snapshot(folder, "validation/loss") is None
    assert [s.step for s in ckpt.ranked(ckpt.list_snapshots(folder), "ppl")] == [200, 300, 400, 100]


def test_open_best_and_prune_agree_on_the_monitor(tmp_path):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    for step, ppl in [(100, 90.0), (200, 60.0), (300, 75.0), (400, 80.0), (500, 85.0)]:
        snapshot(str(folder), step, metrics={"test/ppl": ppl})
    (best,) = ckpt.open_checkpoint_path(["best"], str(tmp_path), monitor="ppl")
    assert best.step == 200
    deleted = ckpt.prune(str(folder), keep_newest=1, keep_best="ppl", keep_best_k=2)
    assert [s.step for s in ckpt.list_snapshots(str(folder))] == [200, 300, 500]
    assert len(deleted) == 4
    with pytest.raises(CheckpointError, match="no complete snapshot recording "
                                                  "validation/accuracy"):
        ckpt.open_checkpoint_path(["best"], str(tmp_path), monitor="validation/accuracy")


def test_prune_never_deletes_newest_complete(tmp_path):
    snapshot(str(tmp_path), 100)
    snapshot(str(tmp_path), 200)
    assert ckpt.prune(str(tmp_path), keep_newest=1) == [
        ckpt.snapshot_file(str(tmp_path), 100, 0), str(tmp_path / "step100-worker0.meta")]
    assert ckpt.prune(str(tmp_path), keep_newest=1) == []


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    alive = f".step6-worker0.bin.tmp-{os.getpid()}"
    dead = [".step5-worker0.bin.tmp-999999999", ".step5-worker0.meta.tmp-999999999"]
    kept = [alive, "step5-worker0.bin", "notes.tmp-1"]
    for n in dead + kept:
        (tmp_path / n).write_bytes(b"x")
    assert sorted(ckpt.remove_stale_temporaries(str(tmp_path))) == sorted(dead)
    assert sorted(os.listdir(tmp_path)) == sorted(kept)
    assert ckpt.remove_stale_temporaries(str(tmp_path / "missing")) == []


def test_a_huge_worker_id_costs_one_problem_line_not_one_per_missing_file(tmp_path):
    shutil.copy(f"{FIX}/run-1worker/step100-worker0", tmp_path)
    open(tmp_path / "step100-worker1000000", "wb").close()
    (snap,) = ckpt.list_snapshots(str(tmp_path))
    assert not snap.complete and snap.problems == [
        f"{tmp_path}/step100-worker1.bin: missing (the snapshot has 1000001 worker files; "
        f"999998 more are missing)"]


def test_a_recorded_worker_count_costs_one_problem_line(tmp_path):
    snapshot(str(tmp_path), 100, nworkers=10**6, workers=[0])
    for nworkers in (None, 1):
        (snap,) = ckpt.list_snapshots(str(tmp_path), nworkers)
        assert snap.problems == [f"{tmp_path}/step100-worker1.bin: missing (the snapshot has "
                                 f"1000000 worker files; 999998 more are missing)"]


def test_worker_ids_beyond_the_jobs_cluster_are_ignored_with_a_warning(tmp_path):
    snapshot(str(tmp_path), 100)
    open(tmp_path / "step100-worker2000000000", "wb").close()
    open(tmp_path / "step500-worker2000000000", "wb").close()
    log = []
    snap = ckpt.latest_snapshot(str(tmp_path), nworkers=1, log=log.append)
    assert snap.step == 100 and snap.complete and list(snap.files) == [0]
    assert log == [f"Ignoring checkpoint file {tmp_path}/step{s}-worker2000000000: worker "
                   f"2000000000 is beyond the job's 1 workers" for s in (100, 500)]
    ws = tmp_path / "ws"
    shutil.copytree(tmp_path, ws / "checkpoint", ignore=shutil.ignore_patterns("ws"))
    assert paths(["latest"], str(ws), nworkers=1) == [
        ckpt.snapshot_file(str(ws / "checkpoint"), 100, 0)]


def test_resume_ignores_files_beyond_the_jobs_workers(tmp_path, caplog):
    snapshot(str(tmp_path), 100)
    open(tmp_path / "step500-worker1000000", "wb").close()
    job = job_pb2.JobProto()
    job.cluster.nworkers_per_group = 1
    assert runtime.resume_from(job, str(tmp_path)).files == {
        0: ckpt.snapshot_file(str(tmp_path), 100, 0)}
    assert job.step == 100
    assert [r.message for r in caplog.records if r.levelno == logging.WARNING] == [
        f"Ignoring checkpoint file {tmp_path}/step500-worker1000000: worker 1000000 is beyond "
        f"the job's 1 workers"]


def test_a_step_beyond_the_last_a_job_can_reach_is_one_problem_line(tmp_path):
    for step in (100, 99999999999, int("9" * 30)):
        shutil.copy(f"{FIX}/run-1worker/step100-worker0", tmp_path / f"step{step}-worker0")
    job = job_pb2.JobProto()
    assert runtime.resume_from(job, str(tmp_path)).files == {0: str(tmp_path / "step100-worker0")}
    assert job.step == 100
    out = cli("ls", str(tmp_path))
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert "step99999999999  worker ids [0]  INCOMPLETE\n    step99999999999: a step beyond 2147483647, " \
           "the last a job can reach\n" in out.stdout
    assert "latest: step100\n" in out.stdout


def test_a_resume_continues_the_newest_run_not_an_earlier_runs_later_step(tmp_path):
    """A fresh run over snapshots of steps 100..500 writes 100..300: a resume continues it at
    300, not at the earlier run's 500; until the new run writes one, the earlier run is the
    newest and stays resumable."""
    folder = str(tmp_path)
    for step in (100, 200, 300, 400, 500):
        ckpt.write_file(ckpt.snapshot_file(folder, step, 0), params(), state(step))
    ckpt.start_run(folder)
    assert ckpt.latest_snapshot(folder, this_run=True).step == 500
    for step in (100, 200, 300):
        ckpt.write_file(ckpt.snapshot_file(folder, step, 0), params(), state(step))
    assert ckpt.latest_snapshot(folder, this_run=True).step == 300
    assert ckpt.latest_snapshot(folder).step == 500
    ckpt.start_run(folder)      # a third run: every file is earlier again
    assert ckpt.latest_snapshot(folder, this_run=True).step == 500
    ckpt.write_file(ckpt.snapshot_file(folder, 100, 0), params(), state(100))
    assert ckpt.latest_snapshot(folder, this_run=True).step == 100
