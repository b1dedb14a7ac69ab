"""Benchmarks: `python -m bench` (or `make bench`) runs every `bench/bench_*.py`."""
