"""The fields and feature axes of a ``CompileCase``, for the conformance map (``cases/fields.py``,
``cases/features.py``): a failing compile-pass example is diagnosed by moving it along its own fields
(a layer's kind and situation, the rope form and style, the model dtype, the cache pool and format, the
block size, the token count, the backend, the level), and its failure line names its features
(``layer kinds hybrid, rope form native, backend inductor, ...``).

Fields are named by their path in the case: ``model.situations[1]``, ``layout.pool``, ``settings.level``.
The model's sizes, seeds and the step's padding are not varied: they pick data, and an example costs
seconds of compiling.
"""

from __future__ import annotations

import dataclasses

from mla_fuse_conformance.cases import features, fields
from mla_fuse_conformance.cases.features import Axis
from mla_fuse_conformance.compile_passes.cases import KV_CACHE_DTYPES, KV_FORMS_OF_POOL, CompileCase
from mla_fuse_conformance.compile_passes.layers import ROPE_FORMS, SITUATIONS
from mla_fuse_conformance.declarations.dtypes import FLOAT_DTYPES


DOMAINS: dict[str, tuple] = {
    "model.dtype": FLOAT_DTYPES,
    "model.rope": ROPE_FORMS,
    "model.is_neox": (False, True),
    "model.shared_rope": (False, True),
    "layout.pool": tuple(KV_FORMS_OF_POOL),
    "layout.kv": KV_FORMS_OF_POOL["separate"],
    "layout.hnd": (False, True),
    "kv_cache_dtype": KV_CACHE_DTYPES,
    "fp8_storage": ("uint8", "float8"),
    "block_size": (1, 4, 16),
    "tokens": (2, 3, 5, 8),
    "dynamic": (False, True),
    "backend": ("light", "inductor"),
    "settings.level": (0, 1, 2, 3),
}


def leaves(case: CompileCase) -> dict[str, object]:
    out: dict[str, object] = {}
    for index, (kind, situation) in enumerate(zip(case.model.kinds, case.model.situations)):
        out[f"model.kinds[{index}]"], out[f"model.situations[{index}]"] = kind, situation
    for path in DOMAINS:
        if path == "fp8_storage" and not case.kv_cache_dtype.startswith("fp8"):
            continue
        out[path] = _get(case, path)
    return out


def _get(case, path: str):
    match = fields.ELEMENT.match(path)
    value = case
    for name in (match.group(1) if match else path).split("."):
        value = getattr(value, name)
    return value[int(match.group(2))] if match else value


def alternatives(case: CompileCase, path: str) -> tuple:
    if path.startswith("model.kinds["):
        values: tuple = ("mla", "mha")
    elif path.startswith("model.situations["):
        values = SITUATIONS
    else:
        values = DOMAINS.get(path, ())
    current = leaves(case).get(path)
    return tuple(value for value in values if value != current)


def _set(case, path: str, value):
    """``case`` with one field replaced (``model.kinds[1]``: one element of the tuple)."""
    match = fields.ELEMENT.match(path)
    names = (match.group(1) if match else path).split(".")
    if match:
        items = list(_get(case, match.group(1)))
        items[int(match.group(2))] = value
        value = tuple(items)
    if len(names) == 1:
        return dataclasses.replace(case, **{names[0]: value})
    inner = getattr(case, names[0])
    return dataclasses.replace(case, **{names[0]: dataclasses.replace(inner, **{names[1]: value})})


def _fix(case: CompileCase) -> CompileCase:
    """What follows a changed field: the fp8 storage (uint8 unless fp8), the padded tokens (inside the
    step), the second token count (only with a dynamic count, and another count)."""
    if not case.kv_cache_dtype.startswith("fp8"):
        case = dataclasses.replace(case, fp8_storage="uint8")
    padded = tuple(t for t in case.padded if t < case.tokens)
    second = 0 if not case.dynamic else case.second_tokens or (3 if case.tokens != 3 else 4)
    if second == case.tokens:
        second = case.tokens + 1
    return dataclasses.replace(case, padded=padded, second_tokens=second)


def valid(case: CompileCase) -> bool:
    """A case the strategies could draw."""
    return (case.tokens >= 2 and case.layout.kv in KV_FORMS_OF_POOL[case.layout.pool]
            and len(case.model.kinds) == len(case.model.situations))


def vary(case: CompileCase, path: str, value):
    try:
        moved = _fix(_set(case, path, value))
    except (TypeError, ValueError, IndexError, AttributeError):
        return None
    return moved if valid(moved) and leaves(moved).get(path, value) == value else None


class CompileFields:
    """``cases.fields`` for a ``CompileCase``."""

    leaves = staticmethod(leaves)
    alternatives = staticmethod(alternatives)
    vary = staticmethod(vary)


# ------------------------------------------------------------------ feature axes


def _layer_kinds(case: CompileCase) -> str:
    kinds = set(case.model.kinds)
    return "hybrid" if len(kinds) > 1 else kinds.pop()


def _set_layer_kinds(case: CompileCase, value: str):
    if value == "hybrid":
        return None
    kinds = (value,) * len(case.model.kinds)
    return _fix(dataclasses.replace(case, model=dataclasses.replace(case.model, kinds=kinds)))


def _field_axis(name: str, values: tuple[str, ...], path: str, shown=str, stored=None) -> Axis:
    """An axis that is one field of the case (``shown``: its value as the axis shows it; ``stored``: back)."""
    stored = stored or (lambda text: text)
    return Axis(name, values, lambda case: shown(_get(case, path)),
                lambda case, value: vary(case, path, stored(value)))


def _fused_layers(case: CompileCase) -> str:
    fused = case.expected_fused()
    return "all" if all(fused) else "none" if not any(fused) else "some"


COMPILE_AXES = (
    Axis("layer kinds", ("mla", "mha", "hybrid"), _layer_kinds, _set_layer_kinds),
    _field_axis("rope form", ROPE_FORMS, "model.rope"),
    _field_axis("rope style", ("neox", "gptj"), "model.is_neox", lambda neox: "neox" if neox else "gptj",
                lambda text: text == "neox"),
    _field_axis("model dtype", FLOAT_DTYPES, "model.dtype"),
    _field_axis("cache pool", tuple(KV_FORMS_OF_POOL), "layout.pool"),
    _field_axis("cache format", KV_CACHE_DTYPES, "kv_cache_dtype"),
    _field_axis("backend", ("light", "inductor"), "backend"),
    _field_axis("token count", ("dynamic", "static"), "dynamic", lambda dynamic: "dynamic" if dynamic else "static",
                lambda text: text == "dynamic"),
    _field_axis("level", ("O0", "O1", "O2", "O3"), "settings.level", lambda level: f"O{level}",
                lambda text: int(text[1:])),
    Axis("fused layers", ("none", "some", "all"), _fused_layers),
)

fields.OTHER_KINDS[CompileCase] = CompileFields()
features.OTHER_AXES[CompileCase] = COMPILE_AXES
features.AXIS.update({axis.name: axis for axis in COMPILE_AXES})
