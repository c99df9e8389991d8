"""End-to-end compile check: a DeepSeek-shaped decoder compiled as engines compile it, on the kernels' device.

    python ci/gpu_compile_check.py                  # CUDA: 4 layers, hidden 1024, 16 heads, nope 128, rope 64,
                                                    #   latent 512; CPU: --small (2 tiny layers, ~1-2 minutes)
    python ci/gpu_compile_check.py --device cpu --layers 3 --tokens 6

The decoder: per layer an RMSNorm, ``mla_fuse.layers.MLAAttention`` (one DeepSeek YaRN rope module shared
by the layers, native form, GPT-J style) and an fp32 residual add; the caches are views of one
engine-owned pool (layer ``i`` is chunk ``i``), every byte starting as a sentinel; one slot mapping for
every layer. Each check is one row of the table; a check that raises is reported as the exception's type
and first line (the innermost cause of a ``BackendCompilerFailed``, e.g. a pass failing to register on
another torch version) and the next check runs. Exit status 1 if any check failed.

1. ``eager``: the model with the custom-op rope (the unfused kernels): the reference bytes.
2. ``O1``: ``mla_fuse.compile(model, level=1, backend="inductor")``: no fusion (match count 0).
3. ``O2 fuses``: level 2: match counts one fusion and one defunctionalization per layer; the post-pass graph
   has one in-place fused node per layer and no unfused update.
4. ``O2 == O1``: every layer's cache (the whole pool) bitwise equal to O1's after the same step.
5. ``second token count``: another token count runs on the same O2 graph (no new graph record, dynamo's
   ``unique_graphs`` unchanged), its caches bitwise equal to O1's.
6. ``CUDA graph`` (CUDA only): the O2 step captured in a ``torch.cuda.CUDAGraph`` on static inputs and
   replayed on sentinel caches gives the compiled step's bytes (caches and output).

Inductor compiles with ``emulate_precision_casts`` (a generated kernel rounds bf16 intermediates where eager
does; the compile-pass property compiles the same way) under a fresh cache key (no FX graph cache hit).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
import uuid
from typing import Callable

import torch
from torch import nn

import mla_fuse.compile as mc
from mla_fuse.layers import DeepseekScalingRotaryEmbedding, LayerKVCache, MLAAttention, set_forward_context
from mla_fuse.layers.mla import RMSNorm
from mla_fuse.layers.unified_ops import FUSED_MLA_UPDATE, UNIFIED_MLA_UPDATE
from mla_fuse.validation import checking_values
from mla_fuse_conformance.running.devices import kernels_device

SENTINEL = 0x5A
DTYPE = torch.bfloat16


@dataclasses.dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    nope: int
    rope: int
    latent: int
    v_dim: int
    tokens: int
    blocks: int          # NB per layer (block size 16)
    positions: int       # the rope's original max positions (table rows = positions * factor)
    factor: float


FULL = Shape(layers=4, hidden=1024, heads=16, nope=128, rope=64, latent=512, v_dim=128, tokens=32, blocks=256,
             positions=4096, factor=40.0)  # DeepSeek-V3's rope scaling
SMALL = Shape(layers=2, hidden=64, heads=2, nope=16, rope=16, latent=32, v_dim=16, tokens=5, blocks=8,
              positions=64, factor=4.0)
BLOCK_SIZE = 16


def layer_name(i: int) -> str:
    return f"model.layers.{i}.self_attn"


class Decoder(nn.Module):
    """DeepSeek-shaped MLA layers: ``x = x + attn(norm(x))`` (the add in fp32, rounded once)."""

    def __init__(self, shape: Shape, use_custom_op: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        rope = DeepseekScalingRotaryEmbedding(shape.rope, shape.rope, shape.positions, 10000.0, False, shape.factor,
                                              mscale=1.0, mscale_all_dim=1.0, use_custom_op=use_custom_op)
        self.norms = nn.ModuleList(RMSNorm(shape.hidden) for _ in range(shape.layers))
        self.layers = nn.ModuleList(
            MLAAttention(shape.hidden, shape.heads, shape.nope, shape.rope, shape.v_dim, shape.latent, rope,
                         layer_name(i)) for i in range(shape.layers))
        for norm in self.norms:  # not all ones: the norm's weight is part of the computed bytes
            nn.init.uniform_(norm.weight, 0.5, 1.5)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        for norm, layer in zip(self.norms, self.layers):
            hidden = (hidden.float() + layer(positions, norm(hidden)).float()).to(hidden.dtype)
        return hidden


@dataclasses.dataclass
class Step:
    positions: torch.Tensor
    hidden: torch.Tensor
    slots: torch.Tensor  # one slot mapping for every layer; the attention reads exactly these slots


def make_step(shape: Shape, tokens: int, device: torch.device) -> Step:
    generator = torch.Generator().manual_seed(tokens)
    rows = int(shape.positions * shape.factor)
    positions = torch.randint(0, rows, (tokens,), generator=generator)
    hidden = torch.randn(tokens, shape.hidden, generator=generator).to(DTYPE)
    slots = torch.randperm(shape.blocks * BLOCK_SIZE, generator=generator)[:tokens]
    return Step(positions.to(device), hidden.to(device), slots.to(device))


class Caches:
    """Layer ``i``'s ``[NB, B, L + R]`` cache is chunk ``i`` of one sentinel-filled pool."""

    def __init__(self, shape: Shape, device: torch.device) -> None:
        width = shape.latent + shape.rope
        self.pool = torch.full((shape.layers * shape.blocks * BLOCK_SIZE * width * 2,), SENTINEL, dtype=torch.uint8,
                               device=device)
        chunks = self.pool.view(DTYPE).view(shape.layers, shape.blocks, BLOCK_SIZE, width)
        self.layers = {layer_name(i): LayerKVCache("auto", kv_cache=chunks[i]) for i in range(shape.layers)}

    def reset(self) -> None:
        self.pool.fill_(SENTINEL)


def run(model, caches: Caches, step: Step, *, mark_dynamic: bool = True) -> torch.Tensor:
    positions, hidden = step.positions, step.hidden
    if mark_dynamic:  # as engines compile: one graph for every token count >= 2
        torch._dynamo.mark_dynamic(positions, 0)
        torch._dynamo.mark_dynamic(hidden, 0)
    slot_mapping = dict.fromkeys(caches.layers, step.slots)
    with set_forward_context(caches.layers, slot_mapping, context_slots=step.slots):
        return model(positions, hidden)


def differing_layers(a: Caches, b: Caches) -> list[str]:
    """The layers whose caches differ in any byte (the whole pool is compared layer by layer), each as
    ``name (N bytes, max |a - b| = x)``."""
    differ = []
    for name in a.layers:
        x, y = a.layers[name].kv_cache, b.layers[name].kv_cache
        bytes_differ = int((x.view(torch.uint8) != y.view(torch.uint8)).sum())
        if bytes_differ:
            largest = float((x.float() - y.float()).abs().nan_to_num(float("inf")).max())
            differ.append(f"{name} ({bytes_differ} bytes, max |diff| {largest:.3g})")
    return differ


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# ------------------------------------------------------------------ the checks


@dataclasses.dataclass
class Outcome:
    check: str
    status: str  # "ok", "FAILED", "skipped"
    detail: str
    seconds: float


def describe_error(error: BaseException) -> str:
    """``Type: first line``, of the innermost cause when the compile wraps it (``BackendCompilerFailed``)."""
    inner = error
    while (deeper := getattr(inner, "inner_exception", None) or inner.__cause__) is not None:
        inner = deeper
    first = (str(inner).strip().splitlines() or [""])[0][:200]
    wrapped = f" (in {type(error).__name__})" if inner is not error else ""
    return f"{type(inner).__name__}: {first}{wrapped}"


class Checks:
    def __init__(self, shape: Shape, device: torch.device) -> None:
        self.shape, self.device = shape, device
        self.outcomes: list[Outcome] = []
        self.state: dict = {}

    def run(self, name: str, check: Callable[[], str], needs: tuple[str, ...] = ()) -> None:
        missing = [n for n in needs if n not in self.state]
        if missing:
            self.outcomes.append(Outcome(name, "FAILED", f"not run: needs {', '.join(missing)}", 0.0))
            return
        start = time.perf_counter()
        try:
            status, detail = "ok", check()
        except AssertionError as error:
            status, detail = "FAILED", str(error).splitlines()[0][:200]
        except Exception as error:  # noqa: BLE001  (reported per check; the next check runs)
            status, detail = "FAILED", describe_error(error)
        self.outcomes.append(Outcome(name, status, detail, time.perf_counter() - start))

    def skip(self, name: str, why: str) -> None:
        self.outcomes.append(Outcome(name, "skipped", why, 0.0))

    # each check: returns its detail, raises AssertionError (or anything) when it fails

    def eager(self) -> str:
        model = Decoder(self.shape, use_custom_op=True).to(self.device, DTYPE)
        caches = Caches(self.shape, self.device)
        output = run(model, caches, make_step(self.shape, self.shape.tokens, self.device), mark_dynamic=False)
        self.state["eager"] = caches, output
        return f"{self.shape.layers} layers, T={self.shape.tokens}"

    def compile_level(self, level: int) -> tuple:
        torch._dynamo.reset()
        compiled = mc.compile(Decoder(self.shape, use_custom_op=False).to(self.device, DTYPE), level=level,
                              backend="inductor")
        caches = Caches(self.shape, self.device)
        output = run(compiled, caches, make_step(self.shape, self.shape.tokens, self.device))
        return compiled, caches, output

    def o1(self) -> str:
        compiled, caches, output = self.compile_level(1)
        self.state["O1"] = compiled, caches, output
        counts = mc.match_counts(compiled)
        assert counts.get("mla_rope_kvcache_fusion", 0) == 0, f"fused at O1: {counts}"
        eager_caches, eager_output = self.state.get("eager", (None, None))
        if eager_caches is None:
            return "no fusion"
        differ = differing_layers(caches, eager_caches)
        return (f"no fusion; caches == eager in {self.shape.layers - len(differ)}/{self.shape.layers} layers, "
                f"output {'==' if same_bytes(output, eager_output) else '!='} eager")

    def o2_fuses(self) -> str:
        compiled, caches, output = self.compile_level(2)
        self.state["O2"] = compiled, caches, output
        counts, layers = mc.match_counts(compiled), self.shape.layers
        assert counts.get("mla_rope_kvcache_fusion") == layers and counts.get("defunctionalization") == layers, \
            f"match counts {counts}, expected {layers} fusions and defunctionalizations"
        graph = mc.graph_records(compiled)[-1].graph
        assert graph is not None, "no post-pass graph recorded"
        fused = [n for n in graph.nodes if n.op == "call_function" and n.target is FUSED_MLA_UPDATE]
        unfused = [n for n in graph.nodes if n.op == "call_function" and (
            n.target is UNIFIED_MLA_UPDATE or (n.target is torch.ops.higher_order.auto_functionalized
                                               and n.args[0] in (UNIFIED_MLA_UPDATE, FUSED_MLA_UPDATE)))]
        per_layer = sorted(n.kwargs["layer_name"] for n in fused)
        assert per_layer == sorted(map(layer_name, range(layers))) and not unfused, \
            f"fused nodes {per_layer}, unfused/functional updates {[n.name for n in unfused]}"
        return f"{layers} fused in-place nodes, 0 unfused; counts {counts}"

    def o2_equals_o1(self) -> str:
        _, o1_caches, o1_output = self.state["O1"]
        _, o2_caches, o2_output = self.state["O2"]
        differ = differing_layers(o2_caches, o1_caches)
        assert not differ, f"caches differ from O1 in {differ}"
        return (f"every layer's cache bitwise; output {'==' if same_bytes(o2_output, o1_output) else '!='} O1 "
                f"(not required)")

    def second_token_count(self) -> str:
        tokens = self.shape.tokens + 3
        o2, o1 = self.state["O2"][0], self.state["O1"][0]
        records, graphs = len(mc.graph_records(o2)), torch._dynamo.utils.counters["stats"]["unique_graphs"]
        o2_caches, o1_caches = Caches(self.shape, self.device), Caches(self.shape, self.device)
        run(o2, o2_caches, make_step(self.shape, tokens, self.device))
        assert len(mc.graph_records(o2)) == records, f"recompiled for T={tokens}: {len(mc.graph_records(o2))} graphs"
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs, f"dynamo compiled again for T={tokens}"
        run(o1, o1_caches, make_step(self.shape, tokens, self.device))
        differ = differing_layers(o2_caches, o1_caches)
        assert not differ, f"T={tokens}: caches differ from O1 in {differ}"
        return f"T={tokens}: same graph, caches == O1"

    def cuda_graph(self) -> str:
        compiled, expected_caches, expected_output = self.state["O2"]
        caches, step = Caches(self.shape, self.device), make_step(self.shape, self.shape.tokens, self.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), checking_values(False):  # warm up off the default stream, as capture needs
            run(compiled, caches, step)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), checking_values(False):
            output = run(compiled, caches, step)
        caches.reset()
        graph.replay()
        torch.cuda.synchronize()
        differ = differing_layers(caches, expected_caches)
        assert not differ, f"replayed caches differ from the compiled step in {differ}"
        assert same_bytes(output, expected_output), "replayed output differs from the compiled step"
        eager_caches = self.state.get("eager", (None,))[0]
        eager = "" if eager_caches is None else \
            f"; caches {'==' if not differing_layers(caches, eager_caches) else '!='} eager"
        return f"replay == compiled step (caches, output){eager}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="default: the kernels' device (CUDA when mla_fuse's kernels run on the GPU)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--small", action="store_true", default=None, help="tiny layers (the default on a CPU)")
    size.add_argument("--full", dest="small", action="store_false", help="DeepSeek sizes (the default on CUDA)")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=None, help=">= 2; the second count is this + 3")
    args = parser.parse_args(argv)
    device = torch.device(args.device) if args.device else kernels_device()
    if device.type != kernels_device().type:
        parser.error(f"--device {device.type}: mla_fuse's kernels run on {kernels_device().type} in this process "
                     "(MLA_FUSE_TRITON_BACKEND chooses)")
    shape = SMALL if (device.type == "cpu" if args.small is None else args.small) else FULL
    shape = dataclasses.replace(shape, layers=args.layers or shape.layers, tokens=args.tokens or shape.tokens)

    torch.set_grad_enabled(False)
    checks = Checks(shape, device)
    start = time.perf_counter()
    fresh_key = (torch.compiler.config.patch(cache_key_tag=f"mla_fuse-gpu-compile-check-{uuid.uuid4().hex}")
                 if hasattr(torch.compiler.config, "cache_key_tag") else contextlib.nullcontext())
    with fresh_key, torch._inductor.config.patch(emulate_precision_casts=True):
        checks.run("eager", checks.eager)
        checks.run("O1", checks.o1)
        checks.run("O2 fuses", checks.o2_fuses)
        checks.run("O2 == O1", checks.o2_equals_o1, needs=("O1", "O2"))
        checks.run("second token count", checks.second_token_count, needs=("O1", "O2"))
        if device.type == "cuda":
            checks.run("CUDA graph", checks.cuda_graph, needs=("O2",))
        else:
            checks.skip("CUDA graph", "CPU")
    print(f"mla_fuse compile check: {device}, torch {torch.__version__}, {shape.layers} layers, hidden {shape.hidden}, "
          f"{shape.heads} heads, nope {shape.nope}, rope {shape.rope}, latent {shape.latent}, T={shape.tokens}, "
          f"{time.perf_counter() - start:.0f} s")
    width = max(len(o.check) for o in checks.outcomes)
    for o in checks.outcomes:
        print(f"  {o.check:{width}}  {o.status:7}  {o.seconds:6.1f}s  {o.detail}")
    return 1 if any(o.status == "FAILED" for o in checks.outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
