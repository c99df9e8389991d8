"""The launch path of ``mla_fuse.kernels``: ``launcher.Launcher``'s refusals, its table's writes on a GPU,
the launch plans kept per known layout (``config.planned``) and the launches kept in them
(``launcher.Plan.again``), and the compile lock processes share (``launcher.compiling``).

``Launcher`` refuses a kernel whose Triton compile key its own key could miss.

The launcher keys its table of compiled kernels on the layout, ``ALIGNED``, the device and the
pointers' dtypes; that stands for Triton's compile key only when no runtime argument is specialised
by Triton (its value, its alignment) and every constexpr follows the runtime arguments (they are
passed to the compiled kernel's launcher by position). A kernel built otherwise is refused when the
launcher is made, by name. That the key is right for our own kernels on the ``gpu`` profile's cases is
``tests/test_compile_keys.py``'s. GPU kernels are built in a subprocess (``TRITON_INTERPRET=0``, as
``test_aot_compile.py``): nothing compiles or runs. On a GPU (``ci/gpu.sh``'s ``test`` step) a launch
through the table and a kept launch write the bytes Triton's own launch writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent('''
    import triton.language as tl

    from mla_fuse.kernels import EVERY_ARGUMENT, jit
    from mla_fuse.kernels.launcher import Launcher


    def refused(kernel):
        try:
            Launcher(kernel)
        except TypeError as error:
            return str(error)
        return None


    @jit(do_not_specialize=EVERY_ARGUMENT, do_not_specialize_on_alignment=EVERY_ARGUMENT)
    def keyed(x_ptr, n: tl.int64, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
        pass


    @jit(do_not_specialize=["n"], do_not_specialize_on_alignment=EVERY_ARGUMENT)
    def value_specialised(x_ptr, n: tl.int64, stride: tl.int64, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
        pass


    @jit(do_not_specialize=EVERY_ARGUMENT)
    def alignment_specialised(x_ptr, n: tl.int64, BLOCK: tl.constexpr, ALIGNED: tl.constexpr):
        pass


    @jit(do_not_specialize=EVERY_ARGUMENT, do_not_specialize_on_alignment=EVERY_ARGUMENT)
    def constexpr_first(BLOCK: tl.constexpr, x_ptr, n: tl.int64, ALIGNED: tl.constexpr):
        pass


    launcher = Launcher(keyed)
    print("pointers", launcher.pointers, "constexprs", launcher.constexpr_names)
    for kernel in (value_specialised, alignment_specialised, constexpr_first):
        print(kernel.fn.__name__, "->", refused(kernel))
''')


def test_a_kernel_triton_would_specialise_is_refused_by_name(tmp_path):
    script = tmp_path / "kernels.py"  # Triton reads a @jit function's source from its file
    script.write_text(SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("MLA_FUSE_TRITON_BACKEND", None)
    process = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300,
                             cwd=ROOT)
    assert process.returncode == 0, process.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in process.stdout.splitlines())
    assert lines["pointers"] == "(0,) constexprs ('BLOCK', 'ALIGNED')", process.stdout
    assert lines["value_specialised"] == ("-> value_specialised: arguments ['stride', 'x_ptr'] are specialised by "
                                          "Triton; Launcher needs jit(do_not_specialize=EVERY_ARGUMENT, "
                                          "do_not_specialize_on_alignment=EVERY_ARGUMENT)"), process.stdout
    assert lines["alignment_specialised"].startswith("-> alignment_specialised: arguments ['n', 'x_ptr'] are "
                                                     "specialised"), process.stdout
    assert lines["constexpr_first"] == "-> constexpr_first: constexprs must follow every runtime argument", \
        process.stdout


def _fused_mla_arguments(tokens=3, heads=2, nope=4, latent=16, rotary=8, is_neox=False, packed=True):
    """A small fused MLA call on the kernels' device (the interpreter runs it in milliseconds): q_pe a
    slice of q, or its own tensor."""
    import torch

    from mla_fuse import kernels

    device = "cuda" if kernels.BACKEND == "gpu" else "cpu"
    q = torch.randn(tokens, heads, nope + rotary, device=device).bfloat16()
    kv = torch.randn(tokens, latent + rotary, device=device).bfloat16()
    return [torch.arange(tokens, device=device), q[..., nope:] if packed else q[..., nope:].contiguous(),
            kv[:, latent:], kv[:, :latent], torch.randn(64, rotary, device=device), is_neox,
            torch.arange(tokens, device=device),
            torch.zeros(4, 4, latent + rotary, dtype=torch.bfloat16, device=device), "auto",
            torch.ones(1, device=device)]


def test_a_launch_through_the_table_writes_what_tritons_own_launch_writes():
    """On a GPU (``ci/gpu.sh``'s ``test`` step): the same call on copies of the same inputs, the first
    launch Triton's ``kernel[grid](...)``, the second through the launcher's table, and a third on the
    second's buffers (their inputs restored in place) through the plan's kept launch, write the same
    bytes. Under the interpreter there is no table and each is Triton's launch."""
    import torch

    from mla_fuse import kernels, ops, validation
    from mla_fuse.kernels import mla_rope_cache

    mla_rope_cache.launcher.compiled.clear()
    arguments = _fused_mla_arguments(tokens=5, heads=3)
    written = []
    for _ in range(2):
        copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in arguments]
        ops.concat_and_cache_mla_rope_fused(*copies)
        written.append([copies[1].clone(), copies[2].clone(), copies[7].clone()])  # q_pe, k_pe, kv_cache
    plan = validation.check_concat_and_cache_mla_rope_fused(*copies)[0]  # the known layout's plan
    assert (plan.again is None) == kernels.INTERPRETED
    for copy, argument in zip(copies, arguments):
        if isinstance(argument, torch.Tensor):
            copy.copy_(argument)
    ops.concat_and_cache_mla_rope_fused(*copies)
    written.append([copies[1], copies[2], copies[7]])
    assert len(mla_rope_cache.launcher.compiled) == (0 if kernels.INTERPRETED else 1)
    for first, *later in zip(*written):
        for other in later:
            assert torch.equal(first.view(torch.int16), other.view(torch.int16))


def test_a_known_layout_reuses_its_launch_plan_and_every_plan_is_its_layouts(monkeypatch):
    """A call on buffers the checks have seen takes its launch plan (grid, sizes, strides, constexprs,
    ``ALIGNED``) from the layout's slot; every plan used equals the one its own arguments give, so a
    slot is never another layout's (the same tensors with another ``is_neox``, the same shapes at
    other strides); ``forget_layouts`` drops the plans with the layouts."""
    from mla_fuse import layouts, ops
    from mla_fuse.kernels import config

    used = []
    planned = config.planned

    def checking(slot, plan, *args):
        kept = slot is not None and slot[0] is not None
        found = planned(slot, plan, *args)
        used.append((kept, found == plan(*args)))
        return found

    monkeypatch.setattr(config, "planned", checking)
    layouts.forget_layouts()
    call = ops.concat_and_cache_mla_rope_fused
    first, other_strides = _fused_mla_arguments(), _fused_mla_arguments(packed=False)
    neox = first[:5] + [True] + first[6:]
    for arguments in (first, first, neox, first, other_strides, neox, other_strides):
        call(*arguments)
    layouts.forget_layouts()
    call(*first)
    assert [kept for kept, _ in used] == [False, True, False, True, False, True, True, False], used
    assert all(same for _, same in used), used


# GPU kernels on the CPU: Triton's run recorded (its compiled kernel a stand-in), launches never run
STAND_INS = textwrap.dedent('''
    import json

    import torch
    from triton.runtime.jit import JITFunction

    from mla_fuse import ops, validation
    from mla_fuse.kernels import launcher, mla_rope_cache

    launches = []  # (path, grid, arguments as the C launcher reads them, stream)


    def read(value):
        return value.data_ptr() if isinstance(value, torch.Tensor) else value


    class Compiled:  # what JITFunction.run returns here in place of a CompiledKernel
        function, packed_metadata = 0xF00, ("packed", "metadata")

        def __getitem__(self, grid):  # its runner
            return lambda *args, stream=None: launches.append(
                ("kept runner" if all(not isinstance(a, torch.Tensor) for a in args) else "table runner",
                 list(grid), [read(a) for a in args[:8]], stream))

        def run(self, grid_x, grid_y, grid_z, stream, function, packed_metadata, launch_metadata, enter, leave,
                *args):  # its C launcher, which the runner calls with the launch hooks and their metadata
            handles = (function, packed_metadata, launch_metadata, enter, leave)
            path = "kept" if all(not isinstance(a, torch.Tensor) for a in args) else "table"
            launches.append((path if handles == (self.function, self.packed_metadata, None, None, None)
                             else f"{path} with {handles}", [grid_x, grid_y, grid_z], [read(a) for a in args[:8]],
                             stream))


    def run(self, *args, grid, warmup, **kwargs):
        launches.append(("triton", [*grid, 1, 1][:3], [read(a) for a in args[:8]], None))
        compile_or_load()
        return Compiled()


    def compile_or_load():  # what Triton does with its caches: nothing here (a script may replace it)
        pass


    JITFunction.run = run
    validation.require_kernel_device = lambda *args: None  # CPU tensors: launches are recorded, never run
    device = [0]
    launcher.current_device = lambda: device[0]
    launcher.current_stream = lambda index: 100 + index

    def arguments():
        q = torch.empty(3, 2, 4 + 8, dtype=torch.bfloat16)
        kv = torch.empty(3, 16 + 8, dtype=torch.bfloat16)
        return [torch.arange(3), q[..., 4:], kv[:, 16:], kv[:, :16], torch.empty(64, 8), False, torch.arange(3),
                torch.empty(4, 4, 24, dtype=torch.uint8), "fp8", torch.ones(1)]
''')

KEPT_SCRIPT = STAND_INS + textwrap.dedent('''
    first, other = arguments(), arguments()  # one layout at two sets of addresses
    steps = [("first", first), ("first", first), ("other", other), ("first", first), ("other", other)]
    for name, call in steps:
        ops.concat_and_cache_mla_rope_fused(*call)
    device[0] = 1  # another current device: the table's path, on that device's stream
    ops.concat_and_cache_mla_rope_fused(*first)
    ops.concat_and_cache_mla_rope_fused(*first, check_values=True)  # no slot: nothing kept, table path
    device[0] = 0
    ops.concat_and_cache_mla_rope_fused(*first)  # the kept launch is device 1's: the table's path, kept anew
    ops.concat_and_cache_mla_rope_fused(*first)
    addresses = {name: [read(a) for a in (call[0], call[1], call[2], call[3], call[4], call[6], call[7], call[9])]
                 for name, call in (("first", first), ("other", other))}
    print(json.dumps(dict(launches=launches, addresses=addresses,
                          names=[name for name, _ in steps] + ["first"] * 4)))
''')


def test_a_known_layout_launches_again_with_its_own_addresses(tmp_path):
    """On the GPU backend (``TRITON_INTERPRET=0``; Triton's ``run`` recorded, the compiled kernel a
    stand-in): a layout's first call is Triton's launch; a later call on the same buffers takes the
    plan's kept launch, every pointer passed as the address of that call's own tensor (an fp8 cache's
    too, as its code bits), on the current stream; the same layout at other addresses is another
    layout with its own plan; another current device takes the table's path (and the plan keeps that
    device's launch); a value-checked call (its plan in no slot) takes the table's path. Planted and
    seen failing: the kept launch blind to the device; a validation key without the addresses (the
    other buffers would launch with the first ones' addresses)."""
    import json

    process = _started(tmp_path, "kept.py", KEPT_SCRIPT)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])
    launches, addresses = result["launches"], result["addresses"]
    assert [path for path, *_ in launches] == ["triton", "kept", "table", "kept", "kept", "triton", "table", "table",
                                               "kept"], launches
    for (path, grid, arguments, stream), name, device in zip(launches, result["names"],
                                                             (0, 0, 0, 0, 0, 1, 1, 0, 0)):
        assert arguments == addresses[name], (path, name, arguments, addresses)
        assert stream in ((None,) if path == "triton" else (100 + device,)), (path, stream)
        assert grid == launches[0][1]
    assert addresses["first"] != addresses["other"]


HOOKED_SCRIPT = STAND_INS + textwrap.dedent('''
    from triton import knobs

    call = arguments()
    ops.concat_and_cache_mla_rope_fused(*call)  # Triton's launch
    ops.concat_and_cache_mla_rope_fused(*call)  # kept: the compiled kernel's launcher, no hooks
    ops.concat_and_cache_mla_rope_fused(*call, check_values=True)  # no slot: the table's, its launcher too
    hook = lambda metadata: None
    knobs.runtime.launch_enter_hook.add(hook)  # a profiler's hook (Proton adds its own so)
    ops.concat_and_cache_mla_rope_fused(*call)
    ops.concat_and_cache_mla_rope_fused(*call, check_values=True)  # the table's: its runner, which calls the hook
    knobs.runtime.launch_enter_hook.remove(hook)
    knobs.runtime.launch_exit_hook.add(hook)
    ops.concat_and_cache_mla_rope_fused(*call)
    knobs.runtime.launch_exit_hook.remove(hook)
    ops.concat_and_cache_mla_rope_fused(*call)
    chain = knobs.runtime.launch_enter_hook
    knobs.runtime.launch_enter_hook = hook  # a hook set in place of the chain
    ops.concat_and_cache_mla_rope_fused(*call)
    knobs.runtime.launch_enter_hook = chain
    ops.concat_and_cache_mla_rope_fused(*call)
    print(json.dumps([path for path, *_ in launches]))
''')


def test_a_launch_calls_the_runner_while_a_launch_hook_is_registered(tmp_path):
    """A kept launch and a launch through the table call the compiled kernel's C launcher itself, with
    no launch metadata and no hooks, only while Triton's launch hooks are empty ``HookChain`` objects;
    with a hook added to either chain, or a hook set in its place, they call the compiled kernel's
    runner, which builds the metadata and passes the hooks (a profiler sees every launch). Planted and
    seen failing: the hooks not looked at (every launch the launcher's)."""
    import json

    process = _started(tmp_path, "hooked.py", HOOKED_SCRIPT)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
    assert json.loads(out.splitlines()[-1]) == ["triton", "kept", "table", "kept runner", "table runner",
                                                "kept runner", "kept", "kept runner", "kept"]


def _started(tmp_path, name: str, text: str, *args: str) -> subprocess.Popen:
    """``text`` as a script in ``tmp_path``, started on the GPU backend (``TRITON_INTERPRET=0``) with
    Triton's cache directory in ``tmp_path``."""
    script = tmp_path / name  # Triton reads a @jit function's source from its file
    script.write_text(text)
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "triton-cache"),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("MLA_FUSE_TRITON_BACKEND", None)
    return subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)


LOCK_SCRIPT = STAND_INS + textwrap.dedent('''
    import os
    import sys
    import time

    from triton import knobs

    os.makedirs(knobs.cache.dir, exist_ok=True)
    made = os.path.join(knobs.cache.dir, "stand-in-kernel")  # Triton's file cache, for one kernel


    def compile_or_load():  # as Triton's run: load a kernel the cache holds, else compile it (1 s) and keep it
        if os.path.exists(made):
            print("loaded")
            return
        time.sleep(1.0)
        open(made, "w").close()
        print("compiled")


    while not os.path.exists(sys.argv[1]):  # both processes launch at once
        time.sleep(0.01)
    ops.concat_and_cache_mla_rope_fused(*arguments())
''')


def test_processes_meeting_a_new_kernel_compile_it_once(tmp_path):
    """Two processes (two pytest workers, two ranks of an engine) launch the same new kernel at the same
    moment, on the GPU backend with Triton's ``run`` a stand-in that compiles (1 s) what its file cache
    lacks: one compiles, the other waits for it and loads (``launcher.compiling``). Planted and seen
    failing: no lock (both compile)."""
    go = tmp_path / "go"
    processes = [_started(tmp_path, "lock.py", LOCK_SCRIPT, str(go)) for _ in range(2)]
    go.touch()
    results = [process.communicate(timeout=300) for process in processes]
    assert all(process.returncode == 0 for process in processes), [err[-2000:] for _, err in results]
    assert sorted(out.split()[-1] for out, _ in results) == ["compiled", "loaded"], results
    assert len(os.listdir(tmp_path / "triton-cache" / "mla_fuse_locks")) == 1


def test_a_cache_directory_that_cannot_be_written_takes_no_lock(tmp_path, monkeypatch):
    """A prebuilt, read-only Triton cache (Triton loads from it): the compile lock cannot be made there,
    and the launch goes on without it instead of failing."""
    from mla_fuse.kernels import launcher

    class Kernel:
        cache_key = "source-hash"

    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")  # a file where the lock directory would go: makedirs raises an OSError
    monkeypatch.setenv("TRITON_CACHE_DIR", str(blocked))
    ran = []
    with launcher.compiling(Kernel(), ("layout",)):
        ran.append(True)
    assert ran == [True]
    with launcher.compiling(Kernel(), ("layout",)):  # and again: nothing was left held
        ran.append(True)
    assert ran == [True, True]
