"""Every kernel variant compiles ahead of time for NVIDIA GPUs, on a machine without one.

The kernels of the test process are interpreter-decorated when there is no
GPU, so the compile runs in a subprocess with ``TRITON_INTERPRET=0``: it
calls the public ops with CPU tensors (the real launchers pick the GPU
configuration: token/head blocks, warps), captures each launch instead of
running it, and compiles the captured specialisation with ``triton.compile``
for ``GPUTarget("cuda", 90, 32)`` and ``("cuda", 80, 32)`` through TTIR,
TTGIR, LLVM IR, PTX and (with the ptxas bundled in the Triton wheel) cubin.
fp8 codes are computed with integer arithmetic and stored as uint8, so no
variant needs hardware fp8 and every one is built for sm_80 too.

On the compiled code it checks what the design relies on:
* every pointer offset is int64 (tokens * heads * dims may pass 2^31);
* fp8 variants divide with ``div.rn.f32`` (IEEE), never an approximate division;
* no FMA contraction (``enable_fp_fusion=False``: GPU and interpreter round alike);
* 16-byte vector loads and stores for the rotary rows (the kernels leave alignment out of Triton's
  specialisation; their ``ALIGNED`` constexpr, set by the launcher, marks aligned rows instead);
* no local-memory spills (when the bundled cuobjdump can read the cubin).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

ARCHITECTURES = (90, 80)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (variant name, op, builder name, arguments of the builder)
VARIANTS = [
    ("mla_fused_bf16_gptj_fp8_h16", "concat_and_cache_mla_rope_fused", "mla", dict(dtype="bfloat16", heads=16)),
    ("mla_fused_bf16_gptj_auto_h128", "concat_and_cache_mla_rope_fused", "mla",
     dict(dtype="bfloat16", heads=128, kv_cache_dtype="auto")),
    ("mla_fused_bf16_prefill_token_blocks", "concat_and_cache_mla_rope_fused", "mla",
     dict(dtype="bfloat16", heads=16, tokens=4096)),
    ("mla_fused_fp16_neox_fp8_e5m2", "concat_and_cache_mla_rope_fused", "mla",
     dict(dtype="float16", heads=16, is_neox=True, kv_cache_dtype="fp8_e5m2")),
    ("mla_fused_fp32_odd_rotary", "concat_and_cache_mla_rope_fused", "mla",
     dict(dtype="float32", heads=3, rotary=12, latent=20, kv_cache_dtype="auto")),
    ("mla_cache_bf16_fp8", "concat_and_cache_mla", "mla", dict(dtype="bfloat16")),
    ("mla_cache_fp16_auto", "concat_and_cache_mla", "mla", dict(dtype="float16", kv_cache_dtype="auto")),
    ("rotary_bf16_neox_gqa", "rotary_embedding", "flash", dict(dtype="bfloat16")),
    ("rotary_fp16_gptj_partial", "rotary_embedding", "flash", dict(dtype="float16", is_neox=False, rotary=64)),
    ("flash_cache_bf16_auto", "reshape_and_cache_flash", "flash", dict(dtype="bfloat16")),
    ("flash_cache_bf16_fp8_per_head", "reshape_and_cache_flash", "flash",
     dict(dtype="bfloat16", kv_cache_dtype="fp8", per_head_scales=True)),
    ("flash_fused_bf16_neox_auto", "rope_and_reshape_and_cache_flash", "flash", dict(dtype="bfloat16")),
    ("flash_fused_fp16_gptj_fp8_partial", "rope_and_reshape_and_cache_flash", "flash",
     dict(dtype="float16", is_neox=False, rotary=64, kv_cache_dtype="fp8_e4m3", per_head_scales=True)),
]
ROTARY_KERNELS = ("mla_rope_cache_kernel", "rotary_embedding_kernel", "flash_rope_cache_kernel")
UNALIGNED_VARIANTS = {"mla_fused_fp32_odd_rotary"}  # R = 12, L = 20: rows not 16-byte aligned, no vectors expected


# ---------------------------------------------------------------- the subprocess (TRITON_INTERPRET=0)


def _mla_args(op, dtype, heads=16, tokens=64, latent=512, rotary=64, is_neox=False, kv_cache_dtype="fp8"):
    import torch
    from mla_fuse_reference.rope import plain_cos_sin_cache

    dtype = getattr(torch, dtype)
    kv = torch.randn(tokens, latent + rotary).to(dtype)
    q = torch.randn(tokens, heads, 128 + rotary).to(dtype)
    cache_dtype = torch.uint8 if kv_cache_dtype.startswith("fp8") else dtype
    cache = torch.zeros(tokens // 16 + 1, 16, latent + rotary, dtype=cache_dtype)
    positions, slots, scale = torch.arange(tokens), torch.arange(tokens), torch.ones(1)
    if op == "concat_and_cache_mla":
        return (kv[:, :latent], kv[:, latent:], cache, slots, kv_cache_dtype, scale)
    return (positions, q[..., 128:], kv[:, latent:], kv[:, :latent], plain_cos_sin_cache(rotary, tokens), is_neox,
            slots, cache, kv_cache_dtype, scale)


def _flash_args(op, dtype, tokens=64, heads=32, kv_heads=8, head_size=128, rotary=128, is_neox=True,
                kv_cache_dtype="auto", per_head_scales=False):
    import torch
    from mla_fuse_reference.rope import plain_cos_sin_cache

    dtype = getattr(torch, dtype)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_size).to(dtype)
    query = qkv[:, :heads * head_size].unflatten(1, (heads, head_size))
    key = qkv[:, heads * head_size:(heads + kv_heads) * head_size].unflatten(1, (kv_heads, head_size))
    value = qkv[:, (heads + kv_heads) * head_size:].unflatten(1, (kv_heads, head_size))
    cache_dtype = torch.uint8 if kv_cache_dtype.startswith("fp8") else dtype
    key_cache = torch.zeros(8, 16, kv_heads, head_size, dtype=cache_dtype)
    value_cache = torch.zeros(8, 16, kv_heads, head_size, dtype=cache_dtype)
    scales = torch.ones(kv_heads if per_head_scales else 1)
    positions, slots, table = torch.arange(tokens), torch.arange(tokens), plain_cos_sin_cache(rotary, tokens)
    if op == "rotary_embedding":
        return (positions, query, key, head_size, table, is_neox)
    if op == "reshape_and_cache_flash":
        return (key, value, key_cache, value_cache, slots, kv_cache_dtype, scales, scales)
    return (positions, query, key, value, key_cache, value_cache, slots, table, is_neox, kv_cache_dtype, scales,
            scales)


def _signature(fn, args, kwargs):
    """Signature, constexprs and attributes as Triton's JIT specialises a launch (``JITFunction.run``'s binder).

    Mirrors it, since ``triton.compile`` applies none of it: constexprs; an integer is its annotation's
    type (else i32/i64 by value) and, unless in ``do_not_specialize``, ``== 1`` (a constexpr when not
    annotated) or divisible by 16; a pointer is 16-byte aligned unless in ``do_not_specialize_on_alignment``.
    """
    import torch

    type_names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.uint8: "u8",
                  torch.int32: "i32", torch.int64: "i64"}
    bound = dict(zip(fn.arg_names, args))
    bound.update({k: v for k, v in kwargs.items() if k in fn.arg_names})
    signature, constexprs, attrs = {}, {}, {}
    for i, (name, param) in enumerate(zip(fn.arg_names, fn.params)):
        value = bound[name]
        if param.is_constexpr:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + type_names[value.dtype]
            if not param.do_not_specialize_on_alignment and value.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif param.annotation_type:
            signature[name] = param.annotation_type
            if not param.do_not_specialize and value != 1 and value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif not param.do_not_specialize and value == 1:
            signature[name], constexprs[name] = "constexpr", value
        else:
            signature[name] = "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
            if not param.do_not_specialize and value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    options = {k: v for k, v in kwargs.items() if k not in fn.arg_names}
    return signature, constexprs, attrs, options


def _resources(cubin: bytes) -> dict | None:
    import tempfile

    import triton

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(cuobjdump):
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    match = re.search(r"REG:(\d+).*?LOCAL:(\d+)", out)
    return {"registers": int(match[1]), "local": int(match[2])} if match else None


def _analyse(compiled) -> dict:
    asm = compiled.asm
    ptx = asm["ptx"]
    offsets = re.findall(r"tt\.addptr [^\n]*?: [^\n]*?, (tensor<[^>]*>|i\d+)\s*(?:loc|$)", asm["ttir"], re.M)
    return {
        "stages": sorted(asm),
        "non_i64_offsets": [t for t in offsets if not (t == "i64" or t.endswith("xi64>"))],
        "num_offsets": len(offsets),
        "div_rn": ptx.count("div.rn.f32"),
        "div_inexact": ptx.count("div.full.f32") + ptx.count("div.approx"),
        "fma": len(re.findall(r"\bfma\.rn\.f32", ptx)),
        "vector_loads": len(re.findall(r"ld\.global(?:\.\w+)*\.v[24]\.", ptx)),
        "vector_stores": len(re.findall(r"st\.global(?:\.\w+)*\.v[24]\.", ptx)),
        "resources": _resources(asm["cubin"]) if "cubin" in asm else None,
    }


def worker() -> None:
    """Compile every variant for every architecture; print one JSON line of results."""
    assert os.environ.get("TRITON_INTERPRET") == "0"
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.runtime.jit import JITFunction

    captured = []
    JITFunction.run = lambda self, *args, grid, warmup, **kwargs: captured.append((self, args, kwargs))

    from mla_fuse import ops, validation
    from mla_fuse.kernels import INTERPRETED, launcher

    validation.require_kernel_device = lambda *args: None  # CPU tensors: the launches are captured, never run
    launcher.current_device = lambda: 0  # no GPU driver here; run returns no kernel, so nothing is kept

    assert not INTERPRETED
    results = {}
    for name, op, builder, arguments in VARIANTS:
        captured.clear()
        args = (_mla_args if builder == "mla" else _flash_args)(op, **arguments)
        getattr(ops, op)(*args)
        assert len(captured) == 1, f"{name}: expected one launch, got {len(captured)}"
        fn, launch_args, kwargs = captured[0]
        signature, constexprs, attrs, options = _signature(fn, launch_args, kwargs)
        source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
        for arch in ARCHITECTURES:
            try:
                compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
                result = _analyse(compiled)
            except Exception as error:  # reported, the test names the variant
                result = {"error": f"{type(error).__name__}: {str(error)[:2000]}"}
            result.update(kernel=fn.__name__, fp8=kwargs.get("FP8_FORMAT", 0) != 0, num_warps=options["num_warps"])
            results[f"{name}@sm_{arch}"] = result
    print("AOT-RESULTS " + json.dumps(results))


# ---------------------------------------------------------------- the test


def compile_all() -> dict:
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    process = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker"], capture_output=True, text=True,
                             env=env, timeout=600, cwd=ROOT)
    lines = [line for line in process.stdout.splitlines() if line.startswith("AOT-RESULTS ")]
    assert process.returncode == 0 and lines, f"AOT worker failed:\n{process.stdout[-3000:]}\n{process.stderr[-5000:]}"
    return json.loads(lines[-1][len("AOT-RESULTS "):])


def problems(variant: str, arch: int, result: dict) -> list[str]:
    where = f"{variant} on sm_{arch}"
    if "error" in result:
        return [f"{where}: {result['error']}"]
    found = []
    if not {"ttir", "ttgir", "llir", "ptx", "cubin"} <= set(result["stages"]):
        found.append(f"{where}: stages {result['stages']}")
    if result["num_offsets"] == 0 or result["non_i64_offsets"]:
        found.append(f"{where}: 32-bit pointer offsets {result['non_i64_offsets']}")
    if result["div_inexact"]:
        found.append(f"{where}: approximate fp32 division")
    if (result["div_rn"] > 0) != result["fp8"]:
        found.append(f"{where}: fp8 quantization must (and only it may) divide with div.rn.f32")
    if result["fma"]:
        found.append(f"{where}: FMA contraction (rounding would differ from the interpreter)")
    if result["kernel"] in ROTARY_KERNELS and variant not in UNALIGNED_VARIANTS and not (
            result["vector_loads"] and result["vector_stores"]):
        found.append(f"{where}: no 16-byte vector loads/stores")
    if result["resources"] is not None and result["resources"]["local"]:
        found.append(f"{where}: register spills {result['resources']}")
    return found


def test_every_variant_compiles_ahead_of_time(tmp_path, monkeypatch):
    """One test (one subprocess, whichever xdist worker runs it): all variants, sm_90 and sm_80, to cubin."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # a fresh cache: the whole pipeline really runs
    results = compile_all()
    found = [p for variant, *_ in VARIANTS for arch in ARCHITECTURES
             for p in problems(variant, arch, results[f"{variant}@sm_{arch}"])]
    assert not found, "\n".join(found)


if __name__ == "__main__" and "--worker" in sys.argv:
    worker()
