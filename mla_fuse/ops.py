"""The five in-place operations of CONTRACT §4 as ``torch.library`` ops (``mla_fuse::*``).

Each operation is declared once, in ``mla_fuse.signatures`` (name, typed parameters, the ones it
writes); ``register`` derives from the declaration its schema (inferred from the declared
signature, every written buffer ``Tensor(a!)``), its kernels, the version bumps after a call and
its fake (in-place ops return nothing, so the fake only checks that the tensors share a device;
it is also the Meta kernel, so a real call that mixes in a ``meta`` tensor dispatches to it).
The op's body (``_kernel``) validates with its checker, ``validation.CHECKERS[<op>]`` (once per
call), and only then launches its kernel module's ``launch`` (with the layout's slot the checker
returns: a call on known buffers reuses its launch plan), so bad input raises before anything is
written on every path into a kernel: the wrapper, and the ``torch.ops.mla_fuse.<op>`` entry
point that compiled graphs call directly (docs/INPUTS.md lists the rules).

Each operation has one public wrapper below, of the same name and parameters plus
``check_values``, written out for its docstring (``_public`` checks its parameters against the
declaration at import). The wrapper first checks what the dispatcher would otherwise coerce or
reject with a RuntimeError (a non-tensor, ``is_neox`` not a bool, a non-integral ``head_size``;
arguments of the plain Python types cost one lookup; ``checked_call``, from the op's schema),
then calls the op with value checks switched by ``check_values``. Each wrapper's ``custom_op``
attribute is its ``torch.ops`` entry point (the suite's bad-input properties call it too).

Registration, as vLLM's ``direct_register_custom_op``: a module-level
``torch.library.Library("mla_fuse", "DEF")`` that lives as long as the process, ``define`` +
``impl`` on the CPU (Triton's interpreter) and CUDA dispatch keys, ``register_fake`` with
``lib=``. Not ``torch.library.custom_op``: it wraps every call in a Python autograd layer and
a Python ADInplaceOrView layer, many times the host time of a small kernel's launch (measured:
docs/INPUTS.md, "What a call costs on the host"; ``tests/test_dispatch_cost.py`` keeps it out).
The schemas, tags and the graphs compiled around the ops (``auto_functionalized``, the passes'
patterns) are the same as under ``custom_op``; the body bumps the written tensors' version
counters as its ADInplaceOrView layer did. No autograd formula is registered (the ops serve
inference; there was none before either).

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
import operator
from typing import Callable

import torch

from mla_fuse import signatures, validation
# rope_kernel: `rotary_embedding` is this module's op
from mla_fuse.kernels import flash_cache, flash_rope_cache, mla_cache, mla_rope_cache, rotary_embedding as rope_kernel

# ---------------------------------------------------------------- registration (vLLM's direct_register_custom_op)

_LIBRARY = torch.library.Library("mla_fuse", "DEF")  # module-level: the ops live as long as the process
_KERNEL_KEYS = ("CPU", "CUDA")  # the interpreter runs CPU tensors, the GPU backend CUDA ones (Meta: the fake)

# operation -> the kernel module whose ``launch`` runs it (written out: docs/STYLE.md 14)
_KERNELS = {
    "rotary_embedding": rope_kernel,
    "concat_and_cache_mla": mla_cache,
    "concat_and_cache_mla_rope_fused": mla_rope_cache,
    "reshape_and_cache_flash": flash_cache,
    "rope_and_reshape_and_cache_flash": flash_rope_cache,
}


def register(library: torch.library.Library, operation: signatures.Operation, kernel: Callable[[tuple], None]):
    """Define ``operation`` in ``library`` and return its entry point (``torch.ops.<namespace>.<name>``):
    the schema inferred from the declared signature, every written parameter ``Tensor(a!)``;
    ``kernel(args)`` (the arguments as one tuple) the kernel of the CPU and CUDA dispatch keys,
    with the written arguments' version counters bumped after it (as an aten in-place op does;
    the kernels write behind autograd's back); the fake (and Meta kernel)
    ``validation.same_device_check`` (an in-place op returns nothing). No autograd or
    ADInplaceOrView Python layers: ``torch.library.custom_op`` adds them to every call, many times
    a small kernel's launch in host time (docs/INPUTS.md)."""
    name = operation.name

    def prototype(*args) -> None:  # what infer_schema reads: the declared signature
        pass

    prototype.__signature__ = operation.signature()
    library.define(name + torch.library.infer_schema(prototype, mutates_args=operation.written),
                   tags=(torch.Tag.pt2_compliant_tag,))
    written = tuple(operation.index(parameter) for parameter in operation.written)
    increment_version = torch.autograd.graph.increment_version
    if any(parameter.written and parameter.may_be_none for parameter in operation.parameters):
        def run(*args):
            kernel(args)
            increment_version([args[i] for i in written if args[i] is not None])
    else:  # every written argument a tensor: fetched at once (a tuple of them, or the one)
        fetch_written = operator.itemgetter(*written)

        def run(*args):
            kernel(args)
            increment_version(fetch_written(args))

    for key in _KERNEL_KEYS:
        library.impl(name, run, key)
    torch.library.register_fake(f"{library.ns}::{name}", validation.same_device_check(operation), lib=library)
    return getattr(getattr(torch.ops, library.ns), name)


def _kernel(operation: signatures.Operation, module) -> Callable[[tuple], None]:
    """The op's body, ``run(args)``: ``validation.CHECKERS[name](*args)`` (once per call; it returns
    the layout's slot, where a call on known buffers finds its launch plan), the kernel's device,
    then ``module.launch(*args, slot)`` (every ``launch`` takes the slot last) with ``kv_cache_dtype``
    passed as its fp8 format."""
    name = operation.name  # validation's functions read when called: tests replace them
    launched_parameters = tuple(inspect.signature(module.launch).parameters)
    if len(launched_parameters) != len(operation.names) + 1 or launched_parameters[-1] != "slot":
        raise TypeError(f"{module.__name__}.launch{launched_parameters} does not take the arguments of {name} "
                        f"{operation.names} and then the slot")
    device_name = operation.kernel_device
    device_index = operation.index(device_name)
    if "kv_cache_dtype" not in operation.names:
        def run(args: tuple) -> None:
            slot = validation.CHECKERS[name](*args)
            validation.require_kernel_device(name, device_name, args[device_index])
            module.launch(*args, slot)

        return run
    dtype = operation.index("kv_cache_dtype")

    def run(args: tuple) -> None:
        slot = validation.CHECKERS[name](*args)
        validation.require_kernel_device(name, device_name, args[device_index])
        launched = [*args, slot]
        launched[dtype] = validation.fp8_format(launched[dtype])
        module.launch(*launched)

    return run


_ENTRY_POINTS = {operation.name: register(_LIBRARY, operation, _kernel(operation, _KERNELS[operation.name])).default
                 for operation in signatures.OPERATIONS}

# ---------------------------------------------------------------- public wrappers (argument types, then the op)

_TAKEN_AS_GIVEN = {"Tensor": (torch.Tensor,), "Optional[Tensor]": (torch.Tensor, type(None)), "int": (int,),
                   "bool": (bool,), "str": (str,)}


def checked_call(entry_point: torch._ops.OpOverload) -> Callable[[tuple, bool | None], None]:
    """``call(arguments, check_values)``: check what the dispatcher would coerce or reject with a
    RuntimeError (a non-tensor, ``is_neox`` not a bool, a non-integral ``head_size``:
    ``validation.check_argument_type``, by the schema's types), then run ``entry_point``, which
    validates everything else, with value checks set by ``check_values`` (``None``:
    ``MLA_FUSE_CHECK_VALUES`` decides). Arguments of the plain types (tensors, a bool, an int, a
    str; exact types: a bool is no int) need no check here: one lookup of their types."""
    name = entry_point._schema.name.partition("::")[2]
    arguments = [(i, a.name, str(a.type)) for i, a in enumerate(entry_point._schema.arguments)]
    plain_types = set(itertools.product(*(_TAKEN_AS_GIVEN[kind] for _, _, kind in arguments)))

    def call(given: tuple, check_values: bool | None) -> None:
        if tuple(map(type, given)) not in plain_types:
            given = [validation.check_argument_type(name, argument, given[i], kind) for i, argument, kind in arguments]
        if check_values is None:
            entry_point(*given)
            return
        with validation.checking_values(check_values):
            entry_point(*given)

    return call


_CHECKED_CALLS = {name: checked_call(entry_point) for name, entry_point in _ENTRY_POINTS.items()}


def _public(wrapper):
    """The public wrapper of the operation it is named after: its parameters are the declared ones
    plus a keyword-only ``check_values`` (checked here, at import); ``wrapper.custom_op`` is its
    ``torch.ops`` entry point (the one compiled graphs call; the suite's bad-input properties call
    it too). The wrapper runs the op through ``_CHECKED_CALLS`` (by name: the suite replaces
    wrappers in this module to count calls, so a wrapper does not look itself up)."""
    operation = next(operation for operation in signatures.OPERATIONS if operation.name == wrapper.__name__)
    parameters = inspect.signature(wrapper).parameters
    keyword_only = parameters.get("check_values") and parameters["check_values"].kind is inspect.Parameter.KEYWORD_ONLY
    if tuple(parameters)[:-1] != operation.names or not keyword_only:
        raise TypeError(f"mla_fuse.ops.{wrapper.__name__}{inspect.signature(wrapper)} does not take the declared "
                        f"parameters {operation.names} and a keyword-only check_values")
    wrapper.custom_op = _ENTRY_POINTS[operation.name].overloadpacket
    return wrapper


@_public
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
    _CHECKED_CALLS["rotary_embedding"]((positions, query, key, head_size, cos_sin_cache, is_neox), check_values)


@_public
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
    _CHECKED_CALLS["concat_and_cache_mla"]((kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale), check_values)


@_public
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
    _CHECKED_CALLS["concat_and_cache_mla_rope_fused"](
        (positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache, kv_cache_dtype, kv_cache_scale),
        check_values)


@_public
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
    _CHECKED_CALLS["reshape_and_cache_flash"](
        (key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale), check_values)


@_public
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
    _CHECKED_CALLS["rope_and_reshape_and_cache_flash"](
        (positions, query, key, value, key_cache, value_cache, slot_mapping, cos_sin_cache, is_neox, kv_cache_dtype,
         k_scale, v_scale), check_values)
