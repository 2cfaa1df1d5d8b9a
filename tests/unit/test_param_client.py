"""ParamClient: a worker's answers to its param requests."""
import numpy as np

from singa.comm import msg as m
from singa.comm import param_msg as pm
from singa.layers.param import Param
from singa.proto import job_pb2
from singa.train.param_client import ParamClient


class Sent(list):
    def send(self, msg):
        self.append(msg)


def param(pid, owner, values):
    p = Param(job_pb2.ParamProto(name="w"))
    p.data, p.grad = values, np.zeros_like(values)
    p.id, p.owner = pid, owner
    return p


def test_a_put_acknowledged_brings_the_owner_its_version_and_a_copy_of_its_own_nothing():
    """The stub acknowledges a Put to every local share of the param: the owner, whose values
    were put, is at the put's version; a copy with values of its own (on another device) still
    waits for its Get's values (it took the version without them and computed on zeros)."""
    owner = param(0, 0, np.arange(4, dtype=np.float32))
    copy = param(1, 0, np.zeros(4, np.float32))
    worker = m.addr(0, 1, m.kWorkerParam)
    client = ParamClient(worker, Sent(), [owner, copy], 1 << 20, "worker")
    client.put(owner)
    client.get(0, copy)
    ack = [m.format_frame("ii", 0, 0)]
    client.answer(pm.gathered(m.STUB, worker, m.kRPut, 0, [(0, (0,), [ack]), (1, (0,), [ack])]))
    assert (owner.version, copy.version) == (0, -1)
    client.answer(pm.gathered(m.STUB, worker, m.kRGet, 0, [(1, (0,), [[owner.data]])]))
    assert copy.version == 0 and copy.data.tolist() == [0, 1, 2, 3]
