"""torch.compile with the mla_fuse passes.

    import mla_fuse.compile as mc
    compiled = mc.compile(model, level=2, backend="inductor")   # or backend="light"
    with set_forward_context(...):
        compiled(positions, hidden_states)
    mc.match_counts(compiled)   # {'split_coalescing': 0, ..., 'mla_rope_kvcache_fusion': 2, ...}

Backends:

* ``"inductor"``: Inductor with the pass manager as ``post_grad_custom_post_pass``.
* ``"light"``: the same graph Inductor's custom post pass sees (aot_autograd with
  Inductor's decompositions, view -> reshape, no-op removal), the same passes,
  then the graph is run eagerly (no code generation). About 0.3 s a compile
  instead of ~12 s of C++ on CPU; for tests.

Both pin ``torch._inductor.config.enable_auto_functionalized_v2 = False``: the
passes match the v1 form (mutations of views appear as ``slice_scatter`` on
the base), whatever torch's default is.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import fx

from mla_fuse.passes.config import FusionConfig, OptimizationLevel
from mla_fuse.passes.pass_manager import PostGradPassManager

BACKENDS = ("inductor", "light")
PINNED_INDUCTOR_CONFIG = {"enable_auto_functionalized_v2": False}


class MlaFuseBackend:
    """A ``torch.compile`` backend running ``PostGradPassManager`` on each post-grad graph."""

    def __init__(self, config: FusionConfig | None = None, backend: str = "inductor") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"mla_fuse.compile: backend must be one of {BACKENDS}, got {backend!r}")
        self.config = config or FusionConfig()
        self.backend = backend
        self.pass_manager = PostGradPassManager(self.config)
        self.graphs: list[fx.GraphModule] = []  # post-pass graphs (light backend), for inspection

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable:
        if self.backend == "inductor":
            from torch._inductor.compile_fx import compile_fx

            patches = {**PINNED_INDUCTOR_CONFIG, "post_grad_custom_post_pass": self.pass_manager}
            return compile_fx(gm, example_inputs, config_patches=patches)
        return self._compile_light(gm, example_inputs)

    def _compile_light(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable:
        from torch._functorch.aot_autograd import aot_module_simplified
        from torch._inductor.decomposition import select_decomp_table

        with torch._inductor.config.patch(PINNED_INDUCTOR_CONFIG):
            return aot_module_simplified(
                gm, example_inputs, fw_compiler=self._run_passes_eagerly,
                decompositions=select_decomp_table(), keep_inference_input_mutations=True,
            )

    def _run_passes_eagerly(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable:
        from torch._inductor.fx_passes.post_grad import remove_noop_ops, view_to_reshape

        view_to_reshape(gm)
        gm.graph.eliminate_dead_code()
        remove_noop_ops(gm.graph)
        self.pass_manager(gm.graph)
        gm.recompile()
        self.graphs.append(gm)
        return gm

    def match_counts(self) -> dict[str, int]:
        return self.pass_manager.match_counts()


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
    """Rewrites per pass, summed over every graph ``compiled`` has been compiled to so far."""
    return compiled.mla_fuse_backend.match_counts()
