"""Helpers the test files share (CMake projects, watched processes, plans, user files)."""
