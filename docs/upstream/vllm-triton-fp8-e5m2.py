"""vLLM: triton_reshape_and_cache_flash stores E4M3 codes when asked for kv_cache_dtype="fp8_e5m2".

Standalone: needs torch, triton and an installed vLLM. Without a GPU, vLLM is not imported (there
vllm.triton_utils replaces triton.jit with a placeholder): only its file
vllm/v1/attention/ops/triton_reshape_and_cache_flash.py is read, and the kernel runs under Triton's
interpreter (TRITON_INTERPRET=1).

    python vllm-triton-fp8-e5m2.py [--file PATH] [--reference]

On a GPU it calls vLLM's wrapper triton_reshape_and_cache_flash itself (importing vLLM). Without
one it launches reshape_and_cache_kernel_flash as that wrapper does (its CUDA branch, mirrored below
statement by statement; current_platform.fp8_dtype() is CUDA's torch.float8_e4m3fn).

Case: one token, one head, head size 4, kv_cache_dtype="fp8_e5m2", a uint8 cache as vLLM allocates
it (STR_DTYPE_TO_TORCH_DTYPE["fp8_e5m2"] is torch.uint8), k_scale = v_scale = 1.0; the stored bytes
are compared with torch's E5M2 codes. The values (1.0, 0.5, -3.0, 4.0) are exact in both E4M3 and
E5M2, so no rounding is involved: Triton's interpreter rounds fp8 wrongly (triton-lang/triton#8322),
and exact values keep the verdict clear of that (the E4M3 codes stored are checked against torch's).

Exit 1: the E4M3 codes of the values were stored (the defect). Exit 0: the E5M2 codes were stored.
Exit 2: anything else (neither format's codes; the wrapper refuses fp8 on this GPU; no kernel file).
--reference stores torch's E5M2 codes in place of the kernel's launch, to show the check passes.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import os
import pathlib
import sys

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton reads it
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

KERNEL = "reshape_and_cache_kernel_flash"
RELATIVE = "v1/attention/ops/triton_reshape_and_cache_flash.py"
# current_platform.fp8_dtype() on CUDA (vllm/platforms/interface.py): what the wrapper views fp8 caches as
PLATFORM_FP8 = torch.float8_e4m3fn


def kernel_file(given: str | None) -> pathlib.Path | None:
    if given:
        return pathlib.Path(given)
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(list(spec.submodule_search_locations)[0]) / RELATIVE


def load_kernel(path: pathlib.Path):
    """The one @triton.jit definition of KERNEL in ``path``, compiled alone with the real triton, under the
    file's own name and line numbers (Triton reads the source back from the file)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    [node] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == KERNEL]
    assert [ast.unparse(d) for d in node.decorator_list] == ["triton.jit"], "the kernel's decorators changed"
    node.decorator_list = []
    scope = {"triton": triton, "tl": tl, "__name__": "vllm_kernel_file"}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), scope)
    return triton.jit(scope[KERNEL])


def triton_reshape_and_cache_flash(kernel, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                   k_scale, v_scale):
    """vLLM 0.32.0's wrapper, statement by statement, for the NHD (4-D) cache on CUDA; the
    _is_supported_kv_cache_dtype assert is checked by the caller."""
    num_heads, head_size = key.shape[1], key.shape[2]
    block_size, x, dim_stride_k, dim_stride_v = key_cache.shape[1], 1, 0, 0
    head_stride = key_cache.stride()[2]
    n = num_heads * head_size
    is_quantized = kv_cache_dtype.startswith("fp8")  # vllm.utils.torch_utils.is_quantized_kv_cache
    kv_cache_torch_dtype = PLATFORM_FP8 if is_quantized else key_cache.dtype
    if key_cache.dtype != kv_cache_torch_dtype and is_quantized:
        key_cache = key_cache.view(kv_cache_torch_dtype)  # <- E4M3 whatever the fp8 name
        value_cache = value_cache.view(kv_cache_torch_dtype)
    TILE_SIZE = min(2048, triton.next_power_of_2(n))
    if key.is_cuda and torch.cuda.get_device_capability(key.device)[0] < 9:
        TILE_SIZE = min(512, TILE_SIZE)
    grid = (slot_mapping.shape[0], triton.cdiv(n, TILE_SIZE))
    kernel[grid](key_ptr=key, value_ptr=value, key_cache_ptr=key_cache, value_cache_ptr=value_cache,
                 slot_mapping_ptr=slot_mapping, k_scale=k_scale, v_scale=v_scale,
                 key_stride=key.stride()[0], value_stride=value.stride()[0], block_stride=key_cache.stride()[0],
                 head_stride=head_stride, dim_stride_k=dim_stride_k, dim_stride_v=dim_stride_v,
                 page_stride=key_cache.stride()[1], num_heads=num_heads, head_size=head_size,
                 block_size=block_size, x=x, USE_HEAD_MAJOR_LAYOUT=False, FP8_KV_CACHE=is_quantized,
                 TILE_SIZE=TILE_SIZE, num_warps=16, num_stages=10)


def codes(values: torch.Tensor, dtype) -> list[int]:
    return values.float().to(dtype).view(torch.uint8).flatten().tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", help="the kernel file, without a GPU (default: the installed vLLM's)")
    parser.add_argument("--reference", action="store_true", help="store torch's E5M2 codes instead of launching")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    path = kernel_file(args.file)
    if path is None or not path.is_file():
        print(f"kernel file {path} not found: is vLLM installed? (--file PATH)", file=sys.stderr)
        return 2
    try:
        version = importlib.metadata.version(importlib.metadata.packages_distributions()["vllm"][0])
    except (KeyError, importlib.metadata.PackageNotFoundError):
        version = "unknown"
    print(f"vLLM {version} ({path}), torch {torch.__version__}, triton {triton.__version__}, "
          f"{'GPU ' + torch.cuda.get_device_name() if device == 'cuda' else 'Triton interpreter (no GPU)'}")
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        print("the wrapper refuses fp8 caches below SM89 (_is_supported_kv_cache_dtype): nothing to check here")
        return 2

    values = [1.0, 0.5, -3.0, 4.0]
    key = torch.tensor(values, dtype=torch.bfloat16, device=device).reshape(1, 1, 4)  # [tokens, heads, D]
    value = key.clone()
    key_cache = torch.zeros(1, 1, 1, 4, dtype=torch.uint8, device=device)  # [blocks, block_size, heads, D]
    value_cache = torch.zeros_like(key_cache)
    slot_mapping = torch.tensor([0], dtype=torch.int64, device=device)
    scale = torch.ones(1, dtype=torch.float32, device=device)
    if args.reference:
        key_cache[0, 0] = (key[0].float() / scale).to(torch.float8_e5m2).view(torch.uint8)
    elif device == "cuda":
        from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash as wrapper

        wrapper(key, value, key_cache, value_cache, slot_mapping, "fp8_e5m2", scale, scale)
    else:
        kernel = load_kernel(path)
        triton_reshape_and_cache_flash(kernel, key, value, key_cache, value_cache, slot_mapping, "fp8_e5m2",
                                       scale, scale)

    got = key_cache.flatten().tolist()
    e5m2, e4m3 = codes(key, torch.float8_e5m2), codes(key, torch.float8_e4m3fn)
    print(f"values                      {values}")
    print(f"expected (E5M2, torch)      {[f'0x{c:02X}' for c in e5m2]}")
    print(f"got (key_cache[0, 0, 0, :]) {[f'0x{c:02X}' for c in got]}")
    print(f"E4M3 codes (torch)          {[f'0x{c:02X}' for c in e4m3]}")
    if got == e5m2:
        print("OK: E5M2 codes stored")
        return 0
    if got == e4m3:
        wrong = [i for i, (g, w) in enumerate(zip(got, e5m2)) if g != w]
        print(f"DEFECT: kv_cache_dtype='fp8_e5m2' stored E4M3 codes at positions {wrong}; decoded as E5M2 they read "
              f"{torch.tensor(got, dtype=torch.uint8).view(torch.float8_e5m2).float().tolist()}")
        return 1
    print("neither format's codes were stored: inconclusive")
    return 2


if __name__ == "__main__":
    sys.exit(main())
