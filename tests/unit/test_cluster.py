import pytest
from google.protobuf import text_format

from singa.cluster import lcm, nprocs, partition_slices, slice_sizes
from singa.proto import job_pb2


def cluster(text):
    return text_format.Parse(text, job_pb2.ClusterProto())


@pytest.mark.parametrize("text, expected", [
    ("", 1),
    # the four frameworks of SINGA's docs (docs/distributed.md)
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


# SINGA's own test_common.cc values (src/test/test_common.cc)
SIZES = [14112, 96, 256, 884736, 384]


def test_slice_matches_singa_test_common():
    assert slice_sizes(2, SIZES) == [[14112], [96], [256], [435328, 449408], [384]]
    assert slice_sizes(4, SIZES)[3] == [210432, 224896, 224896, 224512]
    assert slice_sizes(8, SIZES)[3] == [97984] + [112448] * 6 + [112064]


def test_slices_cover_every_param_exactly():
    for num in (1, 2, 3, 4, 8):
        for sizes, pieces in zip(SIZES, slice_sizes(num, SIZES)):
            assert sum(pieces) == sizes and min(pieces) > 0


def test_partition_slices_matches_singa_test_common():
    slices = [97984] + [112448] * 6 + [112064]
    assert partition_slices(2, slices) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert partition_slices(4, slices) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert partition_slices(1, slices) == [0] * 8


def test_lcm():
    assert (lcm(5, 10), lcm(10, 15), lcm(1, 1)) == (10, 30, 1)
