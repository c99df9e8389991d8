"""LMDeploy's PyTorch-engine Triton kernels as an implementation of the contract (``--impl lmdeploy``).

Written against the ``lmdeploy`` 0.18.0 wheel (``version`` says which one ran). Three operations of CONTRACT §4,
each called as LMDeploy's engine calls it (paths below are in ``lmdeploy/pytorch/``; those starting
``pytorch/``, and ``messages.py``, in ``lmdeploy/``):

* ``rotary_embedding`` -> ``apply_rotary_pos_emb`` of ``pytorch/kernels/cuda/apply_rotary_pos_emb.py``, as
  ``TritonApplyRotaryEmbImpl.forward`` calls it with ``inplace=True`` (``backends/cuda/apply_rotary_emb.py:21-28``:
  ``q_embed=query``, ``k_embed=key``), the default of ``ApplyRotaryEmb.forward`` (``nn/rotary_embedding.py:257``);
  a call without a key as ``ApplyRotaryEmb.forward_single`` makes it (``nn/rotary_embedding.py:283-304``: a
  key of 0 heads, ``inplace=False``, then ``x.copy_``) on the rotary columns ``x[..., :R]``, as its callers pass
  them (``models/deepseek_v4.py:292``: ``q[..., -rd:]``; its ``inplace=False`` output is ``empty_like``, so a
  wider ``x`` would come back with an unwritten tail). NeoX is ``complex_mode=False`` with
  ``cos``/``sin`` ``[T, R]`` (each half repeated: ``emb = freqs.repeat(1, 1, 2)``,
  ``backends/default/rotary_embedding.py:69``); GPT-J is ``complex_mode=True`` with ``[T, R / 2]``, the first
  half of those rows, as ``models/glm_moe_dsa.py:107-117`` passes them. The rows are the contract's table
  gathered at ``positions`` and cast to the activations' dtype (``cos.to(dtype=dtype)``,
  ``backends/default/rotary_embedding.py:77``), in place of the cos/sin LMDeploy computes from ``position_ids``.
  A rank 2 ``[T, H * D]`` query or key is viewed ``[T, H, D]`` (LMDeploy's models pass head views).
* ``concat_and_cache_mla`` -> ``fill_kv_cache`` of ``pytorch/kernels/cuda/fill_kv_cache.py``, as DeepSeek-V2's MLA
  attention reaches it (``models/deepseek_v2.py:568-580``): ``key_states [T, 1, L + R]`` = ``[kv_c | k_pe]``
  (the model writes ``k_pe`` into it, line 569), ``value_states = key_states[..., :L]``, ``k_cache =
  past_key_value[0]`` ``[NB, B, 1, L + R]`` and ``v_cache = k_cache[..., :L]`` (one storage: the kernel skips
  the value store, fill_kv_cache.py:873-874), through ``TritonAttentionImpl._fill_kv_cache_impl``
  (``backends/cuda/attention/default.py:262-299``), which dense MLA takes with a non-fp8-ds cache
  (``backends/cuda/attention/__init__.py:133-135``; ``FlashMLAImpl`` delegates to it, ``mla.py:507-519``).
* ``reshape_and_cache_flash`` -> the same ``fill_kv_cache`` through the same ``_fill_kv_cache_impl``, with
  separate K and V caches ``[NB, B, Hkv, D]``, ``[NB, B, Hkv, Dv]`` (``bshd``; ``get_k_block_shape``,
  ``backends/cuda/op_backend.py:248-259``); a view with other strides passes its strides.

Slots. LMDeploy has no slot mapping: a step is sequences, each ``q_seqlens[b]`` tokens from ``q_start_loc[b]``
written at logical positions ``kv_seqlens[b] - q_seqlens[b]`` on, position ``p`` at block
``block_offsets[b, p // B]``, entry ``p % B`` (fill_kv_cache.py:83-107). ``metadata_of`` maps a contract case
onto that form as the engine builds it: a new sequence wherever the next slot does not continue the run (the
next entry of the block, or entry 0 of a block not yet in the sequence's table); a sequence's history is its
first slot's entry (it holds the earlier positions of its first block); ``q_start_loc`` the exclusive cumsum of
``q_seqlens`` (``model_inputs.py:451-465``), ``kv_seqlens = q_seqlens + history`` (``model_inputs.py:401``), block
tables padded with 0 (``engine/inputs_maker.py:49-59``), int32 as on CUDA (``inputs_maker.py:898-902``); and
``max_q_seq_length`` the longest sequence (``inputs_maker.py:1034-1040``): 1 is the decode launch. Any
arrangement of distinct slots is so expressed. Padding: LMDeploy reserves block 0 "for dummy input and
padding" (``engine/config_builder.py:91-92``, ``num_reserved_gpu_blocks=1``), and a CUDA graph's padded batch
entries have ``q_seqlens = kv_seqlens = 1`` and a block row of zeros
(``pytorch/kernels/cuda/step_metadata/fill_graph_common_inputs.py:74-82`` and ``:134-139``, the table's
rows past the batch zero; its CPU branch ``:170-173``): they write at slot 0. So
``padding_slot=0``: a padded token is such an entry, of its own token (a graph's entries read token 0; slot 0's
contents are not judged); a negative slot has no form and is refused. The contract's real tokens may take the
other entries of block 0, which LMDeploy's allocator never hands out: the kernel writes them like any other.
Tokens past a short ``slot_mapping`` belong to no sequence, as a graph's tokens past the step's own
(fill_graph_common_inputs.py:114-126). No token to write (no token,
or an empty ``slot_mapping``) is a batch of no sequence, a launch of no program (LMDeploy itself builds no
such step: ``inputs_maker.py:53`` takes the ``max`` of the block tables' lengths).

Caches and fp8. A contract cache is viewed ``[NB, B, 1, L + R]`` (``unsqueeze(2)``: its strides kept; the
kernel takes every stride). ``kv_cache_dtype`` names the ``QuantPolicy`` (``messages.py:20-27``): ``fp8`` and
``fp8_e4m3`` -> ``FP8``, ``fp8_e5m2`` -> ``FP8_E5M2``, the others ``NONE``; an fp8 cache is
``torch.float8_e4m3fn`` / ``torch.float8_e5m2`` (``engine/cache_engine/schema.py:16-19``), so a uint8 cache is
handed over as that view. The scale goes in as ``k_scales_zeros`` / ``v_scales_zeros`` as ``Attention.forward``
hands its ``k_scale`` / ``v_scale`` (``nn/attention.py:114-121``; fill_kv_cache.py:803-804 ``per-tensor key
scale``): one value.

Loading: ``$MLA_FUSE_LMDEPLOY_PATH`` (a directory holding ``lmdeploy/``: ``pip download --no-deps
lmdeploy==0.18.0`` and unzip the wheel there), else the installed package (``find_spec``). Nothing of LMDeploy
is imported (``import lmdeploy.pytorch.kernels.cuda`` pulls its engine): the ``@triton.jit`` kernels and the
wrappers ``fill_kv_cache`` and ``apply_rotary_pos_emb`` are compiled from the files
(``running/foreign_kernels.py``) and run as written, with ``QuantPolicy`` compiled from ``messages.py``. The
TurboQuant helpers the wrapper imports (``turbo_quant.py``) are not contract formats: they raise if reached.
``_fill_kv_cache_quant_kernel`` (int4/int8/TurboQuant) is not loaded. Under the interpreter:
``corrected_interpreter`` (``running/interpreter_corrections.py``: fp8, bf16, masks) around each launch.

Declared limits (``CAPABILITIES``), each from an assert or a shape of LMDeploy. Served (``SERVES``): the
adapter calls the kernels as LMDeploy's engine does, so the deployments of LMDeploy's own layouts
(``declarations/lmdeploy_layouts.py``: DeepSeek's MLA write, Llama's rope and flash write) run whatever is declared.
"""

from __future__ import annotations

import ast
import enum
import pathlib

import torch
import triton
import triton.language as tl

from mla_fuse import kernels as mla_fuse_kernels  # not `kernels`: this adapter's kernels are the third party's

from mla_fuse_conformance.contract.capabilities import Capabilities
from mla_fuse_conformance.running.foreign_kernels import (find_package, load_functions, load_jit_functions,
                                                          package_version)
from mla_fuse_conformance.running.interpreter_corrections import corrected_interpreter

PATH_ENV_VAR = "MLA_FUSE_LMDEPLOY_PATH"
FILL_FILE = "pytorch/kernels/cuda/fill_kv_cache.py"
ROPE_FILE = "pytorch/kernels/cuda/apply_rotary_pos_emb.py"
MESSAGES_FILE = "messages.py"
NOT_FOUND = (f"LMDeploy is not found: set {PATH_ENV_VAR} to a directory holding lmdeploy/ (`pip download --no-deps "
             "lmdeploy==0.18.0 -d DIR` and unzip the wheel there); only its kernel files are read")
FILL_KERNELS = {"_fill_kv_cache_kernel": ["triton.jit"], "_fill_kv_cache_fp8_scalar_kernel": ["triton.jit"]}
ROPE_KERNELS = {"_apply_rotary_impl": ["triton.jit"],
                "apply_rotary_pos_emb_qk_kernel": ["triton.jit(do_not_specialize=('seq_len',))"]}
FP8_DTYPE = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
POLICY = {"fp8": "FP8", "fp8_e4m3": "FP8", "fp8_e5m2": "FP8_E5M2"}  # QuantPolicy member by kv_cache_dtype
RESERVED_SLOT = 0  # entry 0 of block 0, reserved "for dummy input and padding" (engine/config_builder.py:91-92)

# The cache writes:
# * messages.py:623-625: kernel_block_size (the block the kernel sees, schema.py:113) >= 16 and a power of 2;
# * padded tokens at slot 0 (module docstring: config_builder.py:91-92, fill_graph_common_inputs.py:74-82).
_CACHE = dict(block_sizes=tuple(2 ** n for n in range(4, 13)), padding_slot=RESERVED_SLOT)
# reshape_and_cache_flash: nn/attention.py:78-79 registers k_scale / v_scale as one-element buffers
# (torch.ones(())), and the fp8 kernel loads one value (fill_kv_cache.py:214, 229): no per-head scales.
CAPABILITIES = {"concat_and_cache_mla": Capabilities(**_CACHE),
                "reshape_and_cache_flash": Capabilities(per_head_scales=False, **_CACHE)}
# the engine calls this adapter stands in for: LMDeploy's own layouts (module docstring)
SERVES = {"rotary_embedding": ("lmdeploy-flash",), "concat_and_cache_mla": ("lmdeploy-mla",),
          "reshape_and_cache_flash": ("lmdeploy-flash",)}


def package_dir() -> pathlib.Path:
    """The ``lmdeploy`` package directory: ``${PATH_ENV_VAR}/lmdeploy``, else the installed one."""
    return find_package("lmdeploy", PATH_ENV_VAR, FILL_FILE, NOT_FOUND, "lmdeploy")


def quant_policy_class(package: pathlib.Path) -> type:
    """``QuantPolicy`` compiled alone from ``messages.py`` (an ``enum.IntEnum``; the module is not imported)."""
    path = package / MESSAGES_FILE
    tree = ast.parse(path.read_text(), filename=str(path))
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "QuantPolicy"]
    if len(found) != 1:
        raise ImportError(f"{path}: expected one class QuantPolicy, found {len(found)}")
    scope = {"enum": enum}
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), scope)
    return scope["QuantPolicy"]


def _turbo_quant_unavailable(*args, **kwargs):
    raise NotImplementedError("TurboQuant (turbo_quant.py) is not a format of the contract")


def load_kernels(package: pathlib.Path, interpreted: bool, sources: dict[str, str] | None = None) -> dict:
    """Name -> the built kernels and the wrappers ``fill_kv_cache`` and ``apply_rotary_pos_emb`` (compiled from
    the files, their kernels handed in), and ``QuantPolicy``. ``sources`` maps ``FILL_FILE`` / ``ROPE_FILE`` to a
    replacement text (a planted kernel in the tests)."""
    sources = sources or {}
    base = {"torch": torch, "triton": triton, "tl": tl, "Tensor": torch.Tensor}
    quant_policy = quant_policy_class(package)
    fill_path, rope_path = package / FILL_FILE, package / ROPE_FILE
    built = load_jit_functions(fill_path, FILL_KERNELS, base, interpreted, sources.get(FILL_FILE))
    built.update(load_jit_functions(rope_path, ROPE_KERNELS, base, interpreted, sources.get(ROPE_FILE)))
    fill_scope = {**base, **built, "QuantPolicy": quant_policy, "hadamard_rotate": _turbo_quant_unavailable,
                  "get_lloyd_max_codebook": _turbo_quant_unavailable}
    wrappers = load_functions(fill_path, ("fill_kv_cache",), fill_scope, sources.get(FILL_FILE))
    wrappers.update(load_functions(rope_path, ("apply_rotary_pos_emb",), {**base, **built}, sources.get(ROPE_FILE)))
    return {**built, **wrappers, "QuantPolicy": quant_policy}


def metadata_of(slots: list[int], block_size: int) -> dict:
    """A contract slot mapping as LMDeploy's step metadata (module docstring, "Slots"): ``q_start_loc``,
    ``q_seqlens``, ``kv_seqlens`` (lists), ``block_offsets`` (rows padded with 0) and ``max_q_seqlen``.
    A negative slot raises NotImplementedError (LMDeploy pads at block 0)."""
    sequences = []  # [first token, tokens, history, physical blocks]
    for token, slot in enumerate(slots):
        if slot < 0:
            raise NotImplementedError(f"slot_mapping[{token}] = {slot}: LMDeploy has no negative slot; its padded "
                                      "entries write at the reserved block 0 (engine/config_builder.py:91-92)")
        block, entry = divmod(slot, block_size)
        if slot == RESERVED_SLOT:  # a padded entry: q_seqlens = kv_seqlens = 1, block row 0
            sequences.append([token, 1, 0, [0], True])
            continue
        last = sequences[-1] if sequences else None
        if last is not None and not last[4]:
            position = last[2] + last[1]
            index, want_entry = divmod(position, block_size)
            same_block = index < len(last[3]) and last[3][index] == block
            next_block = index == len(last[3]) and block not in last[3]
            if entry == want_entry and (same_block or next_block):
                last[1] += 1
                if next_block:
                    last[3].append(block)
                continue
        sequences.append([token, 1, entry, [block], False])
    width = max((len(blocks) for *_, blocks, _ in sequences), default=1)
    return {"q_start_loc": [first for first, *_ in sequences],
            "q_seqlens": [tokens for _, tokens, *_ in sequences],
            "kv_seqlens": [history + tokens for _, tokens, history, *_ in sequences],
            "block_offsets": [blocks + [0] * (width - len(blocks)) for *_, blocks, _ in sequences],
            "max_q_seqlen": max((tokens for _, tokens, *_ in sequences), default=0)}


def _heads(tensor: torch.Tensor | None, head_size: int) -> torch.Tensor | None:
    """A rank 2 ``[T, n * D]`` tensor as the head view ``[T, n, D]`` LMDeploy's models pass (rank 3 unchanged)."""
    return tensor.unflatten(-1, (-1, head_size)) if tensor is not None and tensor.dim() == 2 else tensor


class LmdeployImplementation:
    """LMDeploy's ``fill_kv_cache`` and ``apply_rotary_pos_emb`` (module docstring)."""

    rounding = "per_op"  # cos/sin cast to the activations' dtype, each product rounded (apply_rotary_pos_emb.py:81-84)
    padded_rows = "rotated"  # the rope is not told of padding: every row rotates
    checks_inputs = False  # the wrappers check TurboQuant sizes only
    capabilities = CAPABILITIES
    serves = SERVES  # LMDeploy's own engine layouts (module docstring)

    def __init__(self, sources: dict[str, str] | None = None) -> None:
        package = package_dir()
        self.interpreted = mla_fuse_kernels.INTERPRETED
        self.functions = load_kernels(package, self.interpreted, sources)
        backend = "Triton interpreter" if self.interpreted else "GPU"
        self.name = f"lmdeploy (fill_kv_cache.py, apply_rotary_pos_emb.py, {backend})"
        self.version = package_version(package)
        self.kernel_file = str(package / FILL_FILE)

    def _run(self, function, *args, **kwargs):
        if self.interpreted:
            with corrected_interpreter():
                return function(*args, **kwargs)
        return function(*args, **kwargs)

    # ------------------------------------------------------------ rope

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        query, key = _heads(query, head_size), _heads(key, head_size)
        half = cos_sin_cache.shape[-1] // 2
        cos, sin = cos_sin_cache[positions.long()].to(query.dtype).split(half, dim=-1)  # rotary_embedding.py:77
        if is_neox:
            cos, sin = cos.repeat(1, 2), sin.repeat(1, 2)  # emb = freqs.repeat(1, 1, 2), rotary_embedding.py:69
        rope = self.functions["apply_rotary_pos_emb"]
        if key is None:  # forward_single of the rotary slice, as deepseek_v4.py:292 calls it
            x = query[..., :2 * half]
            dummy_k = x.new_empty(x.size(0), 0, x.size(-1))  # nn/rotary_embedding.py:292-304
            rotated, _ = self._run(rope, x, dummy_k, cos, sin, torch.empty_like(x), torch.empty_like(dummy_k),
                                   complex_mode=not is_neox)
            x.copy_(rotated)
            return
        self._run(rope, query, key, cos, sin, query, key, complex_mode=not is_neox)

    # ------------------------------------------------------------ cache writes

    def _fill(self, key, value, k_cache, v_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
        """``TritonAttentionImpl._fill_kv_cache_impl`` (default.py:262-299) for this step's metadata."""
        quant_policy = self.functions["QuantPolicy"][POLICY.get(kv_cache_dtype, "NONE")]
        if kv_cache_dtype in FP8_DTYPE and k_cache.dtype == torch.uint8:  # schema.py:16-19: float8 caches
            k_cache, v_cache = k_cache.view(FP8_DTYPE[kv_cache_dtype]), v_cache.view(FP8_DTYPE[kv_cache_dtype])
        meta = metadata_of(slot_mapping.tolist(), k_cache.shape[1])  # host: LMDeploy builds it on the host too
        device = key.device
        as_long = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
        width = len(meta["block_offsets"][0]) if meta["block_offsets"] else 1
        block_offsets = torch.tensor(meta["block_offsets"], dtype=torch.int32, device=device).reshape(-1, width)
        fp8 = quant_policy != 0
        self._run(self.functions["fill_kv_cache"], key, value, k_cache, v_cache, as_long(meta["q_start_loc"]),
                  as_long(meta["q_seqlens"]), kv_seq_length=as_long(meta["kv_seqlens"]),
                  max_q_seq_length=meta["max_q_seqlen"], block_offsets=block_offsets,
                  k_scales_zeros=k_scale if fp8 else None, v_scales_zeros=v_scale if fp8 else None,
                  quant_policy=quant_policy)

    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        latent = kv_c.shape[-1]
        key_states = torch.cat([kv_c, k_pe], dim=-1).unsqueeze(1)  # deepseek_v2.py:569: [T, 1, L + R]
        k_cache = kv_cache.unsqueeze(2)  # [NB, B, 1, L + R]
        if kv_cache_dtype in FP8_DTYPE and k_cache.dtype == torch.uint8:
            k_cache = k_cache.view(FP8_DTYPE[kv_cache_dtype])
        self._fill(key_states, key_states[..., :latent], k_cache, k_cache[..., :latent], slot_mapping, kv_cache_dtype,
                   scale, scale)

    def reshape_and_cache_flash(self, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                v_scale):
        if kv_cache_dtype in FP8_DTYPE and (k_scale.numel() != 1 or v_scale.numel() != 1):
            raise NotImplementedError("LMDeploy's fp8 cache takes one k_scale and one v_scale (nn/attention.py:78-79)")
        self._fill(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


__all__ = ["CAPABILITIES", "PATH_ENV_VAR", "SERVES", "LmdeployImplementation", "load_kernels", "metadata_of",
           "package_dir"]
