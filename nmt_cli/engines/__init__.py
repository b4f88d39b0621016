"""Engines: one module per command, taking frozen dataclasses and returning results."""
