"""torch.compile with the mla_fuse passes.

    import mla_fuse.compile as mc
    compiled = mc.compile(model, level=2, backend="inductor")   # or backend="light"
    with set_forward_context(...):
        compiled(positions, hidden_states)
    mc.match_counts(compiled)   # {'split_coalescing': 0, ..., 'mla_rope_kvcache_fusion': 2, ...}
    mc.cache_hits(compiled)     # graphs Inductor's FX graph cache served (their counts were replayed)

Backends:

* ``"inductor"``: Inductor with the pass manager as ``post_grad_custom_post_pass``.
* ``"light"``: Inductor's own graph passes on the forward graph in Inductor's order
  (joint-graph passes, view -> reshape, post-grad passes with the pass manager as the
  custom post pass), then the graph runs eagerly instead of through code generation:
  the graph the passes see is Inductor's, the compile takes ~1 s instead of ~12 s of
  C++ on CPU.

Match counts survive Inductor's FX graph cache: each pass adds its rewrites to
Inductor's ``counters["inductor"]`` (key ``mla_fuse.<pass name>``), which Inductor
stores with a compiled graph and replays when the cache serves it; the backend reads
the counters' change around each compile. Every compiled graph leaves a
``GraphRecord``: its counts, whether the cache served it, and (when the passes ran) a
copy of the graph right after them.

Both backends pin ``torch._inductor.config.enable_auto_functionalized_v2 = False``:
the passes match the v1 form (mutations of views appear as ``slice_scatter`` on the
base), whatever torch's default is.

torch 2.11 to 2.15 (docs/VERSIONS.md). On torch 2.11 and 2.12 the first compile warns once
(``TorchVersionWarning``): their Inductor drops the rounding of a narrowing cast between two
widening ones, so such a model's compiled bits can differ from eager's; the passes are unaffected.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any, Callable

import torch
from torch import fx
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import aot_module_simplified
from torch._inductor.compile_fx import compile_fx, fake_tensor_prop
from torch._inductor.decomposition import select_decomp_table
from torch._inductor.fx_passes.joint_graph import joint_graph_passes
from torch._inductor.fx_passes.post_grad import post_grad_passes, view_to_reshape
from torch._inductor.virtualized import V
from torch._subclasses.fake_tensor import is_fake

from mla_fuse.passes.config import FusionConfig, OptimizationLevel
from mla_fuse.passes.inductor_pass import COUNTER_PREFIX
from mla_fuse.passes.pass_manager import PostGradPassManager

BACKENDS = ("inductor", "light")
PINNED_INDUCTOR_CONFIG = {"enable_auto_functionalized_v2": False}
FX_CACHE_HIT_COUNTER = "fxgraph_cache_hit"


# Inductor's joint-graph rewrite ``pointless_convert`` turns ``x.to(bf16).float()`` of an fp32 ``x`` into
# ``x`` on torch 2.11 and 2.12 (``emulate_precision_casts`` or not); torch 2.13 keeps the rounding.
ROUNDING_KEPT_SINCE = (2, 13)


class TorchVersionWarning(UserWarning):
    """This torch compiles with a difference from the newest supported ones (named in the message)."""


def torch_release(version: str | None = None) -> tuple[int, int]:
    """``(major, minor)`` of ``torch.__version__`` (or of ``version``)."""
    major, minor = (version or torch.__version__).split("+")[0].split(".")[:2]
    return int(major), int(minor)


@functools.cache
def warn_for_this_torch() -> None:
    """Once per process: what this torch's Inductor does that torch 2.13+ does not."""
    if torch_release() < ROUNDING_KEPT_SINCE:
        warnings.warn(
            f"mla_fuse.compile on torch {torch.__version__}: torch 2.11 and 2.12's Inductor drops the rounding "
            "of a narrowing cast between two widening ones (x.to(bfloat16).float() -> x, joint-graph "
            "pointless_convert), so a compiled model that rounds and widens again may differ from eager in "
            "the last bits; torch >= 2.13 keeps the rounding. The fusion passes are unaffected "
            "(docs/VERSIONS.md).", TorchVersionWarning, stacklevel=3)


@dataclasses.dataclass
class GraphRecord:
    """One compiled graph: rewrites per pass, whether Inductor's FX graph cache served it (the passes
    did not run; the counts are the ones recorded when it was compiled), a copy of the graph right
    after the passes (``None`` on a cache hit), and the storages (data pointers) of the tensors it was
    compiled with as inputs: a KV cache among them would be a graph input the compiled code may copy."""

    counts: dict[str, int]
    cache_hit: bool
    graph: fx.Graph | None
    input_storages: frozenset[int] = frozenset()


def _inductor_counters():
    return counters["inductor"]


def _storages(example_inputs: list[Any]) -> frozenset[int]:
    return frozenset(t.untyped_storage().data_ptr() for t in example_inputs
                     if isinstance(t, torch.Tensor) and not is_fake(t))


class MlaFuseBackend:
    """A ``torch.compile`` backend running ``PostGradPassManager`` on each post-grad graph."""

    def __init__(self, config: FusionConfig | None = None, backend: str = "inductor") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"mla_fuse.compile: backend must be one of {BACKENDS}, got {backend!r}")
        warn_for_this_torch()
        self.config = config or FusionConfig()
        self.backend = backend
        self.pass_manager = PostGradPassManager(self.config)
        self.records: list[GraphRecord] = []

    @property
    def graphs(self) -> list[fx.Graph]:
        """Copies of the post-pass graphs of the compiles that ran the passes, in order."""
        return [record.graph for record in self.records if record.graph is not None]

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable:
        before = _inductor_counters().copy()
        self.pass_manager.last_graph = None
        storages = _storages(example_inputs)
        if self.backend == "inductor":
            patches = {**PINNED_INDUCTOR_CONFIG, "post_grad_custom_post_pass": self.pass_manager}
            compiled = compile_fx(gm, example_inputs, config_patches=patches)
        else:
            compiled = self._compile_light(gm, example_inputs)
        self._record(_inductor_counters() - before, storages)
        return compiled

    def _record(self, delta, storages: frozenset[int]) -> None:
        counts = {name: delta.get(COUNTER_PREFIX + name, 0) for name in self.pass_manager.pass_names()}
        self.records.append(GraphRecord(counts, delta.get(FX_CACHE_HIT_COUNTER, 0) > 0, self.pass_manager.last_graph,
                                        storages))

    def _compile_light(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable:
        with torch._inductor.config.patch(PINNED_INDUCTOR_CONFIG):
            return aot_module_simplified(
                gm, example_inputs, fw_compiler=self._run_passes_eagerly,
                decompositions=select_decomp_table(), keep_inference_input_mutations=True,
            )

    def _run_passes_eagerly(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable:
        """Inductor's steps up to code generation (``compile_fx``: joint-graph passes, view -> reshape,
        fake-tensor propagation, post-grad passes), then the graph itself as the compiled function."""
        patches = {**PINNED_INDUCTOR_CONFIG, "post_grad_custom_post_pass": self.pass_manager}
        with torch._inductor.config.patch(patches):
            joint_graph_passes(gm)
            view_to_reshape(gm)
            with torch.no_grad():
                fake_mode = fake_tensor_prop(gm, example_inputs)
            with V.set_fake_mode(fake_mode):
                post_grad_passes(gm, is_inference=True)
        gm.recompile()
        return gm

    def match_counts(self) -> dict[str, int]:
        totals = dict.fromkeys(self.pass_manager.pass_names(), 0)
        for record in self.records:
            for name, count in record.counts.items():
                totals[name] += count
        return totals


def compile(model: torch.nn.Module | Callable, *, level: int | OptimizationLevel = OptimizationLevel.O2,
            backend: str = "inductor", config: FusionConfig | None = None, dynamic: bool | None = None,
            **fusion_flags) -> Callable:
    """``torch.compile(model)`` with the mla_fuse passes. ``config`` wins over ``level``/``fusion_flags``
    (``fuse_rope_kvcache``, ``fuse_mla_rope_kvcache``, ``splitting_ops``, ``fusable_kv_cache_dtypes``).
    The result carries its backend as ``.mla_fuse_backend``; see ``match_counts``."""
    config = config or FusionConfig(level=level, **fusion_flags)
    mla_backend = MlaFuseBackend(config, backend)
    compiled = torch.compile(model, backend=mla_backend, dynamic=dynamic)
    compiled.mla_fuse_backend = mla_backend
    return compiled


def match_counts(compiled) -> dict[str, int]:
    """Rewrites per pass, summed over every graph ``compiled`` has been compiled to so far, those
    served by Inductor's FX graph cache included (their counts are replayed from the cache)."""
    return compiled.mla_fuse_backend.match_counts()


def cache_hits(compiled) -> int:
    """How many of ``compiled``'s graphs Inductor's FX graph cache served (the passes did not run)."""
    return sum(record.cache_hit for record in compiled.mla_fuse_backend.records)


def graph_records(compiled) -> list[GraphRecord]:
    return list(compiled.mla_fuse_backend.records)
