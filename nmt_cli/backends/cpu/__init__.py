"""The CPU backend: speed machinery beside the paper's model, never in it.

core/ holds the Transformer and its Python decoder step, the reference. This package
wraps a Transformer for decoding on a CPU (`CpuDecoder`, a `core.searchable.Searchable`):
packed bf16 and int8 linear layers (linear.py, declared to the planner), a compiled C++
module built on first use (build.py, csrc/) that runs the whole decoder step in one call
(step.py, over the named contract of contract.py), a cache whose keys never move with
its attention kernel (slot_cache.py), and beam search's bookkeeping in one call, fused
with the log-softmax where that is the module's (decoder.py, `decode_advance`). What
its model-shaped parts implement is declared in support.py; a model outside it decodes
on the reference step. decoder.py makes the rest of the choice of arithmetic per model.
The same module gives CPU training its dropout masks, loss sweep and attention
(training.py).

What it may assume of core: the Transformer's modules and their names (the layers of
`DecoderLayer`, `tgt_embed`), `step_hidden`/`logits`, the cross-attention's
`project_kv`, core/cache.py's cache protocols, and core/step_linear.py's `StepLinear`
for its decode-only linear layers, which the planner has the model built with
(`Operations.linear`). Core never imports this package.
"""

from nmt_cli.backends.cpu.decoder import CpuDecoder, cpu_decoders

__all__ = ["CpuDecoder", "cpu_decoders"]
