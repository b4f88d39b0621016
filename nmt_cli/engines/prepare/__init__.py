"""`nmt prepare`: a corpus in, a data directory (vocabulary + token stores + manifest) out.

Four stages, each resumable, each a function of explicit inputs in its own module:

    sources.py     where the pairs come from (presets.py, demo_corpus.py, nmt_cli/text_io.py)
    cleaning.py    clean: stream the source, drop bad training pairs, keep dev/test whole
    vocabulary.py  vocab: SentencePiece BPE on a bounded, seeded sample of the cleaned text
    binarize.py    binarize: encode each split with a process pool into token stores
    manifest.py    manifest: settings, counts, versions, checksums; written last, atomically

`runner.py` runs them in order; `state.py` is the work folder's record of the settings and
each finished stage, so a rerun skips what is done and a rerun with other settings is
refused with the setting that differs; `layout.py` names every file. Every file is written
atomically and every stage is deterministic, so an interrupted run, rerun, gives the same
manifest as an uninterrupted one.
"""

from nmt_cli.engines.prepare.config import PrepareConfig, prepare_from_data_config
from nmt_cli.engines.prepare.presets import list_presets
from nmt_cli.engines.prepare.progress import STAGES, Progress, StageEvent
from nmt_cli.engines.prepare.runner import PrepareResult, StageReport, prepare

__all__ = [
    "STAGES",
    "PrepareConfig",
    "PrepareResult",
    "Progress",
    "StageEvent",
    "StageReport",
    "list_presets",
    "prepare",
    "prepare_from_data_config",
]
