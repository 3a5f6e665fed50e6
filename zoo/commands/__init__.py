"""Subcommands of the `zoo` CLI (see zoo/cli.py)."""
