"""``torch.library.opcheck`` on the cache-update ops a compiled graph calls.

The fusion passes put ops into graphs; if such an op writes a tensor its schema does not
declare, or its fake (meta) function disagrees with what it returns, the light backend (which
runs the graph eagerly) computes the right numbers while Inductor plans memory and ordering
from the wrong facts. ``check_update_ops`` runs opcheck's schema and fake-tensor tests on
every cache-update op in a post-pass graph, with real tensors of the shapes, strides and
dtypes the graph recorded for its arguments, inside a forward context holding copies of the
case's caches and its slot mapping.
"""

from __future__ import annotations

import torch
from torch import fx

from mla_fuse.layers import set_forward_context
from mla_fuse_conformance.cases.engine_caches import EngineCaches
from mla_fuse_conformance.compile_passes.models import Step

UPDATE_OP_SUFFIX = "kv_cache_update"
TESTS = ("test_schema", "test_faketensor")


def _hint(size) -> int:
    return size.node.hint if isinstance(size, torch.SymInt) else int(size)


def _real(val: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A real tensor with ``val``'s shape, strides and dtype (sizes at their compile-time hint)."""
    size, stride = [_hint(s) for s in val.size()], [_hint(s) for s in val.stride()]
    tensor = torch.empty_strided(size, stride, dtype=val.dtype, device=val.device)
    if val.dtype.is_floating_point:
        tensor.copy_(torch.randn(size, generator=generator).to(val.dtype))
    else:
        tensor.zero_()
    return tensor


def _call(node: fx.Node) -> tuple[torch._ops.OpOverload, tuple, dict]:
    if node.target is torch.ops.higher_order.auto_functionalized:
        return node.args[0], (), dict(node.kwargs)
    return node.target, tuple(node.args), dict(node.kwargs)


def update_nodes(graph: fx.Graph) -> list[fx.Node]:
    return [node for node in graph.nodes if node.op == "call_function"
            and isinstance(_call(node)[0], torch._ops.OpOverload) and _call(node)[0]._schema.name.endswith(UPDATE_OP_SUFFIX)]


def _materialize(op, args, kwargs, generator) -> tuple[tuple, dict]:
    made: dict[fx.Node, torch.Tensor] = {}

    def real(value):
        if not isinstance(value, fx.Node):
            return value
        if value not in made:
            made[value] = _real(value.meta["val"], generator)
        return made[value]

    args, kwargs = tuple(real(a) for a in args), {k: real(v) for k, v in kwargs.items()}
    names = [a.name for a in op._schema.arguments]
    bound = dict(zip(names, args)) | kwargs
    if "positions" in bound:  # rows of the table the op will read
        rows = bound["cos_sin_cache"].size(0)
        bound["positions"].copy_(torch.randint(0, rows, bound["positions"].shape, generator=generator))
    if "k_scale" in bound:
        bound["k_scale"].fill_(0.05)
    return args, kwargs


def check_update_ops(graph: fx.Graph, caches: EngineCaches, step: Step) -> list[str]:
    """opcheck problems of each distinct cache-update op of ``graph`` (first call of each)."""
    problems, seen = [], set()
    generator = torch.Generator().manual_seed(0)
    for node in update_nodes(graph):
        op, args, kwargs = _call(node)
        if op in seen:
            continue
        seen.add(op)
        args, kwargs = _materialize(op, args, kwargs, generator)
        with set_forward_context(caches.clone().layers, step.slot_mapping):
            try:
                torch.library.opcheck(op, args, kwargs, test_utils=TESTS)
            except Exception as error:  # opcheck reports through OpCheckError and the errors it wraps
                problems.append(f"opcheck {op}: {type(error).__name__}: {str(error).splitlines()[0][:300]}")
    return problems
