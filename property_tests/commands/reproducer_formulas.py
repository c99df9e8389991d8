"""The text of a standalone reproducer (``reproducer.py`` fills it in): CONTRACT §1-§5 written out.

A script is ``HEADER``, the inputs, the kernel call, ``COMMON`` (inputs rebuilt with their
storage, offsets, strides and alignment; the expected memory image), the helpers of the one
operation it calls (``ROTATE`` for rotating operations, ``STORE`` for cache writes), that
operation's formula (``FORMULAS``) and ``JUDGE`` (compare, print, exit). It imports only torch
and what the kernel call imports, so it runs where the kernel's maintainers work.
"""

from __future__ import annotations

from mla_fuse_conformance.declarations.operations import CACHING_OPERATIONS, ROTATING_OPERATIONS

HEADER = '''#!/usr/bin/env python3
"""{title}

From {origin} (`mla-fuse verify`); needs only torch and the kernel's package. Calls the kernel on the case's inputs
and compares memory with the formula in float64 (CONTRACT §5): exit 0 conforms, 1 differs (printed), a crash dies by
its signal. `--reference` writes the formula's values instead of calling the kernel (exit 0)."""
import math, pathlib, sys  # noqa: E401

import torch
'''

COMMON = '''

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
'''

ROTATE = '''

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
'''

STORE = '''

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
'''

# the rows rotated: q and k of every row, or as the implementation declares padded rows (CONTRACT §4)
ROWS = '''q_rows = written if PADDED_ROWS == "skipped" else torch.ones(TOKENS, dtype=torch.bool)
k_rows = torch.ones(TOKENS, dtype=torch.bool) if PADDED_ROWS == "rotated" else written
'''

FORMULAS = {
    "rotary_embedding": '''
for arg in ("query", "key") if args["key"] is not None else ("query",):
    rotate(arg, torch.ones(args[arg].size(0), dtype=torch.bool), args["head_size"])
''',
    "concat_and_cache_mla": '''
store("kv_cache", torch.cat([at(before, "kv_c"), at(before, "k_pe")], -1), at(before, "scale"), args["kv_c"].dtype)
''',
    "concat_and_cache_mla_rope_fused": '''
''' + ROWS + '''R, L = args["k_pe"].size(1), args["kv_c"].size(1)
rotate("q_pe", q_rows, R)
k, tol = rotate("k_pe", k_rows, R)
store("kv_cache", at(before, "kv_c"), at(before, "scale"), args["kv_c"].dtype, slice(0, L))
store("kv_cache", k[:, 0], at(before, "scale"), args["k_pe"].dtype, slice(L, None), tol[:, 0])
''',
    "reshape_and_cache_flash": '''
store("key_cache", at(before, "key"), at(before, "k_scale").reshape(1, -1, 1), args["key"].dtype)
store("value_cache", at(before, "value"), at(before, "v_scale").reshape(1, -1, 1), args["value"].dtype)
''',
    "rope_and_reshape_and_cache_flash": '''
''' + ROWS + '''R, k_scale = args["cos_sin_cache"].size(1), at(before, "k_scale").reshape(1, -1, 1)
rotate("query", q_rows, args["query"].size(-1))
k, tol = rotate("key", k_rows, args["key"].size(-1))
store("key_cache", k, k_scale, args["key"].dtype, slice(0, R), tol)
store("key_cache", at(before, "key")[..., R:], k_scale, args["key"].dtype, slice(R, None))
store("value_cache", at(before, "value"), at(before, "v_scale").reshape(1, -1, 1), args["value"].dtype)
''',
}

JUDGE = '''

def differences(name, got):  # storage indices breaking §5: a rotated value's bound, {fp8}any other bit
    w, e, tol, codes = (image[name] for image in (want, exact, bound, fp8))
    ok, g = got.view(INTS[got.dtype.itemsize]) == w.view(INTS[got.dtype.itemsize]), got.double()
    ok[tol >= 0] = ((g - e).abs() <= tol)[tol >= 0] | (g.isnan() & e.isnan())[tol >= 0]
{fp8_check}    return (~ok).nonzero().reshape(-1)


def element(name, i):  # which argument's element storage index i of buffer `name` is
    hits = [(arg, (torch.arange(flats[name].numel()).as_strided(*view[1:]) == i).nonzero())
            for arg, view in VIEWS.items() if view[0] == name]
    return next((f"{{arg}}{{hit[0].tolist()}}" for arg, hit in hits if hit.numel()), f"{{name}} storage element {{i}}")


if "--reference" in sys.argv:
    for name, flat in flats.items():
        flat.copy_(want[name])
else:
    kernel(*(args[name] for name in CALL))
bad = {{name: differences(name, flat.cpu()) for name, flat in flats.items()}}
for name, i in ((name, i) for name, where in bad.items() for i in where[:5].tolist()):
    tol = f" (exact {{exact[name][i].item()!r}}, bound {{bound[name][i].item():.3g}})" if bound[name][i] >= 0 else ""
    print(f"{{element(name, i)}}: got {{flats[name][i].item()!r}}, expected {{want[name][i].item()!r}}{{tol}}")
count = sum(where.numel() for where in bad.values())
print(f"{{count}} elements differ from the formula" if count else "conforms to the formula")
sys.exit(1 if count else 0)
'''

FP8_CHECK = '''    if codes.any():  # fp8 codes as ordered integers at most one step apart, NaN alike
        pair = [code.view(torch.uint8).long() for code in (got, w)]
        order, nan = [torch.where(c > 127, 128 - c, c) for c in pair], [c & 127 >= NAN_CODE for c in pair]
        ok[codes] = (((order[0] - order[1]).abs() <= 1) & (nan[0] == nan[1]))[codes]
'''


def program(operation: str, fp8: bool) -> str:
    """Everything after the kernel call: the inputs rebuilt, ``operation``'s formula, the judgement
    (with the fp8 code rule where the cache holds fp8 codes)."""
    judge = JUDGE.format(fp8="an fp8 code's step, " if fp8 else "", fp8_check=FP8_CHECK if fp8 else "")
    return "".join([COMMON, ROTATE if operation in ROTATING_OPERATIONS else "",
                    STORE if operation in CACHING_OPERATIONS else "", FORMULAS[operation], judge]).rstrip()
