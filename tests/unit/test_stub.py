"""comm.stub: the stub talks to the servers as itself and routes their answers by address."""
import threading

import numpy as np
import zmq

from singa.comm import msg as m
from singa.comm import param_msg as pm
from singa.comm.socket import Dealer, Router
from singa.comm.stub import ParamEntry, Stub


def test_the_stub_asks_the_servers_as_itself_and_routes_their_answers_by_its_address():
    """SINGA's stub sends as Addr(grp, procs_id, kStub); a server answers that address. The
    updater state goes only to the worker that asked for it."""
    ctx = zmq.Context()
    router = Router(ctx, "inproc://test-param-msg-stub")
    server = Dealer(ctx, m.addr(0, 0, m.kServer), router.endpoint)
    workers = [Dealer(ctx, m.addr(0, j, m.kWorkerParam), router.endpoint) for j in range(2)]
    entry = ParamEntry(0, 4, [(0, server.address, 0, 3)])
    for j, w in enumerate(workers):
        entry.add_share(w.address, 10 + j)
    entry.num_total = 2
    stub = Stub(router, {(0, 4): entry}, [server.address] + [w.address for w in workers],
                poll_ms=10, pid=7)
    thread = threading.Thread(target=stub.run, daemon=True)
    thread.start()
    try:
        workers[1].send(pm.request(workers[1].address, m.STUB, m.kState, 4, 5))
        req = server.receive(2000)
        assert req.src == m.addr(0, 7, m.kStub) == stub.address(0)
        assert req.type == m.kState and req.trgt_val == m.param_trgt(4, 0)
        server.send(pm.state_reply(req, 5, 2, [np.ones(3, np.float32)]))
        answer = workers[1].receive(2000)
        assert answer.type == m.kRState and m.param_id(answer.trgt_val) == 11
        assert workers[0].receive(200) is None          # it did not ask
        for w in workers:
            w.send(pm.update(w.address, m.STUB, 4, 5, np.ones(3, np.float32)))
        req = server.receive(2000)
        assert req.src == stub.address(0) and pm.parse_slice_update(req, 3)[0] == 2
        server.send(pm.values_reply(req, m.kRUpdate, 6, np.zeros(3, np.float32)))
        assert [w.receive(2000).type for w in workers] == [m.kRUpdate, m.kRUpdate]
    finally:
        stub.stop()
        for w in workers:
            w.send(m.Msg(w.address, m.STUB, m.kStop))
        server.send(m.Msg(server.address, m.STUB, m.kStop))
        thread.join(5)
        for d in workers + [server]:
            d.close()
        router.close()
        ctx.term()
    assert not thread.is_alive()
