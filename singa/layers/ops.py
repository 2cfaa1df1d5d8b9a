"""Array functions that several layers compute, written into preallocated float32 arrays."""
import numpy as np

from singa.device import is_host, module


def sigmoid(x, y):
    """y = 1 / (1 + e^−x); y may be x."""
    np.negative(x, out=y)
    np.exp(y, out=y)
    y += 1
    np.reciprocal(y, out=y)


def softmax(x, p, scratch):
    """p = exp(x − max) / Σ exp(x − max) over axis 1 of x, (N, D) (per row) or (outer, D,
    inner) (at each position of the other dims); `scratch` is x's shape with axis 1 of size 1,
    float32."""
    np.max(x, axis=1, keepdims=True, out=scratch)
    np.subtract(x, scratch, out=p)
    np.exp(p, out=p)
    np.sum(p, axis=1, keepdims=True, out=scratch)
    p /= scratch


def index_add(out, idx, values):
    """out[idx[i]] += values[i] for each i, in order of i (numpy's add.at). On a GPU: out +=
    onehot(idx)ᵀ·values, one product, where atomic adds would sum in a varying order."""
    if is_host(out):
        np.add.at(out, idx, values)
        return
    xp = module(out)
    onehot = xp.zeros((len(idx), len(out)), out.dtype)
    onehot[xp.arange(len(idx)), idx] = 1
    out += np.matmul(onehot.T, values.reshape(len(idx), -1)).reshape(out.shape)


def pad_buffer(shape, pads, fill=0, xp=np):
    """(buf, inner): a float32 array of `shape` grown on each axis d by pads[d] = (before,
    after) cells (axes past len(pads) not grown), those cells = fill, and the view of its
    interior, of `shape`. The caller writes the interior (a chunk copied in, or computed in
    place); the border keeps `fill`, so every window of the chunk is a slice of buf."""
    pads = tuple(pads) + ((0, 0),) * (len(shape) - len(pads))
    buf = xp.empty(tuple(s + a + b for s, (a, b) in zip(shape, pads)), np.float32)
    inner = buf[tuple(slice(a, a + s) for s, (a, _) in zip(shape, pads))]
    for d, (s, (a, b)) in enumerate(zip(shape, pads)):
        edge = (slice(None),) * d
        buf[edge + (slice(0, a),)] = fill
        buf[edge + (slice(a + s, None),)] = fill
    return buf, inner
