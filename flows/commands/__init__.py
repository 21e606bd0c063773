"""The `lexiflow` commands, one module per command group; `flows/cli.py` assembles the parser."""
