"""Measurement: the bench CLI, the Benchmark tab's plans, perf and compare."""
