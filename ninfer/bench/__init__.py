"""Benchmarks behind `ninfer bench` (decode, prefill, serve, kernels); bench/*.py are thin script entry points."""
