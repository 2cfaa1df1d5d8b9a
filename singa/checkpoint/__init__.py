"""Checkpoints: SINGA's `BlobProtos` snapshot files, ours crash-safe and checksummed.

format: one file (CRC trailer, crash-safe write, checked reading); wire: the BlobProtos
bytes where the values are, by hand; meta: the `.meta` text beside a file; state: what a
bit-exact resume needs besides values; snapshots: the files of a step, latest/best,
retention; load: params by (name, piece) from `checkpoint_path`, joining and cutting the
pieces of model-partitioned params; cli: ls/show/diff/merge.
"""
from singa.checkpoint.format import (MAX_FILE_BYTES, MAX_STEP, CheckpointReader,
                                     CheckpointWriter, existing_file, folder, parse_step_worker,
                                     snapshot_file, write_file)
from singa.checkpoint.load import (Joined, joined_shape, load_checkpoint_path, load_owned,
                                   load_params, loaded_line, open_checkpoint_path, sources,
                                   updater_state)
from singa.checkpoint.meta import META_SUFFIX, SUFFIX, meta_path, read_meta
from singa.checkpoint.snapshots import (Snapshot, best_of, best_snapshot, files_of,
                                        latest_snapshot, list_snapshots, lower_is_better,
                                        prune, ranked, recorded,
                                        remove_stale_temporaries, snapshot_at, start_run)
from singa.checkpoint.state import SnapshotState

__all__ = ["CheckpointReader", "CheckpointWriter", "Joined", "joined_shape", "load_checkpoint_path",
           "MAX_FILE_BYTES", "MAX_STEP", "META_SUFFIX", "SUFFIX", "Snapshot", "SnapshotState",
           "best_of", "best_snapshot", "existing_file", "files_of", "folder", "latest_snapshot",
           "list_snapshots", "load_owned", "load_params", "loaded_line", "lower_is_better",
           "meta_path", "open_checkpoint_path", "parse_step_worker", "prune",
           "ranked", "read_meta", "recorded", "remove_stale_temporaries", "snapshot_at",
           "snapshot_file", "sources", "start_run", "updater_state", "write_file"]
