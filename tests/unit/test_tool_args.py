"""singatool's commands that need no ZooKeeper: their refusals of bad arguments and confs."""
import os

import pytest

import singa
from singa.cluster import tool


@pytest.mark.parametrize("args", [["progress", "²"], ["view", "١"], ["waitzk", "³", "-local"],
                                  ["remove", "1.0"], ["wait", "-1"]])
def test_a_number_must_be_ascii_digits(tmp_path, capsys, args):
    assert tool.main(args + ["-confdir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"singatool: {args[0]}: ") and "must be a number" in err
    assert "Traceback" not in err


def conf(tmp_path, cluster):
    """A job conf: mnist's MLP with `cluster` as its cluster block."""
    text = open(os.path.join(singa.HOME, "examples", "mnist", "job.conf")).read()
    path = tmp_path / "job.conf"
    path.write_text(text[:text.index("\ncluster")] + f'\ncluster {{ {cluster} workspace: '
                    f'"{tmp_path}" }}\nmax_restarts: 3\n')
    return str(path)


@pytest.mark.parametrize("cmd", ["nprocs", "elastic", "jobname", "maxrestarts"])
def test_a_cluster_of_more_processes_than_a_job_may_run_is_one_line(tmp_path, capsys, cmd):
    """Refused before anything is made per process (elastic listed 2^31 of them: minutes and
    gigabytes)."""
    path = conf(tmp_path, "nworker_groups: 2147483647 nworkers_per_procs: 1")
    assert tool.main([cmd, path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"singatool: {path}:") and err.count("\n") == 1
    assert "cluster: 2147483647 processes, more than the 65536 a job may run" in err


def test_a_cluster_of_many_processes_still_loads(tmp_path, capsys):
    path = conf(tmp_path, "nworker_groups: 65536 nworkers_per_procs: 1")
    assert tool.main(["nprocs", path]) == 0 and capsys.readouterr().out == "65536\n"
    assert tool.main(["elastic", path]) == 0
    assert capsys.readouterr().out.split()[-1] == "65535"


def test_the_cluster_block_is_found_where_the_text_format_puts_it(tmp_path, capsys):
    """Not only at the start of a line: `nprocs` and `genhost` place the processes (a pattern
    that wanted `cluster {` at the start of a line counted 1 process here)."""
    path = conf(tmp_path, "nworker_groups: 2 server_worker_separate: true")
    text = open(path).read().replace("\ncluster {", " cluster {")
    open(path, "w").write(text)
    assert tool.main(["nprocs", path]) == 0 and capsys.readouterr().out == "3\n"


def test_progress_reads_the_steps_and_workspace_of_the_jobs_conf(tmp_path):
    """As load_job would read them, wherever on a line they stand (a pattern wanted
    `train_steps` at a line's start and showed no total here)."""
    info = tmp_path / "log" / "job-info" / "job-7-20261127-150000"
    info.mkdir(parents=True)
    (info / "job.conf").write_text(f'name: "x" train_steps: 300 cluster {{ workspace: '
                                   f'"{tmp_path / "ws"}" }}\n')
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "metrics.csv").write_text(
        "job,group,step,phase,metric,value,wall_time\n"
        "7,0,120,train,loss,0.5,1.0\n7,0,120,train,accuracy,0.75,1.0\n")
    assert tool.progress(7, str(tmp_path / "log")) == [
        "Train @ step 120 of 300  loss = 0.500000, accuracy = 0.750000"]
