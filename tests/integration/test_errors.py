"""User mistakes given to the `singa` driver: one line on stderr naming the place, no traceback."""
import os
import re
import time

import pytest

import singa

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
}


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
    err = one_line_error(run_driver(fixture_job(edits={"alg: kBP": 'user_alg: "kMine"'})))
    assert err == ("singa: train_one_batch: alg kMine is not implemented yet (kBP, kBPTT and "
                   "kCD are)")


def test_cd_without_rbm_layers_is_refused(fixture_job, run_driver):
    err = one_line_error(run_driver(fixture_job(edits={"alg: kBP": "alg: kCD"})))
    assert err == ("singa: train_one_batch: alg kCD trains RBM layers (kRBMVis, kRBMHid) and "
                   "the net has none")


def test_a_process_whose_job_partners_never_start_stops_with_one_line(fixture_job, run_driver):
    conf = fixture_job(edits={"nworker_groups: 1": "nworker_groups: 2"})    # 2 processes
    r = run_driver(conf)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert re.search(r"^singa: process 1 of job \d+ did not register in ZooKeeper at \S+ within "
                     r"20 s$", r.stderr, re.M), r.stderr
