"""Connection layers: Split, Slice, Concate, BridgeSrc, BridgeDst (src/neuralnet/connection_layer/); they route blobs between other layers."""
import numpy as np

from singa.errors import ConfigError
from singa.layers.base import Layer, register
from singa.proto import job_pb2

__all__ = ["SplitLayer", "SliceLayer", "ConcateLayer", "BridgeSrcLayer", "BridgeDstLayer"]


class _PerDestination(Layer):
    """A layer whose destinations get indices 0, 1, ... in the order they first ask for a blob."""

    feature_parts = True

    def _index(self, dst, limit, what):
        idx = self._dst.setdefault(dst, len(self._dst))
        if idx >= limit:
            raise ConfigError(f"layer '{self.name}' has {limit} {what} but more destinations "
                              f"(the extra one is '{getattr(dst, 'name', dst)}')")
        return idx


@register(job_pb2.kSplit)
class SplitLayer(_PerDestination):
    """data aliases the source; destination d writes its own gradient g_d; gx = Σ_d g_d.

    `grad` is None: each destination's blob is `grad_for(dst)` (one of `grads`).
    """

    capturable = True

    def setup(self, srclayers):
        self.data = srclayers[0].data_for(self)
        self.grads = [self.new_grad() for _ in range(self.conf.split_conf.num_splits)]
        self._dst = {}

    def compute_feature(self, flag, srclayers):
        self.data = srclayers[0].data_for(self)

    def grad_for(self, dst):
        return self.grads[self._index(dst, len(self.grads), "num_splits")]

    def compute_gradient(self, flag, srclayers):
        gsrc = srclayers[0].grad_for(self)
        if gsrc is None:
            return
        used = self.grads[:len(self._dst)]
        if len(used) < 2:
            np.copyto(gsrc, used[0] if used else 0)
            return
        np.add(used[0], used[1], out=gsrc)
        for g in used[2:]:
            gsrc += g


@register(job_pb2.kSlice)
class SliceLayer(_PerDestination):
    """Destination k reads part k of the source cut into `num_slices` equal parts on `slice_dim`;
    backward copies each part's gradient back into place.

    `data` / `grad` are None: the parts are `data_for(dst)` / `grad_for(dst)`.
    """

    capturable = True

    def setup(self, srclayers):
        src = srclayers[0].data_for(self)
        conf = self.conf.slice_conf
        self.axis, k = conf.slice_dim, conf.num_slices
        if not 0 <= self.axis < src.ndim or k <= 0 or src.shape[self.axis] % k:
            raise ConfigError(f"layer '{self.name}': cannot cut source shape {src.shape} into "
                              f"{k} slices on dim {self.axis}")
        shape = list(src.shape)
        shape[self.axis] //= k
        self.datas = [self.xp.zeros(shape, np.float32) for _ in range(k)]
        self.grads = [self.new_grad(shape) for _ in range(k)]
        self._dst = {}

    def order_destinations(self, parts):
        """Destination d reads part `parts[d]` (in a partitioned net: the partition it feeds)."""
        self._dst = dict(parts)

    def data_for(self, dst):
        return self.datas[self._index(dst, len(self.datas), "num_slices")]

    def grad_for(self, dst):
        return self.grads[self._index(dst, len(self.grads), "num_slices")]

    def compute_feature(self, flag, srclayers):
        parts = np.split(srclayers[0].data_for(self), len(self.datas), axis=self.axis)
        for blob, part in zip(self.datas, parts):
            np.copyto(blob, part)

    def compute_gradient(self, flag, srclayers):
        gsrc = srclayers[0].grad_for(self)
        if gsrc is None:
            return
        for part, g in zip(np.split(gsrc, len(self.grads), axis=self.axis), self.grads):
            np.copyto(part, g)


@register(job_pb2.kConcate)
class ConcateLayer(Layer):
    """data = the sources concatenated on `concate_dim`; backward hands each source its part."""

    capturable = True

    feature_parts = True

    def setup(self, srclayers):
        self.axis = self.conf.concate_conf.concate_dim
        shapes = [s.data_for(self).shape for s in srclayers]
        first = list(shapes[0])
        if not 0 <= self.axis < len(first):
            raise ConfigError(f"layer '{self.name}': concate_dim {self.axis} does not exist "
                              f"in source shape {shapes[0]}")
        for src, shape in zip(srclayers, shapes):
            rest = list(shape)
            rest[self.axis] = first[self.axis]
            if rest != first:
                raise ConfigError(f"layer '{self.name}': source '{src.name}' of shape {shape} "
                                  f"does not concatenate with shape {shapes[0]} on dim {self.axis}")
        first[self.axis] = sum(s[self.axis] for s in shapes)
        self.data = self.xp.zeros(first, np.float32)
        self.grad = self.new_grad()
        self._cuts = np.cumsum([s[self.axis] for s in shapes])[:-1].tolist()

    def compute_feature(self, flag, srclayers):
        np.concatenate([s.data_for(self) for s in srclayers], axis=self.axis, out=self.data)

    def compute_gradient(self, flag, srclayers):
        for src, part in zip(srclayers, np.split(self.grad, self._cuts, axis=self.axis)):
            gsrc = src.grad_for(self)
            if gsrc is not None:
                np.copyto(gsrc, part)


class _Bridge(Layer):
    """One end of an edge between two partitions; `peer` is the other end (set by the net)
    and `channel` the worker's messaging to other workers (`send(layer, peer, kind, array)`,
    `receive(layer, kind, out)`), set by the worker that runs the layer."""

    feature_parts = True

    peer = None
    channel = None


@register(job_pb2.kBridgeSrc)
class BridgeSrcLayer(_Bridge):
    """Forward sends the source's data to `peer` (a BridgeDst in another partition); backward
    waits for the peer's gradient and writes it as the source's: y = x, gx = g."""

    def setup(self, srclayers):
        self.data = srclayers[0].data_for(self)
        self.grad = None

    def compute_feature(self, flag, srclayers):
        self.data = srclayers[0].data_for(self)
        self.channel.send(self, self.peer, job_pb2.kForward, self.data)

    def compute_gradient(self, flag, srclayers):
        gsrc = srclayers[0].grad_for(self)
        if gsrc is not None:
            self.channel.receive(self, job_pb2.kBackward, gsrc)


@register(job_pb2.kBridgeDst)
class BridgeDstLayer(_Bridge):
    """Forward waits for the data `peer` (a BridgeSrc in another partition) sends; backward
    sends its gradient back: y = x, gx = g."""

    def setup(self, srclayers):
        self.data = self.xp.zeros(srclayers[0].data_for(self).shape, np.float32)
        self.grad = self.new_grad()

    def compute_feature(self, flag, srclayers):
        self.channel.receive(self, job_pb2.kForward, self.data)

    def compute_gradient(self, flag, srclayers):
        self.channel.send(self, self.peer, job_pb2.kBackward, self.grad)
