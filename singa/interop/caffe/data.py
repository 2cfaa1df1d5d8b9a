"""Caffe's data layers → SINGA's input layers: Input, Data (LMDB read as it is, LevelDB as a
kvfile the user writes), ImageData (the "imagelist" store over Caffe's list), HDF5Data, each
with Caffe's transform_param (mean file or values, scale, crop, mirror) as SINGA's store fields
and kImagePreprocess. Functions of the translator `t` (`translate._Translator`) and a layer,
as the other layer types'."""
import os

import numpy as np

from singa.interop.caffe.netdef import TEST, TRAIN, Refused, relative_to, strip_legacy
from singa.io.caffe_blobs import read_blob_file
from singa.proto import caffe_pb2, common_pb2, job_pb2

__all__ = ["input_layer", "data_layer", "image_data", "hdf5_data", "caffe_path",
           "caffe_store_shape"]

C = caffe_pb2

#: scales applied exactly as a division of the store (x / (1/s)); others by kImagePreprocess
POW2 = {2.0 ** k for k in range(-60, 61)}


def data_path(t, layer):
    """The kvfile a data layer reads: one per phase for Data/HDF5Data, one for Input."""
    if layer.type == "Input":
        return f"{t.data_dir}/{layer.name}.kvfile"
    phase = "train" if t.phase == TRAIN else "test"
    return f"{t.data_dir}/{layer.name}-{phase}.kvfile"

def data_shape(t, layer, mean_shape, store=None):
    if t.input_shape:
        return tuple(t.input_shape)
    if mean_shape:
        return tuple(mean_shape)
    if store is not None and os.path.exists(store.path):
        return caffe_store_shape(store)
    # the first InnerProduct that reads the blob flattens it: its weights give the size
    first = next((l for l in t.net.layer if l.type == "InnerProduct" and
                  layer.top[0] in l.bottom), None)
    blobs = t.blobs(first) if first is not None else None
    if blobs:
        w = blobs[0]
        shape = strip_legacy(w.shape, 2) if w.legacy else w.shape
        return (shape[0] if first.inner_product_param.transpose else shape[-1],)
    t.refuse(layer, "reads records whose shape is not in the prototxt; give "
                "-input_shape C,H,W")

def store_input(t, layer, batch, source, skip=0, store=None):
    """kRecordInput over the kvfile the user provides, or over Caffe's data as it is
    (`store`: a StoreProto of a Caffe backend), with Caffe's transform_param."""
    tops = list(layer.top)
    if not 1 <= len(tops) <= 2:
        t.refuse(layer, f"has {len(tops)} tops, expected data and label")
    tp = layer.transform_param
    for f in ("force_color", "force_gray"):
        if getattr(tp, f):
            t.refuse(layer, f"sets transform_param.{f} (not supported)")
    conf = t.new(layer, job_pb2.kRecordInput, [])
    sc = conf.store_conf
    if store is not None:
        sc.CopyFrom(store)
    else:
        sc.backend, sc.path = "kvfile", data_path(t, layer)
    sc.batchsize.append(batch)
    if skip:
        sc.random_skip = skip
    mean = None
    if tp.HasField("mean_file"):
        if tp.mean_value:
            t.refuse(layer, "sets both mean_file and mean_value")
        mean = mean_file(t, layer, tp.mean_file)
    shape = data_shape(t, layer, None if mean is None else mean.shape, store)
    sc.shape.extend(shape)
    if mean is not None:
        if mean.shape != shape:
            t.refuse(layer, f"has a mean of shape {mean.shape} for records of shape {shape}")
        sc.mean_file = write_mean(t, mean)
    elif len(tp.mean_value) == 1:
        sc.mean_value = tp.mean_value[0]
    elif tp.mean_value:
        if len(shape) != 3 or shape[0] != len(tp.mean_value):
            t.refuse(layer, f"has {len(tp.mean_value)} mean_value for records of shape "
                        f"{shape}")
        sc.mean_file = write_mean(t, np.broadcast_to(
            np.array(tp.mean_value, np.float32)[:, None, None], shape))
    scale = tp.scale
    preprocess = None
    if tp.crop_size or tp.mirror or (scale != 1 and scale not in POW2):
        if t.phase == TEST and tp.mirror:
            t.refuse(layer, "mirrors in TEST: Caffe mirrors at random there, SINGA's "
                        "kImagePreprocess only in training")
        preprocess = t.new(layer, job_pb2.kImagePreprocess, [conf.name],
                              name=f"{layer.name}_transform")
        rc = preprocess.rgbimage_conf
        rc.scale, rc.cropsize, rc.mirror = scale, tp.crop_size, tp.mirror
        if tp.crop_size and t.phase == TEST:
            rc.center_crop = True       # Caffe's TEST crop
    elif scale != 1:
        sc.std_value = 1 / scale     # a power of two: x / (1/s) == x·s exactly
    if store is not None:
        t.notes.append(f"layer '{layer.name}' ({layer.type}) reads the {sc.backend} "
                          f"{sc.path} as it is, records of shape {list(shape)}")
    else:
        t.notes.append(f"layer '{layer.name}' ({layer.type}, {source}) reads the kvfile "
                          f"{sc.path}: write it with RecordProto records of shape "
                          f"{list(shape)} (pixel bytes or float data) and their labels")
    t.tops[tops[0]] = (preprocess or conf).name
    crop = tp.crop_size and len(shape) == 3
    t.shapes[tops[0]] = shape[:1] + (tp.crop_size,) * 2 if crop else shape
    if len(shape) == 1:
        t.flat.add(tops[0])
    if len(tops) == 2:
        t.tops[tops[1]] = conf.name
        t.labels[tops[1]] = conf.name
    return [conf] + ([preprocess] if preprocess else [])

def mean_file(t, layer, name):
    """The mean image of `name`: beside the prototxt, else from the current directory
    (Caffe opens it from where it runs)."""
    path = relative_to(t.path, name)
    if not os.path.exists(path) and os.path.exists(name):
        path = name
    blob = read_blob_file(path)
    shape = blob.shape
    while len(shape) > 3 and shape[0] == 1:
        shape = shape[1:]
    return blob.values.reshape(shape)

def write_mean(t, mean):
    path = f"{t.data_dir}/mean.kvfile"
    rec = common_pb2.RecordProto(shape=mean.shape, data=np.ravel(mean).tolist())
    old = t.files.get(path)
    if old is not None and old[0][1] != rec.SerializeToString():
        path = f"{t.data_dir}/mean{len(t.files)}.kvfile"
    t.files[path] = [(b"mean", rec.SerializeToString())]
    return path


def input_layer(t, layer):
    if len(layer.top) != 1 or len(layer.input_param.shape) > 1:
        t.refuse(layer, "has several tops; one input is supported")
    dims = list(layer.input_param.shape[0].dim) if layer.input_param.shape else []
    if len(dims) < 2:
        t.refuse(layer, "has no shape (N, ...) of its input")
    conf = t.new(layer, job_pb2.kRecordInput, [])
    sc = conf.store_conf
    sc.backend, sc.path = "kvfile", data_path(t, layer)
    sc.batchsize.append(dims[0])
    sc.shape.extend(dims[1:])
    t.notes.append(f"layer '{layer.name}' (Input) reads the kvfile {sc.path}: write it with "
                   f"RecordProto records of shape {dims[1:]} (or use the Python API's predict)")
    out = t.one_top(layer, conf, flat=len(dims) == 2)
    t.shapes[layer.top[0]] = tuple(dims[1:])
    return out


def data_layer(t, layer):
    p = layer.data_param
    if p.backend not in (C.DataParameter.LMDB, C.DataParameter.LEVELDB):
        t.refuse(layer, "has an unknown backend")
    store = None
    if p.backend == C.DataParameter.LMDB:       # read as it is; LevelDB: a kvfile you write
        store = job_pb2.StoreProto(backend="lmdb", path=caffe_path(t.path, p.source))
    return store_input(t, layer, p.batch_size, f"source {p.source}", p.rand_skip, store)


def image_data(t, layer):
    """Caffe's ImageData: the "imagelist" store over its list of images as it is."""
    p = layer.image_data_param
    if bool(p.new_height) != bool(p.new_width):
        t.refuse(layer, "sets one of new_height and new_width (Caffe needs both or neither)")
    store = job_pb2.StoreProto(backend="imagelist", path=caffe_path(t.path, p.source),
                               new_height=p.new_height, new_width=p.new_width,
                               is_color=p.is_color, shuffle=p.shuffle)
    if p.root_folder:
        store.root_folder = caffe_path(t.path, p.root_folder)
    else:           # Caffe opens the list's paths from where it runs: the prototxt's folder
        store.root_folder = os.path.dirname(os.path.abspath(t.path))
    return store_input(t, layer, p.batch_size, f"source {p.source}", p.rand_skip, store)


def caffe_path(net_path, name):
    """The absolute path of a file a Caffe prototxt names: beside the prototxt if it is there,
    else from the current directory (Caffe opens it from where it runs)."""
    path = relative_to(net_path, name)
    if not os.path.exists(path) and os.path.exists(name):
        path = name
    return os.path.abspath(path)


def caffe_store_shape(store):
    """The (C, H, W) of the first record of Caffe's data at `store` (a StoreProto)."""
    from singa.io.records import parse_record
    from singa.io.store import open_store
    with open_store(store.backend, store.path, "read", store) as s:
        kv = s.read()
    if kv is None:
        raise Refused(f"{store.path}: the {store.backend} store is empty")
    return tuple(parse_record(kv[1], kv[0]).shape)


def hdf5_data(t, layer):
    p = layer.hdf5_data_param
    if p.shuffle:
        t.notes.append(f"layer '{layer.name}': Caffe shuffles its HDF5 files; SINGA reads the "
                       f"kvfile in order")
    return store_input(t, layer, p.batch_size, f"source {p.source}")
