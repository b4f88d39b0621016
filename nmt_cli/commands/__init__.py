"""Typer commands, one module each; `nmt_cli.cli` registers them."""
