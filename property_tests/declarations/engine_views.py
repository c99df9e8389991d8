"""The views engines make of their projections, as ``layout_types.View`` builders: the placements
``engine_layouts`` and ``lmdeploy_layouts`` give each input of an engine's call (sizes are the
expressions ``layout_types.size_of`` evaluates).

Imports only ``declarations.layout_types`` (its types).
"""

from __future__ import annotations

from .layout_types import View

__all__ = ["QKV_COLUMNS", "mla_view", "plain_view", "qkv_view"]

_QKV_A = ("fused_qkv_a_proj output [T, q_lora_rank + L + R] (kv_a_proj_with_mqa output [T, L + R] when "
          "q_lora_rank is 0)")
_KV_A_MQA = "key_states: kv_a_proj_with_mqa output [T, 1, L + R] (kv_c written back into its first L columns)"
_QKV_A_WIDTH = "q_lora_rank + latent + rotary_dim"
_QKV = "qkv: qkv_proj output [T, (H + 2 Hkv) D], split by columns"
_QKV_WIDTH = "(heads + 2 * kv_heads) * head_size"
# MLA: the placement of each kind of tensor (shape, parent, parent shape, start).
_MLA_PLACEMENTS = {
    "q_pe": (("tokens", "heads", "rotary_dim"), "q: q_b_proj (or q_proj) output as [T, H, nope + R]",
             ("tokens", "heads", "nope + rotary_dim"), ("0", "0", "nope")),
    "k_pe": (("tokens", "rotary_dim"), _QKV_A, ("tokens", _QKV_A_WIDTH), ("0", "q_lora_rank + latent")),
    "k_pe_head": (("tokens", "1", "rotary_dim"), _QKV_A, ("tokens", "1", _QKV_A_WIDTH),
                  ("0", "0", "q_lora_rank + latent")),
    "kv_c": (("tokens", "latent"), "kv_a_layernorm output (contiguous)", ("tokens", "latent"), ("0", "0")),
    "kv_c_head": (("tokens", "1", "latent"), "kv_a_layernorm output, unsqueeze(1) (contiguous)",
                  ("tokens", "1", "latent"), ("0", "0", "0")),
    # LMDeploy: kv_a_proj_with_mqa's [T, 1, L + R] output, k_pe its last R columns, the layernormed kv_c
    # written back into its first L (lmdeploy/pytorch/models/deepseek_v2.py:527-533)
    "k_pe_mqa": (("tokens", "1", "rotary_dim"), _KV_A_MQA, ("tokens", "1", "latent + rotary_dim"),
                 ("0", "0", "latent")),
    "kv_c_mqa": (("tokens", "1", "latent"), _KV_A_MQA, ("tokens", "1", "latent + rotary_dim"), ("0", "0", "0")),
}
# MHA: rank 2 column views [T, n*D] and rank 3 head views [T, n, D] of the qkv projection.
QKV_COLUMNS = {"query": ("heads", "0"), "key": ("kv_heads", "heads"), "value": ("kv_heads", "heads + kv_heads")}


def mla_view(argument: str, kind: str, operations: tuple[str, ...], source: str) -> View:
    shape, parent, parent_shape, start = _MLA_PLACEMENTS[kind]
    return View(argument, operations, shape, parent, parent_shape, start, source)


def qkv_view(argument: str, operations: tuple[str, ...], rank: int, source: str, width: str = "head_size") -> View:
    """``argument``'s columns of the qkv projection, as ``[T, n * D]`` (rank 2) or ``[T, n, width]``
    (rank 3; ``width`` < D when the engine slices each head to the rotary width)."""
    heads, first = QKV_COLUMNS[argument]
    if rank == 2:
        return View(argument, operations, ("tokens", f"{heads} * head_size"), _QKV, ("tokens", _QKV_WIDTH),
                    ("0", f"({first}) * head_size"), source)
    return View(argument, operations, ("tokens", heads, width), _QKV, ("tokens", "heads + 2 * kv_heads", "head_size"),
                ("0", first, "0"), source)


def plain_view(argument: str, operations: tuple[str, ...], shape: tuple[str, ...], source: str) -> View:
    """A tensor a library takes as the caller made it: its own parent (the library fixes no placement)."""
    return View(argument, operations, shape, "the caller's tensor", shape, ("0",) * len(shape), source)
