#!/usr/bin/env python3
"""rotary_embedding: wrong result on positions contiguous: no; table.max_position not 1 (test_rotary_embedding:test_rotary_embedding_matches_reference)

From test_rotary_embedding_matches_reference-vllm-cpu-amx-9ba95dbcf0.json (`mla-fuse verify`); needs only torch and the kernel's package. Calls the kernel on the case's inputs
and compares memory with the formula in float64 (CONTRACT §5): exit 0 conforms, 1 differs (printed), a crash dies by
its signal. `--reference` writes the formula's values instead of calling the kernel (exit 0)."""
import math, pathlib, sys  # noqa: E401

import torch

DEVICE = 'cpu'
PER_OP = False  # rounding="per_op": CONTRACT §5's wider bound
BUFFERS = {  # dtype, data pointer mod 64 (bytes), raw bits ("pt": in the .pt file beside this script)
    'positions': (torch.int64, 0, [60, 63, 22, 34, 12, 42, 5, 63]),
    'query': (torch.float32, 0, [-1074416981, -1101831305, -1076546891, 1065449731]),
    'key': (torch.float32, 0, [-1111759673, -1097928622, 1063982473, 981054174]),
    'cos_sin_cache': (torch.float32, 0, "pt"),
}
VIEWS = {  # argument: buffer, sizes, strides, storage offset in the buffer
    'positions': ('positions', (2,), (2,), 0),
    'query': ('query', (2, 1, 2), (2, 2, 1), 0),
    'key': ('key', (2, 1, 2), (2, 2, 1), 0),
    'cos_sin_cache': ('cos_sin_cache', (65, 2), (2, 1), 0),
}
ARGS = {'head_size': 2, 'is_neox': False}
CALL = ('positions', 'query', 'key', 'head_size', 'cos_sin_cache', 'is_neox')


def kernel(positions, query, key, head_size, cos_sin_cache, is_neox):
    import importlib.util, pathlib
    torch.ops.load_library(str(pathlib.Path(importlib.util.find_spec("vllm").submodule_search_locations[0]) / '_C.abi3.so'))
    torch.ops._C.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


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


def rotate(arg, rows, size):  # CONTRACT §1: pairs (a, b) of a head's first R -> (a*c - b*s, b*c + a*s)
    heads = lambda t: t.unflatten(-1, (-1, size)) if t.dim() == 2 else t  # noqa: E731 - [T, heads, size]
    x, table = heads(at(before, arg)).double(), at(before, "cos_sin_cache").double()
    R, f = table.size(1), torch.finfo(args[arg].dtype)
    c, s = table[at(before, "positions").long()][:, None].split(R // 2, -1)
    i = torch.arange(R // 2)
    first, second = (i, i + R // 2) if args["is_neox"] else (2 * i, 2 * i + 1)
    a, b, value, terms = x[..., first], x[..., second], x[..., :R].clone(), x[..., :R].clone()
    value[..., first], value[..., second] = a * c - b * s, b * c + a * s
    terms[..., first], terms[..., second] = (a * c).abs() + (b * s).abs(), (b * c).abs() + (a * s).abs()
    # §5: |got - exact| <= ulp_out(exact) + 2^-22 (|a*c| + |b*s|), + 2 u_out (|a*c| + |b*s|) per_op
    exponent = (torch.frexp(value.abs()).exponent - 1).double().clamp(min=math.log2(f.tiny))
    tol = (2.0 ** (exponent + math.log2(f.eps)) + (2.0 ** -22 + f.eps * PER_OP) * terms).nan_to_num(0.0)  # NaN: NaN
    for image, values in ((want, value.to(args[arg].dtype)), (exact, value), (bound, tol)):
        heads(at(image, arg))[rows, ..., :R] = values[rows]
    return value, tol

for arg in ("query", "key") if args["key"] is not None else ("query",):
    rotate(arg, torch.ones(args[arg].size(0), dtype=torch.bool), args["head_size"])


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
