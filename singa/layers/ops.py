"""Array functions that several layers compute, written into preallocated float32 arrays."""
import numpy as np


def sigmoid(x, y):
    """y = 1 / (1 + e^−x); y may be x."""
    np.negative(x, out=y)
    np.exp(y, out=y)
    y += 1
    np.reciprocal(y, out=y)


def softmax(x, p, scratch):
    """p = exp(x − max_row) / Σ_row exp(x − max_row) for 2-D x; `scratch` is (N, 1) float32."""
    np.max(x, axis=1, keepdims=True, out=scratch)
    np.subtract(x, scratch, out=p)
    np.exp(p, out=p)
    np.sum(p, axis=1, keepdims=True, out=scratch)
    p /= scratch
