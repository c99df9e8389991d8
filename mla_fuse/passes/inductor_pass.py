"""The base of every pass: an Inductor ``CustomGraphPass`` that counts and hashes itself.

Inductor's FX graph cache keys a compiled graph on the ``uuid()`` of the custom
passes installed in ``post_grad_custom_post_pass``. Each pass returns a hash of
its own source (and of whatever else decides what it does: the modules its
patterns are traced from, its configuration), so editing a pass never reuses a
graph compiled by the old one.
"""

from __future__ import annotations

import abc
import hashlib
import inspect
import logging
import types
from typing import Any

import torch
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass

logger = logging.getLogger("mla_fuse.passes")
COUNTER_PREFIX = "mla_fuse."  # counters["inductor"]["mla_fuse.<pass name>"]: rewrites, replayed on a cache hit


def hash_source(*sources: Any) -> str:
    """SHA-256 over the source of modules, classes and functions, and the repr of anything else."""
    hasher = hashlib.sha256()
    for source in sources:
        if isinstance(source, (types.ModuleType, type, types.FunctionType, types.MethodType)):
            text = inspect.getsource(source)
        elif isinstance(source, str):
            text = source
        else:
            text = repr(source)
        hasher.update(text.encode())
    return hasher.hexdigest()


class MlaFusePass(CustomGraphPass):
    """A post-grad pass over a functionalized ATen graph.

    Subclasses implement ``run(graph) -> int`` (the number of rewrites) and may
    extend ``uuid_sources()``; ``matched_count`` holds the last run's count and
    ``total_matched`` the sum over every graph this pass has seen. Each run also
    adds its count to Inductor's ``counters["inductor"]["mla_fuse.<name>"]``:
    Inductor stores the counters' change with the compiled graph and replays it
    when its FX graph cache serves the graph, so counts read from there survive
    a cache hit (``mla_fuse.compile``).
    """

    name: str = "pass"

    def __init__(self) -> None:
        self.matched_count = 0
        self.total_matched = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.matched_count = self.run(graph)
        self.total_matched += self.matched_count
        counters["inductor"][COUNTER_PREFIX + self.name] += self.matched_count
        logger.debug("%s: %d rewrites", self.name, self.matched_count)

    @abc.abstractmethod
    def run(self, graph: torch.fx.Graph) -> int:
        """Rewrite ``graph`` in place; return the number of rewrites."""

    def uuid_sources(self) -> tuple[Any, ...]:
        return (inspect.getmodule(type(self)), type(self))

    def uuid(self) -> str:
        return hash_source(*self.uuid_sources())
