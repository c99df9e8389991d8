#!/usr/bin/env python3
"""concat_and_cache_mla: raised RuntimeError on kv_c contiguous: no; k_pe contiguous: no; slot_mapping contiguous: no; a padded entry (slot < 0): yes (test_interactions:test_mla_cache_write_interactions)

From test_mla_cache_write_interactions-vllm-d7800e9620.json (`mla-fuse verify`); needs only torch and the kernel's package. Calls the kernel on the case's inputs
and compares memory with the formula in float64 (CONTRACT §5): exit 0 conforms, 1 differs (printed), a crash dies by
its signal. `--reference` writes the formula's values instead of calling the kernel (exit 0)."""
import math, pathlib, sys  # noqa: E401

import torch

DEVICE = 'cpu'
TOKENS = 513
FP8 = None  # kv_cache_dtype stores the source bits
BUFFERS = {  # dtype, data pointer mod 64 (bytes), raw bits ("pt": in the .pt file beside this script)
    'kv': (torch.bfloat16, 0, "pt"),
    'kv_cache': (torch.bfloat16, 0, "pt"),
    'slot_mapping': (torch.int64, 0, "pt"),
    'scale': (torch.float32, 0, [1065353216, 98417939]),
}
VIEWS = {  # argument: buffer, sizes, strides, storage offset in the buffer
    'kv_c': ('kv', (513, 1), (3, 1), 0),
    'k_pe': ('kv', (513, 2), (3, 1), 1),
    'kv_cache': ('kv_cache', (34, 16, 3), (48, 3, 1), 53),
    'slot_mapping': ('slot_mapping', (512,), (2,), 0),
    'scale': ('scale', (1,), (1,), 0),
}
ARGS = {'kv_cache_dtype': 'bfloat16'}
CALL = ('kv_c', 'k_pe', 'kv_cache', 'slot_mapping', 'kv_cache_dtype', 'scale')


def kernel(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    import importlib.util, pathlib
    torch.ops.load_library(str(pathlib.Path(importlib.util.find_spec("vllm").submodule_search_locations[0]) / '_C.abi3.so'))
    torch.ops._C.concat_and_cache_mla_cpu(kv_c, k_pe, kv_cache, slot_mapping)  # no kv_cache_dtype, scale


INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
DATA = torch.load(pathlib.Path(__file__).with_suffix(".pt")) if any(b[-1] == "pt" for b in BUFFERS.values()) else {}


def allocate(name, dtype, align, bits):  # the raw bits; the data pointer `align` bytes past 64 as in the case
    data = DATA[name] if bits == "pt" else torch.tensor(bits, dtype=INTS[dtype.itemsize]).view(dtype)
    base = torch.empty(data.numel() + 64 // dtype.itemsize, dtype=dtype, device=DEVICE)
    flat = base[(align - base.data_ptr()) % 64 // dtype.itemsize:][:data.numel()]
    return flat.view(INTS[dtype.itemsize]).copy_(data.view(INTS[dtype.itemsize])).view(dtype)


flats = {name: allocate(name, *spec) for name, spec in BUFFERS.items()}
args = dict(ARGS, **{arg: torch.as_strided(flats[buffer], size, stride, flats[buffer].storage_offset() + offset)
                     for arg, (buffer, size, stride, offset) in VIEWS.items()})
before, want = ({name: flat.cpu().clone() for name, flat in flats.items()} for _ in range(2))  # want: bits expected
# where a tolerance applies: rotated values (exact, bound >= 0), fp8 codes (fp8)
exact, bound, fp8 = ({name: torch.full(flat.shape, fill, dtype=dtype) for name, flat in flats.items()}
                     for fill, dtype in ((0.0, torch.float64), (-1.0, torch.float64), (False, torch.bool)))
at = lambda image, arg: torch.as_strided(image[VIEWS[arg][0]], *VIEWS[arg][1:])  # noqa: E731 - arg's view of an image


slots = at(before, "slot_mapping").long()
written = torch.zeros(TOKENS, dtype=torch.bool)
written[:slots.numel()] = slots >= 0  # CONTRACT §2: slot < 0 and rows past slot_mapping write nothing
valid = slots[slots >= 0]


def store(cache, values, scale, dtype, columns=slice(None), tol=None):  # CONTRACT §2, §3
    # row t -> cache[s // B, s % B] (s = slot_mapping[t]): the source bits, or rne_satfinite(float32(x) / scale)
    index, x = (valid // args[cache].size(1), valid % args[cache].size(1), ..., columns), values[written].to(dtype)
    if FP8 is None:
        at(want, cache)[index] = x
        if tol is not None:  # a rotated value: within its bound
            at(exact, cache)[index], at(bound, cache)[index] = values[written], tol[written]
    else:  # FP8: the codes' dtype, its finite max
        codes = (x.float() / scale).clamp(-FP8[1], FP8[1]).to(FP8[0])
        at(want, cache).view(torch.uint8)[index], at(fp8, cache)[index] = codes.view(torch.uint8), True

store("kv_cache", torch.cat([at(before, "kv_c"), at(before, "k_pe")], -1), at(before, "scale"), args["kv_c"].dtype)


def differences(name, got):  # storage indices breaking §5: a rotated value's bound, any other bit
    w, e, tol, codes = (image[name] for image in (want, exact, bound, fp8))
    ok, g = got.view(INTS[got.dtype.itemsize]) == w.view(INTS[got.dtype.itemsize]), got.double()
    ok[tol >= 0] = ((g - e).abs() <= tol)[tol >= 0] | (g.isnan() & e.isnan())[tol >= 0]
    return (~ok).nonzero().reshape(-1)


def element(name, i):  # which argument's element storage index i of buffer `name` is
    hits = [(arg, (torch.arange(flats[name].numel()).as_strided(*view[1:]) == i).nonzero())
            for arg, view in VIEWS.items() if view[0] == name]
    return next((f"{arg}{hit[0].tolist()}" for arg, hit in hits if hit.numel()), f"{name} storage element {i}")


if "--reference" in sys.argv:
    for name, flat in flats.items():
        flat.copy_(want[name])
else:
    kernel(*(args[name] for name in CALL))
bad = {name: differences(name, flat.cpu()) for name, flat in flats.items()}
for name, i in ((name, i) for name, where in bad.items() for i in where[:5].tolist()):
    tol = f" (exact {exact[name][i].item()!r}, bound {bound[name][i].item():.3g})" if bound[name][i] >= 0 else ""
    print(f"{element(name, i)}: got {flats[name][i].item()!r}, expected {want[name][i].item()!r}{tol}")
count = sum(where.numel() for where in bad.values())
print(f"{count} elements differ from the formula" if count else "conforms to the formula")
sys.exit(1 if count else 0)
