"""Compiler passes: pure functions over the resolved topology."""
