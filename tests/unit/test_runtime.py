"""runtime: param slices over the servers, -resume's choice of snapshot, where an executor runs,
a failure's error type, and one process's executors training a small net to the end."""
import numpy as np
import pytest
from google.protobuf import text_format

from singa import checkpoint, errors
from singa.comm import msg as m
from singa.job import topology
from singa.proto import job_pb2
from singa.train import worker
from singa.train.place import Place
from singa.train.runtime import Process, failure_error, resume_from, slice_masters, slice_table

NET = """
layer { name: "x" type: kDummy dummy_conf { input: true shape: 4 shape: 5 } }
layer { name: "ip" type: kInnerProduct srclayers: "x" innerproduct_conf { num_output: 3 }
  param { name: "w" init { type: kUniform low: -1 high: 1 } }
  param { name: "b" init { type: kConstant value: 0.5 } } }
layer { name: "y" type: kDummy srclayers: "ip" dummy_conf { output: true } }
"""


def make_job(tmp_path, steps=3, **cl):
    job = job_pb2.JobProto(name="t", train_steps=steps, seed=7)
    text_format.Parse(NET, job.neuralnet)
    job.train_one_batch.alg = job_pb2.kBP
    text_format.Parse("type: kSGD learning_rate { type: kFixed base_lr: 0.1 }", job.updater)
    job.cluster.workspace = str(tmp_path / "ws")
    for k, v in cl.items():
        setattr(job.cluster, k, v)
    return job


class Owner:
    def __init__(self, id_, size):
        self.id, self.size = id_, size


@pytest.mark.parametrize("groups, servers", [(1, 1), (1, 3), (2, 2), (3, 2)])
def test_slices_cover_every_param_once_and_each_has_a_server(tmp_path, groups, servers):
    job = make_job(tmp_path, nserver_groups=groups, nservers_per_group=servers)
    owners = [Owner(0, 1000), Owner(1, 7), Owner(5, 1)]
    table, slice2server = slice_table(job, owners)
    ids = [sid for rows in table.values() for sid, _, _ in rows]
    assert ids == list(range(len(ids))) and len(slice2server) == len(ids)
    assert set(slice2server) <= set(range(servers))
    for p in owners:
        offset = 0
        for _, o, n in table[p.id]:
            assert o == offset and n > 0
            offset += n
        assert offset == p.size
    masters = slice_masters(job, owners)
    assert sorted(masters) == ids
    assert all(m.addr_type(a) == m.kServer and 0 <= m.addr_grp(a) < groups
               and 0 <= m.addr_id(a) < servers for a in masters.values())
    if groups > 1:      # the slices' masters are spread over the server groups
        assert len({m.addr_grp(a) for a in masters.values()}) > 1


def test_resume_takes_the_newest_complete_snapshot_and_keeps_versions(tmp_path):
    job = make_job(tmp_path)
    folder = tmp_path / "ws" / "checkpoint"
    folder.mkdir(parents=True)
    assert resume_from(job, str(folder)) is None and job.step == 0
    for step in (10, 20):
        checkpoint.write_file(checkpoint.snapshot_file(str(folder), step, 0),
                              [("w", np.ones((3, 5), np.float32), step, None)])
    (folder / "step30-worker0.bin").write_bytes(b"torn")     # not a complete snapshot
    snap = resume_from(job, str(folder))
    assert snap.step == 20 and job.step == 20 and job.reset_param_version is False


def test_every_executor_address_is_located_in_its_process(tmp_path):
    job = make_job(tmp_path, nworker_groups=2, nworkers_per_group=2, nworkers_per_procs=2,
                   nservers_per_group=2, nserver_groups=1, nservers_per_procs=2)
    cl = job.cluster
    process = Process(job, Place(0, topology.nprocs(cl)))     # process 0, without peers
    try:
        for g in range(2):
            for j in range(2):
                assert process.locate(m.addr(g, j, m.kWorkerParam)) == \
                    topology.worker_procs(cl, g, j)
        for s in range(2):
            assert process.locate(m.addr(0, s, m.kServer)) == topology.server_procs(cl, 0, s)
        for stranger in (m.addr(2, 0, m.kWorkerParam), m.addr(0, 2, m.kServer),
                         m.addr(1, 0, m.kServer)):
            with pytest.raises(errors.ClusterError, match="no executor at address"):
                process.locate(stranger)
    finally:
        process.close()


@pytest.mark.parametrize("kind, cls", [("CheckpointError", errors.CheckpointError),
                                       ("ConfigError", errors.ConfigError),
                                       ("ValueError", errors.ExecutorError),
                                       ("SystemExit", errors.ExecutorError),
                                       ("no such name", errors.ExecutorError)])
def test_an_executors_failure_becomes_its_own_singa_error_or_an_executor_error(kind, cls):
    e = failure_error(kind, "it broke")
    assert type(e) is cls and str(e) == "it broke"


def test_one_process_two_workers_two_servers_train_to_the_end(tmp_path):
    """Two workers of one group share each param (the stub sums their gradients), which the
    two servers hold in slices; every param ends at version train_steps, the final snapshot
    holds them."""
    job = make_job(tmp_path, steps=4, nworkers_per_group=2, nworkers_per_procs=2,
                   nservers_per_group=2, nservers_per_procs=2)
    (tmp_path / "ws" / "checkpoint").mkdir(parents=True)
    process = Process(job)
    entries = process.stub.table.entries
    assert {e.num_total for e in entries.values()} == {2}
    assert {e.num_local for e in entries.values()} == {2}
    w, b = process.train_net.params
    process.run()
    assert all(p.version == 4 for p in process.train_net.params)
    reader = checkpoint.CheckpointReader(
        checkpoint.snapshot_file(str(tmp_path / "ws" / "checkpoint"), 4, 0))
    assert set(reader.names) == {p.name for p in process.train_net.owner_params}
    np.testing.assert_array_equal(reader.param(w.name), w.data)
    assert w.data.std() > 0.1 and not np.allclose(reader.param(b.name), 0.5)     # it trained


@pytest.mark.parametrize("bucket", [worker.BUCKET_FLOATS, 1])
def test_gradient_buckets_change_the_messages_not_the_numbers(tmp_path, monkeypatch, bucket):
    """Each worker sends a step's gradients in one Update (buckets of BUCKET_FLOATS), or one
    per param when a bucket holds one; each server gets one Update of its slices per bucket;
    the params end bit for bit where one-param buckets put them."""
    monkeypatch.setattr(worker, "BUCKET_FLOATS", bucket)
    job = make_job(tmp_path / str(bucket), steps=4, nworkers_per_group=2, nworkers_per_procs=2,
                   nservers_per_group=2, nservers_per_procs=2)
    (tmp_path / str(bucket) / "ws" / "checkpoint").mkdir(parents=True)
    process = Process(job)
    updates = []
    for x in process.workers:
        send = x.dealer.send
        x.dealer.send = lambda msg, send=send: (updates.append(msg.src)
                                                if msg.type == m.kUpdate else None, send(msg))
    for x in process.servers:
        handle = x.handle
        x.handle = lambda msg, handle=handle: (updates.append(msg.dst)
                                               if msg.type == m.kUpdate else None, handle(msg))
    buckets = [process.stub.table.entries.values()] if bucket > 1 else \
        [[e] for e in process.stub.table.entries.values()]     # w and b together, or each alone
    to_servers = [server for entries in buckets
                  for server in {server for e in entries for _, server, _, _ in e.slices}]
    process.run()
    workers = [x.address for x in process.workers]
    assert sorted(updates) == sorted((workers * len(buckets) + to_servers) * 4)
    values = {p.name: p.data.copy() for p in process.train_net.params}
    if bucket == 1:
        reference = tmp_path / str(worker.BUCKET_FLOATS) / "ws" / "checkpoint"
        reader = checkpoint.CheckpointReader(checkpoint.snapshot_file(str(reference), 4, 0))
        for name, v in values.items():
            np.testing.assert_array_equal(reader.param(name), v)


def test_a_worker_that_hears_nothing_names_where_its_servers_run(tmp_path):
    process = Process(make_job(tmp_path, nservers_per_group=2, nservers_per_procs=2))
    try:
        worker = process.workers[0]
        worker.response_timeout = 0.3
        with pytest.raises(errors.ClusterError, match=r"^worker \(0, 0\): no answer for the test "
                           r"from its servers \(process 0 at this process\) in 0 s$"):
            worker.wait(lambda: False, "the test")
    finally:
        process.close()


def test_batchnorm_running_sums_are_the_workers_through_training_and_the_snapshot(tmp_path):
    """Caffe's BatchNorm updates its sums itself (`Param.updated_by_layer`): the worker never
    sends them for an update, whose answer (the servers' first values) would undo them."""
    job = make_job(tmp_path, steps=3)
    job.neuralnet.Clear()
    text_format.Parse(NET.replace('srclayers: "x"', 'srclayers: "bn"') + """
        layer { name: "bn" type: kCaffeBatchNorm srclayers: "x"
          param { name: "m" } param { name: "v" } param { name: "f" } }""", job.neuralnet)
    (tmp_path / "ws" / "checkpoint").mkdir(parents=True)
    process = Process(job)
    process.run()
    mean, var, factor = process.train_net.params[:3]
    np.testing.assert_allclose(factor.data, [1 + 0.999 + 0.999 ** 2], rtol=1e-6)
    assert mean.data.min() > 0.5   # about 3 × 0.5, from batches of U[0, 1) inputs
    reader = checkpoint.CheckpointReader(
        checkpoint.snapshot_file(str(tmp_path / "ws" / "checkpoint"), 3, 0))
    np.testing.assert_array_equal(reader.param(factor.name), factor.data)
    np.testing.assert_array_equal(reader.param(mean.name), mean.data)


def test_a_servers_singa_error_stops_the_job_in_its_line_without_a_traceback(tmp_path, caplog):
    """A learning rate beyond a float's range at step 2 (kStep, gamma 1e30): the server's
    NonFiniteError reaches the process as itself, and the log holds its line, no traceback
    (as a worker's SingaError)."""
    job = make_job(tmp_path, steps=5)
    job.ClearField("updater")
    text_format.Parse("type: kSGD learning_rate { type: kStep base_lr: 0.1 "
                      "step_conf { gamma: 1e30 change_freq: 1 } }", job.updater)
    (tmp_path / "ws" / "checkpoint").mkdir(parents=True)
    process = Process(job)
    try:
        with pytest.raises(errors.NonFiniteError, match=r"^step 2: the learning rate is inf"):
            process.run()
    finally:
        process.close()
    assert "step 2: the learning rate is inf" in caplog.text
    assert "Traceback" not in caplog.text
