"""What one request may ask of the server (checked before anything is queued), and what it
is told when a sentence had to be cut, as `nmt translate` warns about it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from nmt_cli.engines.serve.bodies import ApiError
from nmt_cli.engines.serve.settings import ServeConfig

if TYPE_CHECKING:
    from nmt_cli.engines.translate.translator import Translation


def check_size(sentences: Sequence[str], config: ServeConfig, field: str) -> None:
    """At most `max_sentences` sentences and `max_chars` characters (400 naming the limit)."""
    if len(sentences) > config.max_sentences:
        raise ApiError(
            400,
            f"{field}: {len(sentences)} sentences, more than the limit of "
            f"{config.max_sentences} a request (max_sentences)",
        )
    chars = sum(len(s) for s in sentences)
    if chars > config.max_chars:
        raise ApiError(
            400,
            f"{field}: {chars:,} characters, more than the limit of {config.max_chars:,} "
            "a request (max_chars)",
        )


def truncation_warnings(translations: Sequence[Translation], max_source: int) -> list[str]:
    """One warning per sentence longer than the model's positions (its start translated)."""
    return [
        f"sentence {i} is longer than {max_source} subword tokens: only its first "
        f"{max_source} were translated"
        for i, t in enumerate(translations, start=1)
        if t.truncated
    ]
