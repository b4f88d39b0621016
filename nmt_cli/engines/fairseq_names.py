"""fairseq's names of a layer's modules, which MarianMT keeps (transformers ported them):
the one table from which `nmt import --from fairseq`, `nmt import` of MarianMT and
`nmt export --to huggingface` name the other side of core's layer map."""

from __future__ import annotations

from nmt_cli.core.layer_map import Role

# Each sublayer's module (the feed-forward's linear layers sit in the layer itself),
# its projections and its norm.
MODULES = {"self_attn": "self_attn.", "cross_attn": "encoder_attn.", "ffn": ""}
PROJECTIONS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "out": "out_proj"}
PROJECTIONS |= {"w1": "fc1", "w2": "fc2"}
NORMS = {
    "self_attn": "self_attn_layer_norm",
    "cross_attn": "encoder_attn_layer_norm",
    "ffn": "final_layer_norm",
}


def fairseq_modules(role: Role, prefix: str = "") -> list[str]:
    """The modules whose tensors `role` holds (several, stacked in order, for a fused
    projection), under `prefix` ("model." in MarianMT)."""
    layer, module = f"{prefix}{role.stack.side}.layers.{role.index}.", role.sublayer.module
    if role.linear is None:
        return [layer + NORMS[module]]
    return [layer + MODULES[module] + PROJECTIONS[part] for part in role.parts]
