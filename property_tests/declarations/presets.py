"""The sizes real models and serving engines run, as data: the suite's one table of them.

``PRESETS`` holds the attention geometry of the models the suite is sized for, each with the
source of its numbers (the model's published ``config.json``); ``per_rank`` divides the heads as
tensor parallelism does (query heads split, KV heads split until one is left per rank, then
replicated; MLA's latent cache is not split). ``SERVING`` holds what engines feed the kernels:
decode batches, prefill chunks and the block sizes they use. ``largest(field)`` is the largest
value of a field over every preset at TP 1: the boundary examples (``cases/boundaries.py``) cross
every power of two from 16 up to it, and the ``gpu`` profile's limits (``cases/sizes.py``)
reach it. The start-up benchmark (``benchmarks/bench_startup.py``) takes its depths from here.

A leaf module: it imports nothing of the suite.
"""

from __future__ import annotations

import dataclasses

TP_DEGREES = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class Preset:
    """One model's attention. ``attention`` is ``"mla"`` (``concat_and_cache_mla*``: ``latent`` is
    kv_lora_rank, ``rotary_dim`` qk_rope_head_dim, ``nope`` qk_nope_head_dim) or ``"mha"``
    (``*_cache_flash``: GQA when ``kv_heads < heads``; ``rotary_dim < head_size`` is partial rotary).
    ``table_rows`` is the cos/sin table's length (YaRN: original positions x factor)."""

    name: str
    source: str
    attention: str
    layers: int
    heads: int
    kv_heads: int
    head_size: int
    rotary_dim: int
    table_rows: int
    is_neox: bool
    latent: int = 0
    nope: int = 0
    value_head_size: int = 0

    def per_rank(self, tp: int) -> dict[str, int]:
        """The sizes one rank's kernels see at tensor-parallel degree ``tp``."""
        sizes = dict(heads=max(self.heads // tp, 1), head_size=self.head_size, rotary_dim=self.rotary_dim,
                     table_rows=self.table_rows)
        if self.attention == "mla":
            return dict(sizes, latent=self.latent, nope=self.nope)
        return dict(sizes, kv_heads=max(self.kv_heads // tp, 1), value_head_size=self.value_head_size or self.head_size)


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


_DEEPSEEK_MLA = dict(attention="mla", head_size=192, rotary_dim=64, latent=512, nope=128, value_head_size=128,
                     is_neox=False)
PRESETS: dict[str, Preset] = {p.name: p for p in (
    # MLA: kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128; YaRN, original 4096 positions
    Preset("deepseek-v2", _hf("deepseek-ai/DeepSeek-V2"), layers=60, heads=128, kv_heads=1, table_rows=4096 * 40,
           **_DEEPSEEK_MLA),
    Preset("deepseek-v2-lite", _hf("deepseek-ai/DeepSeek-V2-Lite"), layers=27, heads=16, kv_heads=1,
           table_rows=4096 * 40, **_DEEPSEEK_MLA),
    Preset("deepseek-v3", _hf("deepseek-ai/DeepSeek-V3"), layers=61, heads=128, kv_heads=1, table_rows=4096 * 40,
           **_DEEPSEEK_MLA),  # DeepSeek-R1 has the same attention
    Preset("kimi-k2", _hf("moonshotai/Kimi-K2-Instruct"), layers=61, heads=64, kv_heads=1, table_rows=4096 * 32,
           **_DEEPSEEK_MLA),
    # MHA / GQA
    Preset("llama-2-7b", _hf("meta-llama/Llama-2-7b-hf"), attention="mha", layers=32, heads=32, kv_heads=32,
           head_size=128, rotary_dim=128, table_rows=4096, is_neox=True),
    Preset("llama-3.1-8b", _hf("meta-llama/Llama-3.1-8B"), attention="mha", layers=32, heads=32, kv_heads=8,
           head_size=128, rotary_dim=128, table_rows=131072, is_neox=True),
    Preset("llama-3.1-405b", _hf("meta-llama/Llama-3.1-405B"), attention="mha", layers=126, heads=128, kv_heads=8,
           head_size=128, rotary_dim=128, table_rows=131072, is_neox=True),
    Preset("qwen2.5-7b", _hf("Qwen/Qwen2.5-7B-Instruct"), attention="mha", layers=28, heads=28, kv_heads=4,
           head_size=128, rotary_dim=128, table_rows=32768, is_neox=True),
    Preset("qwen2.5-72b", _hf("Qwen/Qwen2.5-72B-Instruct"), attention="mha", layers=80, heads=64, kv_heads=8,
           head_size=128, rotary_dim=128, table_rows=32768, is_neox=True),
    # GLM-4: rotary on half of each head, GPT-J (interleaved) pairs
    Preset("glm-4-9b", _hf("THUDM/glm-4-9b-chat"), attention="mha", layers=40, heads=32, kv_heads=2,
           head_size=128, rotary_dim=64, table_rows=131072, is_neox=False),
    Preset("gemma-7b", _hf("google/gemma-7b"), attention="mha", layers=28, heads=16, kv_heads=16,
           head_size=256, rotary_dim=256, table_rows=8192, is_neox=True),
)}


@dataclasses.dataclass(frozen=True)
class Serving:
    """What serving engines feed one kernel call."""

    decode_tokens: tuple[int, int] = (1, 512)  # a decode batch: one token per running request
    prefill_chunk: int = 16384  # chunked prefill: vLLM max_num_batched_tokens, SGLang chunked_prefill_size
    grid_rows: int = 65535  # CUDA's limit in grid y and z: a kernel that puts tokens there fails past it
    # 1: SGLang's default page; 16: vLLM's default; 64: FlashMLA's; any size is allowed by the contract,
    # and engines use sizes that are not powers of two (vLLM sizes hybrid models' attention blocks to
    # the Mamba state), so the suite also draws 3, 5 and 48
    block_sizes: tuple[int, ...] = (1, 16, 32, 64, 128, 256)


SERVING = Serving()


def largest(field: str) -> int:
    """The largest value of ``field`` in any preset at TP 1 (or in ``SERVING`` for ``tokens``
    and ``block_size``)."""
    if field == "tokens":
        return SERVING.prefill_chunk
    if field == "block_size":
        return max(SERVING.block_sizes)
    values = [preset.per_rank(1).get(field) for preset in PRESETS.values()]
    return max(value for value in values if value is not None)


def values_of(field: str) -> tuple[int, ...]:
    """Every value of ``field`` some preset's rank has at some TP degree in ``TP_DEGREES``."""
    found = {preset.per_rank(tp).get(field) for preset in PRESETS.values() for tp in TP_DEGREES}
    return tuple(sorted(value for value in found if value))
