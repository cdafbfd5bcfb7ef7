"""The node agent and the container runtime hook."""
