"""FlagGems: concat_and_cache_mla refuses vLLM's names of the fp8 cache formats (fp8_e4m3, fp8_e5m2).

Standalone: needs torch, triton and FlagGems' file flag_gems/fused/concat_and_cache_mla.py, either installed
or an unpacked wheel (`pip download --no-deps flag-gems==5.0.2 && unzip flag_gems-5.0.2-py3-none-any.whl -d
DIR`):

    python flaggems-mla-fp8-cache-dtype-names.py [--path DIR] [--reference]

DIR (or $FLAGGEMS_PATH) is the directory holding flag_gems/; without it the installed package is located
with importlib.util.find_spec, which does not import it. On a GPU, FlagGems' own flag_gems.concat_and_cache_mla
is called when `import flag_gems` works. Otherwise FlagGems is not imported (`import flag_gems` raises "No
device were detected" without a GPU): from its file, the kernel concat_and_cache_mla_kernel (its @libentry()
launch cache left out), the FP8_KV_CACHE_DATA_TYPE_* constants, the class ConcatAndCacheMla and the function
concat_and_cache_mla are compiled as written with the real triton (torch_device_fn.device is
torch.cuda.device on a GPU, a no-op without one) and run under Triton's interpreter (TRITON_INTERPRET=1).

Case: FlagGems' vLLM patch (flag_gems/patches/patch_vllm_all.py, custom_concat_and_cache_mla, installed as
vLLM's _C_cache_ops.concat_and_cache_mla) passes vLLM's kv_cache_dtype string unchanged; vLLM's names of the
fp8 formats are "fp8", "fp8_e4m3" and "fp8_e5m2" (vllm/config/cache.py CacheDType). Two tokens, kv_lora_rank
8, pe_dim 4, bfloat16 values exact in E4M3 and E5M2 (so no rounding is involved), scale 2.0, into a uint8
cache [num_blocks=2, block_size=2, 12] at slots 3 and 0, written as vLLM's MLA cache write calls it
(ops.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype=..., scale=k_scale)) with:
  * "fp8e4m3", FlagGems' own spelling: the control, expected written right;
  * "fp8_e4m3", the name vLLM passes for `--kv-cache-dtype fp8_e4m3` (its MLA backends accept it);
  * "fp8_e5m2", vLLM's other fp8 name (shown; vLLM 0.32.0's MLA backends do not list it).
Each cache is compared with plain torch ((x / scale).to(torch.float8_e4m3fn or float8_e5m2), its bytes).

Exit 1: the control is written right and "fp8_e4m3" is refused or written wrong (the defect). Exit 0: every
name is written right. Exit 2: the control is wrong too (something else is broken), or FlagGems' file is not
found. --reference writes the caches with plain torch in place of FlagGems, taking vLLM's names, to show the
check passes.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.metadata
import importlib.util
import logging
import os
import pathlib
import sys
import types

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton reads it
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

RELATIVE = "flag_gems/fused/concat_and_cache_mla.py"
KERNEL = "concat_and_cache_mla_kernel"
FORMATS = {"fp8e4m3": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
CONTROL, VLLM_NAME = "fp8e4m3", "fp8_e4m3"


def package_root(given: str | None) -> pathlib.Path | None:
    given = given or os.environ.get("FLAGGEMS_PATH")
    if given:
        return pathlib.Path(given)
    spec = importlib.util.find_spec("flag_gems")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(list(spec.submodule_search_locations)[0]).parent


def load_wrapper(path: pathlib.Path):
    """FlagGems' ``concat_and_cache_mla`` compiled from ``path`` as written, with the module-level statements
    it needs (the constants, the kernel, ``ConcatAndCacheMla``); ``@libentry()`` only caches launches."""
    tree = ast.parse(path.read_text(), filename=str(path))
    wanted = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "").startswith("FP8_KV_CACHE_DATA_TYPE_")
                                                 for t in node.targets):
            wanted.append(node)
        elif isinstance(node, ast.FunctionDef) and node.name == KERNEL:
            written = [ast.unparse(d) for d in node.decorator_list]
            assert written == ["libentry()", "triton.jit"], f"the kernel's decorators changed: {written}"
            node.decorator_list = [ast.parse("triton.jit", mode="eval").body]
            wanted.append(node)
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in ("ConcatAndCacheMla",
                                                                                  "concat_and_cache_mla"):
            wanted.append(node)
    assert len(wanted) == 6, f"the file's layout changed: {[getattr(n, 'name', 'constant') for n in wanted]}"
    device_fn = types.SimpleNamespace(device=torch.cuda.device if torch.cuda.is_available()
                                      else lambda device: contextlib.nullcontext())
    scope = {"torch": torch, "triton": triton, "tl": tl, "torch_device_fn": device_fn,
             "logger": logging.getLogger("flag_gems"), "__name__": "flaggems_kernel_file"}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(path), "exec"), scope)
    return scope["concat_and_cache_mla"]


def torch_write(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """The reference: vLLM's names, plain torch."""
    rows = kv_cache.view(-1, kv_cache.shape[-1])
    values = (torch.cat([kv_c, k_pe], dim=-1).float() / scale).to(FORMATS[kv_cache_dtype])
    rows[slot_mapping] = values.view(torch.uint8)


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
    write = torch_write if args.reference else None
    if device == "cuda" and write is None:
        sys.path.insert(0, str(root))
        try:
            from flag_gems import concat_and_cache_mla as write
        except ImportError as error:
            print(f"import flag_gems failed ({error}); running the wrapper from its file instead")
    if write is None:
        write = load_wrapper(root / RELATIVE)
    print(f"FlagGems {versions[0] if versions else 'unknown'} ({root / RELATIVE}), torch {torch.__version__}, "
          f"triton {triton.__version__}, "
          f"{'GPU ' + torch.cuda.get_device_name() if device == 'cuda' else 'Triton interpreter (no GPU)'}"
          f"{', plain torch (--reference)' if args.reference else ''}")

    # values exact in E4M3 and E5M2 after the division by the scale: no rounding involved
    kv_c = torch.tensor([[2.0, -4.0, 1.0, 0.5, -0.25, 8.0, 3.0, -1.0],
                         [-2.0, 4.0, 0.0, 6.0, 1.5, -8.0, 0.75, 2.0]], dtype=torch.bfloat16, device=device)
    k_pe = torch.tensor([[1.0, -1.0, 12.0, 0.125], [-6.0, 0.5, 2.0, -3.0]], dtype=torch.bfloat16, device=device)
    slot_mapping = torch.tensor([3, 0], dtype=torch.int64, device=device)
    scale = torch.tensor([2.0], dtype=torch.float32, device=device)
    right = {}
    for name in FORMATS:
        kv_cache = torch.zeros(2, 2, 12, dtype=torch.uint8, device=device)
        expected = kv_cache.clone()
        torch_write(kv_c, k_pe, expected, slot_mapping, name, scale)
        try:
            write(kv_c, k_pe, kv_cache, slot_mapping, name, scale)
        except Exception as error:  # noqa: BLE001 - what the call raises is the finding
            right[name] = False
            print(f'kv_cache_dtype="{name}": raised {type(error).__name__}: {error}'
                  f"{'' if bool((kv_cache == 0).all()) else ' (after writing)'}")
            continue
        right[name] = torch.equal(kv_cache, expected)
        wrong = int((kv_cache != expected).sum())
        print(f'kv_cache_dtype="{name}": {"written as torch writes it" if right[name] else f"{wrong} bytes differ"}')
    if all(right.values()):
        print("OK: every name written right")
        return 0
    if right[CONTROL] and not right[VLLM_NAME]:
        print(f'DEFECT: the cache is written for FlagGems\' spelling "{CONTROL}", and vLLM\'s "{VLLM_NAME}" '
              "(what FlagGems' vLLM patch passes for --kv-cache-dtype fp8_e4m3) is not")
        return 1
    print("the control is wrong too, or only fp8_e5m2 fails: inconclusive")
    return 2


if __name__ == "__main__":
    sys.exit(main())
