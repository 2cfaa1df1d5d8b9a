"""NeuralNet: a NetProto turned into set-up layers for one phase (SINGA's NeuralNet::Create, src/neuralnet/neuralnet.cc).

Steps: phase filter (include/exclude) → unrolling (`<i>#` names, also for unroll_len 1, so
param names are SINGA's `0#w1`) → share_from → split layers → partition connection layers and
`L@k` copies (several partitions, `singa.net.partition`) → topological sort (`singa.net.graph`) → create
and set up layers, number params. Test and validation nets share the train net's param values.
"""
import collections
import json
import logging

from singa import layers  # noqa: F401  (registers every layer type)
from singa.device import CPU, is_host
from singa.device.footprint import BeyondMemory, format_bytes
from singa.errors import ConfigError
from singa.layers.base import Layer, create_layer, layer_class, on_host, set_up
from singa.layers import kernels
from singa.naming import plain, unrolled
from singa.net import grad_memory, graph, partition
from singa.net.numerics import rng_state, set_rng_state
from singa.net.phase import in_phase
from singa.proto import job_pb2

log = logging.getLogger("singa")


class NeuralNet:
    """Layers of one phase in topological order, with their params.

    `layers`: list of Layer; `srclayers[name]`: the layer's sources; `params`: every Param in
    layer order (owners and sharers); `owner_params`: the params that own their values.
    """

    def __init__(self, net_conf, phase, rng, share_from=None, num_partitions=1, first_id=0,
                 device=CPU, share_grads=False):
        """`share_from`: a net whose owner params this one uses (by name): the train net for
        test/validation nets, group 0's net for another group's. Param ids start at
        `first_id` so that they are unique within a process. With `num_partitions` K > 1 the
        net holds every partition's layers `L@k` (each worker runs `partition(k)`); `rng` may
        then be a list of K generators, one per partition. The layers compute on `device`
        (or partition k's on `device[k]`, a list of K), except the input and parser layers
        (`base.on_host`), which compute on the host and mirror their data to a GPU for the
        layers there. `share_grads` (a kBP train net): the gradient blobs of each partition
        share memory by when they are live in a step (`grad_memory`)."""
        self.phase = phase
        self.devices = list(device) if isinstance(device, (list, tuple)) else \
            [device] * num_partitions
        self.device = self.devices[0]
        if any(d.gpu is None for d in self.devices):    # the CPU's engine, said once early
            kernels.onednn_engine()
        self.rngs = list(rng) if isinstance(rng, (list, tuple)) else [rng] * num_partitions
        self.rng = self.rngs[0]
        confs = filter_phase(net_conf, phase, num_partitions)
        graph.sort(confs)   # names and sources checked before unrolling looks sources up
        confs = unroll(confs)
        resolve_share_from(confs)
        confs = add_split_layers(confs)
        if num_partitions > 1:
            confs = partition.replicate(
                partition.add_connection_layers(confs, num_partitions), num_partitions)
        confs = graph.sort(confs)
        self.layers = []
        self.by_name = {}
        self.srclayers = {}
        for conf in confs:
            layer = create_layer(conf)
            layer.rng = self.rngs[conf.partition_id]
            layer.forward_only = not phase & job_pb2.kTrain
            layer.grads_planned = share_grads
            where = self.devices[conf.partition_id]
            if not on_host(layer) or where.gpu is None:     # host layers: also on SHAPES
                layer.device = where
            self.layers.append(layer)
            self.by_name[conf.name] = layer
        # Set up in order once all exist: RBMVis names RBMHid, set up after it, as a source.
        # The arrays go to their partition's device whichever thread builds the net.
        for layer in self.layers:
            srcs = self.srclayers[layer.name] = [self.by_name[s] for s in layer.conf.srclayers]
            with self.devices[layer.partition_id].selected():
                try:
                    set_up(layer, srcs)
                except MemoryError as e:   # numpy's message (or SHAPES's) names shape and bytes
                    raise BeyondMemory(f"layer '{layer.name}': {e}") from None
                except ValueError as e:    # numpy's, for more bytes than an address holds
                    if not str(e).startswith("array is too big"):
                        raise
                    raise BeyondMemory(f"layer '{layer.name}': an array of its shapes would need "
                                       f"more bytes than a 64-bit address can hold") from None
        self._mirror_host_layers()
        self._chain_by_rows()
        if num_partitions > 1:
            self.connect_partitions()
        self.params = [p for layer in self.layers for p in layer.params]
        for i, p in enumerate(self.params, first_id):
            p.id = p.owner = i
        self.next_id = first_id + len(self.params)
        by_name = {(p.name, layer.partition_id): p for layer in self.layers for p in layer.params}
        for layer in self.layers:
            for p, pconf in zip(layer.params, layer.conf.param):
                if pconf.share_from:
                    # unrolled copies share data and gradient; user share_from shares data only
                    p.share_data_from(by_name[(pconf.share_from, layer.partition_id)],
                                      grad=layer.unroll_index > 0)
        for layer in self.layers:   # dim-0 copies use partition 0's values; pieces are their own
            if layer.partition_id > 0:
                for p in layer.params:
                    if p.partition is None:
                        p.share_data_from(by_name[(p.name, 0)])
        if share_from is not None:
            self.share_params_from(share_from)
        self.owner_params = [p for p in self.params if p.is_owner]
        for layer in self.layers:
            if getattr(layer, "dynamic_srclayer", None):
                self.dynamic_srclayer(layer)
        if share_grads:
            for k in range(num_partitions):
                apart, shared = grad_memory.share(self.partition(k) if num_partitions > 1
                                                  else self)
                log.info("Train net%s: its gradient blobs share memory by when they are "
                         "live, %s in %s", f" partition {k}" if num_partitions > 1 else "",
                         format_bytes(apart), format_bytes(shared))

    def _mirror_host_layers(self):
        """Give each host layer read by a layer on a GPU (its partition's) a copy of its data
        and labels there (`Layer.make_mirror`)."""
        read_on_host = collections.defaultdict(set)     # name: whether each reader is a host layer
        for layer in self.layers:
            for s in self.srclayers[layer.name]:
                read_on_host[s.name].add(on_host(layer))
        for layer in self.layers:
            where = self.devices[layer.partition_id]
            if where.gpu is not None and on_host(layer) and False in read_on_host[layer.name] \
                    and is_host(layer.data):
                with where.selected():
                    layer.make_mirror(where, host_read=True in read_on_host[layer.name])

    def _chain_by_rows(self):
        """Give each convolution on the host (`then`) the chain of layers after it that each
        read only the one before and compute by samples (`Layer.by_rows`): a convolution's
        chunks compute their rows too. A layer with several such readers chains its first."""
        readers = collections.defaultdict(list)
        for layer in self.layers:
            srcs = self.srclayers[layer.name]
            if len(srcs) == 1 and type(layer).by_rows is not Layer.by_rows:
                readers[srcs[0].name].append(layer)
        for layer in self.layers:
            if getattr(layer, "then", None) != [] or not is_host(layer.data):
                continue
            last = layer
            while readers[last.name]:
                last = readers[last.name][0]
                layer.then.append((last, self.srclayers[last.name]))

    def connect_partitions(self):
        """Tell each bridge layer its peer, and each Slice which destination reads which part
        (the partition its data ends up in)."""
        dsts = collections.defaultdict(list)
        for layer in self.layers:
            for src in self.srclayers[layer.name]:
                dsts[src.name].append(layer)
                if layer.conf.type == job_pb2.kBridgeDst:
                    layer.peer, src.peer = src, layer
        for layer in self.layers:
            if layer.conf.type == job_pb2.kSlice:
                layer.order_destinations(
                    {d: d.peer.partition_id if d.conf.type == job_pb2.kBridgeSrc
                     else d.partition_id for d in dsts[layer.name]})

    def partition(self, k):
        """The net worker k of the group runs: the layers of partition k (and their params);
        sources in other partitions are reached through bridge layers."""
        view = object.__new__(NeuralNet)
        view.__dict__.update(self.__dict__)
        view.rng, view.graph, view.device = self.rngs[k], self, self.devices[k]
        view.layers = [layer for layer in self.layers if layer.partition_id == k]
        view.params = [p for layer in view.layers for p in layer.params]
        view.owner_params = [p for p in view.params if p.is_owner]
        return view

    def dynamic_srclayer(self, layer):
        """The layer an RNNDummy `layer` reads in a sampling test step: `<i>#<dynamic_srclayer>`."""
        src = self.by_name.get(layer.dynamic_srclayer)
        if src is None:
            raise ConfigError(f"layer '{layer.name}': rnn_dummy_conf.dynamic_srclayer "
                              f"'{layer.conf.rnn_dummy_conf.dynamic_srclayer}' names no layer of "
                              f"the net")
        return src

    def last_unroll_layer(self, layer):
        """The unrolled copy of `layer` with the highest unroll_index (SINGA's NeuralNet::last_unroll_layer)."""
        name = plain(layer.name)
        return max((x for x in self.layers if plain(x.name) == name),
                   key=lambda x: x.unroll_index)

    def share_params_from(self, other):
        """Use `other`'s param values (matched by name and partition); `other`'s params stay
        the owners.

        Sharers are matched too: a `share_from` param must follow `other`'s values, not the
        stale array of this net's own owner."""
        theirs = {(p.name, layer.partition_id): p for layer in other.layers for p in layer.params}
        for layer in self.layers:
            for p in layer.params:
                src = theirs.get((p.name, layer.partition_id))
                if src is not None:
                    p.share_data_from(src)

    def forward(self, flag):
        for layer in self.layers:
            layer.compute_feature(flag, self.srclayers[layer.name])

    def close(self):
        """Release what its layers hold open (stores, reading threads): the net is done."""
        for layer in self.layers:
            layer.close()
        plan = getattr(self, "whole_pass", None)    # an evaluation net's (`evaluation.eval_net`)
        if plan is not None and plan.tail is not None:
            plan.tail.close()

    def metrics(self, flag):
        """{layer name: {metric: value}} of the layers with metrics (`Layer.metrics`, which
        resets them), in layer order."""
        out = {}
        for layer in self.layers:
            values = layer.metrics(flag)
            if values:
                out[layer.name] = values
        return out

    def to_json(self):
        """SINGA's graph file (visualization/train_net.json): node-link JSON of layers and shapes."""
        index = {layer.name: i for i, layer in enumerate(self.layers)}
        nodes = [{"id": layer.name, "shape": "box", "color": "white",
                  "label": f"{layer.name} -- shape: "
                           + " ".join(str(d) for d in getattr(layer.data, "shape", ()))}
                 for layer in self.layers]
        links = [{"source": index[src.name], "target": index[layer.name], "label": ""}
                 for layer in self.layers for src in self.srclayers[layer.name]]
        return json.dumps({"directed": 1, "nodes": nodes, "links": links}, indent=1)

    def input_layers(self):
        """The layers that read a data source (they have a `position`)."""
        return [layer for layer in self.layers if hasattr(layer, "position")]

    def streams(self):
        """Where the net's random and data streams stand, for a snapshot: (its RNG's state as
        `numerics.rng_state` gives it, {input layer name: (reader offset, random_skip done)})."""
        return rng_state(self.rng), {layer.name: layer.position() for layer in self.input_layers()}

    def restore_streams(self, rng, readers):
        """Continue from what `streams` reported (an RNG state or None; reader positions by
        input layer name). From a snapshot of another partitioning an input partition takes
        the unpartitioned layer's position or partition 0's: dim-0 input partitions read every
        whole batch (keeping their rows), so they all stand where the one layer stood."""
        if rng is not None:
            set_rng_state(self.rng, rng)
        for layer in self.input_layers():
            base = layer.name.partition("@")[0]
            for key in (layer.name, base, f"{base}@0"):
                if key in readers:
                    layer.seek(*readers[key])
                    break


def filter_phase(net_conf, phase, num_partitions=1):
    """Layer confs kept in `phase` (exclude removes, include keeps only the listed phases),
    marked as partition 0 of `num_partitions` (`partition.replicate` makes the others)."""
    kept = []
    for conf in net_conf.layer:
        if not in_phase(conf, phase):
            continue
        c = job_pb2.LayerProto()
        c.CopyFrom(conf)
        if not c.HasField("unroll_len"):
            c.unroll_len = net_conf.unroll_len
        if not c.HasField("partition_dim"):
            c.partition_dim = net_conf.partition_dim
        c.partition_id = 0
        c.num_partitions = num_partitions
        kept.append(c)
    return kept


def unroll(confs):
    """Copy each layer `unroll_len` times as `<i>#<name>`, params `<i>#<param>`."""
    by_name = {c.name: c for c in confs}
    out = []
    for conf in confs:
        n = conf.unroll_len
        for i in range(n):
            c = job_pb2.LayerProto()
            c.CopyFrom(conf)
            c.name = unrolled(conf.name, i)
            c.unroll_index = i
            del c.srclayers[:]
            c.ClearField("unroll_len")
            del c.unroll_conn_type[:]
            del c.shift[:]
            for p in c.param:
                if i > 0:
                    p.share_from = unrolled(p.name)
                p.name = unrolled(p.name, i)
            for k, src in enumerate(conf.srclayers):
                m = by_name[src].unroll_len
                ctype = (conf.unroll_conn_type[k] if k < len(conf.unroll_conn_type)
                         else job_pb2.kUnrollOneToOne)
                shift = conf.shift[k] if k < len(conf.shift) else 0
                if ctype == job_pb2.kUnrollOneToAll:
                    c.srclayers.extend(unrolled(src, j) for j in range(m))
                elif ctype == job_pb2.kUnrollFirstToLast:
                    if i == 0:
                        c.srclayers.append(unrolled(src, m - 1))
                elif ctype == job_pb2.kUnrollOneToOne:
                    if i - shift >= 0:
                        c.srclayers.append(unrolled(src, i - shift))
                else:
                    raise ConfigError(f"layer '{conf.name}': unroll_conn_type "
                                      f"{job_pb2.UnrollConnType.Name(ctype)} is not implemented")
            if conf.type == job_pb2.kGRU and i > 0:
                c.srclayers.append(unrolled(conf.name, i - 1))
            out.append(c)
    return out


def resolve_share_from(confs):
    """Point user `share_from` at the unrolled name (`w1` → `0#w1`).

    SINGA 0.2/0.3 leave a user's `share_from` unprefixed and then abort (`can't find
    share_from`), which breaks its own rbm confs (docs/differences.md); we resolve it instead.
    """
    names = {p.name for c in confs for p in c.param}
    for c in confs:
        for p in c.param:
            if not p.share_from or p.share_from in names:
                continue
            prefixed = unrolled(p.share_from, c.unroll_index)
            if prefixed in names:
                p.share_from = prefixed
            elif unrolled(p.share_from) in names:
                p.share_from = unrolled(p.share_from)
            else:
                raise ConfigError(f"layer '{c.name}': param '{p.name}' has share_from "
                                  f"'{p.share_from}', which names no param")


def add_split_layers(confs):
    """Insert `split(<L>)` after each non-input layer that feeds several layers."""
    dsts = collections.defaultdict(list)
    for c in confs:
        for s in c.srclayers:
            dsts[s].append(c.name)
    by_name = {c.name: c for c in confs}
    out = []
    for c in confs:
        out.append(c)
        if len(dsts[c.name]) > 1 and not getattr(layer_class(c), "one_to_many", False):
            split = job_pb2.LayerProto(name=f"split({c.name})", type=job_pb2.kSplit)
            split.srclayers.append(c.name)
            split.split_conf.num_splits = len(dsts[c.name])
            split.partition_dim = c.partition_dim
            split.unroll_index = c.unroll_index
            out.append(split)
            for d in dsts[c.name]:
                srcs = by_name[d].srclayers
                for k, s in enumerate(srcs):
                    if s == c.name:
                        srcs[k] = split.name
    return out
