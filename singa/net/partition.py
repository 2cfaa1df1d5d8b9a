"""A layer graph cut over the workers of a group (SINGA's NeuralNet::AddPartitionConnectionLayers
and NeuralNet::CreateGraph, src/neuralnet/neuralnet.cc).

Per edge src -> dst with partition dims ps, pd: a dst on dim 1 that reads all of its source's
neurons (InnerProduct, Convolution) gets `split(S)` -> `concate(split(S))` (concate_dim ps);
otherwise differing dims get `slice(S)` (slice_dim pd) -> `concate(slice(S))` (concate_dim ps).
Then every layer L becomes `L@k` for partition k; a Concate reads every partition of its
source, other layers their own; an edge between partitions goes through
`bridge_src(<src>-><dst>)` (src's partition) and `bridge_dst(<src>-><dst>)` (dst's).
"""
from singa.errors import ConfigError
from singa.layers.base import layer_class, type_name
from singa.naming import plain
from singa.proto import job_pb2


def add_connection_layers(confs, nparts):
    """Step 6: insert Split/Slice + Concate where an edge's partition dims differ. A layer's
    class tells whether it can run on a part of its features (`feature_parts`; ConfigError
    if one on dim 1 cannot) and whether it needs every neuron of its source (`reads_all`,
    SINGA's kOneToAll)."""
    by_name = {c.name: c for c in confs}
    out, added = [], set()
    for c in confs:
        cls = layer_class(c)
        if c.partition_dim == 1 and not getattr(cls, "feature_parts", False):
            raise ConfigError(f"layer '{plain(c.name)}' ({type_name(c)}) cannot "
                              f"compute on a part of its features (partition_dim 1 over "
                              f"{nparts} workers); give it partition_dim: 0")
        for k, s in enumerate(c.srclayers):
            src = by_name[s]
            ps, pd = src.partition_dim, c.partition_dim
            if pd == 1 and getattr(cls, "reads_all", False):
                first = job_pb2.LayerProto(name=f"split({s})", type=job_pb2.kSplit)
                first.split_conf.num_splits = nparts
            elif ps != pd:
                first = job_pb2.LayerProto(name=f"slice({s})", type=job_pb2.kSlice)
                first.slice_conf.slice_dim = pd
                first.slice_conf.num_slices = nparts
            else:
                continue
            if first.name in added:
                raise ConfigError(f"layer '{s}' feeds several layers that need a "
                                  f"'{first.name}' layer; give them one partition_dim")
            added.add(first.name)
            first.srclayers.append(s)
            first.partition_dim, first.unroll_index = ps, src.unroll_index
            concate = job_pb2.LayerProto(name=f"concate({first.name})", type=job_pb2.kConcate)
            concate.srclayers.append(first.name)
            concate.concate_conf.concate_dim = ps
            concate.concate_conf.num_concates = nparts
            concate.partition_dim, concate.unroll_index = pd, c.unroll_index
            out += [first, concate]
            c.srclayers[k] = concate.name
        out.append(c)
    return out


def replicate(confs, nparts):
    """Step 7: `L@k` per partition k, with bridge pairs on the edges between partitions."""
    out = []
    for c in confs:
        for k in range(nparts):
            r = job_pb2.LayerProto()
            r.CopyFrom(c)
            r.name = f"{c.name}@{k}"
            r.partition_id, r.num_partitions = k, nparts
            del r.srclayers[:]
            for s in c.srclayers:
                for i in (range(nparts) if c.type == job_pb2.kConcate else (k,)):
                    r.srclayers.append(f"{s}@{i}" if i == k else
                                       bridge(out, f"{s}@{i}", r, i, c.unroll_index))
            out.append(r)
    return out


def bridge(out, src, dst, src_partition, unroll_index):
    """Append the pair bridge_src(src->dst) / bridge_dst(src->dst); the name dst reads."""
    edge = f"{src}->{dst.name}"
    for kind, name, srcname, k in ((job_pb2.kBridgeSrc, f"bridge_src({edge})", src, src_partition),
                                   (job_pb2.kBridgeDst, f"bridge_dst({edge})",
                                    f"bridge_src({edge})", dst.partition_id)):
        b = job_pb2.LayerProto(name=name, type=kind, partition_id=k,
                               num_partitions=dst.num_partitions, unroll_index=unroll_index)
        b.partition_dim = dst.partition_dim
        b.srclayers.append(srcname)
        out.append(b)
    return f"bridge_dst({edge})"
