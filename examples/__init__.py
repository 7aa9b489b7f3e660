"""Runnable examples; each folder has a README and one module a test runs."""
