"""Helpers shared by the test files (import as `support.<module>`; tests/ is on the path)."""
