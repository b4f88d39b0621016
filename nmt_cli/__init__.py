"""nmt: the Transformer of "Attention Is All You Need", from raw text to a BLEU score.

`from nmt_cli import Translator` is the Python API: the class `nmt translate` decodes with
(nmt_cli/engines/translate/translator.py). It is imported on first use, so `import nmt_cli`
(and `nmt --version`) does not load torch.
"""

from typing import Any

from nmt_cli.cpu_level import apply_to_torch_environment
from nmt_cli.version import __version__

apply_to_torch_environment()  # NMT_CPU_LEVEL caps oneDNN and ATen only if set before torch loads

__all__ = ["DecodeConfig", "Translator", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Translator":
        from nmt_cli.engines.translate.translator import Translator

        return Translator
    if name == "DecodeConfig":
        from nmt_cli.config import DecodeConfig

        return DecodeConfig
    raise AttributeError(f"module 'nmt_cli' has no attribute {name!r}")
