"""LMDeploy 0.18.0's PyTorch engine (CUDA backend) as ``layout_types.EngineLayout`` entries, in the form
``engine_layouts`` gives the other engines (its module docstring maps them onto the suite's names); paths are
in the ``lmdeploy`` wheel, each cited line re-checked by ``ci/check_engine_sources.py DIR``.

The cache. LMDeploy allocates one uint8 pool per model, ``[layers, NB, bytes per block]``, and packs each
block's K then V in it at 256-byte alignment; a layer's caches are typed views of its ``pool[i]``
(``engine/cache_engine/layout.py:53-75``, chosen for standard K/V by ``backends/default/cache.py:80-106``;
``CacheDesc.alignment = 256``, ``engine/cache_engine/schema.py:37``). So a layer is a contiguous chunk of the
pool (``chunked``), and within a block K ``[B, Hkv, D]`` is followed by V ``[B, Hkv, Dv]`` (``bshd``,
``backends/cuda/op_backend.py:248-259``): the ``flashinfer`` K/V form ``[NB, 2, B, Hkv, D]`` unbind(1), as
long as a K block is a multiple of 256 bytes (any B >= 16 with Hkv * D * itemsize a multiple of 16, so every
deployment here; otherwise V starts at the next multiple). DeepSeek-V2/V3 declare ``v_head_dim = 0``
(``pytorch/configurations/deepseek_v2.py:20``): the V block is empty, the pool holds ``[NB, B, 1, L + R]`` per
layer and the value cache is ``k_cache[..., :L]``, a view of the key cache (``models/deepseek_v2.py:576``).

Blocks, padding, fp8. Block size 64 by default (``messages.py:557``), any power of two from 16
(``messages.py:623-625``: the kernel's block; listed here to 4096, as the adapter declares). Block 0 is
reserved "for dummy input and padding" (``engine/config_builder.py:91-92``): padded entries write at slot 0,
never a token's. No slot mapping: sequences, block tables int32 on CUDA (``engine/inputs_maker.py:898-902``).
An fp8 cache (``quant_policy`` 16, ``FP8`` (``messages.py:25``): ``float8_e4m3fn``,
``engine/cache_engine/schema.py:16-19``) takes ``Attention``'s ``k_scale``/``v_scale``, fixed at 1.0 "for now"
(``nn/attention.py:76-79``): scale ``unit``.
The rope's cos/sin are computed in float32 and cast to the activations' dtype
(``backends/default/rotary_embedding.py:77``): table dtype ``input``.

Not a layout here: DeepSeek's rope (``models/deepseek_v2.py:561``) runs ``inplace=False`` into new tensors,
then copies them back, a call the contract's in-place ``rotary_embedding`` is not; the MLA layout has the
cache write only. DeepSeek-V3.2's ``fp8_ds_mla`` cache (656 bytes a token) is not a contract format.
"""

from __future__ import annotations

from .engine_views import mla_view, qkv_view
from .layout_types import CacheForm, Call, EngineLayout

__all__ = ["LMDEPLOY"]

_LMD = "lmdeploy/pytorch"
_LMD_INDEX = dict(slot_dtype="int32", padding_slot=0, positions_dtype="", table_dtype="input", block_default=64,
                  block_sizes=tuple(2 ** n for n in range(4, 13)), block_multiple=0, scales=("unit",),
                  fp8_scale="k_scale, v_scale: one-element buffers fixed at 1.0 (nn/attention.py:76-79), handed "
                            "to fill_kv_cache as k_scales_zeros / v_scales_zeros with an fp8 quant_policy")
_LMD_SOURCES = ("lmdeploy/messages.py:557", "lmdeploy/messages.py:623", f"{_LMD}/engine/config_builder.py:92",
                f"{_LMD}/engine/inputs_maker.py:901", f"{_LMD}/engine/cache_engine/schema.py:17",
                f"{_LMD}/nn/attention.py:78", f"{_LMD}/nn/attention.py:114",
                f"{_LMD}/backends/default/rotary_embedding.py:77", f"{_LMD}/engine/cache_engine/schema.py:37",
                f"{_LMD}/backends/default/cache.py:101", f"{_LMD}/backends/cuda/attention/default.py:286")
_LMD_NOTES = ("No slot_mapping: the adapter maps the contract's slots onto sequences and block tables as the "
              "engine builds them (adapters/lmdeploy.py); padded entries are sequences of one token in block 0. ")
_LMD_POOL = ("one uint8 pool [layers, NB, bytes per block] (torch.zeros); layer i's {what} typed views of "
             "pool[i, :, offset:offset + size] at 256-byte aligned offsets")

LMDEPLOY = (
    EngineLayout(
        "lmdeploy-mla", "lmdeploy", "mla",
        calls=(Call("concat_and_cache_mla", "attn_fwd (nn.attention.Attention.forward -> fill_kv_cache)",
                    f"{_LMD}/models/deepseek_v2.py:571"),),
        views=(mla_view("k_pe", "k_pe_mqa", ("concat_and_cache_mla",), f"{_LMD}/models/deepseek_v2.py:529"),
               mla_view("kv_c", "kv_c_mqa", ("concat_and_cache_mla",), f"{_LMD}/models/deepseek_v2.py:533")),
        cache=CacheForm("chunked", "", False, _LMD_POOL.format(what="key cache [NB, B, 1, L + R] is one of the")
                        + "; the value cache k_cache[..., :L] (v_head_dim 0)",
                        f"{_LMD}/engine/cache_engine/layout.py:63"),
        **_LMD_INDEX,
        sources=(*_LMD_SOURCES, f"{_LMD}/configurations/deepseek_v2.py:20", f"{_LMD}/models/deepseek_v2.py:576",
                 f"{_LMD}/backends/cuda/attention/mla.py:524"),
        notes=_LMD_NOTES + "The write takes key_states [T, 1, L + R] whole, k_pe and kv_c being its columns "
              "(deepseek_v2.py:527-533); FlashMLA's and Triton's MLA attention both write through "
              "fill_kv_cache; an fp8 cache (quant_policy 16) only on Triton's: FlashMLA's writer asserts "
              "quant_policy NONE for a float8 cache (backends/cuda/attention/mla.py:507-524). DeepSeek's rope is "
              "inplace=False (deepseek_v2.py:561): not the contract's call."),
    EngineLayout(
        "lmdeploy-flash", "lmdeploy", "mha",
        calls=(Call("rotary_embedding", "apply_rotary_pos_emb (ApplyRotaryEmb, inplace=True)",
                    f"{_LMD}/models/llama.py:85"),
               Call("reshape_and_cache_flash", "attn_fwd (nn.attention.Attention.forward -> fill_kv_cache)",
                    f"{_LMD}/models/llama.py:94")),
        views=tuple(qkv_view(argument, operations, 3, f"{_LMD}/nn/linear/utils.py:{line}")
                    for argument, operations, line in (("query", ("rotary_embedding",), 88),
                                                       ("key", ("rotary_embedding", "reshape_and_cache_flash"), 89),
                                                       ("value", ("reshape_and_cache_flash",), 90))),
        cache=CacheForm("chunked", "flashinfer", False,
                        _LMD_POOL.format(what="K [NB, B, Hkv, D] and V [NB, B, Hkv, Dv] are two") +
                        " (K then V in each block: [NB, 2, B, Hkv, D] unbind(1) when K's block is 256-aligned)",
                        f"{_LMD}/engine/cache_engine/layout.py:63"),
        **_LMD_INDEX, sources=(*_LMD_SOURCES, f"{_LMD}/backends/cuda/op_backend.py:248"),
        notes=_LMD_NOTES + "q, k, v are head views [T, n, D] of qkv_proj's output (split_qkv, utils.py:87-90); "
              "the rope rotates q and k in place, then the same k and v are written. The same split in "
              "qwen2.py and internlm2.py."),
)
