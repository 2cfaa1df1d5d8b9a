"""A kBP training step on a GPU with its layers' passes as CUDA graphs.

At SINGA's batch sizes a step on a GPU takes the host's time, not the GPU's: the host queues
some 40-60 device operations a step, each tens of µs of Python and CuPy. A run of consecutive
passes (forward or backward) of layers that declare themselves `capturable` (their passes
only queue device work on buffers they keep: no host values read or written, no random
draws, no Python state that changes from step to step, but for their `prepare`, which runs
before each launch) is captured once, after WARMUP steps run op by op (kernels compiled,
scratch buffers made), and then launched as one CUDA graph a step. The passes of other
layers (input layers reading records, random draws, layers on the host) run as before,
between the graphs. A graph replays the operations it captured with the arguments they had,
in the order they were queued: a step gives the bits of the same step queued op by op.

A capture is made on a stream of its own, from a memory pool of its own (the graph's
temporaries stay its own while it lives), and launched on the current stream, CUDA's legacy
default stream, where it keeps its place among the servers' updates. Before each launch the
arrays the passes read and write are checked to be those captured (a new array: captured
again). A capture or a launch that fails (an operation a capture cannot hold) is logged
once, and the worker's step runs op by op from then on.
"""
import logging

from singa.errors import SingaError
from singa.proto import job_pb2

log = logging.getLogger("singa")

#: steps run op by op before the passes are captured
WARMUP = 2

FORWARD, BACKWARD = job_pb2.kTrain | job_pb2.kForward, job_pb2.kTrain | job_pb2.kBackward


class Segment:
    """Consecutive passes of a net: (layer, forward?) each; `graph` a run of capturable
    layers' passes, launched as one CUDA graph once captured."""

    def __init__(self, passes, graph):
        self.passes, self.graph = passes, graph
        self.captured = None        # (the arrays' ids it was captured with, the CUDA graph)

    def run(self, net):
        """Queue the passes op by op."""
        for layer, forward in self.passes:
            if forward:
                layer.compute_feature(FORWARD, net.srclayers[layer.name])
            else:
                layer.compute_gradient(BACKWARD, net.srclayers[layer.name])

    def prepare(self, net):
        """The host's work of the passes, which their graph does not replay."""
        for layer, forward in self.passes:
            layer.prepare(FORWARD if forward else BACKWARD, net.srclayers[layer.name])

    def arrays(self, net):
        """The ids of the arrays its passes read and write: each layer's blobs and params,
        and what it reads of its sources."""
        ids = []
        for layer, _ in self.passes:
            ids += [id(layer.data), id(layer.grad)]
            ids += [id(a) for p in layer.params for a in (p.data, p.grad)]
            for src in net.srclayers[layer.name]:
                ids += [id(src.data_for(layer)), id(src.grad_for(layer))]
        return tuple(ids)


class StepGraphs:
    """The passes of a train net's step, forward then backward, in segments: on a GPU
    (`capture`) each maximal run of capturable layers' passes is one segment, captured as a
    CUDA graph; otherwise each pass is a segment of its own."""

    def __init__(self, net, device, capture):
        self.net, self.xp = net, device.xp
        passes = [(layer, True) for layer in net.layers] + \
                 [(layer, False) for layer in reversed(net.layers)]
        self.segments = []
        for layer, forward in passes:
            graph = capture and vars(type(layer)).get("capturable", False)
            last = self.segments[-1] if self.segments else None
            if graph and last is not None and last.graph:
                last.passes.append((layer, forward))
            else:
                self.segments.append(Segment([(layer, forward)], graph))
        self.capture = capture
        self.steps = 0      # steps run (the worker counts them)
        self.stream = self.pool = None

    def run(self, segment):
        """Queue `segment`'s passes: op by op, or as its CUDA graph (captured first where it
        has none, or none of the arrays it now has)."""
        if not (self.capture and segment.graph and self.steps >= WARMUP):
            segment.run(self.net)
            return
        arrays = segment.arrays(self.net)
        fresh = segment.captured is None or segment.captured[0] != arrays
        if not fresh:       # a capture runs the passes' host work itself
            segment.prepare(self.net)
        try:
            if fresh:
                segment.captured = (arrays, self._captured(segment))
            segment.captured[1].launch()
        except SingaError:      # the passes' own (a label out of range): the job's error
            raise
        except Exception as e:      # e.g. an operation that waits for the GPU
            layers = ", ".join(sorted({layer.name for layer, _ in segment.passes}))
            log.warning("the passes of layers %s could not be captured as a CUDA graph "
                        "(%s: %s); the step runs op by op", layers, type(e).__name__, e)
            self.capture = False
            segment.run(self.net)

    def _captured(self, segment):
        """`segment`'s passes captured as a CUDA graph (nothing computed)."""
        xp = self.xp
        if self.stream is None:
            self.stream = xp.cuda.Stream(non_blocking=True)
            self.pool = xp.cuda.MemoryPool()
        with xp.cuda.using_allocator(self.pool.malloc), self.stream:
            self.stream.begin_capture()
            try:
                segment.run(self.net)
            finally:
                graph = self.stream.end_capture()
        return graph
