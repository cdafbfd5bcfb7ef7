"""Dependency snapshotting: run the install once, snapshot it, restore it everywhere."""
