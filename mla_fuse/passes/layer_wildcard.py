"""The layer name in a traced pattern: traced as a sentinel string, then a wildcard.

A pattern function takes the layer name as its last argument. It is traced with
``PATTERN_LAYER_NAME`` in its place, and ``layer_name_wildcard`` turns that literal into a
wildcard (``KeywordArg(LAYER_NAME_ARG)``) the match binds to the layer's own name, so one pattern
serves every layer of a shape (``pattern_utils``, module docstring). ``copy_with_layer`` puts
another layer's name into a kept trace (``pattern_utils.MatchTraces``).
"""

from __future__ import annotations

import torch._inductor.pattern_matcher as pm
from torch import fx

LAYER_NAME_ARG = "layer_name"
PATTERN_LAYER_NAME = "<mla_fuse pattern layer>"  # traced in place of a layer name, then made a wildcard


def copy_with_layer(gm: fx.GraphModule, traced: str, layer: str) -> fx.GraphModule:
    """A copy of ``gm`` (torch renames its placeholders in place) with the string ``traced`` as an
    argument replaced by ``layer``."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    if traced != layer:
        for node in graph.nodes:
            node.args = tuple(layer if isinstance(a, str) and a == traced else a for a in node.args)
            node.kwargs = {k: layer if isinstance(v, str) and v == traced else v for k, v in node.kwargs.items()}
    return fx.GraphModule(gm, graph)


def layer_name_wildcard(pattern: pm.PatternExpr, wildcard: pm.PatternExpr) -> pm.MultiOutputPattern:
    """``pattern`` with ``PATTERN_LAYER_NAME`` literals replaced by ``wildcard`` (in place)."""
    seen: set[int] = set()
    replaced = 0

    def visit(node) -> None:
        nonlocal replaced
        if not isinstance(node, pm.PatternExpr) or id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, pm.MultiOutputPattern):
            for output in node.outputs:
                visit(output)
        if isinstance(node, pm._TargetArgsExpr):
            if PATTERN_LAYER_NAME in node.args or PATTERN_LAYER_NAME in node.kwargs.values():
                node.args = tuple(wildcard if a == PATTERN_LAYER_NAME else a for a in node.args)
                node.kwargs = {k: wildcard if v == PATTERN_LAYER_NAME else v for k, v in node.kwargs.items()}
                node.flat_args_kwargs = node.flatten(node.args, node.kwargs)
                replaced += 1
            for child in (*node.args, *node.kwargs.values()):
                visit(child)

    visit(pattern)
    if not replaced or not isinstance(pattern, pm.MultiOutputPattern):
        raise ValueError(f"mla_fuse pattern: expected a multi-output pattern naming {PATTERN_LAYER_NAME!r} "
                         f"(the layer_name argument), got {pattern}")
    return pattern
