"""A named deployment (``declarations/deployments.py``) and one of its operations, as the suite's case.

``deployment_case(deployment, operation)`` gives the case an engine's call makes in that deployment,
at its per-rank sizes and its (CPU-sized) token count:

* bf16 activations; the cache format it names, fp8 stored as ``uint8`` (as vLLM stores it), with a
  non-unit scale where ``scale`` is ``tensor`` and ``[Hkv]`` scales that differ per head where it is
  ``per_head``; the deployment's block size;
* every input placed as its layout's ``View`` for that operation says (``engine_placements``): a
  ``q_pe`` sliced after ``nope`` columns, a ``k_pe`` split from a wider projection beside a
  contiguous ``kv_c``, q/k/v column splits of a fused qkv, each input on its own;
* the cache's K/V form (``layout_types.KV_FORMS``) and head order from the layout's ``CacheForm``;
* the batch: ``decode`` has scattered slots (one block each) and positions among the table's last
  rows; ``prefill`` consecutive positions and consecutive slots from ``block_size // 2``;
* the cos/sin table of the preset (DeepSeek YaRN for MLA presets), with unused rows poisoned, so
  only the rows read are computed however long it is.

``engine_placements(layout, operation, sizes)`` is also what the strategies use to draw an
engine's layout at drawn sizes (``strategies.py``). ``user_deployments(target, hooked)`` reads and checks
an adapter's own ``deployments = (Deployment(...), ...)`` attribute and a conftest's
``pytest_mla_fuse_deployments`` hook.
"""

from __future__ import annotations

from mla_fuse_conformance.cases.types import (FlashCase, MlaCase, Placement, PositionSpec, RopeCase, ScaleSpec,
                                              SlotSpec, TableSpec, ValueSpec)
from mla_fuse_conformance.declarations.deployments import DEPLOYMENTS, Deployment, problems_of
from mla_fuse_conformance.declarations.engine_layouts import LAYOUTS, EngineLayout, placement_of, size_of
from mla_fuse_conformance.declarations.operations import FAMILY_OF_OPERATION, FUSED_OPERATIONS

ACTIVATIONS = "bfloat16"
FP8_STORAGE = "uint8"
# a scale that is neither 1 nor a power of two, and values that use the fp8 range at it
SCALES = {"unit": ScaleSpec(), "tensor": ScaleSpec(log2=-2.0, mantissa=1.25),
          "per_head": ScaleSpec(log2=-2.0, mantissa=1.25, per_head=True)}
FP8_VALUES = ValueSpec(log2_magnitude=1.0)  # midpoints: the random cases (they cost a second at 128 heads)
YARN_ORIGINAL_POSITIONS = 4096  # DeepSeek's original_max_position_embeddings (the presets' table rows / factor)
SEED = 2025


# ---------------------------------------------------------------- placements from an engine's views


def engine_placements(layout: EngineLayout, operation: str, sizes: dict[str, int]) -> dict[str, Placement]:
    """``{argument: Placement}`` of each input ``layout`` passes to ``operation`` at ``sizes``; a
    ``[T, 1, X]`` view given where the operation takes ``[T, X]`` (SGLang's MLA cache inputs) keeps
    its row placement. The rank of each is its view's."""
    found = {}
    for view in layout.views:
        if operation in view.operations:
            found[view.argument] = Placement(**placement_of(view, sizes))
    if FAMILY_OF_OPERATION[operation] == "mla":
        found = {name: _without_head_dim(place) if name in ("kv_c", "k_pe") else place
                 for name, place in found.items()}
    return found


def _without_head_dim(place: Placement) -> Placement:
    if len(place.pad) != 3:
        return place
    return Placement(pad=(place.pad[0], place.pad[2]), offset=(place.offset[0], place.offset[2]))


# ---------------------------------------------------------------- the parts every case shares


def table_of(deployment: Deployment, layout: EngineLayout) -> TableSpec:
    preset, sizes = deployment.model, deployment.sizes()
    dtype = layout.table_dtype
    if preset.attention == "mla":
        return TableSpec("deepseek_yarn", sizes["rotary_dim"], YARN_ORIGINAL_POSITIONS, dtype=dtype,
                         yarn_factor=sizes["table_rows"] / YARN_ORIGINAL_POSITIONS, yarn_mscale=1.0,
                         yarn_mscale_all_dim=1.0, poison_unused_rows=True)
    return TableSpec("plain", sizes["rotary_dim"], sizes["table_rows"], dtype=dtype, poison_unused_rows=True)


def batch_specs(deployment: Deployment) -> tuple[PositionSpec, SlotSpec]:
    """Positions and slots of the deployment's batch kind; an engine that reserves a padding slot (SGLang's
    0, ``EngineLayout.padding_slot``) never gives it to a token."""
    padding_slot = LAYOUTS[deployment.layout].padding_slot
    pad = dict(pad_value=padding_slot) if padding_slot is not None and padding_slot >= 0 else {}
    if deployment.batch == "decode":
        return PositionSpec(pattern="last_rows"), SlotSpec(deployment.tokens, placement="per_block", **pad)
    return PositionSpec(pattern="prefill"), SlotSpec(deployment.tokens, placement="mid_block", **pad)


def cache_format(deployment: Deployment) -> dict:
    """``kv_cache_dtype``, ``cache_storage`` and the value spec that suits the scale."""
    fp8 = deployment.kv_cache_dtype.startswith("fp8")
    return dict(kv_cache_dtype=deployment.kv_cache_dtype, cache_storage=FP8_STORAGE if fp8 else "source",
                values=FP8_VALUES if fp8 else ValueSpec())


# ---------------------------------------------------------------- one case per family


def _rope_case(deployment: Deployment, layout: EngineLayout, operation: str) -> RopeCase:
    sizes, places = deployment.sizes(), engine_placements(layout, operation, deployment.sizes())
    query = next(v for v in layout.views if v.argument == "query" and operation in v.operations)
    rank = len(query.shape)  # [T, H*D] columns (vLLM's MHA) or [T, H, width] heads
    heads, kv_heads = sizes["heads"], sizes.get("kv_heads", 1)  # MLA: the key is k_pe as [T, 1, R]
    head_size = size_of(query.shape[-1], sizes) if rank == 3 else sizes["head_size"]
    positions, _ = batch_specs(deployment)
    return RopeCase(seed=SEED, tokens=deployment.tokens, heads=heads, kv_heads=kv_heads, head_size=head_size,
                    dtype=ACTIVATIONS, is_neox=deployment.model.is_neox, table=table_of(deployment, layout),
                    positions=positions, rank=rank, query_place=places["query"],
                    key_place=places.get("key", Placement()), values=ValueSpec())


def _blocks(deployment: Deployment) -> dict:
    return dict(num_blocks=deployment.num_blocks(), block_size=deployment.block_size)


def _mla_case(deployment: Deployment, layout: EngineLayout, operation: str) -> MlaCase:
    sizes, places = deployment.sizes(), engine_placements(layout, operation, deployment.sizes())
    fused = operation in FUSED_OPERATIONS
    positions, slots = batch_specs(deployment)
    rotary_dim = sizes["rotary_dim"]
    table = table_of(deployment, layout) if fused else TableSpec("plain", rotary_dim, 1)
    return MlaCase(seed=SEED, tokens=deployment.tokens, heads=sizes["heads"] if fused else 1, latent=sizes["latent"],
                   rotary_dim=rotary_dim, dtype=ACTIVATIONS, slots=slots, table=table,
                   is_neox=deployment.model.is_neox, positions=positions if fused else PositionSpec(),
                   q_place=places.get("q_pe", Placement()) if fused else Placement(), kv_packed=False,
                   kv_c_place=places["kv_c"], k_pe_place=places["k_pe"], scale=SCALES[deployment.scale],
                   **_blocks(deployment), **cache_format(deployment))


def _flash_case(deployment: Deployment, layout: EngineLayout, operation: str) -> FlashCase:
    sizes, places = deployment.sizes(), engine_placements(layout, operation, deployment.sizes())
    fused = operation in FUSED_OPERATIONS
    positions, slots = batch_specs(deployment)
    scale = SCALES[deployment.scale]
    kv_form = layout.cache.kv if sizes["value_head_size"] == sizes["head_size"] else "split"
    table = table_of(deployment, layout) if fused else TableSpec("plain", sizes["rotary_dim"], 1)
    return FlashCase(seed=SEED, tokens=deployment.tokens, heads=sizes["heads"] if fused else sizes["kv_heads"],
                     kv_heads=sizes["kv_heads"], head_size=sizes["head_size"],
                     value_head_size=sizes["value_head_size"], dtype=ACTIVATIONS, slots=slots, table=table,
                     is_neox=deployment.model.is_neox, cache_order=(0, 2, 1) if layout.cache.hnd else (0, 1, 2),
                     kv_form=kv_form, positions=positions if fused else PositionSpec(),
                     query_place=places.get("query", Placement()) if fused else Placement(),
                     key_place=places["key"], value_place=places["value"], k_scale=scale, v_scale=scale,
                     value_values=cache_format(deployment)["values"], **_blocks(deployment),
                     **cache_format(deployment))


BUILDERS = {"rope": _rope_case, "mla": _mla_case, "flash": _flash_case}


def deployment_case(deployment: Deployment, operation: str):
    """The case ``operation`` runs in ``deployment`` (module docstring)."""
    if operation not in deployment.operations:
        raise ValueError(f"deployment_case: {deployment.name} does not run {operation} "
                         f"(its operations: {', '.join(deployment.operations)})")
    layout = LAYOUTS[deployment.layout]
    return BUILDERS[FAMILY_OF_OPERATION[operation]](deployment, layout, operation)


def deployments_running(operation: str, deployments=DEPLOYMENTS) -> tuple[Deployment, ...]:
    return tuple(d for d in deployments if operation in d.operations)


def deployment_cases(operation: str, deployments=DEPLOYMENTS) -> dict[str, object]:
    """``{deployment name: case}`` of every deployment that runs ``operation``."""
    return {d.name: deployment_case(d, operation) for d in deployments_running(operation, deployments)}


def user_deployments(target, hooked=()) -> tuple[Deployment, ...]:
    """The user's own deployments, checked: an adapter's ``deployments`` attribute and those a
    conftest returns from the ``pytest_mla_fuse_deployments`` hook (``hooked``: one iterable per
    hook implementation). A ValueError names each problem: not a ``Deployment``, what
    ``problems_of`` finds, a name of one of the suite's deployments, a name given twice."""
    declared = tuple(getattr(target, "deployments", ()) or ()) + tuple(d for group in hooked for d in group or ())
    ours = {d.name for d in DEPLOYMENTS}
    problems = [f"{d!r} is not a Deployment" for d in declared if not isinstance(d, Deployment)]
    seen = set()
    for d in declared:
        if isinstance(d, Deployment):
            problems += problems_of(d, user=True) + ([f"{d.name}: the name of one of the suite's deployments"]
                                                     if d.name in ours else [])
            problems += [f"{d.name}: declared twice"] if d.name in seen else []
            seen.add(d.name)
    if problems:
        raise ValueError("deployments: " + "; ".join(problems))
    return declared
