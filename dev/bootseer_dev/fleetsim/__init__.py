"""A flow-level simulator of a fleet restart (issue #16): the network part.

:mod:`.network` moves bytes over links shared max-min fairly, on SimPy's event loop; a
restart model (nodes, origins, phases, calibrated from the lab) is built on it.
"""

from .network import Flow, Link, Network

__all__ = ["Flow", "Link", "Network"]
