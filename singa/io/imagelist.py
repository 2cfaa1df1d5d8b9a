"""The "imagelist" store backend: Caffe's ImageData source, a text file of `<image path> <label>`
lines (caffe/src/caffe/layers/image_data_layer.cpp), each image read with Pillow into a
RecordProto (shape (C, H, W), `pixel` bytes in OpenCV's BGR order, the label).

store_conf's root_folder (else the list's folder) prefixes the paths; new_height/new_width
resize as Caffe's cv::resize does; is_color gives 3 channels, else 1; shuffle reads each pass
in a new order, as Caffe reshuffles at every pass. The position of a shuffled reader holds the
pass's order key above its index (`tell`), so a resumed reader goes on in the same order.
A batch's images are decoded side by side.
"""
import os

import numpy as np

from singa.errors import DataError
from singa.io.base import ReadOnly
from singa.io.images import batch_values, decode_many, image_record

__all__ = ["ImageListStore"]

_INDEX_BITS = 32
_KEYS = 1 << 31


class ImageListStore(ReadOnly):
    """An image list opened for reading; `conf` is the layer's store_conf (None: defaults)."""

    backend = "imagelist"

    def __init__(self, path, mode="read", conf=None):
        self.path = os.fspath(path)
        if mode != "read":
            raise DataError(f"{self.path}: the imagelist store is read-only")
        try:
            with open(self.path, "rb") as f:
                text = f.read()
        except OSError as e:
            raise DataError(f"{self.path}: cannot read the image list: {e.strerror}") from None
        self.items = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line:
                continue
            # Caffe splits at the last space, so a path may hold spaces
            name, _, label = line.rpartition(b" ")
            try:
                self.items.append((name.decode(), int(label)))
            except (ValueError, UnicodeDecodeError):
                raise DataError(f"{self.path}:{number}: expected '<image path> <label>', got "
                                f"{line[:80].decode(errors='backslashreplace')!r}") from None
        root = conf.root_folder if conf is not None and conf.root_folder else None
        self.root = root or os.path.dirname(os.path.abspath(self.path))
        self.size = None
        if conf is not None and (conf.new_height or conf.new_width):
            if conf.new_height <= 0 or conf.new_width <= 0:
                raise DataError(f"{self.path}: new_height and new_width must both be positive "
                                f"(got {conf.new_height}, {conf.new_width})")
            self.size = (conf.new_height, conf.new_width)
        self.is_color = conf.is_color if conf is not None else True
        self.shuffle = conf is not None and conf.shuffle
        self._key, self._order, self._i = 0, None, 0

    def start(self, rng):
        """Draw the first pass's order from `rng` (a shuffling reader; nothing otherwise)."""
        if self.shuffle:
            self._set(int(rng.integers(1, _KEYS)), 0)

    def read(self):
        """Next (path, RecordProto bytes), or None at the end of the pass."""
        got = self.read_many(1)
        return got[0] if got else None

    def read_many(self, n):
        """The next `n` (path, RecordProto bytes), fewer at the end of the pass: the images
        decoded side by side (`images.decode_many`)."""
        items, raws = self._read(n)
        return [(key, image_record(pixels, label))
                for (key, label), pixels in zip(items, decode_many(raws))]

    def read_samples(self, n):
        """(paths, values) of the next `n` images, fewer at the end of the pass:
        `images.batch_values`'s (one array where they have one shape, else RecordProto
        bytes)."""
        items, raws = self._read(n)
        return [key for key, _ in items], batch_values(raws, [label for _, label in items])

    def _read(self, n):
        """((path, label), decode_image's args) of the next `n` images, fewer at the end."""
        items, raws = [], []
        while len(items) < n and self._i < len(self.items):
            name, label = self.items[self._i if self._order is None else self._order[self._i]]
            self._i += 1
            image = os.path.join(self.root, name)
            try:
                with open(image, "rb") as f:
                    raws.append((f.read(), image, self.is_color, self.size))
            except OSError as e:
                raise DataError(f"{self.path}: cannot read image {image}: {e.strerror}") \
                    from None
            items.append((name.encode(), label))
        return items, raws

    def seek_to_first(self):
        """The next pass: a shuffling reader draws its order from the last one's key."""
        key = self._key
        if self.shuffle and key:
            key = int(np.random.default_rng([key, 1]).integers(1, _KEYS))
        self._set(key, 0)

    def tell(self):
        """key · 2³² + the index of the next line in the pass's order (key 0: the file's)."""
        return (self._key << _INDEX_BITS) | self._i

    def seek(self, offset):
        """Continue at `offset`, a value of `tell`."""
        key, i = offset >> _INDEX_BITS, offset & ((1 << _INDEX_BITS) - 1)
        if offset < 0 or i > len(self.items) or key >= _KEYS:
            raise DataError(f"{self.path}: position {offset} is not one of its "
                            f"{len(self.items)} lines")
        self._set(key, i)

    def count(self):
        return len(self.items)

    def _set(self, key, i):
        if key != self._key or (key and self._order is None):
            # the pass's order: a permutation drawn from its key (the key's first draws)
            self._order = np.random.default_rng(key).permutation(len(self.items)) if key else None
        self._key, self._i = key, i
