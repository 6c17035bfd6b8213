"""A checkpoint of real MoE shape (issue 40): DeepSeek-V3's tensor names, shards and index, small bytes.

DeepSeek-V3/R1 ship 61 decoder layers (the first 3 dense, 58 with 256 routed experts and a shared
expert), FP8 weights each with a ``weight_scale_inv``, in 163 shards with a
``model.safetensors.index.json``: about 90,000 tensors (90,427 here by default; the sample issue 40
was measured on had 89,881). Tensor sizes are scaled down (``expert_dim``) so the whole is small;
``pad_bytes`` adds real bytes per shard for the throughput runs. Used by tests, ``bench/moe.py`` and
``weightd demo``-like scripts; the generator never holds a shard in memory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .sample import SampleTensor, fill_bytes, write_safetensors

ATTN = ("self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj",
        "self_attn.o_proj")
NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_a_layernorm.weight",
         "self_attn.kv_a_layernorm.weight")
PROJ = ("gate_proj", "up_proj", "down_proj")


def _fp8(prefix: str, d: int) -> list[SampleTensor]:
    """An FP8 linear layer as DeepSeek-V3 stores it: the weight and its block scales."""
    return [SampleTensor(prefix + ".weight", "F8_E4M3", (d, d)), SampleTensor(prefix + ".weight_scale_inv", "F32", (1, 1))]


def moe_tensors(layers: int = 61, dense: int = 3, experts: int = 256, d: int = 8) -> list[SampleTensor]:
    """Every tensor of the checkpoint, in the order the shards hold them (layer by layer)."""
    out = [SampleTensor("model.embed_tokens.weight", "BF16", (64, d))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [SampleTensor(p + n, "BF16", (d,)) for n in NORMS]
        for a in ATTN:
            out += _fp8(p + a, d)
        if i < dense:
            out += [t for x in PROJ for t in _fp8(p + f"mlp.{x}", d)]
            continue
        out += [SampleTensor(p + "mlp.gate.weight", "BF16", (experts, d)),
                SampleTensor(p + "mlp.gate.e_score_correction_bias", "F32", (experts,))]
        out += [t for x in PROJ for t in _fp8(p + f"mlp.shared_experts.{x}", d)]
        for e in range(experts):
            out += [t for x in PROJ for t in _fp8(p + f"mlp.experts.{e}.{x}", d)]
    return out + [SampleTensor("model.norm.weight", "BF16", (d,)), SampleTensor("lm_head.weight", "BF16", (64, d))]


def make_moe_checkpoint(root: str | os.PathLike[str], *, layers: int = 61, experts: int = 256, shards: int = 163,
                        d: int = 8, pad_bytes: int = 0, seed: str = "v1") -> Path:
    """Write the checkpoint into ``root``: ``shards`` files of consecutive tensors, the index json and a
    ``config.json`` with ``n_routed_experts``. ``pad_bytes`` > 0 adds one BF16 tensor of about that
    many bytes to each shard (``model.pad.N``), for runs that need real bytes per shard."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tensors = moe_tensors(layers, experts=experts, d=d)
    per = -(-len(tensors) // shards)
    weight_map: dict[str, str] = {}
    for s in range(shards):
        chunk = tensors[s * per:(s + 1) * per]
        if pad_bytes > 0:
            chunk = chunk + [SampleTensor(f"model.pad.{s}", "BF16", (max(1, pad_bytes // 2),))]
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(root / name, chunk, lambda t: fill_bytes(f"{seed}:{t.name}", t.nbytes))
        weight_map.update((t.name, name) for t in chunk)
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"],
                                                  "num_hidden_layers": layers, "first_k_dense_replace": 3,
                                                  "n_routed_experts": experts, "n_shared_experts": 1}))
    return root
