"""A model in eval mode for a while (dropout off), then back in the mode it was in.

The one way training's validation (dev loss, greedy BLEU) and its attention pictures
use the model being trained, and `engines/translate` a live model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
