"""nmt: the Transformer of "Attention Is All You Need", from raw text to a BLEU score."""

__version__ = "0.1.0"
