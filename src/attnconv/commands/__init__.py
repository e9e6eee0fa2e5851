"""Subcommands of the `attnconv` CLI (see attnconv.cli)."""
