"""Lazy-loaded container images and hot block record-and-prefetch."""
