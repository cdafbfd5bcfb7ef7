"""Helpers shared by test modules (never a test module itself: pytest collects nothing here).

Test modules import these as ``support.<module>``; fixtures live in the conftest files.
"""
