"""The models a server translates with, one per language pair, loaded as `nmt translate`
loads them.

Each checkpoint becomes one `Translator` (`Translator.from_checkpoint` with the command's
decoding settings and CPU threads), so the server and `nmt translate` give the same output
for the same settings. Its language pair is the one its training recipe recorded
(`data.src`, `data.tgt`), or the `--pair` given for it; two models of one pair are refused.

Requests that keep the server's decoding settings decode with that translator, on its
worker processes: one decoding lane of the queue per worker, each lane's batch sent to a
free worker (batcher.py). A request that asks for another beam, n-best size, alignments
or attention gets a variant: a `Translator` sharing the same model and vocabularies with
those settings. The workers were forked with the server's settings and decode only those,
so a variant decodes in the server's process, one batch at a time.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from nmt_cli.config import DecodeConfig
from nmt_cli.core.checkpoint import Checkpoint, load_checkpoint
from nmt_cli.engines.serve.batcher import Batcher, Options, Rule
from nmt_cli.engines.serve.metrics import Metrics
from nmt_cli.engines.serve.settings import ServeConfig
from nmt_cli.engines.translate.loading import set_threads
from nmt_cli.engines.translate.translator import Translation, Translator
from nmt_cli.engines.translate.views import check_layer, decoder_layers
from nmt_cli.errors import UsageError

_CODE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,15}$")
VARIANTS = 16  # translators with other settings kept per model, the most recently used


@dataclass(frozen=True)
class Pair:
    source: str
    target: str

    def __str__(self) -> str:
        return f"{self.source}-{self.target}"

    @classmethod
    def parse(cls, text: str, option: str = "--pair") -> Pair:
        """`en-de` -> Pair("en", "de")."""
        source, _, target = text.partition("-")
        if not (_CODE.match(source) and _CODE.match(target)):
            raise UsageError(f"{option} {text!r}: give two language codes, e.g. en-de")
        return cls(source, target)


def recorded_pair(ckpt: Checkpoint) -> Pair | None:
    """The languages the checkpoint's training recipe names, if it has them."""
    data = (ckpt.recipe or {}).get("data")
    source, target = (data.get("src"), data.get("tgt")) if isinstance(data, dict) else (0, 0)
    if isinstance(source, str) and isinstance(target, str) and source and target:
        return Pair(source, target)
    return None


class Model:
    """One loaded model: its pair, its translator (and variants), its queue."""

    def __init__(
        self,
        pair: Pair,
        translator: Translator,
        alignment_layer: int,
        config: ServeConfig,
        metrics: Metrics,
    ) -> None:
        self.pair, self.translator, self.alignment_layer = pair, translator, alignment_layer
        self.defaults = Options(translator.cfg.beam_size, translator.cfg.nbest)
        # A lane's batch: `nmt translate`'s, unless told otherwise.
        self.max_batch = config.max_batch or translator.batch_sentences
        rule = Rule(
            self.max_batch,
            config.gather_ms / 1000,
            config.return_ms / 1000,
            lanes=translator.workers,
        )
        self.batcher = Batcher(str(pair), self.decode, metrics, config.queue_sentences, rule)
        self._variants: OrderedDict[Options, Translator] = OrderedDict()
        self._in_process = threading.Lock()  # variants decode here, one batch at a time

    def decode(self, lines: list[str], options: Options) -> list[Translation]:
        """Translate `lines` with `options` (in a decoding lane): with the server's own
        settings on a free worker process, with others in this process."""
        if options == self.defaults:
            return self.translator.translate_chunk(lines, pooled=True)
        with self._in_process:
            return self._translator(options).translate_chunk(lines, options.attention)

    def warm_up(self) -> None:
        """One short translation: the first decoding of a process builds its kernels."""
        self.decode(["a"], self.defaults)

    def close(self, wait: bool) -> None:
        for translator in [self.translator, *self._variants.values()]:
            translator.close(wait)

    def _translator(self, options: Options) -> Translator:
        plain = dataclasses.replace(options, attention=False)  # every translator records it
        if plain == self.defaults:
            return self.translator
        variant = self._variants.pop(plain, None)
        if variant is None:
            base = self.translator
            cfg = dataclasses.replace(base.cfg, beam_size=options.beam, nbest=options.nbest)
            layer = self.alignment_layer if options.alignment else None
            variant = Translator(base.model, base.vocab, cfg, 1, layer, None, base.threads)
        self._variants[plain] = variant  # the most recently used last
        while len(self._variants) > VARIANTS:
            self._variants.popitem(last=False)
        return variant


@dataclass
class Models:
    """The server's models by language pair."""

    by_pair: dict[Pair, Model]

    def __iter__(self) -> Iterator[Model]:
        return iter(self.by_pair.values())

    def pairs(self) -> list[Pair]:
        return list(self.by_pair)

    def describe(self) -> str:
        return ", ".join(str(p) for p in self.by_pair)

    def close(self, wait: bool) -> None:
        for model in self:
            model.close(wait)


def load_models(
    paths: Sequence[Path],
    pairs: Sequence[str],
    cfg: DecodeConfig,
    alignment_layer: int,
    config: ServeConfig,
    metrics: Metrics,
    on_compile: Callable[[str], None] | None = None,
    on_fallback: Callable[[str], None] = lambda reason: None,
) -> Models:
    """Load every model as `nmt translate` does and start its worker processes (call it
    before any thread is started: see Translator.start_workers).

    `pairs` (one per model, in order, or none) overrides the recorded languages.
    """
    if pairs and len(pairs) != len(paths):
        raise UsageError(
            f"{len(pairs)} --pair for {len(paths)} --model: give one --pair per --model, "
            "in the same order, or none"
        )
    given = [Pair.parse(p) for p in pairs]
    if config.max_beam < cfg.beam_size:
        raise UsageError(f"--max-beam {config.max_beam} is below --beam {cfg.beam_size}")
    threads, workers = set_threads(cfg.threads, cfg.workers)
    by_pair: dict[Pair, Model] = {}
    for i, path in enumerate(paths):
        ckpt = load_checkpoint(path)
        pair = given[i] if given else recorded_pair(ckpt)
        if pair is None:
            raise UsageError(
                f"{path}: the checkpoint records no languages (it was not trained by nmt "
                "train); name them with --pair SRC-TGT, one per --model"
            )
        if pair in by_pair:
            raise UsageError(f"two models translate {pair}; serve one model per language pair")
        translator = Translator.from_checkpoint(
            ckpt, cfg, workers, None, [str(path)], on_compile, on_fallback, threads
        )
        if alignment_layer:  # checked now, not at a request's first alignment
            layers = decoder_layers(translator.model)
            check_layer(alignment_layer, layers, "--alignment-layer", "decoder")
        by_pair[pair] = Model(pair, translator, alignment_layer, config, metrics)
    for model in by_pair.values():
        model.translator.start_workers()
    return Models(by_pair)
