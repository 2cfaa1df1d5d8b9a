import itertools

import pytest
from google.protobuf import text_format

from singa.job.topology import (check_layout, elastic_procs, executor_range, lcm, nprocs, partition_slices, server_group,
                           server_procs, servers_of, slice_sizes, worker_procs, workers_of)
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


FRAMEWORKS = {
    "sandblaster": "nworker_groups:1 nserver_groups:1 nworkers_per_group:3 nservers_per_group:2 "
                   "server_worker_separate:true",
    "allreduce": "nworker_groups:1 nserver_groups:1 nworkers_per_group:3 nservers_per_group:3",
    "downpour": "nworker_groups:2 nserver_groups:1 nworkers_per_group:2 nservers_per_group:2 "
                "server_worker_separate:true",
    "hogwild": "nworker_groups:3 nserver_groups:3 nworkers_per_group:1 nservers_per_group:1",
}


def test_framework_layouts():
    sb = cluster(FRAMEWORKS["sandblaster"])
    assert [workers_of(sb, p) for p in range(5)] == [[(0, 0)], [(0, 1)], [(0, 2)], [], []]
    assert [servers_of(sb, p) for p in range(5)] == [[], [], [], [(0, 0)], [(0, 1)]]
    ar = cluster(FRAMEWORKS["allreduce"])
    assert [(workers_of(ar, p), servers_of(ar, p)) for p in range(3)] == \
        [([(0, j)], [(0, j)]) for j in range(3)]
    hw = cluster(FRAMEWORKS["hogwild"])
    assert [server_group(hw, g) for g in range(3)] == [0, 1, 2]
    dp = cluster(FRAMEWORKS["downpour"])
    assert [server_group(dp, g) for g in range(2)] == [0, 0]
    assert servers_of(dp, 4) == [(0, 0)] and servers_of(dp, 5) == [(0, 1)]


def test_executor_range_matches_singa():
    assert executor_range(3, 4, 2) == (1, 2, 2, 4)      # part of a group
    assert executor_range(1, 2, 4) == (2, 4, 0, 2)      # whole groups


def layouts():
    for G, K, per, S, sper, sep in itertools.product((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 4),
                                                     (1, 2, 4), (1, 2), (False, True)):
        text = (f"nworker_groups:{G} nworkers_per_group:{K} nworkers_per_procs:{per} "
                f"nserver_groups:1 nservers_per_group:{S} nservers_per_procs:{sper} "
                f"server_worker_separate:{str(sep).lower()}")
        c = cluster(text)
        if check_layout(c) is None:
            yield c


def test_every_executor_lives_in_exactly_the_process_the_formulas_name():
    count = 0
    for c in layouts():
        count += 1
        seen = {}
        for p in range(nprocs(c)):
            for g, j in workers_of(c, p):
                assert ("w", g, j) not in seen
                seen[("w", g, j)] = p
                assert worker_procs(c, g, j) == p
            for g, j in servers_of(c, p):
                assert ("s", g, j) not in seen
                seen[("s", g, j)] = p
                assert server_procs(c, g, j) == p
        expected = {("w", g, j) for g in range(c.nworker_groups) for j in range(c.nworkers_per_group)}
        expected |= {("s", g, j) for g in range(c.nserver_groups) for j in range(c.nservers_per_group)}
        assert set(seen) == expected, c
    assert count > 100


def test_layouts_singa_cannot_run_are_refused():
    assert "multiple" in check_layout(cluster("nworkers_per_group:3 nworkers_per_procs:2"))
    assert "at least 1" in check_layout(cluster("nworkers_per_procs:0"))
    assert "divides" in check_layout(cluster("nworker_groups:3 nworkers_per_group:1 "
                                             "nworkers_per_procs:2"))


@pytest.mark.parametrize("text, expected", [
    ("", set()),                                                       # one worker group
    ("nworker_groups:1 nserver_groups:1 nworkers_per_group:3 nservers_per_group:2 "
     "server_worker_separate:true", set()),                             # Sandblaster: one group
    ("nworker_groups:2 nserver_groups:1", {1}),                         # Downpour, SINGA's conf
    ("nworker_groups:2 nserver_groups:1 server_worker_separate:true", {0, 1}),
    ("nworker_groups:2 nserver_groups:1 nworkers_per_group:2 nservers_per_group:2 "
     "server_worker_separate:true", set()),                             # a group over 2 procs
    ("nworker_groups:4 nworkers_per_procs:2 server_worker_separate:true", {0, 1}),
    ("nworker_groups:3 nserver_groups:3", set()),                       # Hogwild: servers each
    ("nworker_groups:2 nserver_groups:2 nservers_per_procs:2 server_worker_separate:true",
     {0, 1}),
])
def test_elastic_procs_hold_whole_asynchronous_groups_and_no_server(text, expected):
    assert elastic_procs(cluster(text), 1) == expected
    assert elastic_procs(cluster(text), 0) == set()         # nothing restarts them
