"""What the compile-pass property checks of one ``CompileCase`` (docs/PASSES.md): the fusion fired
exactly where it should, compiled == the same step without passes bit for bit (eager, or where eager and
Inductor disagree, Inductor at O0: ``Run``), no cache copy, the ops left in the graph
pass ``torch.library.opcheck``, and an Inductor compile served again by the FX graph cache agrees;
and planting a broken pass (``compile_passes.mutants``) in a process.
"""

from __future__ import annotations

import os
import uuid

import torch

import mla_fuse.compile as mc  # not `compile`: Python's builtin
from mla_fuse_conformance.cases.engine_caches import EngineCaches, build_caches, pools_bitwise_equal
from mla_fuse_conformance.compile_passes.cases import CompileCase, describe
from mla_fuse_conformance.compile_passes.inspection import (
    ATTENTION, CACHE_KERNEL, FUSED_KERNEL, PASS_NAME, counting_kernel_calls, layer_of, result_differences,
)
from mla_fuse_conformance.compile_passes.models import build_model, make_step, run, same_weights, Step
from mla_fuse_conformance.compile_passes.opcheck import check_update_ops
from mla_fuse_conformance.contract.implementation import pass_mutants
from mla_fuse_conformance.running.devices import allocated_bytes, kernels_device
from mla_fuse_conformance.running.events import event

GROWTH_LIMIT = 0.05  # a step may allocate at most 5% of the bytes a cache grows by (a copy is >= 100%)
FP8_STORAGE = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
UPDATE_NAMES = {"mla": ("unified_mla_kv_cache_update", "fused_rope_and_unified_mla_kv_cache_update"),
                "mha": ("unified_kv_cache_update", "fused_rope_and_unified_kv_cache_update")}


# ------------------------------------------------------------------ building a case


def case_caches(case: CompileCase, blocks: int | None = None) -> EngineCaches:
    if case.kv_cache_dtype.startswith("fp8"):
        storage = torch.uint8 if case.fp8_storage == "uint8" else FP8_STORAGE[case.kv_cache_dtype]
    else:
        storage = case.model.torch_dtype
    return build_caches(case.model.cache_specs(), case.layout, blocks=blocks or case.blocks,
                        block_size=case.block_size, dtype=storage, kv_cache_dtype=case.kv_cache_dtype,
                        device=kernels_device())


def case_step(case: CompileCase, tokens: int | None = None) -> Step:
    tokens = tokens or case.tokens
    padded = [t for t in case.padded if t < tokens]
    return make_step(case.model, tokens, case.blocks * case.block_size, seed=case.seed + tokens, padded=padded,
                     unmapped=case.unmapped)


def compile_case(model, case: CompileCase):
    torch._dynamo.reset()
    return mc.compile(model, backend=case.backend, **case.settings.kwargs())


class Run:
    """The case's model compiled, and what it must equal bit for bit: the same step without any pass.
    First eager (the model with the custom-op rope: the unfused kernels), which a compiled step that no
    pass changed gives on the light backend (Inductor's graph passes, then eager kernels). On Inductor a
    step that differs from eager is compared again with the model compiled by Inductor at O0 (no pass),
    with the same settings, and fails only if it differs from that too: Inductor's C++ code for what the
    passes never touch (an RMSNorm's sum) need not give eager's float32 bits (docs/PASSES.md, "What the
    property compares"). The O0 compile runs only then."""

    def __init__(self, case: CompileCase) -> None:
        self.case = case
        self.reference = build_model(case.model, use_custom_op=True)
        self.model = same_weights(self.reference, build_model(case.model))
        self.compiled = compile_case(self.model, case)
        self.baseline = (mc.compile(same_weights(self.reference, build_model(case.model, use_custom_op=True)),
                                    backend=case.backend, level=0)  # compiled at its first step, if any
                         if case.backend == "inductor" else None)
        self._expected: dict[tuple[int, bool], tuple] = {}
        self.pool_inputs: list[str] = []  # graphs compiled with a cache pool among their inputs

    def caches(self, blocks: int | None = None) -> EngineCaches:
        return case_caches(self.case, blocks)

    def run_compiled(self, caches: EngineCaches, step, compiled=None):
        """The compiled model's step on ``caches``; a graph compiled during it whose inputs include one of
        these pools is noted in ``pool_inputs``. Compared while the pools and the graph's example inputs
        are alive together, so one storage is one address: a pool freed earlier may share an address with
        a later input (CUDA's caching allocator hands freed blocks out again at once)."""
        compiled = self.compiled if compiled is None else compiled
        first = len(mc.graph_records(compiled))
        result = run(compiled, caches.layers, step, dynamic=self.case.dynamic)
        pools = {pool.untyped_storage().data_ptr() for pool in caches.pools}
        self.pool_inputs += [f"a cache pool is an input of compiled graph {i}: the graph may copy it"
                             for i, record in enumerate(mc.graph_records(compiled)[first:], first)
                             if record.input_storages & pools]
        return result

    def expected(self, tokens: int, baseline: bool = False) -> tuple[tuple, EngineCaches]:
        """The passes-free step on fresh caches (the output and rotated q/k, the caches), eager or (``baseline``)
        compiled by Inductor at O0, once per token count. The O0 compile has a cache key of its own, so it
        never serves the case's own compile from the FX graph cache."""
        if (tokens, baseline) not in self._expected:
            caches = self.caches()
            if not baseline:
                result = run(self.reference, caches.layers, case_step(self.case, tokens))
            else:
                tag = f"{torch.compiler.config.cache_key_tag}-baseline"
                with torch.compiler.config.patch(cache_key_tag=tag):
                    result = run(self.baseline, caches.layers, case_step(self.case, tokens), dynamic=self.case.dynamic)
            self._expected[tokens, baseline] = result, caches
        return self._expected[tokens, baseline]

    def step(self, tokens: int | None = None, compiled=None) -> tuple[list[str], dict]:
        """One step compiled and without passes on copies of the same caches: the differences (each naming
        what the compiled step was compared with), the kernel calls."""
        tokens = tokens or self.case.tokens
        caches, step = self.caches(), case_step(self.case, tokens)
        with counting_kernel_calls() as calls:
            result = self.run_compiled(caches, step, compiled)
        differences = self.differences(result, caches, tokens, baseline=False)
        if differences and self.baseline is not None:
            differences = self.differences(result, caches, tokens, baseline=True)
        return differences, dict(calls)

    def differences(self, result, caches: EngineCaches, tokens: int, baseline: bool) -> list[str]:
        expected, expected_caches = self.expected(tokens, baseline)
        name = "Inductor at O0 (no pass)" if baseline else "eager"
        return [f"compiled != {name}: {difference}"
                for difference in result_differences(result, expected) + pools_bitwise_equal(caches, expected_caches)]


# ------------------------------------------------------------------ the checks


def _op_name(node: torch.fx.Node) -> str | None:
    """``name`` of a call of one of our ops (``mla_fuse::name`` or a look-alike), in place or functional."""
    target = node.target
    if target is torch.ops.higher_order.auto_functionalized:
        target = node.args[0]
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    return target._schema.name.partition("::")[2]


def graph_problems(case: CompileCase, graph: torch.fx.Graph) -> list[str]:
    """Per layer: one in-place fused node (before its attention) if fused, else its unfused update."""
    problems, nodes = [], list(graph.nodes)
    order = {node: i for i, node in enumerate(nodes)}
    for name, kind, fused in zip(case.model.layer_names, case.model.kinds, case.expected_fused()):
        unified, fused_name = UPDATE_NAMES[kind]
        mine = [n for n in nodes if _op_name(n) in (unified, fused_name) and layer_of(n) == name]
        wanted = fused_name if fused else unified
        if [_op_name(n) for n in mine] != [wanted]:
            problems.append(f"{name}: expected one {wanted} node, the graph has {[_op_name(n) for n in mine]}")
            continue
        if fused and mine[0].target is torch.ops.higher_order.auto_functionalized:
            problems.append(f"{name}: the fused node was left functional (auto_functionalized)")
        attention = [n for n in nodes if n.target is ATTENTION[kind] and layer_of(n) == name]
        if any(order[a] < order[mine[0]] for a in attention):
            problems.append(f"{name}: attention runs before the cache write")
    return problems


def count_problems(case: CompileCase, counts: dict[str, int]) -> list[str]:
    fused = case.expected_fused()
    problems = []
    for kind in ("mla", "mha"):
        expected = sum(f for f, k in zip(fused, case.model.kinds) if k == kind)
        if counts.get(PASS_NAME[kind], 0) != expected:
            problems.append(f"match counts {counts}: expected {expected} {PASS_NAME[kind]}")
    if counts.get("defunctionalization", 0) != sum(fused):
        problems.append(f"match counts {counts}: expected {sum(fused)} defunctionalization")
    return problems


def expected_kernel_calls(case: CompileCase) -> dict[str, int]:
    calls: dict[str, int] = {}
    for i, (kind, fused) in enumerate(zip(case.model.kinds, case.expected_fused())):
        mapped = i not in case.unmapped
        name = (FUSED_KERNEL[kind] if mapped else "rotary_embedding") if fused else (CACHE_KERNEL[kind] if mapped else None)
        if name:
            calls[name] = calls.get(name, 0) + 1
    return calls


def copy_problems(run_: Run) -> list[str]:
    """No pool is a graph input; the bytes a step allocates do not grow with the cache."""
    case = run_.case
    small, large = run_.caches(), run_.caches(blocks=4 * case.blocks)
    step = case_step(case)
    used = [allocated_bytes(lambda caches=caches: run_.run_compiled(caches, step)) for caches in (small, large)]
    problems = list(dict.fromkeys(run_.pool_inputs))
    grown = large.cache_bytes - small.cache_bytes
    if used[1] - used[0] > GROWTH_LIMIT * grown:
        problems.append(f"a step allocated {used[0]} bytes with the cache, {used[1]} with the cache grown by "
                        f"{grown} bytes: the compiled step copies cache memory")
    return problems


def op_problems(case: CompileCase, graph: torch.fx.Graph) -> list[str]:
    """``torch.library.opcheck`` (schema: every written tensor declared; fake == real metadata) on each
    cache-update op the graph calls, with tensors of the graph's own argument shapes."""
    return check_update_ops(graph, case_caches(case), case_step(case))


def cache_hit_problems(run_: Run, counts: dict[str, int]) -> list[str]:
    """Inductor: a second compile (fresh dynamo) served by the FX graph cache."""
    again = compile_case(same_weights(run_.reference, build_model(run_.case.model)), run_.case)
    differences, _ = run_.step(compiled=again)
    problems = [f"after an FX graph cache hit: {d}" for d in differences]
    if mc.cache_hits(again) != len(mc.graph_records(again)):
        problems.append(f"the second compile was not served by the FX graph cache: {mc.graph_records(again)}")
    if mc.match_counts(again) != counts:
        problems.append(f"match counts after an FX graph cache hit {mc.match_counts(again)} != {counts}")
    return problems


def check_compile_case(case: CompileCase) -> None:
    """The example: every problem of ``observe_compile_case``, as one AssertionError."""
    problems = observe_compile_case(case)["problems"]
    assert not problems, "\n".join(problems)


def observe_compile_case(case: CompileCase) -> dict:
    """What one example observes: its problems, and per compiled graph the match counts, whether
    the FX graph cache served it and the post-pass graph (``tests/test_compile_purity.py`` requires
    all of it to depend on the case alone).

    Inductor compiles with ``emulate_precision_casts``: a generated kernel then rounds a bf16/fp16
    intermediate where eager does (without it, an unfused native rope feeding another op in one
    kernel keeps the rotated value in fp32: not eager's bits, and not the passes' doing); and with
    a cache key of its own, so its first compile misses Inductor's FX graph cache and the second hits,
    whatever earlier examples (or processes) stored there."""
    with torch.compiler.config.patch(cache_key_tag=f"mla_fuse-property-{uuid.uuid4().hex}"), \
            torch._inductor.config.patch(emulate_precision_casts=case.backend == "inductor"):
        problems, run_ = _problems(case)
    records = mc.graph_records(run_.compiled)
    return {"problems": problems, "counts": [record.counts for record in records],
            "cache_hits": [record.cache_hit for record in records],
            "graphs": [None if record.graph is None else str(record.graph) for record in records]}


def _problems(case: CompileCase) -> tuple[list[str], Run]:
    run_ = Run(case)
    differences, calls = run_.step()
    records = mc.graph_records(run_.compiled)
    counts = mc.match_counts(run_.compiled)
    problems = count_problems(case, counts) + differences
    if calls != expected_kernel_calls(case):
        problems.append(f"kernel calls {calls}, expected {expected_kernel_calls(case)}")
    graph = records[-1].graph if records else None
    problems += graph_problems(case, graph) if graph is not None else ["no post-pass graph recorded"]
    if case.second_tokens:
        problems += [f"{case.second_tokens} tokens: {d}" for d in run_.step(case.second_tokens)[0]]
        if len(mc.graph_records(run_.compiled)) != len(records):
            problems.append(f"recompiled for {case.second_tokens} tokens with a dynamic token count")
    problems += copy_problems(run_)
    if graph is not None:
        problems += op_problems(case, graph)
    if case.backend == "inductor":
        problems += cache_hit_problems(run_, counts)
    return problems, run_


# ------------------------------------------------------------------ a planted pass bug (demonstrations, replays)

PASS_MUTANT_ENV = "MLA_FUSE_PASS_MUTANT"


def planted_pass_mutant() -> str | None:
    """The pass mutant planted in this process (``$MLA_FUSE_PASS_MUTANT`` at import), if any."""
    return os.environ.get(PASS_MUTANT_ENV) or None


def plant_pass_mutant(name: str | None):
    """Make the passes of this process broken as ``compile_passes.mutants.PASS_MUTANTS[name]`` breaks them, for
    the rest of the process (as a bug in the source would be): ``$MLA_FUSE_PASS_MUTANT`` at import, so
    that pytest, ``mla-fuse fuzz`` workers and ``mla-fuse repro`` (from the failure record's
    ``pass_mutant``) run the same broken passes. The kernel properties are not affected. Returns the
    entered context, which the caller keeps: its exit (at garbage collection too) unplants the bug."""
    if not name:
        return None
    mutants = pass_mutants()
    if name not in mutants:
        raise ValueError(f"${PASS_MUTANT_ENV}={name!r}: no such pass mutant; known: {', '.join(sorted(mutants))}")
    planted = mutants[name].active()
    planted.__enter__()  # never left: the process runs the broken passes to its end
    return planted


def check_planted(run, case: CompileCase) -> None:
    """One compile-pass example (``harness.PropertyRun.example`` records it as the kernel
    properties' examples are: failure file, in-flight file, hang watchdog); a failure record names
    the pass mutant planted in the process, if any, which ``mla-fuse repro`` plants again."""
    for text in describe(case):  # (the run has noted the case; these also work outside hypothesis)
        event(text)
    try:
        check_compile_case(case)
    except Exception as error:
        if planted_pass_mutant():
            error.mla_fuse_record = {"pass_mutant": planted_pass_mutant()}
        raise
