"""Data stores (kvfile, textfile), records (decoding; `write_records` of numpy samples) and
the MNIST IDX reader; protowire: protobuf's wire format by hand; caffe_blobs: Caffe's binary
files (`.caffemodel`, `.solverstate`, a mean `.binaryproto`) walked through mmap."""
from singa.io.idx import read_idx
from singa.io.kvfile import KVFile
from singa.io.records import write_records
from singa.io.store import open_store, KVFileStore, TextFileStore

__all__ = ["open_store", "KVFile", "KVFileStore", "TextFileStore", "read_idx", "write_records"]
