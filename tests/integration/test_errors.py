"""User mistakes given to the `singa` driver: one line on stderr naming the place, no traceback."""
import importlib.util
import os
import re
import subprocess
import time

import numpy as np
import pytest

import singa
from singa import checkpoint
from singa.comm.trust import ENV, new_secret
from conftest import PYTHON

CONFS = os.path.join(singa.HOME, "tests", "fixtures", "confs")


def one_line_error(r, code=2):
    """The single stderr line of a failed run, after checking exit code and the absence of a traceback."""
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("singa: "), r.stderr
    return r.stderr.rstrip("\n")


# (edits of the fixture job.conf, line the error names, words it must contain)
BAD_CONFS = {
    "syntax error": ({"train_steps: 200": "train_steps 200"}, 2, 'Expected ":"'),
    "unknown field": ({"disp_freq: 20": "disp_freq: 20\nbogus_field: 3"}, 6, 'no field named "bogus_field"'),
    "unknown enum value": ({"type: kSigmoid": "type: kSigmoidX"}, 17, "no value named kSigmoidX"),
    "unknown layer type": ({"type: kSigmoid": 'user_type: "kNoSuch"'}, 17,
                           "layer 'sig1': layer type kNoSuch is not implemented"),
    "srclayer naming no layer": ({'srclayers: "sig1"': 'srclayers: "nope"'}, 18,
                                 "layer 'ip2': srclayer 'nope' names no layer"),
    "duplicate layer names": ({'name: "sig1"': 'name: "ip1"', 'srclayers: "sig1"': 'srclayers: "ip1"'}, 17,
                              "duplicate layer name 'ip1' in the kTrain net (also at line 14)"),
    "duplicate param names": ({'name: "weight2"': 'name: "weight1"'}, 19,
                              "duplicate param name 'weight1' in the kTrain net (also at line 15)"),
    "cycle": ({'srclayers: "data" innerproduct_conf { num_output: 64 }':
               'srclayers: "sig1" innerproduct_conf { num_output: 64 }'}, 14,
              "srclayers form a cycle: ip1 -> sig1 -> ip1"),
    "missing data file": ({"train-1000.bin": "nope.bin"}, 11,
                          "store_conf.path 'tests/fixtures/singa-0.3/nope.bin' does not exist"),
    "num_output 0": ({"num_output: 64": "num_output: 0"}, 14,
                     "layer 'ip1': innerproduct_conf.num_output must be at least 1, got 0"),
    "nworkers_per_procs 0": ({"nserver_groups: 1": "nserver_groups: 1 nworkers_per_procs: 0"}, 23,
                             "cluster.nworkers_per_procs must be at least 1, got 0"),
    "job name with a path": ({'name: "fixture-mlp"': 'name: "x/../../../../tmp/pwn"'}, 1,
                             "a job name may not contain '/'"),
    "job name too long": ({'name: "fixture-mlp"': f'name: "{"n" * 300}"'}, 1,
                          "name is 300 bytes long; a job name may have at most 230"),
}
if importlib.util.find_spec("cupy") is None:    # tests/gpu checks the GPU itself
    BAD_CONFS["gpu without CuPy"] = (
        {"train_steps: 200": "train_steps: 200\ngpu: 0"}, 3,
        "training on a GPU needs CuPy, which is not installed: pip install 'singa[gpu]'")


@pytest.mark.parametrize("case", BAD_CONFS)
def test_bad_job_conf_names_file_and_line(case, fixture_job, run_driver):
    edits, line, words = BAD_CONFS[case]
    conf = fixture_job(edits=edits)
    err = one_line_error(run_driver(conf))
    assert err.startswith(f"singa: {conf}:{line}: ") and words in err, err


def test_missing_workspace_parent_names_the_workspace(fixture_job, run_driver, tmp_path):
    ws = tmp_path / "nope" / "ws"
    conf = fixture_job(workspace=ws)
    err = one_line_error(run_driver(conf))
    assert err == (f"singa: {conf}:23: cluster.workspace '{ws}' does not exist and neither does "
                   f"its parent ({ws.parent})")
    assert not (tmp_path / "nope").exists()


def test_missing_workspace_with_existing_parent_is_created_and_runs(fixture_job, run_driver, tmp_path):
    ws = tmp_path / "new" / "ws"
    ws.parent.mkdir()
    conf = fixture_job(workspace=ws, edits={"train_steps: 200": "train_steps: 20"})
    r = run_driver(conf)
    assert r.returncode == 0, r.stderr
    assert (ws / "checkpoint" / "step20-worker0.bin").is_file()


def test_stale_pre_0_1_conf_says_so(run_driver):
    conf = os.path.abspath(os.path.join(CONFS, "mnist", "rbm_job.conf"))
    err = one_line_error(run_driver(conf))
    assert err.startswith(f"singa: {conf}:9: not a SINGA 0.2/0.3 job conf (stale pre-0.1 format?)"), err


def test_missing_conf_file(run_driver, tmp_path):
    conf = tmp_path / "none.conf"
    err = one_line_error(run_driver(conf))
    assert err == f"singa: {conf}: cannot read: No such file or directory"


def test_no_conf_flag_prints_usage(run_driver):
    err = one_line_error(run_driver(None))
    assert err.startswith("singa: no job conf given; usage: singa -conf JOB_CONF"), err


def test_unreachable_zookeeper_names_host_and_port(fixture_job, run_driver, tmp_path, closed_port):
    singa_conf = tmp_path / "unreachable.conf"
    singa_conf.write_text(f'zookeeper_host: "127.0.0.1:{closed_port}"\nlog_dir: "{tmp_path / "log"}/"\n')
    start = time.monotonic()
    r = run_driver(fixture_job(), conf_file=singa_conf, timeout=60)
    assert time.monotonic() - start < 15
    assert r.returncode != 0
    err = one_line_error(r, r.returncode)
    assert f"cannot reach ZooKeeper at 127.0.0.1:{closed_port}" in err, err


def test_an_algorithm_not_implemented_is_refused(fixture_job, run_driver):
    conf = fixture_job(edits={"alg: kBP": 'user_alg: "kMine"'})
    err = one_line_error(run_driver(conf))
    assert err == (f"singa: {conf}:7: train_one_batch: alg kMine is not implemented yet (kBP, "
                   f"kBPTT and kCD are)")


def test_cd_without_rbm_layers_is_refused(fixture_job, run_driver):
    conf = fixture_job(edits={"alg: kBP": "alg: kCD"})
    err = one_line_error(run_driver(conf))
    assert err == (f"singa: {conf}:7: train_one_batch: alg kCD trains RBM layers (kRBMVis, "
                   f"kRBMHid) and the net has none")


def test_a_process_whose_job_partners_never_start_stops_with_one_line(fixture_job, run_driver):
    conf = fixture_job(edits={"nworker_groups: 1": "nworker_groups: 2"})    # 2 processes
    r = run_driver(conf)
    assert r.returncode == 2 and r.stderr == "singa: fixture-mlp: a job of 2 processes needs " \
        "its secret in SINGA_JOB_SECRET (bin/singa-run.sh makes one per run)\n", r.stderr
    r = run_driver(conf, env={ENV: new_secret(), "SINGA_REGISTER_TIMEOUT": "4"})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert re.search(r"^singa: process 1 of job \d+ did not register in ZooKeeper at \S+ within "
                     r"4 s$", r.stderr, re.M), r.stderr
    r = run_driver(conf, env={ENV: new_secret(), "SINGA_REGISTER_TIMEOUT": "soon"})
    assert r.returncode == 2 and r.stderr == ("singa: SINGA_REGISTER_TIMEOUT=soon: must be a "
                                              "positive number of seconds\n"), r.stderr


def last_line_error(r, code=2):
    """The last stderr line of a run that failed after it started logging, without a traceback."""
    assert r.returncode == code and "Traceback" not in r.stderr, r.stderr
    return r.stderr.splitlines()[-1]


def test_num_output_too_large_for_memory_names_param_shape_and_bytes(fixture_job, run_driver):
    err = last_line_error(run_driver(fixture_job(edits={"num_output: 64": "num_output: 2000000000"})))
    assert err.startswith("singa: param '0#weight1' of shape (2000000000, 784): its values and "
                          "gradient need 12.5 TB"), err


def test_workspace_on_a_read_only_file_system_is_one_line(fixture_job, singa_conf, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    conf = fixture_job(workspace=ws)
    driver = f"{PYTHON} -m singa.driver -conf {conf} -singa_conf {singa_conf}"
    r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind {ws} {ws} && "
                        f"mount -o remount,bind,ro {ws} && exec {driver}"],
                       capture_output=True, text=True, timeout=120)
    if "mount" in r.stderr or "unshare" in r.stderr:
        pytest.skip(f"cannot mount a read-only file system here: {r.stderr.strip()}")
    err = one_line_error(r)
    assert err == f"singa: {conf}:23: cluster.workspace: cannot write to {ws}: read-only file system"


def test_a_truncated_shard_stops_the_job_naming_file_and_offset(fixture_job, run_driver, tmp_path):
    shard = tmp_path / "cut.bin"
    data = open(os.path.join(singa.HOME, "tests", "fixtures", "singa-0.3", "train-1000.bin"), "rb").read()
    tuple_bytes = len(data) // 1000
    shard.write_bytes(data[:10 * tuple_bytes + 100])       # 10 tuples and part of the 11th
    r = run_driver(fixture_job(edits={"tests/fixtures/singa-0.3/train-1000.bin": str(shard)}))
    assert last_line_error(r) == (
        f"singa: {shard}: the tuple at byte {10 * tuple_bytes} is cut short (its value length "
        f"{tuple_bytes - 24} points past the end of the {len(shard.read_bytes())}-byte file); "
        f"10 whole tuples before it: truncated or corrupt")


def test_a_nan_in_a_csv_shard_stops_the_job_naming_step_and_layer(run_driver, tmp_path,
                                                                  nan_csv_job):
    assert last_line_error(run_driver(nan_csv_job)) == (
        "singa: step 6: the loss of layer '0#loss' is nan; the first non-finite values are in "
        "the output of layer '0#data'")
    folder = tmp_path / "ws" / "checkpoint"
    assert sorted(os.listdir(folder)) == [f"step{s}-worker0.{ext}" for s in (0, 2, 4, 6)
                                          for ext in ("bin", "meta")]
    readers = [checkpoint.CheckpointReader(str(folder / f"step{s}-worker0.bin"))
               for s in (0, 2, 4, 6)]
    assert all(np.isfinite(r.param(n)).all() for r in readers for n in r.names)


def test_a_non_finite_param_stops_the_job_before_it_is_snapshotted(mlp_job, run_driver, tmp_path):
    bad = np.full((64, 784), 0.01, np.float32)
    bad[3, 5] = np.inf
    path = checkpoint.write_file(str(tmp_path / "pretrained.bin"), [("0#weight1", bad, 0)])
    r = run_driver(mlp_job(checkpoint_path=[path], train_steps=20, checkpoint_freq=10))
    assert last_line_error(r) == "singa: step 0: param '0#weight1' holds nan or inf; no snapshot written"
    assert os.listdir(tmp_path / "ws" / "checkpoint") == []


def test_a_diverging_job_prints_no_numpy_warnings(fixture_job, run_driver):
    """Its sigmoid's exp overflows (1 / (1 + inf) = 0: no fault); a value that stays
    non-finite stops the job with its own line (the tests above)."""
    r = run_driver(fixture_job(edits={"base_lr: 0.05": "base_lr: 1000"}))
    assert r.returncode == 0, r.stderr
    assert "Warning" not in r.stderr, r.stderr
