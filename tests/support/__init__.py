"""Helpers shared by test suites (store, end-to-end, benchmarks)."""
