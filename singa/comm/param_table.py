"""The stub's param entries (SINGA's ParamEntry, src/stub.cc): per (worker group, owner param)
of a process, the local shares of the param (worker address, param id), how many shares the
group has in all, and the param's slices on the servers.

`ParamTable` turns the workers' requests into the servers' (Put / Get / Update / State per
slice, sent as the stub, `address(grp)`: the gradients of local shares summed first, in the
order of their addresses; a bucket's completed slices one message per server) and the
servers' answers, once every slice of a param has answered, into each share's (one message
per worker and version; `comm.param_msg`). Each returns the messages to send.
"""
from singa.comm import msg as m
from singa.comm import param_msg as pm
from singa.errors import ClusterError


class ParamEntry:
    """One owner param of a worker group in this process: its local shares and its slices."""

    def __init__(self, grp, owner, slices):
        self.grp = grp
        self.owner = owner
        self.shares = []            # (worker address, param id)
        self.num_total = 0          # shares in the whole group
        self.slices = slices        # [(slice id, server address, offset, size)]
        self.index = {sid: i for i, (sid, _, _, _) in enumerate(slices)}
        self.offsets = tuple(o for _, _, o, _ in slices)
        self.size = sum(n for _, _, _, n in slices)
        self.grads = None           # the OrderedSum of the current step's gradients
        self.next_version = -1
        self.answers = {}           # message type -> {slice index: (version, frames)}
        self.state_requests = []    # the workers waiting for the updater state

    def add_share(self, worker_addr, param_id):
        self.shares.append((worker_addr, param_id))

    @property
    def num_local(self):
        return len(self.shares)


class ParamTable:
    """The ParamEntries of a process's stub, `entries` {(grp, owner id): ParamEntry}; the
    stub of process `pid`."""

    def __init__(self, entries, pid):
        self.entries, self.pid = entries, pid
        self.requests = {m.kPut: self.put, m.kGet: self.get, m.kUpdate: self.update,
                         m.kState: self.state}

    def address(self, grp):
        """The stub's address for worker group `grp` (SINGA's Addr(grp, procs_id, kStub)):
        where the servers answer its requests."""
        return m.addr(grp, self.pid, m.kStub)

    def request(self, msg):
        """A worker's Put, Get, Update or State -> the servers' messages."""
        return self.requests[msg.type](msg)

    def entry(self, grp, owner):
        try:
            return self.entries[(grp, owner)]
        except KeyError:
            raise ClusterError(f"no param entry for group {grp}, param {owner}") from None

    def request_entry(self, msg):
        return self.entry(m.addr_grp(msg.src), m.param_id(msg.trgt_val))

    def put(self, msg):
        """A worker's Put -> a Put per slice."""
        e, out = self.request_entry(msg), []
        lr_scale, wd_scale, lr_index, arrays = pm.parse_put(msg, e.size)
        src = self.address(e.grp)
        for sid, server, o, n in e.slices:
            out.append(pm.slice_put(src, server, e.owner, sid, msg.trgt_version, lr_scale,
                                    wd_scale, e.num_total, lr_index, [a[o:o + n] for a in arrays]))
        return out

    def get(self, msg):
        """The first Get of a version -> a Get per slice (the answer goes to every share)."""
        e = self.request_entry(msg)
        if msg.trgt_version <= e.next_version:
            return []
        e.next_version = msg.trgt_version
        return [pm.request(self.address(e.grp), server, m.kGet, e.owner, msg.trgt_version, sid)
                for sid, server, _, _ in e.slices]

    def update(self, msg):
        """A worker's bucket of gradients: each param's, once every local share has sent its
        own, summed; the slices so completed go one message per server."""
        grp = m.addr_grp(msg.src)
        grads = []
        for owner, frame in pm.parse_update(msg):   # checked whole before anything is kept
            e = self.entries.get((grp, owner)) or self.entry(grp, owner)
            grads.append((e, m.frame_array(frame, e.size)))
        out = {}    # server -> [(owner, slice id, num_local, gradient)]
        for e, grad in grads:
            num_local = len(e.shares)
            if num_local > 1:
                if e.grads is None:
                    e.grads = m.OrderedSum(e.size)
                if e.grads.add(msg.src, grad) < num_local:
                    continue
                grad = e.grads.take()
            for sid, server, o, n in e.slices:
                out.setdefault(server, []).append(
                    (e.owner, sid, num_local, grad if n == e.size else grad[o:o + n]))
        return [pm.slice_update(self.address(grp), server, msg.trgt_version, items)
                for server, items in out.items()]

    def state(self, msg):
        """A worker asks for the updater state (a snapshot): a kState per slice; the answer
        goes to the workers that asked."""
        e = self.request_entry(msg)
        e.state_requests.append(msg.src)
        if len(e.state_requests) > 1:
            return []
        return [pm.request(self.address(e.grp), server, m.kState, e.owner, msg.trgt_version,
                           sid) for sid, server, _, _ in e.slices]

    def answer(self, msg):
        """Answers of slices (a kRUpdate's several); once every slice of a param has answered,
        its shares get the answers: every local share for values, the workers that asked for
        the updater state; one message per worker and version."""
        grp = m.addr_grp(msg.dst)
        items = pm.parse_updated(msg) if msg.type == m.kRUpdate else \
            [(m.param_id(msg.trgt_val), m.slice_id(msg.trgt_val), msg.frames)]
        answers = []
        for owner, sid, frames in items:       # checked whole before anything is kept
            e = self.entries.get((grp, owner)) or self.entry(grp, owner)
            i = e.index.get(sid)
            if i is None:
                raise ClusterError(f"answer for unknown slice {sid}")
            answers.append((e, i, frames))
        out = {}    # (worker, version) -> [(param id, offsets, answers)]
        for e, i, frames in answers:
            version = msg.trgt_version
            if len(e.slices) == 1:
                slices = [frames]
            else:
                got = e.answers.setdefault(msg.type, {})
                got[i] = (version, frames)
                if len(got) < len(e.slices):
                    continue
                del e.answers[msg.type]
                version = min(v for v, _ in got.values())
                slices = [got[k][1] for k in range(len(e.slices))]
            shares = e.shares
            if msg.type == m.kRState:
                asked, e.state_requests = set(e.state_requests), []
                shares = [s for s in e.shares if s[0] in asked]
            for worker, pid in shares:
                out.setdefault((worker, version), []).append((pid, e.offsets, slices))
        return [pm.gathered(msg.dst, worker, msg.type, version, params)
                for (worker, version), params in out.items()]
