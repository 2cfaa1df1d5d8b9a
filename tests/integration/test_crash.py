"""Crash safety: SIGKILL at random moments (inside checkpoint writes too) never leaves a snapshot
that resume picks up broken; damaged snapshots are skipped and the log says which file and why."""
import os
import random
import re
import resource
import subprocess
import time

import numpy as np

from conftest import PYTHON
from singa import checkpoint

KILLS = 20


def small_net(job):
    """The fixture MLP with 8 hidden units: snapshots of 25 KB, so checkpoint_freq 1 is cheap."""
    for layer in job.neuralnet.layer:
        if layer.name == "ip1":
            layer.innerproduct_conf.num_output = 8


def temporary_files(folder):
    return {n for n in (os.listdir(folder) if os.path.isdir(folder) else ()) if ".tmp-" in n}


def meta_steps(folder):
    """The steps of worker 0's finished .meta files in the folder (the last file a write renames)."""
    return {int(m.group(1)) for n in (os.listdir(folder) if os.path.isdir(folder) else ())
            if (m := re.fullmatch(r"step(\d+)-worker0\.meta", n))}


def versions(path):
    return {v for *_, v in checkpoint.CheckpointReader(path).meta()}


def test_sigkill_at_random_moments_then_resume(mlp_job, singa_popen, run_driver, tmp_path):
    folder = str(tmp_path / "ws" / "checkpoint")
    job = mlp_job(train_steps=1_000_000, checkpoint_freq=1, test_freq=0, disp_freq=0,
                  edit=small_net)
    rng = random.Random(20160401)
    latest, kills, torn = None, 0, 0
    while kills < KILLS:
        old = temporary_files(folder)
        proc = singa_popen(job, "-resume")
        time.sleep(rng.uniform(0.3, 1.5))
        if kills % 4 == 3:   # every fourth kill aims at a write: the moment a new temporary file
            # shows once this run has written a snapshot of its own (however slow a loaded
            # machine makes its start), so the kills do not all land before the first checkpoint
            newest = -1 if latest is None else latest.step
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and max(meta_steps(folder), default=-1) <= newest:
                time.sleep(0.01)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not temporary_files(folder) - old:
                pass
        proc.kill()
        assert proc.wait() == -9, f"the run ended by itself: {open(f'{job}.log').read()[-2000:]}"
        kills += 1
        torn += bool(temporary_files(folder) - old)
        log = open(f"{job}.log").read()
        # when the run got as far as choosing, it chose the newest complete snapshot
        chosen = re.search(r"Resume from step (\d+)|No complete checkpoint", log)
        if chosen:
            assert chosen.group(1) == (None if latest is None else str(latest.step)), log
        assert "Skipping checkpoint" not in log, log
        snaps = checkpoint.list_snapshots(folder) if (tmp_path / "ws" / "checkpoint").exists() else []
        assert all(s.complete for s in snaps), [p for s in snaps for p in s.problems]
        now = checkpoint.latest_snapshot(folder) if snaps else None
        if latest is not None:
            assert now.step >= latest.step      # a resumed run never goes back
        if now is not None:
            assert versions(now.files[0]) == {now.step}
        latest = now
    assert latest is not None and latest.step > 0, "no kill came after the first checkpoint"
    # kills inside a write leave its temporary file behind
    assert torn, "no kill landed inside a checkpoint write"
    end = latest.step + 20
    r = run_driver(mlp_job("final", train_steps=end, checkpoint_freq=1, test_freq=0,
                           disp_freq=0, edit=small_net), "-resume")
    assert r.returncode == 0, r.stderr
    assert f"Resume from step {latest.step}" in r.stderr
    assert not temporary_files(folder)       # the killed writes' leftovers are cleaned up
    assert versions(checkpoint.snapshot_file(folder, end, 0)) == {end}


def test_damaged_snapshots_are_skipped_with_reasons(mlp_job, run_driver, tmp_path):
    folder = tmp_path / "ws" / "checkpoint"
    job = mlp_job(train_steps=60, checkpoint_freq=10, test_freq=0, edit=small_net)
    assert run_driver(job).returncode == 0
    step = {s: folder / f"step{s}-worker0.bin" for s in range(0, 70, 10)}
    data = step[60].read_bytes()
    step[60].write_bytes(data[:len(data) // 2])                            # torn write
    data = bytearray(step[50].read_bytes())
    data[len(data) // 2] ^= 0x10                                           # one flipped bit
    step[50].write_bytes(bytes(data))
    r = checkpoint.CheckpointReader(str(step[40]))                         # a lost worker file:
    state = r.snapshot_state()                                             # the snapshot says 2
    state.nworkers = 2
    checkpoint.write_file(str(step[40]), [(n, r.param(n), r.version(n)) for n in r.names], state)
    (folder / "step30-worker0.meta").unlink()                              # no .meta to compare
    step[30].write_bytes(step[30].read_bytes()[:-3])

    r = run_driver(job, "-resume")
    assert r.returncode == 0, r.stderr
    skipped = [line.split("] ", 1)[1] for line in r.stderr.splitlines() if "Skipping" in line]
    assert len(skipped) == 4, r.stderr
    assert skipped[0].startswith(f"Skipping checkpoint step60: checkpoint {step[60]}: truncated")
    assert "step60-worker0.meta records" in skipped[0]
    assert skipped[1].startswith(f"Skipping checkpoint step50: checkpoint {step[50]}: bad checksum")
    assert skipped[2] == (f"Skipping checkpoint step40: {folder / 'step40-worker1.bin'}: missing "
                          f"(the snapshot has 2 worker files)")
    assert skipped[3].startswith(f"Skipping checkpoint step30: checkpoint {step[30]}:")
    assert "Resume from step 20" in r.stderr
    final = checkpoint.CheckpointReader(str(step[60]))
    assert {v for *_, v in final.meta()} == {60}
    assert np.isfinite(final.param("0#weight1")).all()


def test_a_full_disk_stops_with_one_line_and_resume_continues(mlp_job, singa_conf, run_driver):
    """A snapshot write that fails (a file size limit: EFBIG, like ENOSPC) stops the job with one
    line and leaves no torn or temporary file; the older snapshot it was replacing is intact and
    -resume continues from it once there is room."""
    first = mlp_job(name="first", checkpoint_freq=100, train_steps=100)
    assert run_driver(first).returncode == 0
    folder = os.path.join(os.path.dirname(first), "ws", "checkpoint")
    before = open(os.path.join(folder, "step100-worker0.bin"), "rb").read()
    conf = mlp_job(checkpoint_freq=100, train_steps=200)
    full = subprocess.run(
        [PYTHON, "-m", "singa.driver", "-conf", str(conf), "-singa_conf", str(singa_conf), "-resume"],
        capture_output=True, text=True, timeout=120,
        # logs fit; a 400 KB snapshot (params + momentum) does not
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000)))
    lines = full.stderr.strip().splitlines()
    assert full.returncode == 2, full.stderr
    assert "Traceback" not in full.stderr
    assert lines[-1].startswith("singa: cannot write checkpoint ") and "step100" in lines[-1]
    assert not [f for f in os.listdir(folder) if ".tmp" in f]
    assert open(os.path.join(folder, "step100-worker0.bin"), "rb").read() == before
    r = run_driver(conf, "-resume")
    assert r.returncode == 0, r.stderr
    assert "Resume from step 100" in r.stderr
    assert checkpoint.latest_snapshot(folder).step == 200
