"""Test-support code shipped with the package (used by tests, the demo model and benchmarks)."""
