"""Cases to tensors, deterministically from the case's seed.

Every tensor is generated on the CPU from ``memory.generator(seed, purpose)`` and
then moved to the device, so a case gives the same bits on every device and every
run. Tables come from ``reference.rope``; values are drawn here (never through
hypothesis), shaped by the case's ``ValueSpec``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from mla_fuse_conformance.cases import memory
from mla_fuse_conformance.cases.types import FlashCase, MlaCase, Placement, RopeCase
from mla_fuse_conformance.declarations.dtypes import FLOAT_DTYPES, FP8_FORMAT_OF_KV_CACHE_DTYPE, INDEX_DTYPES
# ref_*: the reference's modules, apart from the product's and the suite's values of those names
from mla_fuse_reference import fp8 as ref_fp8
from mla_fuse_reference import rope as ref_rope
from mla_fuse_reference.rounding import FLOAT_FORMATS, round_once

# dtype name (declarations.dtypes) -> torch dtype; fp8 format -> its torch.float8_* storage dtype
DTYPES = {name: getattr(torch, name) for name in (*FLOAT_DTYPES, *INDEX_DTYPES)}
FLOAT8_STORAGE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}  # the keys of FP8_FORMATS


def fp8_format(kv_cache_dtype: str) -> str | None:
    return FP8_FORMAT_OF_KV_CACHE_DTYPE.get(kv_cache_dtype)


@dataclasses.dataclass
class Built:
    """The tensors of one case: the operation's ``args`` (views) and the buffers behind them."""

    case: object
    device: torch.device
    args: dict[str, object]
    buffers: dict[str, memory.Buffer]
    view_buffer: dict[str, str]  # argument name -> name of the buffer holding it

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {name: buffer.flat.clone() for name, buffer in self.buffers.items()}

    def buffer_of(self, arg: str) -> memory.Buffer:
        return self.buffers[self.view_buffer[arg]]

    def index_map(self, arg: str, *leading: torch.Tensor) -> torch.Tensor:
        """``memory.Buffer.index_map`` of the argument's view."""
        return self.buffer_of(arg).index_map(arg, *leading)

    def add(self, buffer: memory.Buffer, **views: torch.Tensor) -> None:
        self.buffers[buffer.name] = buffer
        for arg, tensor in views.items():
            self.args[arg] = tensor
            self.view_buffer[arg] = buffer.name


# ---------------------------------------------------------------- values


def activation_values(shape, dtype: torch.dtype, spec, gen: torch.Generator,
                      fp8: str | None = None, scale: torch.Tensor | None = None) -> torch.Tensor:
    """CPU values of ``dtype``: ``N(0,1) * 2^magnitude * 2^U(-spread, spread)`` kept well inside
    the dtype's range, with ``spec.nan_count`` NaNs and (with ``fp8``) some elements moved onto
    fp8 rounding midpoints of ``x / scale`` (``scale`` broadcasts against ``shape``)."""
    numel = math.prod(shape)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    spread = spec.log2_spread * (2 * torch.rand(shape, generator=gen, dtype=torch.float64) - 1)
    x = x * 2.0 ** (spec.log2_magnitude + spread)
    limit = FLOAT_FORMATS[dtype][2] / 8  # rotations (|cos|+|sin| <= 2 * table magnitude) stay finite
    x = x.clamp(-limit, limit)
    if fp8 is not None and spec.midpoint_fraction > 0 and numel:
        x = _near_fp8_midpoints(x, dtype, spec.midpoint_fraction, gen, fp8, scale).clamp(-limit, limit)
    if spec.sign != "any":
        x = x.abs() if spec.sign == "non-negative" else -x.abs()
    x = round_once(x, dtype)
    if spec.nan_count and numel:
        flat = x.reshape(-1)
        flat[torch.randint(0, numel, (spec.nan_count,), generator=gen)] = float("nan")
    return x


def _near_fp8_midpoints(x: torch.Tensor, dtype, fraction: float, gen, fmt: str, scale) -> torch.Tensor:
    """Put a ``fraction`` of the elements at ``scale * m * (1 + nudge)``, ``m`` halfway between two
    adjacent fp8 values: exact ties (where the scale is a power of two), one or two input ulps off,
    and, for fp32/fp16 inputs, a few fp32 ulps off (where rounding to bf16 first lands on the tie)."""
    f = ref_fp8.FORMATS[fmt]
    scale = torch.ones_like(x) if scale is None else scale.to(torch.float64).expand_as(x)
    chosen = torch.rand(x.shape, generator=gen) < fraction
    max_code = ref_fp8.encode(torch.tensor([f.max_finite], dtype=torch.float64), fmt).item()
    codes = torch.randint(0, max_code, x.shape, generator=gen)  # m between code and code + 1
    low = ref_fp8.decode(codes.to(torch.uint8), fmt)
    high = ref_fp8.decode((codes + 1).to(torch.uint8), fmt)
    midpoint = (low + high) / 2
    nudge_kind = torch.randint(0, 4, x.shape, generator=gen)
    direction = torch.where(torch.rand(x.shape, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
    mantissa_bits = FLOAT_FORMATS[dtype][0]
    input_ulps = torch.where(nudge_kind == 1, 1.0, 2.0) * 2.0 ** -mantissa_bits
    fine = 2.0 ** -torch.randint(10, 21, x.shape, generator=gen).to(torch.float64)
    relative = torch.where(nudge_kind == 0, 0.0, torch.where(nudge_kind == 3, fine, input_ulps))
    sign = torch.where(torch.rand(x.shape, generator=gen) < 0.5, -1.0, 1.0).to(torch.float64)
    placed = sign * midpoint * (1 + direction * relative) * scale
    return torch.where(chosen, placed, x)


def scale_tensor(spec, num_heads: int, gen: torch.Generator) -> torch.Tensor:
    """A fp32 scale: ``[1]``, or ``[num_heads]`` of different values when ``spec.per_head``."""
    base = spec.mantissa * 2.0 ** spec.log2
    if not spec.per_head:
        return torch.tensor([base], dtype=torch.float32)
    exponents = torch.randint(1, 4, (num_heads,), generator=gen) * torch.where(
        torch.rand(num_heads, generator=gen) < 0.5, -1, 1)
    exponents[0] = 0  # head 0 has the base scale; every other head differs from it
    factors = 2.0 ** exponents.to(torch.float64)
    factors = factors * (1 + torch.rand(num_heads, generator=gen, dtype=torch.float64) * (spec.mantissa != 1.0))
    return (base * factors).to(torch.float32)


# ---------------------------------------------------------------- tables and indices


def table_rows(spec, positions: torch.Tensor) -> torch.Tensor:
    """float64 rows ``[len(positions), R]`` of the table ``spec`` describes, at ``positions``."""
    rotary_dim = spec.rotary_dim
    if spec.style == "plain":
        inv_freq, magnitude = ref_rope.plain_inv_freq(rotary_dim, spec.base), 1.0
    else:
        inv_freq = ref_rope.yarn_inv_freq(rotary_dim, spec.base, spec.yarn_factor, spec.max_position)
        magnitude = (ref_rope.yarn_mscale(spec.yarn_factor, spec.yarn_mscale)
                     / ref_rope.yarn_mscale(spec.yarn_factor, spec.yarn_mscale_all_dim) * spec.yarn_attn_factor)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1) * magnitude


def full_table(spec, dtype: torch.dtype) -> torch.Tensor:
    """The whole table, from the reference's own builders."""
    if spec.style == "plain":
        return ref_rope.plain_cos_sin_cache(spec.rotary_dim, spec.max_position, spec.base, dtype)
    return ref_rope.deepseek_yarn_cos_sin_cache(
        spec.rotary_dim, spec.max_position, spec.base, spec.yarn_factor, attn_factor=spec.yarn_attn_factor,
        mscale=spec.yarn_mscale, mscale_all_dim=spec.yarn_mscale_all_dim, dtype=dtype)


def table_tensor(spec, input_dtype: torch.dtype, positions: torch.Tensor) -> torch.Tensor:
    """CPU table for a case: full, or with only the rows at ``positions`` filled and NaN elsewhere."""
    dtype = input_dtype if spec.dtype == "input" else DTYPES[spec.dtype]
    if not spec.poison_unused_rows:
        return full_table(spec, dtype)
    table = torch.full((spec.num_positions, spec.rotary_dim), float("nan"), dtype=dtype)
    rows = positions.long().unique()
    table[rows] = round_once(table_rows(spec, rows), dtype)
    return table


def position_values(spec, tokens: int, num_positions: int, gen: torch.Generator) -> torch.Tensor:
    if spec.pattern == "zeros":
        return torch.zeros(tokens, dtype=torch.int64)
    if spec.pattern == "prefill":
        start = int(torch.randint(0, max(num_positions - tokens, 0) + 1, (), generator=gen))
        return (start + torch.arange(tokens)) % num_positions
    if spec.pattern == "last_rows":
        values = num_positions - 1 - torch.randint(0, min(num_positions, 4), (tokens,), generator=gen)
        if tokens:
            values[int(torch.randint(0, tokens, (), generator=gen))] = num_positions - 1
        return values
    return torch.randint(0, num_positions, (tokens,), generator=gen)


def _block_slots(placement: str, count: int, num_slots: int, block_size: int, gen) -> torch.Tensor:
    """``per_block``: ``count`` slots, each in its own block at a random offset (a decode batch);
    ``mid_block``: ``count`` consecutive slots from ``block_size // 2`` (a prefill chunk)."""
    if placement == "mid_block":
        return (block_size // 2 + torch.arange(count)) % num_slots
    blocks = torch.randperm(num_slots // block_size, generator=gen)[:count]
    return blocks * block_size + torch.randint(0, block_size, (len(blocks),), generator=gen)


def slot_values(spec, num_slots: int, gen: torch.Generator, block_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slot_mapping values, unused valid slots)`` for ``spec``; valid slots are distinct. A ``pad_value``
    >= 0 is a reserved slot (SGLang's 0): no valid slot is it, and it is not among the unused ones."""
    length = spec.length
    reserved = spec.pad_value if spec.pad_value >= 0 else None
    usable = num_slots - (reserved is not None)
    if spec.padding == "all":
        padded = torch.ones(length, dtype=torch.bool)
    elif spec.padding == "none":
        padded = torch.zeros(length, dtype=torch.bool)
    else:
        padded = torch.rand(length, generator=gen) < spec.pad_fraction
        if length >= 2:  # at least one of each
            padded[int(torch.randint(0, length, (), generator=gen))] = True
            valid_at = (~padded).nonzero()
            if not valid_at.numel():
                padded[int(torch.randint(0, length, (), generator=gen))] = False
    if reserved is not None and int((~padded).sum()) > usable:  # one slot fewer: the last valid tokens pad
        padded[(~padded).nonzero().flatten()[usable:]] = True
    num_valid = int((~padded).sum())
    num_slots, all_slots = usable, num_slots
    order = torch.randperm(num_slots, generator=gen)
    if spec.placement in ("per_block", "mid_block"):
        chosen = _block_slots(spec.placement, num_valid, num_slots, block_size, gen)
    elif spec.placement == "prefill":
        start = int(torch.randint(0, num_slots, (), generator=gen))
        chosen = (start + torch.arange(num_valid)) % num_slots
    elif spec.placement == "extremes":  # the first and the last slot of the cache are among them
        chosen = torch.cat([torch.tensor([num_slots - 1, 0]), order[(order != 0) & (order != num_slots - 1)]])
        chosen = chosen[:num_valid][torch.randperm(num_valid, generator=gen)]
    else:
        chosen = order[:num_valid]
    if reserved is not None:
        chosen = chosen + (chosen >= reserved).long()  # the usable slots are every slot but the reserved one
    values = torch.full((length,), spec.pad_value, dtype=torch.int64)
    values[~padded] = chosen
    used = torch.zeros(all_slots, dtype=torch.bool)
    used[chosen] = True
    if reserved is not None:
        used[reserved] = True
    return values, (~used).nonzero().flatten()


def index_buffer(name: str, values: torch.Tensor, stride: int, bait: torch.Tensor, dtype, device, seed: int):
    """A 1-D index tensor as a view with ``stride`` into storage whose gaps and tail hold ``bait``."""
    length = values.numel()
    numel = max(length * stride, 1) + 4
    gen = memory.generator(seed, "bait:" + name)
    if bait.numel():
        storage = bait[torch.randint(0, bait.numel(), (numel,), generator=gen)]
    else:
        storage = torch.full((numel,), -1, dtype=torch.int64)
    storage[: length * stride: stride] = values
    buffer = memory.Buffer(name, numel, DTYPES[dtype], "cpu", seed, fill=0)
    buffer.flat.copy_(storage)
    buffer.flat = buffer.flat.to(device)
    return buffer, buffer.add_view(name, (length,), (stride,), 0)


def _fill(view: torch.Tensor, values: torch.Tensor) -> None:
    view.copy_(values.to(view.device))


def _table_and_positions(built: Built, case, tokens: int, input_dtype) -> None:
    seed, spec = case.seed, case.table
    positions = position_values(case.positions, tokens, spec.num_positions, memory.generator(seed, "positions"))
    bait = torch.randint(0, spec.num_positions, (8,), generator=memory.generator(seed, "position bait"))
    buffer, view = index_buffer("positions", positions, case.positions.stride, bait, case.positions.dtype,
                                built.device, seed)
    built.add(buffer, positions=view)
    table = table_tensor(spec, input_dtype, positions)
    buffer, view = memory.placed("cos_sin_cache", tuple(table.shape), Placement(trail=spec.rotary_dim), table.dtype,
                                 built.device, seed)
    _fill(view, table)
    built.add(buffer, cos_sin_cache=view)


def _slot_mapping(built: Built, case, num_slots: int) -> None:
    values, unused = slot_values(case.slots, num_slots, memory.generator(case.seed, "slots"), case.block_size)
    buffer, view = index_buffer("slot_mapping", values, case.slots.stride, unused, case.slots.dtype, built.device,
                                case.seed)
    built.add(buffer, slot_mapping=view)


def cache_dtype(case, source: torch.dtype) -> torch.dtype:
    fmt = fp8_format(case.kv_cache_dtype)
    if fmt is None:
        return source
    return torch.uint8 if case.cache_storage == "uint8" else FLOAT8_STORAGE[fmt]


def _scale(built: Built, name: str, spec, num_heads: int, seed: int) -> torch.Tensor:
    values = scale_tensor(spec, num_heads, memory.generator(seed, name))
    buffer, view = memory.placed(name, tuple(values.shape), Placement(trail=1), torch.float32, built.device, seed)
    _fill(view, values)
    built.add(buffer, **{name: view})
    return values


# ---------------------------------------------------------------- cases


def build_rope(case: RopeCase, device) -> Built:
    """``rotary_embedding`` arguments: positions, query, key (or None), head_size, cos_sin_cache, is_neox."""
    built = Built(case, torch.device(device), {}, {}, {})
    dtype, T, D = DTYPES[case.dtype], case.tokens, case.head_size
    _table_and_positions(built, case, T, dtype)
    shapes = {"query": (case.heads, D)}
    if case.kv_heads:
        shapes["key"] = (case.kv_heads, D)
    if case.rank == 2:
        shapes = {name: (heads * size,) for name, (heads, size) in shapes.items()}
    if case.qkv_packed:
        buffer, views = memory.packed("qkv", T, shapes, case.query_place, dtype, built.device, case.seed)
        built.add(buffer, **views)
    else:
        for name, place in (("query", case.query_place), ("key", case.key_place)):
            if name in shapes:
                buffer, view = memory.placed(name, (T, *shapes[name]), place, dtype, built.device, case.seed)
                built.add(buffer, **{name: view})
    for name in shapes:
        _fill(built.args[name], activation_values((T, *shapes[name]), dtype, case.values,
                                                  memory.generator(case.seed, "values:" + name)))
    built.args.setdefault("key", None)
    built.args["head_size"] = D
    built.args["is_neox"] = case.is_neox
    return built


def build_mla(case: MlaCase, device) -> Built:
    """Arguments of both MLA operations (the unfused one ignores positions, q_pe and the table)."""
    built = Built(case, torch.device(device), {}, {}, {})
    dtype, T, L, R = DTYPES[case.dtype], case.tokens, case.latent, case.rotary_dim
    fmt = fp8_format(case.kv_cache_dtype)
    _table_and_positions(built, case, T, dtype)
    buffer, q_pe = memory.placed("q_pe", (T, case.heads, R), case.q_place, dtype, built.device, case.seed)
    built.add(buffer, q_pe=q_pe)
    if case.kv_packed:
        buffer, views = memory.packed("kv", T, {"kv_c": (L,), "k_pe": (R,)}, case.kv_c_place, dtype, built.device,
                                      case.seed)
        built.add(buffer, **views)
    else:
        for name, width, place in (("kv_c", L, case.kv_c_place), ("k_pe", R, case.k_pe_place)):
            buffer, view = memory.placed(name, (T, width), place, dtype, built.device, case.seed)
            built.add(buffer, **{name: view})
    scale = _scale(built, "scale", case.scale, 1, case.seed)
    for name, shape in (("q_pe", (T, case.heads, R)), ("kv_c", (T, L)), ("k_pe", (T, R))):
        _fill(built.args[name], activation_values(shape, dtype, case.values, memory.generator(case.seed, name),
                                                  fmt, scale))
    buffer, cache = memory.placed("kv_cache", (case.num_blocks, case.block_size, L + R), case.cache_place,
                                  cache_dtype(case, dtype), built.device, case.seed)
    built.add(buffer, kv_cache=cache)
    _slot_mapping(built, case, case.num_blocks * case.block_size)
    built.args["is_neox"] = case.is_neox
    built.args["kv_cache_dtype"] = case.kv_cache_dtype
    return built


def build_flash(case: FlashCase, device) -> Built:
    """Arguments of both MHA operations (the unfused one ignores positions, query and the table)."""
    built = Built(case, torch.device(device), {}, {}, {})
    dtype, T, Hkv, D, Dv = DTYPES[case.dtype], case.tokens, case.kv_heads, case.head_size, case.value_head_size
    fmt = fp8_format(case.kv_cache_dtype)
    _table_and_positions(built, case, T, dtype)
    shapes = {"query": (case.heads, D), "key": (Hkv, D), "value": (Hkv, Dv)}
    if case.qkv_packed:
        buffer, views = memory.packed("qkv", T, shapes, case.query_place, dtype, built.device, case.seed)
        built.add(buffer, **views)
    else:
        places = {"query": case.query_place, "key": case.key_place, "value": case.value_place}
        for name, shape in shapes.items():
            buffer, view = memory.placed(name, (T, *shape), places[name], dtype, built.device, case.seed)
            built.add(buffer, **{name: view})
    k_scale = _scale(built, "k_scale", case.k_scale, Hkv, case.seed)
    v_scale = _scale(built, "v_scale", case.v_scale, Hkv, case.seed)
    specs = {"query": (case.values, None), "key": (case.values, k_scale), "value": (case.value_values, v_scale)}
    for name, (spec, scale) in specs.items():
        scale = None if scale is None else scale.reshape(1, -1, 1)
        _fill(built.args[name], activation_values((T, *shapes[name]), dtype, spec,
                                                  memory.generator(case.seed, "values:" + name), fmt, scale))
    _flash_caches(built, case, cache_dtype(case, dtype))
    _slot_mapping(built, case, case.num_blocks * case.block_size)
    built.args["is_neox"] = case.is_neox
    built.args["kv_cache_dtype"] = case.kv_cache_dtype
    return built


def _flash_caches(built: Built, case: FlashCase, dtype: torch.dtype) -> None:
    """The two caches as ``case.kv_form`` lays them out (``layout_types.KV_FORMS``)."""
    NB, B, Hkv = case.num_blocks, case.block_size, case.kv_heads
    order = tuple(case.cache_order) + (3,)
    if case.kv_form == "split":
        for name, size in (("key_cache", case.head_size), ("value_cache", case.value_head_size)):
            place = dataclasses.replace(case.cache_place, order=order)
            buffer, view = memory.placed(name, (NB, B, Hkv, size), place, dtype, built.device, case.seed)
            built.add(buffer, **{name: view})
        return
    # one pool: the cache dims (NB, B, Hkv, D) padded as cache_place says, and a K/V dim (4) of 2
    place = case.cache_place
    shape, strides, start = memory.pool_geometry((NB, B, Hkv, case.head_size), place, case.kv_form, order)
    numel = place.lead + math.prod(max(extent, 1) for extent in shape) + place.trail
    buffer = memory.Buffer("kv_pool", numel, dtype, built.device, case.seed)
    for index, name in enumerate(("key_cache", "value_cache")):
        size = case.head_size if index == 0 else case.value_head_size
        view = buffer.add_view(name, (NB, B, Hkv, size), strides[:4], start + index * strides[4])
        built.add(buffer, **{name: view})


BUILDERS = {RopeCase: build_rope, MlaCase: build_mla, FlashCase: build_flash}


def build(case, device) -> Built:
    return BUILDERS[type(case)](case, device)
