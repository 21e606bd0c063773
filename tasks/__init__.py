"""Prefect tasks: one pipeline stage each, reading input artifacts and publishing one output artifact."""
