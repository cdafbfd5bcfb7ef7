"""Striped checkpoint reads: parallel ranged reads over many DataNodes, with read-ahead."""
