"""ParamClient: a worker's end of the param protocol (SINGA's Worker::Put / Get / Update and the
handling of their answers, src/worker.cc).

Requests go to the stub: Put (values, and updater state on a resume), Get, Update (the
gradients of a bucket of params, sent once it holds `bucket_cap` floats or by
`send_updates`) and State (the updater state, for a snapshot). RPut / RGet / RUpdate answers
bring the new version and, unless the frames alias the param's own array (a server in this
process), its values; an RState brings the updater state into `states`. A param's
`last_version` is the version it had when last asked for: the worker waits until an answer
has brought a newer one before using it again.
"""
import logging

from singa.comm import msg as m
from singa.comm import param_msg as pm

log = logging.getLogger("singa")

ANSWERS = (m.kRPut, m.kRGet, m.kRUpdate, m.kRState)


class ParamClient:
    """The requests of the executor at `address` (named `who` in log lines) through `dealer`,
    for `params`, and the answers to them."""

    def __init__(self, address, dealer, params, bucket_cap, who):
        self.address, self.dealer, self.who = address, dealer, who
        self.by_id = {p.id: p for p in params}
        self.bucket, self.bucket_step, self.bucket_floats = [], None, 0    # gradients to send
        self.bucket_cap = bucket_cap
        self.states = {}        # owner param id -> (lr index, updater buffers), for a snapshot
        self.put_buffers = {}   # owner param id -> (updater buffers put, their files)
        self.aliases = {}       # param id -> (an answer's frame, the p.data it aliases)

    def put(self, p, buffers=(), lr_index=-1, files=""):
        """Send `p`'s values (and updater `buffers`, read from `files`) to its servers."""
        if buffers:
            self.put_buffers[p.owner] = (len(buffers), files)
        p.last_version = p.version - 1
        self.dealer.send(pm.put(self.address, m.STUB, p.owner, p.version, p.lr_scale, p.wd_scale,
                                lr_index, p.data, buffers))

    def get(self, step, p):
        """Ask for `p`'s values of version `step` unless it has them."""
        if p.version < step:
            p.last_version = p.version
            self.dealer.send(pm.request(self.address, m.STUB, m.kGet, p.owner, step))

    def ask_states(self, params, step):
        """Ask for the updater state of `params` (owners) at `step`: `states` gets them."""
        self.states = {}
        for p in params:
            self.dealer.send(pm.request(self.address, m.STUB, m.kState, p.owner, step))

    def update(self, step, p):
        """Put `p`'s gradient of `step` in the bucket, sent once it holds `bucket_cap` floats
        or by `send_updates`."""
        if p.updated_by_layer:      # the layer's own values: the servers keep their first
            return
        if p.partition is not None:
            # Each of the K partitions' losses is a mean over its K-th of the batch, so a piece
            # gets K times the whole batch's gradient (a dim-0 param is averaged over its K
            # copies by the server). SINGA leaves it K times larger.
            p.grad *= 1 / p.partition[2]
        p.last_version = p.version
        self.bucket.append(p)
        self.bucket_step = step
        self.bucket_floats += p.grad.size
        if self.bucket_floats >= self.bucket_cap:
            self.send_updates()

    def send_updates(self):
        """Send the gradients in the bucket to the servers, in one Update."""
        if self.bucket:
            self.dealer.send(pm.update(self.address, m.STUB, self.bucket_step,
                                       [p.owner for p in self.bucket],
                                       [p.grad for p in self.bucket]))
            self.bucket, self.bucket_floats = [], 0

    def answer(self, msg):
        """Take an answer (RPut, RGet, RUpdate, RState) to this client's requests."""
        t = msg.type
        for pid, slices in pm.answered(msg, None if t == m.kRState else 1):
            p = self.by_id.get(pid)
            if p is None:
                log.warning("%s: dropped the answer for param %d, which it does not have",
                            self.who, pid)
                continue
            if t == m.kRState:
                self.states[p.owner] = pm.read_state(slices, p.shape, f"param '{p.name}'")
                continue
            if t == m.kRPut:
                if not p.is_owner:     # the owner's values were put: a copy's come by its Get
                    continue
                self.check_put(p, slices)
            else:
                self.read_values(p, slices)
            p.version = msg.trgt_version

    def read_values(self, p, slices):
        """Write answered values into `p`: nothing where its one slice's frame is the array
        found to be p's own last time (a server in this process answers with the same view of
        p's values every step: checked once, not at every answer)."""
        frame = slices[0][1][0] if len(slices) == 1 else None
        known = self.aliases.get(p.id)
        if known is not None and known[0] is frame and known[1] is p.data:
            return
        flat = p.data.reshape(-1)
        pm.read_values(slices, flat, f"param '{p.name}'")
        if frame is not None and m.same_memory(m.frame_array(frame), flat):
            self.aliases[p.id] = (frame, p.data)

    def check_put(self, p, slices):
        """Warn when the servers dropped the updater buffers put for `p` (a snapshot of
        another updater): they say so in their kRPut."""
        put = self.put_buffers.pop(p.owner, None)
        if put is None:
            return
        kept, dropped = pm.read_put_reply(slices)
        if dropped:
            log.warning("Param %s: %s holds %d updater buffers, the updater keeps %d: its "
                        "state starts afresh", p.name, put[1], put[0], kept)
