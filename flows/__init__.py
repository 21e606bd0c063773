"""Prefect flows: the `pipeline` and one flow per stage, plus the `lexiflow` command line."""
