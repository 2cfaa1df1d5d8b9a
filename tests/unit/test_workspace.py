"""singa.job.workspace: a job's hold on its workspace (flock, shared by the job's processes)."""
import os

import pytest

from singa.errors import ConfigError
from singa.job import workspace


def test_a_second_job_is_refused_naming_the_first(tmp_path):
    first = workspace.hold(str(tmp_path), 7)
    with pytest.raises(ConfigError) as e:
        workspace.hold(str(tmp_path), 8)
    assert str(e.value).startswith(f"workspace {tmp_path} is in use by job 7 (pid {os.getpid()} "
                                   f"on host ")
    assert str(e.value).endswith("; stop that job (bin/singa-console.sh kill 7) or give this one "
                                 "another workspace")
    first.close()
    workspace.hold(str(tmp_path), 8).close()     # free again once the first job is gone


def test_processes_of_one_job_share_the_workspace(tmp_path):
    holds = [workspace.hold(str(tmp_path), 7) for _ in range(3)]
    holds[0].close()                 # the one that wrote the holder ends first
    with pytest.raises(ConfigError, match="in use by job 7"):
        workspace.hold(str(tmp_path), 9)
    for h in holds[1:]:
        h.close()
    workspace.hold(str(tmp_path), 9).close()


def test_a_lock_file_with_junk_is_taken_over_when_nobody_holds_it(tmp_path):
    (tmp_path / workspace.HOLDER).write_bytes(b"\xff junk")
    workspace.hold(str(tmp_path), 3).close()
    assert (tmp_path / workspace.HOLDER).read_text().startswith("job 3 pid ")


def test_a_workspace_that_cannot_be_made_is_one_line(tmp_path):
    missing = tmp_path / "none" / "ws"
    with pytest.raises(ConfigError, match=f"cannot make the workspace {missing}: No such file"):
        workspace.hold(str(missing), 1)
