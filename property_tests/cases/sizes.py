"""Sizes of the drawn cases: the limits of a run and the strategies that draw a size within them.

``limits()`` is small on the CPU (the Triton interpreter runs every kernel there); under the ``gpu``
profile (``nightly`` on a GPU, or ``MLA_FUSE_PROPERTY_SIZES=large``) it reaches the model presets'
largest sizes, and ``sizes`` also draws those exact sizes (``declarations/presets.py``). Every
profile also runs ``cases/boundaries.py``'s crossings (``properties/test_real_sizes.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import torch
from hypothesis import strategies as st

from mla_fuse_conformance.declarations.presets import SERVING, largest, values_of
from mla_fuse_conformance.settings import profiles

SIZES_ENV_VAR = "MLA_FUSE_PROPERTY_SIZES"


@dataclasses.dataclass(frozen=True)
class Limits:
    max_tokens: int
    max_heads: int
    max_kv_heads: int
    max_head_size: int
    max_rotary_dim: int
    max_latent: int
    max_nope: int
    max_extra_blocks: int
    block_sizes: tuple[int, ...]
    max_full_table_rows: int
    large_table_rows: tuple[int, ...]  # poisoned (sparse) tables: only the rows read are computed
    yarn_original_positions: tuple[int, ...]
    large_pool_elements: int  # a large pool puts the cache view past this many elements (2^16 and more)
    model_sizes: bool = False  # also draw the exact sizes of the model presets and serving engines


SMALL = Limits(max_tokens=40, max_heads=5, max_kv_heads=3, max_head_size=40, max_rotary_dim=32, max_latent=64,
               max_nope=16, max_extra_blocks=4, block_sizes=(1, 2, 3, 4, 5, 8, 16, 32), max_full_table_rows=4096,
               large_table_rows=(2 ** 15 + 3, 2 ** 17), yarn_original_positions=(16, 32, 64, 2048),
               large_pool_elements=2 ** 16 + 2 ** 12)
# the gpu and nightly profiles: up to the largest size of any model preset or serving engine
# (declarations/presets.py), and those exact sizes drawn as ordinary cases (model_sizes)
LARGE = Limits(max_tokens=largest("tokens"), max_heads=largest("heads"), max_kv_heads=largest("kv_heads"),
               max_head_size=largest("head_size"), max_rotary_dim=largest("rotary_dim"),
               max_latent=largest("latent"), max_nope=largest("nope"), max_extra_blocks=64,
               block_sizes=tuple(sorted({*SERVING.block_sizes, 3, 5, 48})), max_full_table_rows=8192,
               large_table_rows=(2 ** 17, largest("table_rows"), 2 ** 20), yarn_original_positions=(64, 512, 4096),
               large_pool_elements=2 ** 24, model_sizes=True)


@functools.cache
def _has_gpu() -> bool:
    return torch.cuda.is_available()


def limits() -> Limits:
    """Sizes for the current run: ``$MLA_FUSE_PROPERTY_SIZES`` (small/large), else by profile
    (``gpu``, and ``nightly`` where a GPU is present: large)."""
    choice = os.environ.get(SIZES_ENV_VAR)
    if choice is None:
        large = profiles.current() == "gpu" or (profiles.current() == "nightly" and _has_gpu())
        choice = "large" if large else "small"
    return LARGE if choice == "large" else SMALL


def weighted(*options_and_weights):
    """``sampled_from`` with whole-number weights, shrinking toward the first option."""
    return st.sampled_from([option for option, weight in options_and_weights for _ in range(weight)])


def sizes(field: str, low: int, high: int, unit: int = 1):
    """Any size in ``[low, high]``; with ``model_sizes``, also (one time in four) a size some model
    preset has in ``field`` at some TP degree, divided by ``unit`` (shrinks toward ``low``)."""
    anything = st.integers(low, high)
    used = [value // unit for value in values_of(field) if low <= value // unit <= high and not value % unit] \
        if limits().model_sizes else []
    return st.one_of(anything, anything, anything, st.sampled_from(used)) if used else anything


@st.composite
def token_counts(draw, max_tokens: int | None = None, min_tokens: int = 0) -> int:
    """T: 0, 1, small, and anywhere up to the limit (so every kernel block-size tail shows up)."""
    top = max_tokens if max_tokens is not None else limits().max_tokens
    kind = draw(weighted(("any", 4), ("few", 2), ("one", 1), ("zero", 1)))
    if kind == "zero" and min_tokens == 0:
        return 0
    if kind == "one" and min_tokens <= 1:
        return 1
    low = min(max(min_tokens, 2), top)  # 0 and 1 come from their own branches, not by chance
    if kind == "few":
        return draw(st.integers(low, min(top, max(low, 8))))
    if limits().model_sizes and draw(st.booleans()):  # a decode batch, or a prefill chunk up to the limit
        decode_low, decode_high = SERVING.decode_tokens
        return draw(st.integers(max(low, decode_low), min(top, decode_high)))
    return draw(st.integers(low, top))


# rotary widths MHA models run: a whole head (16, 32, 64, 128) and partial rotary, 20 of StableLM-3B's
# 80-wide heads, 24 of GPT-NeoX-20B's 96, 32 of Phi-2's 80; each half is 8 or more values (one 16-byte
# bf16 vector or more), and the second half of 20, 24 and 40 starts off a 16-byte boundary
ENGINE_ROTARY_DIMS = (16, 20, 24, 32, 40, 64, 128)


@st.composite
def rotary_dims(draw, max_dim: int, engine_widths: bool = False) -> int:
    """R: any even width up to ``max_dim``; with ``engine_widths``, one time in two one of the
    ``ENGINE_ROTARY_DIMS`` that fit (shrinks toward any width, then toward 2)."""
    widths = [width for width in ENGINE_ROTARY_DIMS if width <= max_dim] if engine_widths else []
    if widths and draw(st.booleans()):
        return draw(st.sampled_from(widths))
    return 2 * draw(sizes("rotary_dim", 1, max(max_dim // 2, 1), unit=2))


@st.composite
def block_geometry(draw, tokens: int) -> tuple[int, int]:
    """``(NB, B)`` with room for every token plus spare slots (unused slots must stay untouched)."""
    block_size = draw(st.sampled_from(limits().block_sizes))
    least = math.ceil((tokens + 1) / block_size)
    return draw(st.integers(least, least + limits().max_extra_blocks)), block_size
