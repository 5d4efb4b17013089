"""The node-wide write-ahead log, segments and snapshots: the storage issue."""
