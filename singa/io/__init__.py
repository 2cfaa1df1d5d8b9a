"""Data stores (kvfile, textfile), record decoding and the MNIST IDX reader."""
from singa.io.idx import read_idx
from singa.io.kvfile import KVFile
from singa.io.store import open_store, KVFileStore, TextFileStore

__all__ = ["open_store", "KVFile", "KVFileStore", "TextFileStore", "read_idx"]
