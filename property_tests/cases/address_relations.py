"""Address relations of a built case: where each rotated input's halves start, against a vector's 16
bytes (the conformance map's diagnosis, ``commands/conformance_map/diagnosis.py``, computes them on every
case it tries, beside ``fields.relations`` and ``value_relations``)."""

from __future__ import annotations

import math


ROTATED = {"query": "q", "key": "k", "q_pe": "q_pe", "k_pe": "k_pe"}  # argument -> its name in a relation
VECTOR_BYTES = 16  # one SSE/NEON vector, a CUDA 16-byte access; the store vLLM's CPU rope faults on
# every half of 16 bytes or more (stored in vectors) of every rotated input starts on a vector boundary:
# what an aligned vector store of the halves needs (vLLM CPU's vmovdqa), true where no half holds a vector
VECTOR_HALVES = f"every half of >= {VECTOR_BYTES} bytes {VECTOR_BYTES}-byte aligned"


def alignment_relations(built) -> dict[str, bool]:
    """Whether every first half (a head's start) and every second half of each rotated input starts at a
    16-byte aligned address (the built tensors' own addresses), whether a half is one vector or
    more, and both at once (``VECTOR_HALVES``): a misaligned vector access reads
    ``q second half 16-byte aligned: no``, not a width."""
    table = built.args.get("cos_sin_cache")
    if table is None:
        return {}
    half, out = table.size(1) // 2, {}
    for name, short in ROTATED.items():
        view = built.args.get(name)
        if view is None or not view.numel():
            continue
        head_size = table.size(1) if name.endswith("_pe") else getattr(built.case, "head_size", view.size(-1))
        heads = view.size(1) if view.dim() == 3 else view.size(1) // head_size
        head_stride = view.stride(1) if view.dim() == 3 else head_size
        size = view.element_size()
        steps = [stride * size for stride, extent in ((view.stride(0), view.size(0)), (head_stride, heads))
                 if extent > 1]
        for part, start in (("first half", 0), ("second half", half)):
            out[f"{short} {part} {VECTOR_BYTES}-byte aligned"] = math.gcd(view.data_ptr() + start * size,
                                                                           *steps) % VECTOR_BYTES == 0
        out[f"rotary half >= {VECTOR_BYTES} bytes"] = half * size >= VECTOR_BYTES
        aligned = [out[f"{short} {part} {VECTOR_BYTES}-byte aligned"] for part in ("first half", "second half")]
        out[VECTOR_HALVES] = out.get(VECTOR_HALVES, True) and (half * size < VECTOR_BYTES or all(aligned))
    return out
