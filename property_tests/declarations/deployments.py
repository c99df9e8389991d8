"""Named deployments engines run, as data: a model at a TP degree, a cache format, a block size and
an engine's tensor layouts, all in one call, because bugs live where two such conditions meet.

A ``Deployment``'s fields (a user declares their own in the same form; ``problems_of`` says what
is wrong with one):

``name``            unique across the suite
``preset``          a ``presets.PRESETS`` name, or a ``presets.Preset`` of the user's own model; ``tp``
                    a degree of ``presets.TP_DEGREES``
``heads``,          the per-rank query and KV heads (``kv_heads`` 0 for MLA), as ``Preset.per_rank(tp)``
``kv_heads``        gives them: stated so a reader sees them, checked so they cannot drift
``kv_cache_dtype``  ``auto``, ``bfloat16`` or ``fp8_e4m3`` (``dtypes.KV_CACHE_DTYPES``)
``scale``           a ``SCALE_KINDS`` entry the layout passes: ``unit``, ``tensor`` (one non-unit value)
                    or ``per_head`` (``[Hkv]``, a different value per head; MHA cache ops only);
                    ``unit`` for a non-fp8 cache
``block_size``      one the layout's engine allows (``EngineLayout.allows_block_size``)
``layout``          an ``engine_layouts.LAYOUTS`` name: where every input lives and the cache's form
``batch``           ``decode``: a few tokens, scattered slots (one block each), positions among the
                    table's last rows; ``prefill``: a chunk past the largest decode batch, consecutive
                    positions, consecutive slots starting mid-block (at ``block_size // 2``)
``tokens``          the token count run on the CPU (every profile runs every deployment through
                    Triton's interpreter): decode 4 to 8, prefill 24 to 40, past every decode count
``operations``      the ``operations.OPERATIONS`` it runs, each one of its layout's
``why``             the conditions it combines
``sources``         ``path:line`` in the pinned engine of the settings that make it (block size,
                    backend, cache format); a user's deployment may leave it empty

``cpu_elements`` gives what one example allocates: the parents of its inputs, the cache (blocks as
``num_blocks`` says) and the cos/sin table (``table_rows x rotary_dim``; only the rows read are
computed when unused rows are poisoned). The largest example holds 1.2 million input and cache
elements (DeepSeek-V3 TP 1 prefill: q [40, 128, 192]); the table dominates where it is long (up
to 16.8 million, Llama-3.1's 131,072 rows x 128). docs/REAL_SIZES.md lists them all.

Imports only other ``declarations`` modules.
"""

from __future__ import annotations

import dataclasses
import math
import re

from .dtypes import KV_CACHE_DTYPES
from .engine_layouts import LAYOUTS, SCALE_KINDS, size_of
from .operations import CACHING_OPERATIONS, OPERATIONS
from .presets import PRESETS, TP_DEGREES, Preset

BATCHES = ("decode", "prefill")
# q_lora_rank of each MLA preset (its config.json, the preset's source); 0: no q-LoRA
Q_LORA_RANK = {"deepseek-v2": 1536, "deepseek-v2-lite": 0, "deepseek-v3": 1536, "kimi-k2": 1536}
SOURCE_FORM = re.compile(r"^[\w./-]+\.py:\d+$")


@dataclasses.dataclass(frozen=True)
class Deployment:
    name: str
    preset: str | Preset
    tp: int
    heads: int
    kv_heads: int
    kv_cache_dtype: str
    scale: str
    block_size: int
    layout: str
    batch: str
    tokens: int
    operations: tuple[str, ...]
    why: str
    sources: tuple[str, ...]

    @property
    def model(self) -> Preset:
        """The model's geometry: the named preset, or the user's own ``Preset``."""
        return self.preset if isinstance(self.preset, Preset) else PRESETS[self.preset]

    @property
    def model_name(self) -> str:
        return self.model.name

    def sizes(self) -> dict[str, int]:
        """Every size the layout's expressions name: ``Preset.per_rank(tp)``, ``tokens``, ``q_lora_rank``."""
        return dict(self.model.per_rank(self.tp), tokens=self.tokens,
                    q_lora_rank=Q_LORA_RANK.get(self.model_name, 0))

    def num_blocks(self) -> int:
        """Blocks the cache needs: one per decode token, or the chunk from mid-block on, plus a spare."""
        if self.batch == "decode":
            return self.tokens + 1
        return math.ceil((self.block_size // 2 + self.tokens) / self.block_size) + 1


def cpu_elements(deployment: Deployment) -> dict[str, int]:
    """Elements one example allocates: ``inputs`` (each distinct parent once), ``cache``, ``table``."""
    layout, sizes = LAYOUTS[deployment.layout], deployment.sizes()
    parents = {view.parent: math.prod(size_of(e, sizes) for e in view.parent_shape)
               for view in layout.views if set(view.operations) & set(deployment.operations)}
    slots = deployment.num_blocks() * deployment.block_size
    if layout.attention == "mla":
        cache = slots * (sizes["latent"] + sizes["rotary_dim"])
    else:
        cache = slots * sizes["kv_heads"] * (sizes["head_size"] + sizes["value_head_size"])
    if not set(deployment.operations) & set(CACHING_OPERATIONS):
        cache = 0
    return dict(inputs=sum(parents.values()), cache=cache, table=sizes["table_rows"] * sizes["rotary_dim"])


def problems_of(deployment: Deployment, user: bool = False) -> list[str]:
    """What is wrong with ``deployment``, one message per problem (empty: nothing). A ``user``'s
    deployment may name its own ``Preset`` and leave ``sources`` empty."""
    d = deployment
    known = isinstance(d.preset, Preset) if user else False
    if not (known or (isinstance(d.preset, str) and d.preset in PRESETS)) or d.layout not in LAYOUTS:
        return [f"{d.name}: preset {getattr(d.preset, 'name', d.preset)!r} or layout {d.layout!r} unknown"
                + (" (a PRESETS name or a Preset)" if user else "")]
    layout, preset = LAYOUTS[d.layout], d.model
    per_rank = preset.per_rank(d.tp) if d.tp in TP_DEGREES else {}
    checks = {
        f"tp {d.tp} not in {TP_DEGREES}": d.tp in TP_DEGREES,
        f"heads {d.heads}, kv_heads {d.kv_heads}: per_rank({d.tp}) gives {per_rank.get('heads')}, "
        f"{per_rank.get('kv_heads', 0)}": (d.heads, d.kv_heads) == (per_rank.get("heads"), per_rank.get("kv_heads", 0)),
        f"a {preset.attention} preset on a {layout.attention} layout": preset.attention == layout.attention,
        f"operations {d.operations} not all among the layout's {layout.operations}":
            bool(d.operations) and set(d.operations) <= set(layout.operations) and set(d.operations) <= set(OPERATIONS),
        f"block size {d.block_size} not allowed by {d.layout}": layout.allows_block_size(d.block_size),
        f"kv_cache_dtype {d.kv_cache_dtype!r} unknown": d.kv_cache_dtype in KV_CACHE_DTYPES,
        f"scale {d.scale!r} not one {d.layout} passes with a {d.kv_cache_dtype} cache": d.scale in SCALE_KINDS and (
            d.scale in layout.scales if d.kv_cache_dtype.startswith("fp8") else d.scale == "unit"),
        f"batch {d.batch!r} not in {BATCHES}": d.batch in BATCHES,
        f"sources {d.sources} not all path:line": (user or bool(d.sources)) and all(SOURCE_FORM.match(s) for s in d.sources),
    }
    return [f"{d.name}: {message}" for message, ok in checks.items() if not ok]


_ALL_MLA = ("rotary_embedding", "concat_and_cache_mla", "concat_and_cache_mla_rope_fused")
_MHA = ("rotary_embedding", "reshape_and_cache_flash")
_V16 = "vllm/config/cache.py:185"                    # vLLM's default block size, 16
_VFP8 = "vllm/config/cache.py:49"                    # --kv-cache-dtype fp8_e4m3
_V_FA_MLA = "vllm/platforms/cuda.py:150"             # FLASH_ATTN_MLA first for MLA on Hopper
_V_FLASHMLA = "vllm/v1/attention/backends/mla/flashmla.py:58"
_V_FI_MLA = "vllm/v1/attention/backends/mla/flashinfer_mla.py:205"
_V_FA = "vllm/platforms/cuda.py:176"                 # FLASH_ATTN first for MHA before Blackwell
_V_FI = "vllm/platforms/cuda.py:163"                 # FLASHINFER first for MHA on Blackwell
_V_PER_HEAD = "vllm/model_executor/layers/attention/attention.py:294"
_V_TRITON = "vllm/config/attention.py:40"            # --attention-backend TRITON_ATTN (a user's choice)
_V_TRITON_AUTO = "vllm/platforms/cuda.py:178"        # TRITON_ATTN third for MHA, after FLASH_ATTN and FLASHINFER
_S_PAGE = "sglang/srt/arg_groups/overrides.py:1362"  # SGLang's default page size, 1
_SFP8 = "sglang/srt/model_executor/model_runner_components/load_model_utils.py:123"
_S_TRTLLM = "sglang/srt/arg_groups/model_overrides/deepseek_v2.py:185"
_L64 = "lmdeploy/messages.py:557"                    # LMDeploy's default block size, 64
_LFP8 = "lmdeploy/messages.py:25"                    # quant_policy 16 (FP8): an e4m3 cache, scales fixed at 1.0


def _d(name: str, preset: str, tp: int, heads: int, kv_heads: int, cache: str, block_size: int, layout: str,
       batch: str, tokens: int, operations: tuple[str, ...], why: str, *sources: str) -> Deployment:
    """``cache``: ``auto``, ``bf16`` (kv_cache_dtype ``bfloat16``), ``fp8`` (``fp8_e4m3``, a non-unit
    scale), ``fp8-unit`` (scale 1.0) or ``fp8-per-head``."""
    dtype, scale = {"auto": ("auto", "unit"), "bf16": ("bfloat16", "unit"), "fp8": ("fp8_e4m3", "tensor"),
                    "fp8-unit": ("fp8_e4m3", "unit"), "fp8-per-head": ("fp8_e4m3", "per_head")}[cache]
    return Deployment(name, preset, tp, heads, kv_heads, dtype, scale, block_size, layout, batch, tokens,
                      operations, why, sources)


DEPLOYMENTS = (
    # DeepSeek-V3 (R1): 128 query heads at TP 1, 16 at TP 8; q_pe inside q [T, H, 192], k_pe in [T, 2112]
    _d("deepseek-v3-tp1-fp8-vllm-decode", "deepseek-v3", 1, 128, 0, "fp8", 64, "vllm-mla", "decode", 4, _ALL_MLA,
       "128 heads, k_pe in the 2112-wide q-LoRA output, a scaled fp8 cache, last YaRN rows", _VFP8, _V_FLASHMLA),
    _d("deepseek-v3-tp1-fp8-vllm-prefill", "deepseek-v3", 1, 128, 0, "fp8", 64, "vllm-mla", "prefill", 40, _ALL_MLA,
       "a prefill chunk of 128 heads crossing a 64-slot block from its middle, fp8", _VFP8, _V_FLASHMLA),
    _d("deepseek-v3-tp8-bf16-vllm-decode", "deepseek-v3", 8, 16, 0, "auto", 16, "vllm-mla", "decode", 8, _ALL_MLA,
       "16 heads per rank, default 16-slot blocks, scattered slots", _V16, _V_FA_MLA),
    _d("deepseek-v3-tp8-fp8-vllm-prefill", "deepseek-v3", 8, 16, 0, "fp8", 32, "vllm-mla", "prefill", 40, _ALL_MLA,
       "FlashInfer MLA's 32-slot blocks (Blackwell), fp8, a chunk over two blocks", _VFP8, _V_FI_MLA),
    _d("deepseek-v3-tp1-bf16-sglang-decode", "deepseek-v3", 1, 128, 0, "bf16", 1, "sglang-mla", "decode", 4,
       _ALL_MLA[:2], "SGLang's one-token pages, [T, 1, L] and [T, 1, R] inputs, 128 heads", _S_PAGE),
    _d("deepseek-v3-tp8-fp8-sglang-prefill", "deepseek-v3", 8, 16, 0, "fp8-unit", 1, "sglang-mla", "prefill", 40,
       _ALL_MLA[:2], "an fp8 cache written by a plain cast (scale 1), one-token pages", _SFP8, _S_PAGE),
    _d("deepseek-v3-tp8-fp8-sglang-trtllm-decode", "deepseek-v3", 8, 16, 0, "fp8-unit", 64, "sglang-mla-trtllm",
       "decode", 8, ("concat_and_cache_mla_rope_fused",), "SGLang's Blackwell default: fused rope + fp8, 64-slot pages",
       _S_TRTLLM, "sglang/srt/arg_groups/overrides.py:1159"),
    _d("deepseek-v3-tp4-bf16-sglang-trtllm-prefill", "deepseek-v3", 4, 32, 0, "bf16", 32, "sglang-mla-trtllm",
       "prefill", 40, ("concat_and_cache_mla_rope_fused",), "32 heads, 32-slot pages, a chunk from mid-page",
       _S_TRTLLM, "sglang/srt/arg_groups/overrides.py:1159"),
    # DeepSeek-V2-Lite: no q-LoRA, k_pe in [T, 576]
    _d("deepseek-v2-lite-tp1-bf16-vllm-decode", "deepseek-v2-lite", 1, 16, 0, "auto", 16, "vllm-mla", "decode", 8,
       _ALL_MLA, "no q-LoRA: k_pe at column 512 of the 576-wide KV-A output", _V16, _V_FA_MLA),
    _d("deepseek-v2-lite-tp1-fp8-vllm-prefill", "deepseek-v2-lite", 1, 16, 0, "fp8", 16, "vllm-mla", "prefill", 40,
       _ALL_MLA, "no q-LoRA with a scaled fp8 cache, a chunk over three 16-slot blocks", _VFP8, _V_FA_MLA),
    # Kimi-K2: 64 heads, a 131,072-row YaRN table
    _d("kimi-k2-tp8-fp8-vllm-decode", "kimi-k2", 8, 8, 0, "fp8", 64, "vllm-mla", "decode", 8, _ALL_MLA,
       "8 heads per rank, the last rows of a 131,072-row table, fp8, 64-slot blocks", _VFP8, _V_FLASHMLA),
    _d("kimi-k2-tp1-bf16-sglang-prefill", "kimi-k2", 1, 64, 0, "bf16", 1, "sglang-mla", "prefill", 24, _ALL_MLA[:2],
       "64 heads, one-token pages, consecutive positions", _S_PAGE),
    # Llama-3.1-8B: GQA 32/8
    _d("llama-3.1-8b-tp1-bf16-vllm-flash-prefill", "llama-3.1-8b", 1, 32, 8, "auto", 16, "vllm-flash", "prefill", 40,
       _MHA, "GQA 4:1, q and k as [T, H*D] columns of qkv, K|V halves of one row per head", _V16, _V_FA),
    _d("llama-3.1-8b-tp1-fp8-vllm-flash-decode", "llama-3.1-8b", 1, 32, 8, "fp8-per-head", 16, "vllm-flash", "decode",
       8, _MHA, "per-head fp8 scales that differ per KV head, K|V halves", _VFP8, _V_PER_HEAD),
    _d("llama-3.1-8b-tp1-bf16-vllm-flashinfer-prefill", "llama-3.1-8b", 1, 32, 8, "auto", 32, "vllm-flashinfer",
       "prefill", 40, _MHA, "the FlashInfer backend's 32-slot blocks, a chunk from mid-block", _V16,
       "vllm/v1/attention/backends/flashinfer.py:603"),
    _d("llama-3.1-8b-tp2-fp8-vllm-flashinfer-hnd-decode", "llama-3.1-8b", 2, 16, 4, "fp8", 64, "vllm-flashinfer-hnd",
       "decode", 8, _MHA, "Blackwell's HND blocks with K|V halves, fp8, TP 2", _VFP8, _V_FI,
       "vllm/v1/attention/backends/flashinfer.py:734"),
    # the fused rope + flash write, where engines fuse it (ROCm): vLLM's AITER path, SGLang's ROCm rotary
    _d("llama-3.1-8b-tp1-fp8-vllm-rocm-rope-cache-decode", "llama-3.1-8b", 1, 32, 8, "fp8", 16,
       "vllm-rope-cache-rocm", "decode", 8, ("rope_and_reshape_and_cache_flash",),
       "the fused rope + cache write of vLLM's ROCm backends, fp8 with a scale, 16-slot blocks", _VFP8,
       "vllm/v1/attention/backends/triton_attn.py:871"),
    _d("llama-3.1-8b-tp1-bf16-sglang-rocm-rope-cache-prefill", "llama-3.1-8b", 1, 32, 8, "bf16", 1,
       "sglang-rope-cache", "prefill", 24, ("rope_and_reshape_and_cache_flash",),
       "SGLang's fused rope + cache write (ROCm), one-token pages, padded tokens to slot 0", _S_PAGE,
       "sglang/srt/models/utils.py:299"),
    # Llama-3.1-405B: 128 query heads over 8 KV heads; one KV head per rank at TP 8
    _d("llama-3.1-405b-tp1-fp8-vllm-flash-decode", "llama-3.1-405b", 1, 128, 8, "fp8", 16, "vllm-flash", "decode", 4,
       _MHA, "128 query heads (a 16:1 group), fp8, a 18,432-wide qkv row", _VFP8, _V_FA),
    _d("llama-3.1-405b-tp8-bf16-vllm-flash-prefill", "llama-3.1-405b", 8, 16, 1, "auto", 16, "vllm-flash", "prefill",
       40, _MHA, "one KV head per rank: head stride 2D in a one-head row", _V16, _V_FA),
    _d("llama-3.1-405b-tp8-fp8-sglang-decode", "llama-3.1-405b", 8, 16, 1, "fp8", 1, "sglang-mha", "decode", 8, _MHA,
       "SGLang's [2, slots, Hkv, D] pool with one-token pages, fp8 with a scale", _SFP8, _S_PAGE),
    # Llama-2-7B: MHA, a 4,096-row table
    _d("llama-2-7b-tp1-bf16-sglang-prefill", "llama-2-7b", 1, 32, 32, "bf16", 1, "sglang-mha", "prefill", 24, _MHA,
       "no GQA (32 KV heads), a short table, one-token pages", _S_PAGE),
    _d("llama-2-7b-tp1-fp8-vllm-flash-decode", "llama-2-7b", 1, 32, 32, "fp8-per-head", 16, "vllm-flash", "decode", 4,
       _MHA, "32 per-head scales, positions at the end of a 4,096-row table", _VFP8, _V_PER_HEAD),
    # Gemma-7B: 256-wide heads
    _d("gemma-7b-tp1-bf16-vllm-flash-prefill", "gemma-7b", 1, 16, 16, "auto", 16, "vllm-flash", "prefill", 24, _MHA,
       "256-wide heads: a 512-wide K|V row per head", _V16, _V_FA),
    _d("gemma-7b-tp2-fp8-vllm-flashinfer-decode", "gemma-7b", 2, 8, 8, "fp8", 16, "vllm-flashinfer", "decode", 4,
       _MHA, "256-wide heads, fp8 with a scale, FlashInfer's blocks", _VFP8,
       "vllm/v1/attention/backends/flashinfer.py:603"),
    # Qwen2.5: 28 (7B) and 64 (72B) query heads
    _d("qwen2.5-7b-tp1-bf16-vllm-flash-decode", "qwen2.5-7b", 1, 28, 4, "auto", 16, "vllm-flash", "decode", 8, _MHA,
       "28 query heads (not a power of two) over 4 KV heads", _V16, _V_FA),
    _d("qwen2.5-72b-tp8-fp8-vllm-flash-prefill", "qwen2.5-72b", 8, 8, 1, "fp8-per-head", 16, "vllm-flash",
       "prefill", 40, _MHA, "one KV head per rank with a one-element per-head scale, a 32,768-row table", _VFP8, _V_PER_HEAD),
    # GLM-4: rotary on the first 64 of 128, GPT-J pairs
    _d("glm-4-9b-tp1-bf16-vllm-flash-prefill", "glm-4-9b", 1, 32, 2, "auto", 16, "vllm-flash", "prefill", 40, _MHA,
       "partial GPT-J rotary (64 of 128) on [T, H*D] columns, 2 KV heads", _V16, _V_FA,
       "vllm/model_executor/models/chatglm.py:130"),
    _d("glm-4-9b-tp2-bf16-sglang-decode", "glm-4-9b", 2, 16, 1, "bf16", 1, "sglang-mha", "decode", 8, _MHA,
       "heads sliced to the rotary width ([T, H, 64] of a 128 head), one KV head", _S_PAGE,
       "sglang/srt/layers/rotary_embedding/base.py:466"),
    # LMDeploy's PyTorch engine: per-layer views into one packed byte pool, block 0 reserved for padding
    _d("deepseek-v3-tp8-bf16-lmdeploy-decode", "deepseek-v3", 8, 16, 0, "auto", 64, "lmdeploy-mla", "decode", 8,
       ("concat_and_cache_mla",), "[T, 1, L + R] key_states whole, the value cache a view of the key cache, "
       "64-slot blocks of a layer's pool chunk (FlashMLA's and Triton's path alike)", _L64,
       "lmdeploy/messages.py:573"),
    _d("llama-3.1-8b-tp1-bf16-lmdeploy-prefill", "llama-3.1-8b", 1, 32, 8, "bf16", 64, "lmdeploy-flash", "prefill",
       40, _MHA, "head views of qkv rotated in place, K then V packed in each block of a layer's pool chunk", _L64),
    _d("llama-3.1-8b-tp1-fp8-lmdeploy-decode", "llama-3.1-8b", 1, 32, 8, "fp8-unit", 16, "lmdeploy-flash", "decode",
       8, _MHA, "LMDeploy's smallest block (16), an fp8 cache at scale 1, K|V packed per block",
       "lmdeploy/messages.py:623", _LFP8),
    # vLLM's Triton attention backend: its own Triton write (triton_reshape_and_cache_flash) into the K|V halves;
    # the rope call is vllm-flash's (the backend does not change it), so the cache write alone; listed last, so the
    # deployments above keep their positions in the suite's draws of a deployment
    _d("llama-3.1-8b-tp1-bf16-vllm-triton-attn-decode", "llama-3.1-8b", 1, 32, 8, "auto", 16, "vllm-triton-attn",
       "decode", 8, ("reshape_and_cache_flash",), "the Triton backend's write, K|V halves, default 16-slot blocks",
       _V_TRITON, _V_TRITON_AUTO, _V16),
    _d("llama-3.1-8b-tp1-fp8-vllm-triton-attn-prefill", "llama-3.1-8b", 1, 32, 8, "fp8", 32, "vllm-triton-attn",
       "prefill", 40, ("reshape_and_cache_flash",),
       "the Triton backend's fp8 write with a scale, 32-slot blocks (a multiple of 16), a chunk from mid-block",
       _V_TRITON, _VFP8, "vllm/v1/attention/backends/triton_attn.py:340"),
)
