"""The tensor layouts serving engines pass at their call sites of the five operations, as data.

Each ``EngineLayout`` is what one engine version hands one family of calls: per input tensor a
``View`` (which parent tensor it is a view of, the parent's shape, where the view starts), the
cache's form, the slot and position dtypes, the padding slot and the block sizes the engine uses
by default and allows. Every entry names its source as ``path:line`` in the pinned version
(``ci/engine_pins.sh``; ``ci/check_engine_sources.py DIR`` re-checks the lines against unpacked
wheels). Where a layout is decided in C++ or the Python sources do not say, ``notes`` says so.

Sizes are expressions over the names of ``Preset.per_rank`` (``tokens``, ``heads``, ``kv_heads``,
``head_size``, ``value_head_size``, ``rotary_dim``, ``latent``, ``nope``) plus ``q_lora_rank``
(0 for a model without q-LoRA); ``size_of`` evaluates one.

How an entry maps onto the suite's names (``cases/types.py`` ``Placement``,
``cases/engine_caches.py``):

* a ``View`` is a ``Placement`` of the view in its parent: ``pad[d] = parent_shape[d] - shape[d]``,
  ``offset[d] = start[d]``, ``order`` empty (row-major), ``lead = trail = 0``;
  ``placement_of(view, sizes)`` returns exactly those keyword arguments. A view whose parent is
  its own shape (``kv_c``, a layernorm output) is plain.
* ``CacheForm.pool`` is ``engine_caches.POOLS`` (``separate``: one allocation per layer;
  ``chunked``: one pool, layer-outer; ``interleaved``: one pool, block-outer), ``kv`` is
  ``engine_caches.KV_FORMS`` (``flash`` ``[2, NB, B, Hkv, D]`` unbind(0); ``flashinfer``
  ``[NB, 2, B, Hkv, D]`` unbind(1); ``split`` two allocations; ``halves`` ``[NB, B, Hkv, 2D]``
  split(D, dim=-1)); ``hnd`` is the suite's HND flag; MLA caches have ``kv=""``.
* ``table_dtype`` is ``TableSpec.dtype`` (``float32`` or ``input``, the activations' dtype).

Not found in the Python sources (decided in C++ or not stated): whether FlashInfer's
``quant_scale_kv`` multiplies or divides; the dtype FlashInfer's rope takes for positions; the
strides vLLM's CUDA ``reshape_and_cache_flash`` accepts beyond the views its callers pass (the
``halves`` form gives a key_cache head stride of 2D). FlashInfer's ``mla_rope_quantize_fp8``
(SGLang's fused fp8 MLA path) rotates and quantizes into new tensors and writes no cache.

Imports only ``declarations.layout_types`` (its types), ``declarations.engine_views`` (the views engines
make, as ``View`` builders) and ``declarations.lmdeploy_layouts`` (LMDeploy's layouts, built the same way).
"""

from __future__ import annotations

import dataclasses

from .engine_views import QKV_COLUMNS, mla_view, plain_view, qkv_view
from .layout_types import KV_FORMS, SCALE_KINDS, CacheForm, Call, EngineLayout, View, placement_of, size_of
from .lmdeploy_layouts import LMDEPLOY

__all__ = ["LAYOUTS", "KV_FORMS", "SCALE_KINDS", "CacheForm", "Call", "EngineLayout", "View",
           "placement_of", "size_of"]

# ---------------------------------------------------------------- vLLM 0.33.0

_MLA_OPS = ("rotary_embedding", "concat_and_cache_mla", "concat_and_cache_mla_rope_fused")
_MLA_CACHE_OPS = _MLA_OPS[1:]
_VLLM_MLA = "vllm/model_executor/layers/mla.py"
_VLLM_INDEX = dict(slot_dtype="int64", padding_slot=-1, positions_dtype="int64")
_VLLM_INDEX_SOURCES = ("vllm/v1/worker/block_table.py:85", "vllm/v1/attention/backends/utils.py:54",
                       "vllm/v1/worker/gpu_model_runner.py:778", "vllm/config/cache.py:185")
_VLLM_FP8 = "k_scale (and v_scale): a tensor [1] fp32, divided by (CONTRACT §3)"
_VLLM_FP8_PER_HEAD = _VLLM_FP8 + "; [Hkv] per head with a kv_cache_scheme of strategy attn_head on FlashAttention 3"
_VLLM_HALVES = ("one pool per KV-cache group: logical [layers, NB, Hkv, B, 2D], stored {order}; a layer's "
                "key_cache, value_cache = kv_cache.transpose(1, 2).split(D, dim=-1)")
_VLLM_QKV = "vllm/model_executor/models/llama.py:230"
_VLLM_TRITON = "vllm/v1/attention/backends/triton_attn.py"
_VLLM_MHA_VIEWS = (
    qkv_view("query", ("rotary_embedding",), 2, _VLLM_QKV),
    qkv_view("key", ("rotary_embedding",), 2, _VLLM_QKV),
    qkv_view("key", ("reshape_and_cache_flash",), 3, "vllm/model_executor/layers/attention/attention.py:541"),
    qkv_view("value", ("reshape_and_cache_flash",), 3, "vllm/model_executor/layers/attention/attention.py:543"),
)
_VLLM_ROPE = Call("rotary_embedding", "vllm._custom_ops.rotary_embedding (RotaryEmbedding.forward_cuda)",
                  "vllm/model_executor/layers/rotary_embedding/base.py:244")
_VLLM_MHA_NOTES = ("The same qkv split in qwen2.py:214, gemma.py:199 and chatglm.py:130 (GLM-4, partial GPT-J "
                   "rotary). The K/V form is 'halves' (layout_types.KV_FORMS). An "
                   "interleaved pool (BLNHC, BLHNC: block-outer) is used only when every backend of the worker "
                   "declares it (vllm/v1/attention/backends/utils.py:229).")

_VLLM = (
    EngineLayout(
        "vllm-mla", "vllm", "mla",
        calls=(Call("rotary_embedding", "torch.ops.vllm.flashinfer_rotary_embedding (FlashInfer's "
                    "apply_rope_with_cos_sin_cache_inplace)",
                    "vllm/model_executor/layers/rotary_embedding/deepseek_scaling_rope.py:211"),
               Call("concat_and_cache_mla", "vllm._custom_ops.concat_and_cache_mla",
                    "vllm/v1/attention/backend.py:1122"),
               Call("concat_and_cache_mla_rope_fused", "vllm._custom_ops.concat_and_cache_mla_rope_fused",
                    "vllm/compilation/passes/fusion/mla_rope_kvcache_cat_fusion.py:43")),
        views=(mla_view("query", "q_pe", ("rotary_embedding",), f"{_VLLM_MLA}:228"),
               mla_view("key", "k_pe_head", ("rotary_embedding",), f"{_VLLM_MLA}:219"),
               mla_view("q_pe", "q_pe", ("concat_and_cache_mla_rope_fused",), f"{_VLLM_MLA}:228"),
               mla_view("k_pe", "k_pe", _MLA_CACHE_OPS, f"{_VLLM_MLA}:203"),
               mla_view("kv_c", "kv_c", _MLA_CACHE_OPS, f"{_VLLM_MLA}:217")),
        cache=CacheForm("chunked", "", False, "one pool per KV-cache group: logical [layers, NB, 1, B, L + R], "
                        "stored LBNHC (layer-outer, the default preference); a layer's view squeezed to "
                        "[NB, B, L + R]", "vllm/v1/core/kv_cache_planning.py:721"),
        **_VLLM_INDEX, table_dtype="float32", block_default=16, block_sizes=(), block_multiple=16,
        scales=("unit", "tensor"), fp8_scale=_VLLM_FP8 + "; skip_scale when the scale is 1.0",
        sources=(*_VLLM_INDEX_SOURCES, "vllm/model_executor/layers/attention/mla_attention.py:750",
                 "vllm/v1/attention/backends/mla/flashattn_mla.py:50", "vllm/v1/attention/backends/mla/flashmla.py:58",
                 "vllm/v1/attention/backends/mla/flashinfer_mla.py:205",
                 "vllm/v1/attention/backends/mla/cutlass_mla.py:50",
                 "vllm/model_executor/layers/rotary_embedding/deepseek_scaling_rope.py:56"),
        notes="Block sizes per backend: FLASH_ATTN_MLA (first on Hopper) multiples of 16, FLASHINFER_MLA (first on "
              "Blackwell) 32 or 64, FlashMLA 64, CUTLASS MLA 128. DeepSeek-V2/V3's rotary goes to FlashInfer's "
              "kernel (a bf16/fp16 model on CUDA, head size 64) with a float32 table, otherwise to torch "
              "(forward_native); vllm._custom_ops.rotary_embedding is called only by DeepSeek-V4's rope "
              "(deepseek_scaling_rope.py:327). The rotary key is k_pe.unsqueeze(1), [T, 1, R]; the cache ops "
              "take k_pe.squeeze(1). Without q-LoRA (V2-Lite) k_pe is a view of kv_a_proj_with_mqa's "
              "[T, L + R] output (mla.py:199): q_lora_rank 0 in the same expressions."),
    EngineLayout(
        "vllm-flash", "vllm", "mha",
        calls=(_VLLM_ROPE, Call("reshape_and_cache_flash", "vllm._custom_ops.reshape_and_cache_flash",
                                "vllm/v1/attention/backends/flash_attn.py:1457")),
        views=_VLLM_MHA_VIEWS,
        cache=CacheForm("chunked", "halves", False, _VLLM_HALVES.format(order="LBNHC (NHD, layer-outer)"),
                        "vllm/v1/attention/backends/flash_attn.py:1448"),
        **_VLLM_INDEX, table_dtype="input", block_default=16, block_sizes=(), block_multiple=16,
        scales=("unit", "tensor", "per_head"), fp8_scale=_VLLM_FP8_PER_HEAD,
        sources=(*_VLLM_INDEX_SOURCES, "vllm/v1/attention/backends/flash_attn.py:367",
                 "vllm/v1/attention/backends/utils.py:229", "vllm/model_executor/layers/attention/attention.py:294",
                 "vllm/model_executor/layers/rotary_embedding/base.py:240"),
        notes=_VLLM_MHA_NOTES + " FA4 with head size 256, and FA4 with an fp8 cache on SM90, fix one block "
              "size instead (flash_attn.py:362-365)."),
    EngineLayout(
        "vllm-flashinfer", "vllm", "mha",
        calls=(_VLLM_ROPE, Call("reshape_and_cache_flash", "torch.ops._C_cache_ops.reshape_and_cache_flash",
                                "vllm/v1/attention/backends/flashinfer.py:2847")),
        views=_VLLM_MHA_VIEWS,
        cache=CacheForm("chunked", "halves", False, _VLLM_HALVES.format(order="LBNHC (NHD, layer-outer)"),
                        "vllm/v1/attention/backends/flashinfer.py:2844"),
        **_VLLM_INDEX, table_dtype="input", block_default=16, block_sizes=(16, 32, 64), block_multiple=0,
        scales=("unit", "tensor"), fp8_scale=_VLLM_FP8,
        sources=(*_VLLM_INDEX_SOURCES, "vllm/v1/attention/backends/flashinfer.py:603"),
        notes=_VLLM_MHA_NOTES + " On Hopper and older; Blackwell: vllm-flashinfer-hnd."),
    EngineLayout(
        "vllm-flashinfer-hnd", "vllm", "mha",
        calls=(_VLLM_ROPE, Call("reshape_and_cache_flash", "torch.ops._C_cache_ops.reshape_and_cache_flash",
                                "vllm/v1/attention/backends/flashinfer.py:2847")),
        views=_VLLM_MHA_VIEWS,
        cache=CacheForm("chunked", "halves", True, _VLLM_HALVES.format(order="LBHNC (HND, layer-outer)"),
                        "vllm/v1/attention/backends/flashinfer.py:734"),
        **_VLLM_INDEX, table_dtype="input", block_default=16, block_sizes=(16, 32, 64, 128, 256, 512, 1024),
        block_multiple=0, scales=("unit", "tensor"), fp8_scale=_VLLM_FP8,
        sources=(*_VLLM_INDEX_SOURCES, "vllm/v1/attention/backends/flashinfer.py:604"),
        notes=_VLLM_MHA_NOTES + " Blackwell (capability 10) only: the trtllm-gen kernels read head-major "
              "blocks; pages past 64 only for GQA on trtllm-gen. BLHNC (block-outer: an interleaved pool) is "
              "the other layout it accepts."),
    EngineLayout(
        "vllm-rope-cache-rocm", "vllm", "mha",
        calls=(Call("rope_and_reshape_and_cache_flash", "AttentionImpl.do_rope_and_kv_cache_update (in "
                    "torch.ops.vllm.fused_rope_and_unified_kv_cache_update)",
                    "vllm/compilation/passes/fusion/rope_kvcache_fusion.py:64"),),
        views=tuple(qkv_view(argument, ("rope_and_reshape_and_cache_flash",), 3,
                         "vllm/compilation/passes/fusion/rope_kvcache_fusion.py:337") for argument in QKV_COLUMNS),
        cache=CacheForm("chunked", "halves", False,
                        _VLLM_HALVES.format(order="LBNHC (NHD) by default; ROCm backends also declare LBHNC "
                                                  "and LHBNC (HND)"),
                        "vllm/v1/attention/backends/triton_attn.py:863"),
        **_VLLM_INDEX, table_dtype="input", block_default=16, block_sizes=(), block_multiple=16,
        scales=("unit", "tensor"), fp8_scale=_VLLM_FP8,
        sources=(*_VLLM_INDEX_SOURCES, "vllm/v1/attention/backends/triton_attn.py:340",
                 "vllm/v1/attention/backends/triton_attn.py:871"),
        notes="Only ROCm backends implement the fused MHA rope + cache write (AITER's triton_rope_and_cache); "
              "CUDA backends leave fused_rope_kvcache_supported False, so the pass does not fire there."),
)


# vLLM's Triton attention backend (TRITON_ATTN): its own Triton write. Listed after the other engines' layouts, so
# those keep their positions in the strategies' draws (strategies.engine_views samples LAYOUTS in order).
_VLLM_TRITON_ATTN = EngineLayout(
    "vllm-triton-attn", "vllm", "mha",
    calls=(_VLLM_ROPE, Call("reshape_and_cache_flash", "triton_reshape_and_cache_flash "
                            "(TritonAttentionImpl.do_kv_cache_update: vLLM's Triton kernel)",
                            f"{_VLLM_TRITON}:834")),
    views=_VLLM_MHA_VIEWS,
    cache=CacheForm("chunked", "halves", False,
                    _VLLM_HALVES.format(order="LBNHC (NHD, layer-outer: the default preference, the backend "
                                              "declaring no layouts)"),
                    f"{_VLLM_TRITON}:828"),
    **_VLLM_INDEX, table_dtype="input", block_default=16, block_sizes=(), block_multiple=16,
    scales=("unit", "tensor"),
    fp8_scale=_VLLM_FP8 + "; every fp8 name viewed as current_platform.fp8_dtype() (float8_e4m3fn on CUDA)",
    sources=(*_VLLM_INDEX_SOURCES, f"{_VLLM_TRITON}:340", f"{_VLLM_TRITON}:326", f"{_VLLM_TRITON}:332",
             f"{_VLLM_TRITON}:514", f"{_VLLM_TRITON}:542", "vllm/platforms/interface.py:1276",
             "vllm/v1/attention/backend.py:187", "vllm/v1/attention/backend.py:326",
             "vllm/v1/attention/backend.py:375", "vllm/v1/attention/backends/utils.py:229",
             "vllm/platforms/cuda.py:178", "vllm/config/attention.py:40"),
    notes=_VLLM_MHA_NOTES + " TRITON_ATTN: on CUDA third in line after FLASH_ATTN and FLASHINFER (cuda.py:176-178),"
          " or chosen with --attention-backend TRITON_ATTN; the last MHA fallback on ROCm (rocm.py:564). Kernel "
          "block sizes: multiples of 16. Caches: auto, float16, bfloat16, fp8, fp8_e4m3, fp8_e5m2 (fp8 only "
          "from capability 8.9, triton_attn.py:514) and per-token-head quantized ones (another kernel, not the "
          "contract's). One k_scale/v_scale: supports_per_head_quant_scales stays False, so a per-head "
          "kv_cache_scheme rules the backend out. vLLM's ROCm backend calls the same wrapper on its own "
          "head-major caches for blocks other than 16 and 32 (rocm_attn.py:516), a layout not declared here.")


# ---------------------------------------------------------------- SGLang 0.5.23

_SGL_MLA = "sglang/srt/models/deepseek_common/attention_forward_methods/forward_mla.py"
_SGL_ROPE = "sglang/srt/layers/rotary_embedding/base.py"
_SGL_POOL = "sglang/srt/mem_cache/memory_pool.py"
_SGL_INDEX = dict(slot_dtype="int64", padding_slot=0, positions_dtype="int64", table_dtype="float32")
_SGL_INDEX_SOURCES = ("sglang/srt/mem_cache/allocator/token.py:44", "sglang/kernels/ops/attention/position.py:13",
                      "sglang/srt/managers/schedule_batch.py:2786", "sglang/kernels/ops/attention/rope.py:200",
                      "sglang/srt/arg_groups/overrides.py:1362")
_SGL_PADDING = ("Padded tokens are written to slot 0, a reserved page (allocator/token.py:43), not skipped "
                "with a negative slot: a padded row's write lands in the cache.")
_SGL_MLA_CACHE = CacheForm("separate", "", False, "per layer torch.zeros((size + page_size, 1, L + R)): slot-major, "
                           "seen as [NB, B, L + R] with B = page_size", f"{_SGL_POOL}:4864")
_SGL_MLA_FP8 = "none: a plain cast, cache_k_nope.to(fp8) (scale 1; torch's cast, not the contract's saturation)"
_SGL_ROPE_CALL = Call("rotary_embedding", "sglang.kernels.ops.attention.rope.apply_rope_with_cos_sin_cache_inplace "
                      "(RotaryEmbedding.forward_cuda)", f"{_SGL_ROPE}:468")
_SGL_MHA_CACHE = CacheForm("separate", "flash", False, "per layer torch.zeros((2, rows, Hkv, D)), rows = size + "
                           "page_size (NHD); K = buf[0, :rows], V = buf[1, :rows]: [2, NB, B, Hkv, D] with "
                           "B = page_size", f"{_SGL_POOL}:2640")

_SGLANG = (
    EngineLayout(
        "sglang-mla", "sglang", "mla",
        calls=(_SGL_ROPE_CALL, Call("concat_and_cache_mla", "MLATokenToKVPool.set_mla_kv_buffer",
                                    "sglang/srt/layers/attention/flashattention_backend.py:2116")),
        views=(mla_view("query", "q_pe", ("rotary_embedding",), f"{_SGL_MLA}:201"),
               mla_view("key", "k_pe_head", ("rotary_embedding",), f"{_SGL_MLA}:202"),
               mla_view("k_pe", "k_pe_head", ("concat_and_cache_mla",), f"{_SGL_MLA}:202"),
               mla_view("kv_c", "kv_c_head", ("concat_and_cache_mla",), f"{_SGL_MLA}:400")),
        cache=_SGL_MLA_CACHE, **_SGL_INDEX, block_default=1, block_sizes=(), block_multiple=1,
        scales=("unit",), fp8_scale=_SGL_MLA_FP8,
        sources=(*_SGL_INDEX_SOURCES, f"{_SGL_POOL}:5016", f"{_SGL_MLA}:345", f"{_SGL_MLA}:363",
                 "sglang/srt/arg_groups/overrides.py:1154"),
        notes=_SGL_PADDING + " k_pe and kv_c reach the cache write as [T, 1, R] and [T, 1, L] (the contract's "
              "[T, R], [T, L] after squeeze(1)). FlashMLA forces page 64 (overrides.py:1154). Without q-LoRA "
              "the latent is kv_a_proj_with_mqa's output (forward_mla.py:485)."),
    EngineLayout(
        "sglang-mla-trtllm", "sglang", "mla",
        calls=(Call("concat_and_cache_mla_rope_fused",
                    "sglang.kernels.ops.attention.utils.mla_quantize_and_rope_for_fp8 "
                    "(FlashInfer's mla_rope_quantize_fp8), then set_mla_kv_buffer",
                    "sglang/srt/layers/attention/trtllm_mla_backend.py:1266"),),
        views=(mla_view("q_pe", "q_pe", ("concat_and_cache_mla_rope_fused",), f"{_SGL_MLA}:201"),
               mla_view("k_pe", "k_pe", ("concat_and_cache_mla_rope_fused",),
                    "sglang/srt/layers/attention/trtllm_mla_backend.py:1270"),
               mla_view("kv_c", "kv_c", ("concat_and_cache_mla_rope_fused",),
                    "sglang/srt/layers/attention/trtllm_mla_backend.py:1269")),
        cache=_SGL_MLA_CACHE, **_SGL_INDEX, block_default=64, block_sizes=(32, 64), block_multiple=0,
        scales=("unit",), fp8_scale="quant_scale_kv=1.0 (fp8 caches only)",
        sources=(*_SGL_INDEX_SOURCES, "sglang/srt/arg_groups/overrides.py:1159",
                 "sglang/kernels/ops/attention/utils.py:117",
                 "sglang/srt/arg_groups/model_overrides/deepseek_v2.py:185"),
        notes=_SGL_PADDING + " The default for DeepSeek-V3/R1 on Blackwell. Not in place: the rotated q and k go "
              "to new fp8 tensors (q_out [T, H, L + R]), which set_mla_kv_buffer then writes; the contract's "
              "fused op matches its cache bytes, not its q_pe/k_pe."),
    EngineLayout(
        "sglang-mha", "sglang", "mha",
        calls=(_SGL_ROPE_CALL, Call("reshape_and_cache_flash", "MHATokenToKVPool.set_kv_buffer",
                                    "sglang/srt/layers/attention/flashattention_backend.py:2103")),
        views=(qkv_view("query", ("rotary_embedding",), 3, f"{_SGL_ROPE}:463", width="rotary_dim"),
               qkv_view("key", ("rotary_embedding",), 3, f"{_SGL_ROPE}:464", width="rotary_dim"),
               qkv_view("key", ("reshape_and_cache_flash",), 3, "sglang/srt/layers/radix_attention.py:126"),
               qkv_view("value", ("reshape_and_cache_flash",), 3, "sglang/srt/layers/radix_attention.py:132")),
        cache=_SGL_MHA_CACHE, **_SGL_INDEX, block_default=1, block_sizes=(), block_multiple=1,
        scales=("unit", "tensor"),
        fp8_scale="k_scale, v_scale python floats: cache_k.div_(k_scale) on the caller's k, in place, then a "
                  "plain cast",
        sources=(*_SGL_INDEX_SOURCES, f"{_SGL_POOL}:2928", f"{_SGL_POOL}:2569",
                 "sglang/srt/arg_groups/overrides.py:1183",
                 "sglang/srt/models/llama.py:245"),
        notes=_SGL_PADDING + " The rotary call gets each head sliced to the rotary width, q.view(T, -1, D)[..., :R] "
              "(partial rotary: GLM-4). With HND (use_hnd) the pool is [pages, Hkv, page, D] per half "
              "(memory_pool.py:2569). trtllm_mha pages: 16, 32, 64, 128."),
    EngineLayout(
        "sglang-rope-cache", "sglang", "mha",
        calls=(Call("rope_and_reshape_and_cache_flash", "apply_rope_with_cos_sin_cache_inplace(fused_args="
                    "FusedSetKVBufferArg)", f"{_SGL_ROPE}:468"),),
        views=(qkv_view("query", ("rope_and_reshape_and_cache_flash",), 3, f"{_SGL_ROPE}:463"),
               qkv_view("key", ("rope_and_reshape_and_cache_flash",), 3, f"{_SGL_ROPE}:464"),
               qkv_view("value", ("rope_and_reshape_and_cache_flash",), 3, "sglang/kernels/ops/attention/rope.py:207")),
        cache=dataclasses.replace(_SGL_MHA_CACHE, source="sglang/srt/models/utils.py:322"),
        **_SGL_INDEX, block_default=1, block_sizes=(), block_multiple=1,
        scales=(), fp8_scale="not taken: bfloat16 caches only, and no k_scale/v_scale",
        sources=(*_SGL_INDEX_SOURCES, "sglang/srt/models/utils.py:299", "sglang/srt/models/utils.py:319"),
        notes=_SGL_PADDING + " Each K/V half is passed as [rows, Hkv * D]. Used by gpt_oss, bailing_moe, sdar_moe, "
              "llada2 and mellum (create_fused_set_kv_buffer_arg), not by Llama, Qwen2, Gemma or GLM-4."),
)


# ---------------------------------------------------------------- FlashInfer 0.7.2 (a library: its API, not a caller)

_FI_ROPE = "flashinfer/rope.py"
_FI_PAGE = "flashinfer/page.py"
_FI_INDEX = dict(slot_dtype="int32", padding_slot=None, positions_dtype="", table_dtype="float32",
                 block_default=16, block_sizes=(), block_multiple=1)
_FI_INDEX_SOURCES = (f"{_FI_PAGE}:665", f"{_FI_ROPE}:1277", f"{_FI_ROPE}:1584", f"{_FI_ROPE}:1645")
_FI_FP8 = ("quant_scale_kv: a python float (fp8 caches only); whether it multiplies or divides is decided in "
           "C++ (the docstring says 'scaling factor')")
_FI_NOTES = ("No slot_mapping: tokens are placed by batch_indices and positions through the page table "
             "(kv_indices, kv_indptr, kv_last_page_len, int32): slot = kv_indices[kv_indptr[b] + p // B] * B "
             "+ p % B. Every token is appended (no padding rows). The pos_ids dtype is not stated in Python. "
             "Neither pinned engine calls these functions (vLLM calls FlashInfer's rope only, SGLang "
             "mla_rope_quantize_fp8 only).")
_FI_FUSED_MHA = Call("rope_and_reshape_and_cache_flash", "flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache",
                     f"{_FI_ROPE}:1567")
_FI_MHA_VIEWS = (
    plain_view("query", ("rotary_embedding",), ("tokens", "heads * head_size"), f"{_FI_ROPE}:1234"),
    plain_view("key", ("rotary_embedding",), ("tokens", "kv_heads * head_size"), f"{_FI_ROPE}:1234"),
    plain_view("query", ("rope_and_reshape_and_cache_flash",), ("tokens", "heads", "rotary_dim"), f"{_FI_ROPE}:1567"),
    plain_view("key", ("reshape_and_cache_flash", "rope_and_reshape_and_cache_flash"),
               ("tokens", "kv_heads", "head_size"),
           f"{_FI_PAGE}:580"),
    plain_view("value", ("reshape_and_cache_flash", "rope_and_reshape_and_cache_flash"),
           ("tokens", "kv_heads", "value_head_size"), f"{_FI_PAGE}:580"),
)


def _flashinfer_mha(name: str, hnd: bool) -> EngineLayout:
    order = "[NB, 2, Hkv, B, D] (HND)" if hnd else "[NB, 2, B, Hkv, D] (NHD)"
    return EngineLayout(
        name, "flashinfer", "mha",
        calls=(Call("rotary_embedding", "flashinfer.rope.apply_rope_with_cos_sin_cache_inplace", f"{_FI_ROPE}:1234"),
               Call("reshape_and_cache_flash", "flashinfer.page.append_paged_kv_cache", f"{_FI_PAGE}:580"),
               _FI_FUSED_MHA),
        views=_FI_MHA_VIEWS,
        cache=CacheForm("separate", "flashinfer", hnd, f"paged_kv_cache: one {order} tensor, paged_kv_cache[:, 0] "
                        "K and [:, 1] V, or a (k_cache, v_cache) tuple; allocated by the caller", f"{_FI_PAGE}:612"),
        **_FI_INDEX, scales=("unit", "tensor"), fp8_scale=_FI_FP8, sources=(*_FI_INDEX_SOURCES, f"{_FI_PAGE}:589"),
        notes=_FI_NOTES + " The fused call takes the key as k_rope [T, Hkv, R] and k_nope [T, Hkv, D - R] (the "
              "contract's key when both are column views of it) and fp8 caches only.")


_FLASHINFER = (
    _flashinfer_mha("flashinfer-paged", hnd=False),
    _flashinfer_mha("flashinfer-paged-hnd", hnd=True),
    EngineLayout(
        "flashinfer-paged-mla", "flashinfer", "mla",
        calls=(Call("concat_and_cache_mla", "flashinfer.page.append_paged_mla_kv_cache", f"{_FI_PAGE}:411"),
               Call("concat_and_cache_mla_rope_fused", "flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache",
                    f"{_FI_ROPE}:1567")),
        views=(plain_view("kv_c", _MLA_CACHE_OPS, ("tokens", "latent"), f"{_FI_PAGE}:411"),
               plain_view("k_pe", _MLA_CACHE_OPS, ("tokens", "rotary_dim"), f"{_FI_PAGE}:411"),
               plain_view("q_pe", ("concat_and_cache_mla_rope_fused",), ("tokens", "heads", "rotary_dim"),
                      f"{_FI_ROPE}:1567")),
        cache=CacheForm("separate", "", False, "ckv_cache [NB, B, L] and kpe_cache [NB, B, R], two tensors: the "
                        "contract's [NB, B, L + R] cache passed as cache[..., :L] and cache[..., L:]",
                        f"{_FI_PAGE}:437"),
        **_FI_INDEX, scales=("unit", "tensor"), fp8_scale=_FI_FP8, sources=(*_FI_INDEX_SOURCES, f"{_FI_PAGE}:423"),
        notes=_FI_NOTES + " append_paged_mla_kv_cache supports only L = 512, R = 64. mla_rope_quantize_fp8 "
              f"({_FI_ROPE}:1292) rotates and quantizes into new tensors and writes no cache."),
)

LAYOUTS: dict[str, EngineLayout] = {layout.name: layout for layout in (*_VLLM, *_SGLANG, *_FLASHINFER, *LMDEPLOY,
                                                                    _VLLM_TRITON_ATTN)}
