"""mla_fuse's own Triton kernels (``mla_fuse.ops``) as an implementation of the contract (``triton``)."""

from __future__ import annotations

from mla_fuse import ops

from mla_fuse_conformance.declarations.operations import OPERATION_ARGUMENTS


class TritonImplementation:
    """The public wrappers of ``mla_fuse.ops``: fp32 math rounded once, every row rotated, bad input rejected."""

    name = "triton"
    rounding = "single"
    padded_rows = "rotated"
    checks_inputs = True
    # per operation, the kernel call a standalone reproducer inlines (commands/repro/script.py)
    call_source = {op: f"from mla_fuse import ops\nops.{op}({', '.join(arguments)})"
                   for op, arguments in OPERATION_ARGUMENTS.items()}

    rotary_embedding = staticmethod(ops.rotary_embedding)
    concat_and_cache_mla = staticmethod(ops.concat_and_cache_mla)
    concat_and_cache_mla_rope_fused = staticmethod(ops.concat_and_cache_mla_rope_fused)
    reshape_and_cache_flash = staticmethod(ops.reshape_and_cache_flash)
    rope_and_reshape_and_cache_flash = staticmethod(ops.rope_and_reshape_and_cache_flash)
