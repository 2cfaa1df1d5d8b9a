"""The layer graph's rules, in one place: unique names, known srclayers, and the order layers run in (SINGA's Graph::Sort, src/utils/graph.cc).

`singa.job.config` checks each phase's net of a job conf with them (its errors name the file and
line); `singa.net.neuralnet` sorts the net it builds (unrolled, with split layers) by the same rule.
"""
import collections

from singa.errors import ConfigError


def sort(layers, net=None, everywhere=(), path=None, line=None):
    """`layers` (LayerProtos) in Kahn's order: breadth-first from the layers without sources, in
    conf order. A layer with several sources, one of which is also its destination (RBMVis <->
    RBMHid), waits only for its other sources; SINGA waits for its first source, which refuses
    RBMVis's `srclayers: "hid" srclayers: "data"` (the data layer comes first in SINGA's confs).

    ConfigError on a repeated name, a srclayer naming no layer and a cycle. `net` names the phase
    (`kTrain`) and `everywhere` the layers of every phase, to say a srclayer is in another one.
    `line(k, field)` is the line of field "name" or "srclayers" of `layers[k]` in conf file
    `path`: errors then start with `path:line: `.
    """
    def fail(k, field, what):
        raise ConfigError(f"{path}:{line(k, field)}: {what}" if line else what)

    index = {}
    for k, layer in enumerate(layers):
        if layer.name in index:
            also = f" (also at line {line(index[layer.name], 'name')})" if line else ""
            fail(k, "name", f"duplicate layer name '{layer.name}'"
                            f"{f' in the {net} net' if net else ''}{also}")
        index[layer.name] = k
    for k, layer in enumerate(layers):
        for src in layer.srclayers:
            if src not in index:
                where = (f"is not in the {net} net" if src in everywhere else "names no layer")
                fail(k, "srclayers", f"layer '{layer.name}': srclayer '{src}' {where}")
    waits = [_waits_for(layer, layers, index) for layer in layers]
    dsts = collections.defaultdict(list)
    for k, srcs in enumerate(waits):
        for s in srcs:
            dsts[s].append(k)
    pending = [len(srcs) for srcs in waits]
    queue = collections.deque(k for k, n in enumerate(pending) if n == 0)
    order = []
    while queue:
        k = queue.popleft()
        order.append(layers[k])
        for d in dsts[k]:
            pending[d] -= 1
            if pending[d] == 0:
                queue.append(d)
    if len(order) < len(layers):
        cycle = _cycle(waits, pending)
        fail(cycle[0], "name", "srclayers form a cycle: "
                               + " -> ".join(layers[k].name for k in cycle + cycle[:1]))
    return order


def _waits_for(layer, layers, index):
    """Indices of the sources `layer` waits for: all of them, less those with a two-way edge
    when it has several."""
    srcs = {index[s] for s in layer.srclayers}
    if len(srcs) > 1:
        srcs = {s for s in srcs if layer.name not in layers[s].srclayers}
    return srcs


def _cycle(waits, pending):
    """A cycle among the unsorted layers, from the one written first; each is followed by the
    layer it feeds."""
    k, seen = next(k for k, n in enumerate(pending) if n), []
    while k not in seen:
        seen.append(k)
        k = min(s for s in waits[k] if pending[s])
    cycle = seen[seen.index(k):][::-1]
    first = cycle.index(min(cycle))
    return cycle[first:] + cycle[:first]
