#!/usr/bin/env python3
"""rotary_embedding: wrong result on query contiguous: no (not shown needed); tokens not 0 or 1 or 2 or 3 (not shown needed); head_size not 48 (not shown needed); rank 3; qkv_packed no (test_rotary_embedding:test_rotary_embedding_matches_reference)
From test_rotary_embedding_matches_reference-vllm-908effbb90.json (`mla-fuse verify`); needs only torch and the
kernel's package. Exit 0: the buffers hold the float64 formula's values (CONTRACT §5), their guard bytes intact; 1:
what differs is printed; a crash dies by its signal. `--reference` judges the formula's own values."""
import math, pathlib, sys, torch  # noqa: E401

DEVICE, PER_OP = 'cpu', False  # PER_OP: rounding="per_op", CONTRACT §5's wider bound
TENSORS = {  # argument: its buffer (dtype, address % 64, bits or "pt": in .pt) or the argument sharing it; sizes, strides, offset
    'positions': ((torch.int64, 0, [0, 0, 0, 0, 0, 0, 0, 0]), (4,), (1,), 0),
    'query': ((torch.float32, 0, 'pt'), (4, 1, 24), (48, 24, 1), 0),
    'key': ((torch.float32, 0, 'pt'), (4, 1, 24), (24, 24, 1), 0),
    'cos_sin_cache': ((torch.float32, 0, [1065353216, 1065353216, 1065353216, 1065353216, 1065353216, 1065353216, 1065353216, 1065353216, 1065353216, 1065353216, 1065353216, 1065353216, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1588804986, 1141075906, -579047462, 233870434, 1440193073, 1190880873, -1347190694, 1899479303, 1935554477, -1167557386, -1436281631, -129753659, -138567487, 117941778, -17560409, -213863757, 805053699, 1818285685, 1049763248, 1167661477, 806945869, 732282304, -802386694, -1127180981]), (1, 24), (24, 1), 0),
}
ARGS = {'head_size': 24, 'is_neox': False}
DATA = torch.load(pathlib.Path(__file__).with_suffix(".pt"))  # the buffers marked "pt", as integers

def kernel(positions, query, key, head_size, cos_sin_cache, is_neox):
    import importlib.util, pathlib
    torch.ops.load_library(str(pathlib.Path(importlib.util.find_spec("vllm").submodule_search_locations[0]) / '_C.abi3.so'))
    torch.ops._C.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)

# Each buffer at its alignment mod 64 between guards of 0xA5 bytes as large as it plus the largest argument laid out
# contiguously (where a kernel that ignores strides writes); the arguments as the same views; `want`: bits expected.
INTS, owner, memory, args = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}, {}, {}, dict(ARGS)
for arg, (buffer, size, stride, offset) in TENSORS.items():
    owner[arg] = buffer if isinstance(buffer, str) else arg
    if owner[arg] == arg:
        dtype, align, bits = buffer
        data = (DATA[arg] if bits == "pt" else torch.tensor(bits, dtype=INTS[dtype.itemsize])).view(torch.uint8)
        guard = data.numel() + max(math.prod(t[1]) for t in TENSORS.values()) * dtype.itemsize
        base = torch.full((2 * guard + data.numel() + 64,), 0xA5, dtype=torch.uint8, device=DEVICE)
        start = guard + (align - base.data_ptr() - guard) % 64
        memory[arg] = (base, start, base[start:start + data.numel()].copy_(data).view(dtype))
    flat = memory[owner[arg]][2]
    args[arg] = torch.as_strided(flat, size, stride, flat.storage_offset() + offset)
before, want = ({name: flat.cpu().clone() for name, (_, _, flat) in memory.items()} for _ in range(2))
at = lambda image, arg: torch.as_strided(image[owner[arg]], *TENSORS[arg][1:])  # noqa: E731 - arg's view of an image
exact, bound = ({name: torch.full(w.shape, fill, dtype=torch.float64) for name, w in want.items()} for fill in (0, -1))

def rotate(arg, rows, size):  # CONTRACT §1: pairs (a, b) of a head's first R -> (a*c - b*s, b*c + a*s)
    heads = lambda t: t.view(len(t), -1, size)  # noqa: E731 - [T, heads, size]
    x, table, f = heads(at(before, arg)).double(), at(before, "cos_sin_cache").double(), torch.finfo(args[arg].dtype)
    R, i = table.size(1), torch.arange(table.size(1) // 2)
    c, s = table[at(before, "positions").long()][:, None].split(R // 2, -1)
    first, second = (i, i + R // 2) if args["is_neox"] else (2 * i, 2 * i + 1)
    a, b, value, terms = x[..., first], x[..., second], x[..., :R].clone(), x[..., :R].clone()
    value[..., first], value[..., second] = a * c - b * s, b * c + a * s
    terms[..., first], terms[..., second] = (a * c).abs() + (b * s).abs(), (b * c).abs() + (a * s).abs()
    # §5: |got - exact| <= ulp_out(exact) + 2^-22 (|a*c| + |b*s|), + 2 u_out (|a*c| + |b*s|) per_op
    ulp = 2.0 ** ((torch.frexp(value.abs()).exponent - 1).double().clamp(min=math.log2(f.tiny)) + math.log2(f.eps))
    tol = (ulp + (2.0 ** -22 + f.eps * PER_OP) * terms).nan_to_num(0.0)  # a NaN value: NaN
    for image, values in ((want, value.to(args[arg].dtype)), (exact, value), (bound, tol)):
        heads(at(image, arg))[rows, ..., :R] = values[rows]

for arg in ("query", "key") if args["key"] is not None else ("query",):
    rotate(arg, slice(None), args["head_size"])

if "--reference" not in sys.argv:  # --reference: the formula's values stand in for the kernel's
    kernel(**args)
failed = wrote = 0
for name, (base, start, flat) in memory.items():  # every bit as `want`, but (§5):
    got, ints = want[name] if "--reference" in sys.argv else flat.cpu(), INTS[flat.element_size()]
    ok, worse = got.view(ints) == want[name].view(ints), torch.zeros(got.shape, dtype=torch.float64)  # worse: order
    e, tol = exact[name], bound[name]  # a rotated value (tol >= 0): within its bound, NaN where exact is NaN
    ok = torch.where(tol >= 0, ((got.double() - e).abs() <= tol) | (got.isnan() & e.isnan()), ok)
    worse = torch.where(tol >= 0, ((got.double() - e).abs() / tol).nan_to_num(1e300), worse)  # |error| / bound
    views, ids, bad = [arg for arg in owner if owner[arg] == name], {name: torch.arange(got.numel())}, (~ok).nonzero()
    for i in bad.reshape(-1)[torch.sort(-worse[bad.reshape(-1)], stable=True).indices][:5].tolist():
        where = [f"{a}{(at(ids, a) == i).nonzero()[0].tolist()}" for a in views if (at(ids, a) == i).any()]
        print(f"{(where or [f'{name} storage element {i}'])[0]}: got {got[i].item()!r}, expected {want[name][i].item()!r}"
              + (f" (exact {e[i].item()!r}, bound {tol[i].item():.3g})" if tol[i] >= 0 else ""))
    for where, guard in (("before the start", base[:start]), ("past the end", base[start + flat.nbytes:])):
        if (count := (guard != 0xA5).sum().item()):
            print(f"wrote {count} bytes {where} of {'/'.join(views)}'s storage")
        wrote += count
    failed += (~ok).sum().item()
print(f"{failed} elements differ from the formula" if failed else "every element conforms to the formula")
sys.exit(1 if failed or wrote else 0)
