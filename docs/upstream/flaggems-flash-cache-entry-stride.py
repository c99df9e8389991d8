"""FlagGems: reshape_and_cache_flash ignores the cache's entry stride (token-in-block stride).

Standalone: needs torch, triton and FlagGems' files, either installed or an unpacked wheel
(`pip download --no-deps flag-gems==5.0.2 && unzip flag_gems-5.0.2-py3-none-any.whl -d DIR`):

    python flaggems-flash-cache-entry-stride.py [--path DIR] [--reference]

DIR (or $FLAGGEMS_PATH) is the directory holding flag_gems/; without it the installed package is
located with importlib.util.find_spec, which does not import it. On a GPU, FlagGems' wrapper
flag_gems.fused.reshape_and_cache_flash is called itself when `import flag_gems` works. Otherwise
FlagGems is not imported (`import flag_gems` raises "No device were detected" without a GPU): the
kernel reshape_and_cache_flash_kernel is read from flag_gems/fused/reshape_and_cache_flash.py, compiled
alone with the real triton (its @libentry() launch cache left out) and launched as the wrapper's
pure-Python branch does, statement by statement, under Triton's interpreter (TRITON_INTERPRET=1).

Case: one token, one head, head size 4, slot 1 (block 0, entry 1), bfloat16, kv_cache_dtype "auto",
into key and value caches [num_blocks=1, block_size=2, heads=1, head_size=4], views of one pool, for
three pool layouts:
  * packed: [2, NB, B, H, D], K and V = pool.unbind(0) (entry stride H*D = 4), what FlagGems' vLLM
    patch passes (flag_gems/patches/patch_vllm_all.py); the control, written right;
  * interleaved: [NB, B, 2, H, D], K and V = pool.unbind(2) (entry stride 2*H*D = 8);
  * per-head halves: [NB, B, H, 2*D], K and V = pool.split(D, dim=-1), the split vLLM 0.32.0's
    FlashAttention backend makes (entry stride 2*H*D = 8).
Each pool is compared with plain torch (key_cache[block, entry] = key[t], value_cache[...] = value[t]).

Exit 1: the packed caches are written right and another layout wrong (the defect). Exit 0: all
written right. Exit 2: the packed control is wrong too (something else is broken), or FlagGems' file
is not found.
--reference writes the caches with plain torch in place of the kernel, to show the check passes.
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

KERNEL = "reshape_and_cache_flash_kernel"
RELATIVE = "flag_gems/fused/reshape_and_cache_flash.py"


def package_root(given: str | None) -> pathlib.Path | None:
    given = given or os.environ.get("FLAGGEMS_PATH")
    if given:
        return pathlib.Path(given)
    spec = importlib.util.find_spec("flag_gems")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(list(spec.submodule_search_locations)[0]).parent


def load_kernel(path: pathlib.Path):
    """The definition of KERNEL in ``path``, compiled alone with the real triton under the file's own name
    and line numbers, built as ``@triton.jit`` builds it (``@libentry()`` only caches launches)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    [node] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == KERNEL]
    written = [ast.unparse(d) for d in node.decorator_list]
    assert written == ["libentry()", "triton.jit"], f"the kernel's decorators changed: {written}"
    node.decorator_list = []
    scope = {"triton": triton, "tl": tl, "__name__": "flaggems_kernel_file"}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), scope)
    return triton.jit(scope[KERNEL])


def reshape_and_cache_flash(kernel, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                            v_scale):
    """FlagGems 5.0.2's wrapper, pure-Python branch (the wheel has no C extension), statement by statement;
    torch_device_fn.device(...) is left out (no device under the interpreter)."""
    num_tokens = slot_mapping.size(0)
    num_heads = key.size(1)
    head_size = key.size(2)
    block_size = key_cache.size(1)
    key_stride = key.stride(0)
    value_stride = value.stride(0)
    block_stride = key_cache.stride(0)
    assert key_cache.stride(0) == value_cache.stride(0)
    kernel[(num_tokens,)](key, value, key_cache, value_cache, slot_mapping, block_stride, key_stride,
                          value_stride, num_heads, head_size, block_size, k_scale, v_scale, num_heads * head_size)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", help="directory holding flag_gems/ (an unpacked wheel); default $FLAGGEMS_PATH, "
                                       "else the installed package")
    parser.add_argument("--reference", action="store_true", help="write the caches with plain torch instead")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    root = package_root(args.path)
    if root is None or not (root / RELATIVE).is_file():
        where = f"under {root}" if root else "(FlagGems is not installed)"
        print(f"no {RELATIVE} {where}: pass --path DIR (an unpacked flag_gems wheel) or set FLAGGEMS_PATH",
              file=sys.stderr)
        return 2
    versions = [d.version for d in importlib.metadata.distributions(path=[str(root)])
                if d.metadata["Name"] in ("flag_gems", "flag-gems")]
    write = None
    if device == "cuda" and not args.reference:
        sys.path.insert(0, str(root))
        try:
            from flag_gems.fused.reshape_and_cache_flash import reshape_and_cache_flash as write
        except ImportError as error:
            print(f"import flag_gems failed ({error}); launching the kernel from its file instead")
    if write is None:
        kernel = load_kernel(root / RELATIVE)

        def write(*arguments):
            reshape_and_cache_flash(kernel, *arguments)
    print(f"FlagGems {versions[0] if versions else 'unknown'} ({root / RELATIVE}), torch {torch.__version__}, "
          f"triton {triton.__version__}, "
          f"{'GPU ' + torch.cuda.get_device_name() if device == 'cuda' else 'Triton interpreter (no GPU)'}")

    heads, head_size, block_size, blocks = 1, 4, 2, 1
    key = torch.arange(1, 1 + heads * head_size, dtype=torch.bfloat16, device=device).reshape(1, heads, head_size)
    value = -key
    slot_mapping = torch.tensor([1], dtype=torch.int64, device=device)  # block 0, entry 1
    scale = torch.ones(1, dtype=torch.float32, device=device)
    packed = "packed [2, NB, B, H, D]"
    layouts = {  # name -> (pool shape, the K and V views [NB, B, H, D] of a pool)
        packed: ((2, blocks, block_size, heads, head_size), lambda pool: pool.unbind(0)),
        "interleaved [NB, B, 2, H, D]": ((blocks, block_size, 2, heads, head_size), lambda pool: pool.unbind(2)),
        "per-head halves [NB, B, H, 2*D]": ((blocks, block_size, heads, 2 * head_size),
                                            lambda pool: pool.split(head_size, dim=-1)),
    }
    right = {}
    for name, (shape, views) in layouts.items():
        pool, expected_pool = (torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(2))
        key_cache, value_cache = views(pool)
        expected_key, expected_value = views(expected_pool)
        expected_key[0, 1], expected_value[0, 1] = key[0], value[0]  # plain torch: slot 1 = block 0, entry 1
        if args.reference:
            key_cache[0, 1], value_cache[0, 1] = key[0], value[0]
        else:
            write(key, value, key_cache, value_cache, slot_mapping, "auto", scale, scale)
        right[name] = torch.equal(pool, expected_pool)
        print(f"{name}: key_cache strides {key_cache.stride()} (block, entry, head, dim)")
        for cache, want, label in ((key_cache, expected_key, "key_cache"), (value_cache, expected_value, "value_cache")):
            for entry in range(block_size):
                got, exp = cache[0, entry, 0].float().tolist(), want[0, entry, 0].float().tolist()
                mark = "" if got == exp else "   <- wrong"
                print(f"    {label}[0, {entry}, 0]: expected {exp}, got {got}{mark}")
    if all(right.values()):
        print("OK: every layout written where its strides say")
        return 0
    if right[packed]:
        wrong = [name for name, ok in right.items() if not ok]
        print(f"DEFECT: {wrong} written as if the entries were H*D apart (the entry stride is not read): "
              "key and value land in each other's places")
        return 1
    print("the packed control is wrong too: inconclusive")
    return 2


if __name__ == "__main__":
    sys.exit(main())
