"""The five in-place operations of CONTRACT §4 as ``torch.library`` ops (``mla_fuse::*``).

Each operation has one definition: a typed Python function registered by ``_define`` (its
schema inferred from the signature, every written buffer declared ``Tensor(a!)``), its fake
right below (in-place ops return nothing, so the fake only checks that the tensors share a
device; it is also the Meta kernel, so a real call that mixes in a ``meta`` tensor dispatches
to it), and one public wrapper of the same name and signature plus ``check_values``. The
op's body validates with ``mla_fuse.validation.check_<op>`` (once per call) and only then
launches (with the layout's slot the checker returns: a call on known buffers reuses its launch
plan), so bad input raises before anything is written on every path into a kernel: the
wrapper, and the ``torch.ops.mla_fuse.<op>`` entry point that compiled graphs call directly
(docs/INPUTS.md lists the rules). The wrapper first checks what the dispatcher would otherwise
coerce or reject with a RuntimeError (a non-tensor, ``is_neox`` not a bool, a non-integral
``head_size``; arguments of the plain Python types cost one lookup), then calls the op with
value checks switched by ``check_values``. Each wrapper's ``custom_op`` attribute is its
``torch.ops`` entry point (the suite's bad-input properties call it too).

Registration, as vLLM's ``direct_register_custom_op``: a module-level
``torch.library.Library("mla_fuse", "DEF")`` that lives as long as the process, ``define`` +
``impl`` on the CPU (Triton's interpreter) and CUDA dispatch keys, ``register_fake`` with
``lib=``. Not ``torch.library.custom_op``: it wraps every call in a Python autograd layer and
a Python ADInplaceOrView layer, 17-40 us of host time per call on a 2-core Xeon, where the
kernel of a decode step takes 3-5 us on an H200 (docs/INPUTS.md, "What a call costs on the
host"; ``tests/test_dispatch_cost.py`` keeps it out). The schemas, tags and the graphs
compiled around the ops (``auto_functionalized``, the passes' patterns) are the same as
under ``custom_op``; the body bumps the written tensors' version counters as its
ADInplaceOrView layer did. No autograd formula is registered (the ops serve inference; there
was none before either).

Shared conventions (named dims: ``T`` tokens, ``H`` query heads, ``Hkv`` KV
heads, ``D`` head size, ``R`` rotary width, ``L`` latent width, ``NB``
blocks, ``B`` block size, ``P`` table rows):

* RoPE. ``cos_sin_cache [P, R]`` (fp32 or the input dtype) holds in row
  ``p`` the ``R/2`` cosines then the ``R/2`` sines. Pairs of a head's first
  ``R`` elements: NeoX (``is_neox=True``) ``(x[j], x[j + R/2])``, GPT-J
  ``(x[2j], x[2j + 1])``. With ``c, s = cos_sin_cache[positions[t], j],
  cos_sin_cache[positions[t], R/2 + j]``: ``a' = a*c - b*s``,
  ``b' = b*c + a*s``, computed in fp32 and rounded once (RNE) to the input
  dtype. Elements past ``R`` pass through. Every row is rotated, padded or not.
* Paged caches. ``slot = slot_mapping[t]`` (int32/int64, length ``<= T``);
  ``slot < 0`` (``-1``) is padding and writes nothing, rows ``t >=
  len(slot_mapping)`` write nothing; otherwise the entry is block
  ``slot // B``, offset ``slot % B`` of the cache (any block/entry/head
  strides; writes land in the parent storage of a view).
* ``kv_cache_dtype``: ``auto``/``bfloat16``/``float16``/``float32`` store the
  source bits; ``fp8``/``fp8_e4m3`` (E4M3, finite max 448) and ``fp8_e5m2``
  (E5M2, finite max 57344) store ``code = fp8(clamp(float32(x) / scale))``:
  an IEEE division, round to nearest even, saturation to the finite max
  (inf too), NaN kept (``0x7F | sign``). fp8 caches may be ``torch.uint8``
  or the matching ``torch.float8_*`` dtype (same code bits). Scales are fp32
  device tensors (never synced unless value checks are on), ignored for
  non-fp8 caches.
* Every size but ``T`` must be positive; no written buffer may overlap
  another argument or itself (an expanded view).
"""

from __future__ import annotations

import inspect
import itertools
from typing import Optional

import torch

from mla_fuse import validation
from mla_fuse.kernels import flash_cache, flash_rope_cache, mla_cache, mla_rope_cache, rotary_embedding as rope_kernel

Tensor = torch.Tensor

# ---------------------------------------------------------------- registration (vLLM's direct_register_custom_op)

_LIBRARY = torch.library.Library("mla_fuse", "DEF")  # module-level: the ops live as long as the process
_KERNEL_KEYS = ("CPU", "CUDA")  # the interpreter runs CPU tensors, the GPU backend CUDA ones (Meta: the fake)


def _define(name: str, *, mutates_args: tuple[str, ...]):
    """Register the decorated function as ``torch.ops.mla_fuse.<name>``: the schema inferred from its
    annotations with ``mutates_args`` written (``Tensor(a!)``), the function itself the kernel of
    the CPU and CUDA dispatch keys, with the mutated arguments' version counters bumped after it
    (as an aten in-place op does; the kernels write behind autograd's back). No autograd or
    ADInplaceOrView Python layers: ``torch.library.custom_op`` adds them to every call, tens of
    microseconds of host time where a small kernel takes a few."""

    def register(kernel):
        schema = torch.library.infer_schema(kernel, mutates_args=mutates_args)
        _LIBRARY.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
        parameters = list(inspect.signature(kernel).parameters)
        written = [parameters.index(argument) for argument in mutates_args]
        increment_version = torch.autograd.graph.increment_version

        def run(*args):
            kernel(*args)
            increment_version([args[i] for i in written if args[i] is not None])

        for key in _KERNEL_KEYS:
            _LIBRARY.impl(name, run, key)
        return kernel

    return register


def _fake(name: str):
    """Register the decorated function as the fake (and Meta kernel) of ``torch.ops.mla_fuse.<name>``."""
    return torch.library.register_fake(f"mla_fuse::{name}", lib=_LIBRARY)


# ---------------------------------------------------------------- the operations (one definition each)


@_define("rotary_embedding", mutates_args=("query", "key"))
def _rotary_embedding(positions: Tensor, query: Tensor, key: Optional[Tensor], head_size: int,
                      cos_sin_cache: Tensor, is_neox: bool) -> None:
    slot = validation.check_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
    validation.require_kernel_device("rotary_embedding", "query", query)
    rope_kernel.launch(positions, query, key, head_size, cos_sin_cache, is_neox, slot=slot)


@_fake("rotary_embedding")
def _(positions, query, key, head_size, cos_sin_cache, is_neox) -> None:
    validation.require_same_device("rotary_embedding", positions=positions, query=query, key=key,
                                   cos_sin_cache=cos_sin_cache)


@_define("concat_and_cache_mla", mutates_args=("kv_cache",))
def _concat_and_cache_mla(kv_c: Tensor, k_pe: Tensor, kv_cache: Tensor, slot_mapping: Tensor, kv_cache_dtype: str,
                          scale: Tensor) -> None:
    slot = validation.check_concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
    validation.require_kernel_device("concat_and_cache_mla", "kv_cache", kv_cache)
    mla_cache.launch(kv_c, k_pe, kv_cache, slot_mapping, validation.fp8_format(kv_cache_dtype), scale, slot=slot)


@_fake("concat_and_cache_mla")
def _(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale) -> None:
    validation.require_same_device("concat_and_cache_mla", kv_c=kv_c, k_pe=k_pe, kv_cache=kv_cache,
                                   slot_mapping=slot_mapping, scale=scale)


@_define("concat_and_cache_mla_rope_fused", mutates_args=("q_pe", "k_pe", "kv_cache"))
def _concat_and_cache_mla_rope_fused(positions: Tensor, q_pe: Tensor, k_pe: Tensor, kv_c: Tensor,
                                     cos_sin_cache: Tensor, is_neox: bool, slot_mapping: Tensor, kv_cache: Tensor,
                                     kv_cache_dtype: str, kv_cache_scale: Tensor) -> None:
    slot = validation.check_concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox,
                                                            slot_mapping, kv_cache, kv_cache_dtype, kv_cache_scale)
    validation.require_kernel_device("concat_and_cache_mla_rope_fused", "kv_cache", kv_cache)
    mla_rope_cache.launch(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache,
                          validation.fp8_format(kv_cache_dtype), kv_cache_scale, slot=slot)


@_fake("concat_and_cache_mla_rope_fused")
def _(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache, kv_cache_dtype,
      kv_cache_scale) -> None:
    validation.require_same_device("concat_and_cache_mla_rope_fused", positions=positions, q_pe=q_pe, k_pe=k_pe,
                                   kv_c=kv_c, cos_sin_cache=cos_sin_cache, slot_mapping=slot_mapping,
                                   kv_cache=kv_cache, kv_cache_scale=kv_cache_scale)


@_define("reshape_and_cache_flash", mutates_args=("key_cache", "value_cache"))
def _reshape_and_cache_flash(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                             slot_mapping: Tensor, kv_cache_dtype: str, k_scale: Tensor, v_scale: Tensor) -> None:
    slot = validation.check_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                                    k_scale, v_scale)
    validation.require_kernel_device("reshape_and_cache_flash", "key_cache", key_cache)
    flash_cache.launch(key, value, key_cache, value_cache, slot_mapping, validation.fp8_format(kv_cache_dtype),
                       k_scale, v_scale, slot=slot)


@_fake("reshape_and_cache_flash")
def _(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale) -> None:
    validation.require_same_device("reshape_and_cache_flash", key=key, value=value, key_cache=key_cache,
                                   value_cache=value_cache, slot_mapping=slot_mapping, k_scale=k_scale,
                                   v_scale=v_scale)


@_define("rope_and_reshape_and_cache_flash", mutates_args=("query", "key", "key_cache", "value_cache"))
def _rope_and_reshape_and_cache_flash(positions: Tensor, query: Tensor, key: Tensor, value: Tensor,
                                      key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor,
                                      cos_sin_cache: Tensor, is_neox: bool, kv_cache_dtype: str, k_scale: Tensor,
                                      v_scale: Tensor) -> None:
    slot = validation.check_rope_and_reshape_and_cache_flash(positions, query, key, value, key_cache, value_cache,
                                                             slot_mapping, cos_sin_cache, is_neox, kv_cache_dtype,
                                                             k_scale, v_scale)
    validation.require_kernel_device("rope_and_reshape_and_cache_flash", "key_cache", key_cache)
    flash_rope_cache.launch(positions, query, key, value, key_cache, value_cache, slot_mapping, cos_sin_cache,
                            is_neox, validation.fp8_format(kv_cache_dtype), k_scale, v_scale, slot=slot)


@_fake("rope_and_reshape_and_cache_flash")
def _(positions, query, key, value, key_cache, value_cache, slot_mapping, cos_sin_cache, is_neox, kv_cache_dtype,
      k_scale, v_scale) -> None:
    validation.require_same_device("rope_and_reshape_and_cache_flash", positions=positions, query=query, key=key,
                                   value=value, key_cache=key_cache, value_cache=value_cache,
                                   slot_mapping=slot_mapping, cos_sin_cache=cos_sin_cache, k_scale=k_scale,
                                   v_scale=v_scale)


# ---------------------------------------------------------------- public wrappers (argument types, then the op)

_OPERATIONS = ("rotary_embedding", "concat_and_cache_mla", "concat_and_cache_mla_rope_fused",
               "reshape_and_cache_flash", "rope_and_reshape_and_cache_flash")
_ENTRY_POINTS = {name: getattr(torch.ops.mla_fuse, name).default for name in _OPERATIONS}
# per operation: (position, name, schema type) of each argument
_ARGUMENTS = {name: [(i, a.name, str(a.type)) for i, a in enumerate(op._schema.arguments)]
              for name, op in _ENTRY_POINTS.items()}
_TAKEN_AS_GIVEN = {"Tensor": (torch.Tensor,), "Optional[Tensor]": (torch.Tensor, type(None)), "int": (int,),
                   "bool": (bool,), "str": (str,)}
# per operation: the tuples of argument types the dispatcher takes unchanged (exact types: a bool is no int)
_PLAIN_TYPES = {name: set(itertools.product(*(_TAKEN_AS_GIVEN[kind] for _, _, kind in arguments)))
                for name, arguments in _ARGUMENTS.items()}


def _call(name: str, arguments: tuple, check_values: bool | None) -> None:
    """Check what the dispatcher would coerce or reject with a RuntimeError (a non-tensor, ``is_neox``
    not a bool, a non-integral ``head_size``: ``validation.check_argument_type``), then run
    ``torch.ops.mla_fuse.<name>``, which validates everything else, with value checks set by
    ``check_values`` (``None``: ``MLA_FUSE_CHECK_VALUES`` decides). Arguments of the plain types
    (tensors, a bool, an int, a str) need no check here: one lookup of their types."""
    if tuple(map(type, arguments)) not in _PLAIN_TYPES[name]:
        arguments = [validation.check_argument_type(name, argument, arguments[i], kind)
                     for i, argument, kind in _ARGUMENTS[name]]
    if check_values is None:
        _ENTRY_POINTS[name](*arguments)
        return
    with validation.checking_values(check_values):
        _ENTRY_POINTS[name](*arguments)


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox, *,
                     check_values: bool | None = None) -> None:
    """RoPE of ``query`` and ``key`` in place.

    ``positions [T]`` int32/int64; ``query [T, H, head_size]`` or ``[T, H * head_size]``
    and ``key`` likewise with ``Hkv`` heads, or ``None`` (query only), fp32/fp16/bf16
    with innermost stride 1 (token and head strides free); ``cos_sin_cache [P, R]``,
    ``R <= head_size`` even. For every head, pair ``(a, b)`` (NeoX ``(j, j + R/2)``,
    GPT-J ``(2j, 2j + 1)``) becomes ``(a*c - b*s, b*c + a*s)`` with ``c | s`` the two
    halves of row ``positions[t]``: fp32 math, one rounding. Elements ``R..head_size``
    are untouched. Mutates ``query`` and ``key``.
    """
    _call("rotary_embedding", (positions, query, key, head_size, cos_sin_cache, is_neox), check_values)


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, *,
                         check_values: bool | None = None) -> None:
    """Write MLA cache entries ``[kv_c | k_pe]`` (no RoPE).

    ``kv_c [T, L]``, ``k_pe [T, R]`` (same float dtype; often column slices of one
    ``[T, L + R]`` projection); ``kv_cache [NB, B, L + R]`` (the source dtype, or
    uint8/float8 for fp8); ``slot_mapping [T' <= T]``; ``scale [1]`` fp32. For
    ``t < T'`` with ``slot = slot_mapping[t] >= 0``:
    ``kv_cache[slot // B, slot % B] = [stored(kv_c[t]) | stored(k_pe[t])]`` where
    ``stored(x)`` is the bits of ``x`` or ``fp8(clamp(float32(x) / scale))``;
    ``slot = -1`` writes nothing. Mutates ``kv_cache``.
    """
    _call("concat_and_cache_mla", (kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale), check_values)


def concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache,
                                    kv_cache_dtype, kv_cache_scale, *, check_values: bool | None = None) -> None:
    """RoPE of ``q_pe`` and ``k_pe`` in place and the MLA cache write, in one pass.

    ``positions [T]``; ``q_pe [T, H, R]`` (often ``q[..., nope:]`` of ``q [T, H, nope + R]``);
    ``k_pe [T, R]``, ``kv_c [T, L]`` (often column slices of one ``[T, L + R]``);
    ``cos_sin_cache [P, R]`` (cos | sin halves); ``kv_cache [NB, B, L + R]``;
    ``slot_mapping [T' <= T]``; ``kv_cache_scale [1]`` fp32. Every row of ``q_pe``
    and ``k_pe`` is rotated (NeoX ``(j, j + R/2)`` or GPT-J ``(2j, 2j + 1)`` pairs,
    ``(a*c - b*s, b*c + a*s)``, fp32 math, one rounding); for ``t < T'`` with
    ``slot >= 0``: ``kv_cache[slot // B, slot % B] = [stored(kv_c[t]) | stored(k_pe'[t])]``
    with ``k_pe'`` the rotated bits written back and ``stored(x)`` the bits or
    ``fp8(clamp(float32(x) / scale))``; ``slot = -1`` writes nothing.
    Mutates ``q_pe``, ``k_pe`` and ``kv_cache``.
    """
    _call("concat_and_cache_mla_rope_fused", (positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping,
                                              kv_cache, kv_cache_dtype, kv_cache_scale), check_values)


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, *,
                            check_values: bool | None = None) -> None:
    """Write MHA key/value heads into flash-layout paged caches (no RoPE).

    ``key [T, Hkv, D]``, ``value [T, Hkv, Dv]``; ``key_cache [NB, B, Hkv, D]``,
    ``value_cache [NB, B, Hkv, Dv]`` (any stride order, innermost stride 1);
    ``slot_mapping [T' <= T]``; ``k_scale``, ``v_scale`` fp32 ``[1]`` or ``[Hkv]``.
    For ``t < T'`` with ``slot >= 0`` and every head ``h``:
    ``key_cache[slot // B, slot % B, h] = stored(key[t, h], k_scale[h])`` and likewise
    for values, ``stored(x, scale)`` being the bits or ``fp8(clamp(float32(x) / scale))``;
    ``slot = -1`` writes nothing. Mutates ``key_cache`` and ``value_cache``.
    """
    _call("reshape_and_cache_flash", (key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                      v_scale), check_values)


def rope_and_reshape_and_cache_flash(positions, query, key, value, key_cache, value_cache, slot_mapping,
                                     cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale, *,
                                     check_values: bool | None = None) -> None:
    """RoPE of ``query`` and ``key`` in place and the flash cache write of the rotated key, in one pass.

    ``positions [T]``; ``query [T, H, D]``, ``key [T, Hkv, D]`` (``Hkv`` divides ``H``),
    ``value [T, Hkv, Dv]``; ``cos_sin_cache [P, R]``, ``R <= D`` (cos | sin halves);
    caches, ``slot_mapping`` and scales as in ``reshape_and_cache_flash``. Every row's
    first ``R`` elements of each head rotate (NeoX ``(j, j + R/2)`` or GPT-J
    ``(2j, 2j + 1)`` pairs, ``(a*c - b*s, b*c + a*s)``, fp32 math, one rounding), the
    rest pass through; for ``t < T'`` with ``slot >= 0`` the caches receive
    ``stored(key'[t, h], k_scale[h])`` (``key'`` = the rotated bits written back) and
    ``stored(value[t, h], v_scale[h])``; ``slot = -1`` writes nothing.
    Mutates ``query``, ``key``, ``key_cache`` and ``value_cache``.
    """
    _call("rope_and_reshape_and_cache_flash", (positions, query, key, value, key_cache, value_cache, slot_mapping,
                                               cos_sin_cache, is_neox, kv_cache_dtype, k_scale,
                                               v_scale), check_values)


for _name in _OPERATIONS:
    globals()[_name].custom_op = getattr(torch.ops.mla_fuse, _name)  # the entry point compiled graphs call
