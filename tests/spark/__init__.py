"""Spark data source tests (local[2] against real grid members)."""
