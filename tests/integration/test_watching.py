"""Watching training through the driver: metrics.csv holds exactly what the log displays and a
-resume continues it; each train display is followed by steps/s and the time left; a summary
ends the run."""
import re
import sys

import pytest

from conftest import fixture_proto
from singa.api import session
from singa.proto import job_pb2
from singa.watch import metrics, tensorboard

LINE = re.compile(r"\] (Train|Test|Validation) @ step (\d+)(?:  |\n.*\]    )(.*?)\n")


def logged(stderr):
    """[(phase, step, {metric: value})] of the display lines, as the log prints them."""
    out = []
    for phase, step, text in LINE.findall(stderr):
        values = {k.lower(): float(v) for k, v in re.findall(r"(\w[\w ]*?) = ([\d.]+)", text)}
        out.append((phase.lower(), int(step), values))
    return out


def rows_by_event(path, job_id=None):
    events = {}
    for row in metrics.read_rows(path, job_id):
        events.setdefault((row["job"], row["phase"], row["step"]), {})[row["metric"]] = row["value"]
    return events


def test_metrics_csv_is_the_log_and_resume_continues_it(fixture_job, run_driver, tmp_path):
    ws = tmp_path / "ws"
    conf = fixture_job("job.conf", workspace=ws, edits={"test_freq: 100": "test_freq: 50"})
    r = run_driver(conf)
    assert r.returncode == 0, r.stderr
    shown = logged(r.stderr)
    assert [(p, s) for p, s, _ in shown if p == "test"] == [("test", s) for s in (0, 50, 100, 150)]
    events = rows_by_event(str(ws / "metrics.csv"))
    (job_id,) = {job for job, _, _ in events}
    assert sorted((p, s) for _, p, s in events) == sorted((p, s) for p, s, _ in shown)
    for phase, step, values in shown:       # the log's 6 decimals of the file's numbers
        row = events[job_id, phase, step]
        assert {k: round(v, 6) for k, v in row.items()} == values

    # steps/s and the time left on each train display; a summary at the end
    trains = re.findall(r"Train @ step (\d+)  .*\n.*\] Progress @ step \1: ([\d.e+]+) steps/s, "
                        r"(\w+) left$", r.stderr, re.M)
    assert [int(s) for s, _, _ in trains] == list(range(0, 200, 20))
    assert all(float(rate) > 0 for _, rate, _ in trains) and trains[-1][2].endswith("s")
    assert re.search(r"\] Trained steps 0-200 in \w+ \([\d.e+]+ steps/s\)\n", r.stderr)
    last = events[job_id, "test", 150]
    best = {m: max(v[m] for (_, p, _), v in events.items() if p == "test") for m in ["accuracy"]}
    assert re.search(rf"\] Last test @ step 150:  loss = {last['loss']:f}, accuracy = "
                     rf"{last['accuracy']:f};  best: .*accuracy = {best['accuracy']:f} @ step",
                     r.stderr), r.stderr
    assert f"] Newest snapshot: {ws}/checkpoint/step200-worker0.bin\n" in r.stderr
    assert f"] Resume: bin/singa-run.sh -conf {conf} -resume" in r.stderr

    more = conf.with_name("more.conf")
    more.write_text(conf.read_text().replace("train_steps: 200", "train_steps: 300"))
    r = run_driver(more, "-resume")
    assert r.returncode == 0, r.stderr
    events = rows_by_event(str(ws / "metrics.csv"))
    jobs = sorted({job for job, _, _ in events})
    assert len(jobs) == 2 and jobs[0] == job_id         # one file, both runs, each its job id
    again = sorted((p, s) for job, p, s in events if job == jobs[1])
    assert again == sorted((p, s) for p, s, _ in logged(r.stderr))
    assert min(s for _, s in again) == 200 and ("test", 250) in again
    assert re.search(r"\] Trained steps 200-300 in ", r.stderr)


def test_a_fresh_run_in_a_used_workspace_says_it_writes_over_the_snapshots(fixture_job,
                                                                         run_driver, tmp_path):
    conf = fixture_job("job.conf", edits={"train_steps: 200": "train_steps: 20"})
    assert run_driver(conf).returncode == 0
    r = run_driver(conf)
    assert r.returncode == 0
    assert (f"] {tmp_path / 'ws' / 'checkpoint'} holds snapshots of an earlier run (steps 0 "
            f"to 20): this run writes over") in r.stderr


def test_tensorboard_events_hold_the_metrics_csv_curves(tmp_path):
    """Read back with TensorBoard's own reader: every metrics.csv row is a scalar of its tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    job = fixture_proto(tmp_path / "ws", train_steps=60, test_freq=20, validate_steps=2,
                        validate_freq=30, seed=4)
    job.neuralnet.layer[1].include.append(job_pb2.kVal)
    session.train(session.prepare(job), progress=False)
    rows = metrics.read_rows(str(tmp_path / "ws" / "metrics.csv"))
    (run,) = (tmp_path / "ws" / "tensorboard").iterdir()        # one run: one folder
    events = EventAccumulator(str(run))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert sorted(tags) == sorted({f"{r['phase']}/{r['metric']}" for r in rows}) == [
        "test/accuracy", "test/loss", "train/accuracy", "train/loss", "validation/accuracy",
        "validation/loss"]
    for tag in tags:
        phase, name = tag.split("/")
        want = [(r["step"], r["value"]) for r in rows if (r["phase"], r["metric"]) == (phase, name)]
        got = [(e.step, e.value) for e in events.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in want]
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)


def test_without_tensorboardx_one_log_line_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    job = fixture_proto(tmp_path / "ws", train_steps=20, seed=4)
    session.train(session.prepare(job), progress=False)
    text = (tmp_path / "ws" / f"{job.name}.log").read_text()
    assert text.count(tensorboard.hint()) == 1 and "pip install" in tensorboard.hint()
    assert not (tmp_path / "ws" / "tensorboard").exists()


def test_two_workers_of_a_group_write_each_test_and_validation_row_once(tmp_path):
    """Model partitioning under checkpoint_on_improvement: worker 1 gets worker 0's averages
    back (it decides on snapshots alike), but only worker 0 reports them."""
    job = fixture_proto(tmp_path / "ws", train_steps=40, test_freq=20, validate_steps=2,
                        validate_freq=20, checkpoint_freq=0, seed=4,
                        checkpoint_keep_best="validation/loss", checkpoint_on_improvement=True)
    job.cluster.nworkers_per_group = job.cluster.nworkers_per_procs = 2
    job.neuralnet.layer[1].include.append(job_pb2.kVal)
    history = session.train(session.prepare(job), progress=False)
    rows = metrics.read_rows(str(tmp_path / "ws" / "metrics.csv"))
    keys = [(r["phase"], r["step"], r["metric"]) for r in rows]
    assert sorted(keys) == sorted(set(keys))
    assert sorted({(p, s) for p, s, _ in keys}) == sorted(
        [("train", s) for s in (0, 20)] + [(p, s) for p in ("test", "validation")
                                           for s in (0, 20)])
    assert [s for s, _ in history["validation"]] == [0, 20]
    assert [s for s, _ in history["test"]] == [0, 20]


def test_each_downpour_group_writes_its_train_rows_the_log_shows_group_0(tmp_path):
    """Two asynchronous worker groups in one process (Downpour: one server group): group 1's
    worker 0 writes its train rows with its group number; tests, the log lines and History
    are group 0's."""
    job = fixture_proto(tmp_path / "ws", train_steps=60, test_freq=30, checkpoint_freq=0,
                        seed=4)
    job.cluster.nworker_groups = job.cluster.nworkers_per_procs = 2
    history = session.train(session.prepare(job), progress=False)
    rows = metrics.read_rows(str(tmp_path / "ws" / "metrics.csv"))
    events = {}
    for r in rows:
        events.setdefault((r["group"], r["phase"]), set()).add(r["step"])
    assert events == {(0, "train"): {0, 20, 40}, (1, "train"): {0, 20, 40},
                      (0, "test"): {0, 30}}
    assert {r["metric"] for r in rows if r["group"] == 1} == {"loss", "accuracy"}
    assert [s for s, _ in history["train"]] == [0, 20, 40]
    text = (tmp_path / "ws" / f"{job.name}.log").read_text()
    assert len(re.findall(r"\] Train @ step \d+  ", text)) == 3


def test_tensorboard_keeps_a_fresh_rerun_apart_and_a_resume_in_its_runs_folder(tmp_path):
    """A folder per run under <workspace>/tensorboard: a -resume continues the folder of the
    run it resumes, a fresh run in the same workspace gets its own."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ws = tmp_path / "ws"
    job = fixture_proto(ws, train_steps=40, test_freq=20, checkpoint_freq=0, seed=4)
    session.train(session.prepare(job), progress=False)
    job.train_steps = 60
    session.train(session.prepare(job), resume=True, progress=False)
    job.train_steps = 20
    session.train(session.prepare(job), progress=False)
    folders = sorted((ws / "tensorboard").iterdir())
    assert len(folders) == 2
    steps = []
    for folder in folders:
        events = EventAccumulator(str(folder))
        events.Reload()
        steps.append(sorted({e.step for e in events.Scalars("train/loss")}))
    assert steps == [[0, 20, 40], [0]]      # display every 20 steps
    assert folders[1].name == metrics.run_name(metrics.newest_run(
        metrics.read_rows(str(ws / "metrics.csv"))))
