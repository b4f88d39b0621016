"""nmt's version, in a module of its own: modules that record it (checkpoints, manifests,
exports) import it from here, not from the package, whose `Translator` imports them."""

__version__ = "0.1.0"
