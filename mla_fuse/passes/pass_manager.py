"""The pass manager: the one place that decides which passes run, and in what order.

Installed as Inductor's ``post_grad_custom_post_pass`` (or run by the light
backend on the same post-grad graph). Order:

1. ``SplitCoalescingPass``          (O1+) one split per (tensor, sizes, dim)
2. ``ScatterSplitReplacementPass``  (O1+) rope outputs feed their users directly
3. ``MLARopeKVCacheFusionPass``     (O2+, flag) MLA rope + cache update -> fused op
4. ``RopeKVCacheFusionPass``        (O2+, flag) MHA rope + cache update -> fused op
5. topological sort (when a fusion rewrote), then ``DefunctionalizationPass`` (whenever a fusion may run)

A fusion with nothing to match (no update op it may fuse in the graph) traces nothing, runs no
matcher and changes nothing, so a level-2 compile of such a graph is a level-1 compile.

``uuid()`` hashes this file, the config and every pass's own uuid, so a changed
pass or setting never reuses a cached compiled graph. After each graph the
manager keeps a copy of it as the passes left it (``last_graph``), for
inspection; ``mla_fuse.compile`` files it with the graph's counts.
"""

from __future__ import annotations

import torch
from torch import fx
from torch._dynamo.utils import dynamo_timed
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.pattern_matcher import stable_topological_sort

from mla_fuse.passes.config import FusionConfig
from mla_fuse.passes.defunctionalize import DefunctionalizationPass
from mla_fuse.passes.inductor_pass import MlaFusePass, hash_source, logger
from mla_fuse.passes.mla_rope_kvcache_fusion import MLARopeKVCacheFusionPass
from mla_fuse.passes.rope_kvcache_fusion import RopeKVCacheFusionPass
from mla_fuse.passes.scatter_split_replace import ScatterSplitReplacementPass
from mla_fuse.passes.split_coalescing import SplitCoalescingPass

PASSES_TIMER = "mla_fuse.passes"  # compilation_time_metrics key: every pass of one graph, clean-up included


class PostGradPassManager(CustomGraphPass):
    def __init__(self, config: FusionConfig | None = None) -> None:
        self.config = config or FusionConfig()
        self.passes: list[MlaFusePass] = []
        if self.config.utility_passes:
            self.passes += [SplitCoalescingPass(), ScatterSplitReplacementPass()]
        if self.config.mla_rope_kvcache_enabled:
            self.passes.append(MLARopeKVCacheFusionPass(self.config))
        if self.config.rope_kvcache_enabled:
            self.passes.append(RopeKVCacheFusionPass(self.config))
        self.defunctionalization = DefunctionalizationPass()
        self.graphs_seen = 0
        self.last_graph: fx.Graph | None = None

    def __call__(self, graph: fx.Graph) -> None:
        with dynamo_timed(PASSES_TIMER):
            self._run(graph)

    def _run(self, graph: fx.Graph) -> None:
        self.graphs_seen += 1
        for graph_pass in self.passes:
            graph_pass(graph)
        fusions = [p for p in self.passes if isinstance(p, (MLARopeKVCacheFusionPass, RopeKVCacheFusionPass))]
        if any(p.matched_count for p in fusions):
            stable_topological_sort(graph)  # a replacement may sit before its inputs
        if fusions:
            self.defunctionalization(graph)  # rewrites fused nodes only: none, nothing changes
        graph.eliminate_dead_code()
        graph.lint()
        self.last_graph = _copy(graph)
        logger.info("mla_fuse passes: %s", self.last_match_counts())

    def last_match_counts(self) -> dict[str, int]:
        """Rewrites per pass in the last graph."""
        return {p.name: p.matched_count for p in self._all()}

    def match_counts(self) -> dict[str, int]:
        """Rewrites per pass over every graph this manager has seen."""
        return {p.name: p.total_matched for p in self._all()}

    def pass_names(self) -> list[str]:
        return [p.name for p in self._all()]

    def _all(self) -> list[MlaFusePass]:
        return [*self.passes, self.defunctionalization]

    def uuid(self) -> str:
        return hash_source(__import__(__name__, fromlist=["_"]), repr(self.config),
                           *(p.uuid() for p in self._all()), torch.__version__)


def _copy(graph: fx.Graph) -> fx.Graph:
    copied = fx.Graph()
    copied.output(copied.graph_copy(graph, {}))
    return copied
