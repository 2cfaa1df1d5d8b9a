import pytest
from google.protobuf import text_format

from singa.cluster import nprocs
from singa.proto import job_pb2


def cluster(text):
    return text_format.Parse(text, job_pb2.ClusterProto())


@pytest.mark.parametrize("text, expected", [
    ("", 1),
    # the four frameworks of SINGA's docs (reference §4.3)
    ("nworker_groups:1 nserver_groups:1 nworkers_per_group:3 nservers_per_group:2 "
     "server_worker_separate:true", 5),                                         # Sandblaster
    ("nworker_groups:1 nserver_groups:1 nworkers_per_group:3 nservers_per_group:3 "
     "server_worker_separate:false", 3),                                        # AllReduce
    ("nworker_groups:2 nserver_groups:1 nworkers_per_group:2 nservers_per_group:2 "
     "server_worker_separate:true", 6),                                         # Downpour
    ("nworker_groups:3 nserver_groups:3 nworkers_per_group:1 nservers_per_group:1 "
     "server_worker_separate:false", 3),                                        # Hogwild
    # single-process quick-start variants
    ("nworker_groups:2 nworkers_per_procs:2", 1),
    ("nworkers_per_group:2 nworkers_per_procs:2", 1),
    # servers dominate when co-located
    ("nservers_per_group:4 nservers_per_procs:2", 2),
    # integer division like SINGA's C++
    ("nworkers_per_group:3 nworkers_per_procs:2", 1),
    ("nworkers_per_group:4 nworkers_per_procs:2 nservers_per_group:2 server_worker_separate:true", 4),
])
def test_nprocs(text, expected):
    assert nprocs(cluster(text)) == expected
