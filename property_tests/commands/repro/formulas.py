"""The text of a standalone reproducer (``script.py`` fills it in): CONTRACT §1-§5 written out.

A script is ``HEADER``, the constants and inputs, the kernel call, ``MEMORY`` (each buffer rebuilt
between guard bytes, the arguments as the same views, the expected memory image), the helpers of
the one operation it calls (``rotate`` for rotating operations, ``store`` for cache writes, each
with only the pieces the case needs), that operation's formula (``FORMULAS``) and ``JUDGE_*`` (every
byte compared, the guards checked, the worst five differences named, worst first as the suite orders
them: an fp8 code as its code and value, ``got code 247 (-240.0), expected code 254 (-448.0)``; the
exit status). It imports only
torch and what the kernel call imports, so it runs where the kernel's maintainers work.
"""

from __future__ import annotations

from mla_fuse_conformance.declarations.operations import (CACHING_OPERATIONS, FUSED_OPERATIONS, OPERATION_ARGUMENTS,
                                                          ROTATING_OPERATIONS)

HEADER = """#!/usr/bin/env python3
\"\"\"{title}
{about}\"\"\"
import math, pathlib, sys, torch  # noqa: E401
"""

ABOUT = ("From {origin} (`mla-fuse verify`); needs only torch and the kernel's package. Exit 0: the buffers hold "
         "the float64 formula's values (CONTRACT §5), their guard bytes intact; 1: what differs is printed; a crash dies "
         "by its signal. `--reference` judges the formula's own values.")

TENSORS_HEAD = ("TENSORS = {  # argument: its buffer (dtype, address % 64, bits or \"pt\": in .pt) or the argument "
                "sharing it; sizes, strides, offset")

DATA = 'DATA = torch.load(pathlib.Path(__file__).with_suffix(".pt"))  # the buffers marked "pt", as integers'

MEMORY = """
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
"""

BOUNDS = """exact, bound = ({name: torch.full(w.shape, fill, dtype=torch.float64) for name, w in want.items()} for fill in (0, -1))
"""

FP8_IMAGE = """fp8 = {name: torch.zeros(w.shape, dtype=torch.bool) for name, w in want.items()}  # where want holds fp8 codes
low, high, copies = *({name: w.clone() for name, w in want.items()} for _ in range(2)), []  # codes allowed (§5)
shown = lambda image, name, i: (  # noqa: E731 - an fp8 element as its code and value, another as its value
    f"code {(c := image.view(torch.uint8)[i:i + 1]).item()} ({c.view(FP8[0]).float().item()!r})" if fp8[name][i]
    else repr(image[i].item()))
"""

ROTATE = """
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
"""

SLOTS = """
slots = at(before, "slot_mapping").long()  # CONTRACT §2: slot < 0 and rows past slot_mapping write nothing
written = torch.nn.functional.pad(slots >= 0, (0, TOKENS - len(slots)))
"""

STORE = """
def store(cache, source{scale}{columns}):  # §2: row t of source -> cache[s // B, s % B], s = slot_mapping[t]
    s = slots[slots >= 0]
    index = (s // args[cache].size(1), s % args[cache].size(1), ...{columns})
{body}"""

STORE_BITS = """    at(want, cache)[index] = at(want, source)[written]  # the source bits
"""

STORE_BOUND = """    for image in (want, exact, bound):  # the source bits; a rotated value within its bound
        at(image, cache)[index] = at(image, source)[written]
"""

STORE_FP8 = """    x = at(want, source)[written].float()  # §3: code = rne_satfinite(float32(x) / scale), exactly (§5)
    codes = (x / scale).clamp(-FP8[1], FP8[1]).to(FP8[0]).view(torch.uint8)
    for image in (want, low, high):
        at(image, cache).view(torch.uint8)[index] = codes
    at(fp8, cache)[index] = True
"""

# a rotated source: any code its §5 bound reaches, and the code of the value the kernel wrote back (checked at the end)
STORE_FP8_ROTATED = """    e, tol = at(exact, source)[written], at(bound, source)[written]
    for image, q in ((low, (e - tol) / scale), (high, (e + tol) / scale)):
        allowed = q.clamp(-FP8[1], FP8[1]).to(FP8[0]).view(torch.uint8)
        at(image, cache).view(torch.uint8)[index] = torch.where(tol >= 0, allowed, codes)
    copies.append((cache, index, source, scale, tol >= 0))
"""

# the rows rotated: q and k of every row, or as the implementation declares padded rows (CONTRACT §4)
Q_ROWS, K_ROWS = ('written if PADDED_ROWS == "skipped" else slice(None)',
                  'slice(None) if PADDED_ROWS == "rotated" else written')

# per operation its formula; {scale}, {k_scale}, {v_scale}: the scale argument a store reads (fp8 caches only)
FORMULAS = {
    "rotary_embedding": """
for arg in ("query", "key") if args["key"] is not None else ("query",):
    rotate(arg, slice(None), args["head_size"])
""",
    "concat_and_cache_mla": """
store("kv_cache", "kv_c"{scale}, slice(0, args["kv_c"].size(1)))
store("kv_cache", "k_pe"{scale}, slice(args["kv_c"].size(1), None))
""",
    "concat_and_cache_mla_rope_fused": """
rotate("q_pe", """ + Q_ROWS + """, args["q_pe"].size(-1))  # the padded rows as declared (§4)
rotate("k_pe", """ + K_ROWS + """, args["k_pe"].size(-1))
store("kv_cache", "kv_c"{scale}, slice(0, args["kv_c"].size(1)))
store("kv_cache", "k_pe"{scale}, slice(args["kv_c"].size(1), None))
""",
    "reshape_and_cache_flash": """
store("key_cache", "key"{k_scale})
store("value_cache", "value"{v_scale})
""",
    "rope_and_reshape_and_cache_flash": """
rotate("query", """ + Q_ROWS + """, args["query"].size(-1))  # the padded rows as declared (§4)
rotate("key", """ + K_ROWS + """, args["key"].size(-1))
store("key_cache", "key"{k_scale})
store("value_cache", "value"{v_scale})
""",
}
SCALES = {"scale": ', at(before, "{}")', "k_scale": ', at(before, "k_scale").reshape(1, -1, 1)',
          "v_scale": ', at(before, "v_scale").reshape(1, -1, 1)'}

JUDGE_START = """
if "--reference" not in sys.argv:  # --reference: the formula's values stand in for the kernel's
    kernel(**args)
failed = wrote = 0
for name, (base, start, flat) in memory.items():  # every bit as `want`{but}
    got, ints = want[name] if "--reference" in sys.argv else flat.cpu(), INTS[flat.element_size()]
    ok, worse = got.view(ints) == want[name].view(ints), torch.zeros(got.shape, dtype=torch.float64)  # worse: order
"""

JUDGE_BOUND = """    e, tol = exact[name], bound[name]  # a rotated value (tol >= 0): within its bound, NaN where exact is NaN
    ok = torch.where(tol >= 0, ((got.double() - e).abs() <= tol) | (got.isnan() & e.isnan()), ok)
    worse = torch.where(tol >= 0, ((got.double() - e).abs() / tol).nan_to_num(1e300), worse)  # |error| / bound
"""

JUDGE_FP8 = """    if fp8[name].any():  # an fp8 code (§5): the formula's, or for a rotated value one its bound reaches; NaN where the
        # formula's is NaN; never inf; the sign kept where every allowed code has it. As ordered integers:
        c = [image.view(torch.uint8).long() for image in (got, want[name], low[name], high[name])]
        g, w, lo, hi = (torch.where(x > 127, 128 - x, x) for x in c)
        lo, hi = torch.minimum(torch.minimum(lo, hi), w), torch.maximum(torch.maximum(lo, hi), w)
        nan, sign = [(x & 127) >= NAN_CODE for x in c], [x > 127 for x in c]
        kept = ~((sign[1] == sign[2]) & (sign[1] == sign[3]) & (sign[0] != sign[1]))
        fits = torch.where(nan[0] | nan[1], nan[0] == nan[1], (g >= lo) & (g <= hi) & kept) & ((c[0] & 127) != INF_CODE)
        ok[fp8[name]], worse[fp8[name]] = fits[fp8[name]], (g - w).abs().double()[fp8[name]]  # worse: codes apart
"""

# the five elements that differ most (worst first), each named as an argument's element (else storage index); the guards
JUDGE_END = """    views, ids, bad = [arg for arg in owner if owner[arg] == name], {{name: torch.arange(got.numel())}}, (~ok).nonzero()
    for i in bad.reshape(-1)[torch.sort(-worse[bad.reshape(-1)], stable=True).indices][:5].tolist():
        where = [f"{{a}}{{(at(ids, a) == i).nonzero()[0].tolist()}}" for a in views if (at(ids, a) == i).any()]
        print(f"{{(where or [f'{{name}} storage element {{i}}'])[0]}}: got {{{got}}}, expected {{{want}}}"{bound_text})
    for where, guard in (("before the start", base[:start]), ("past the end", base[start + flat.nbytes:])):
        if (count := (guard != 0xA5).sum().item()):
            print(f"wrote {{count}} bytes {{where}} of {{'/'.join(views)}}'s storage{crash}")
        wrote += count
    failed += (~ok).sum().item()
"""

# a fused operation's fp8 cache holds the code of the value it wrote back (§5: fused = its unfused chain)
JUDGE_COPIES = """got = {name: want[name] if "--reference" in sys.argv else flat.cpu().clone() for name, (_, _, flat) in memory.items()}
for cache, index, source, scale, rotated in copies:
    x = at(got, source)[written].float()
    codes, held = (x / scale).clamp(-FP8[1], FP8[1]).to(FP8[0]).view(torch.uint8), at(got, cache).view(torch.uint8)[index]
    bad = rotated & (held != codes) & ~(((held & 127) >= NAN_CODE) & ((codes & 127) >= NAN_CODE))
    for i in bad.nonzero()[:5].tolist():
        print(f"{cache} entry of {source} row {i}: code {held[tuple(i)].item()}, "
              f"the written-back value's is {codes[tuple(i)].item()}")
    failed += bad.sum().item()
"""

FINISH = """print(f"{failed} elements differ from the formula" if failed else "every element conforms to the formula")
sys.exit(1 if failed or wrote else 0)
"""

BOUND_TEXT = '\n              + (f" (exact {e[i].item()!r}, bound {tol[i].item():.3g})" if tol[i] >= 0 else "")'


def program(operation: str, fp8: bool, crash: str) -> str:
    """Everything after the kernel call: the inputs rebuilt, ``operation``'s formula, the judgement (with
    the fp8 code rule where the cache holds fp8 codes); ``crash``: what the suite's run died of, or ''."""
    rotating, caching = operation in ROTATING_OPERATIONS, operation in CACHING_OPERATIONS
    body = (STORE_FP8 + (STORE_FP8_ROTATED if rotating else "")) if fp8 else STORE_BOUND if rotating else STORE_BITS
    scale = "kv_cache_scale" if operation in FUSED_OPERATIONS else "scale"
    scales = {key: text.format(scale) if fp8 else "" for key, text in SCALES.items()}
    mla = "kv_cache" in OPERATION_ARGUMENTS[operation]  # an MLA entry: kv_c's columns, then k_pe's
    store = STORE.format(scale=", scale" if fp8 else "", columns=", columns" if mla else "", body=body)
    crash_text = f" (the suite's run died by {crash})" if crash else ""
    return "".join([MEMORY, BOUNDS if rotating else "", FP8_IMAGE if fp8 else "", ROTATE if rotating else "",
                    SLOTS if caching else "", store if caching else "",
                    FORMULAS[operation].format(**scales),
                    JUDGE_START.format(but=", but (§5):" if rotating or fp8 else ""), JUDGE_BOUND if rotating else "",
                    JUDGE_FP8 if fp8 else "",
                    JUDGE_END.format(bound_text=BOUND_TEXT if rotating else "", crash=crash_text,
                                     got="shown(got, name, i)" if fp8 else "got[i].item()!r",
                                     want="shown(want[name], name, i)" if fp8 else "want[name][i].item()!r"),
                    JUDGE_COPIES if fp8 and rotating and caching else "", FINISH]).rstrip()
