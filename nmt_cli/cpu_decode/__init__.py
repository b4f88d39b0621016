"""CPU decoding backend: placeholder."""
