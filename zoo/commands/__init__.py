"""Subcommands of the `zoo` CLI (see zoo/commands/cli.py)."""
