"""Backends: faster implementations of the model's hot operations, per machine."""
