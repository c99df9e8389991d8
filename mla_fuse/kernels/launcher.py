"""A kernel's launches on the GPU with Triton's per-call work done once per layout.

``kernel[grid](*args, **constexprs)`` is Triton's ``JITFunction.run`` on every call: it binds the
arguments to the signature and specialises each of them (a generated binder), builds the compile
key, looks the kernel up, then launches the compiled kernel. On a decode step that host work is
most of what an eager call costs (docs/GPU.md, "What a call costs on the host"). Our kernels keep
every runtime argument out of Triton's specialisation (``do_not_specialize`` and
``do_not_specialize_on_alignment`` for all of them, every integer annotated ``tl.int64``), so the key
Triton would compute is a function of three things the launcher knows without binding anything:

* the layout: the constexpr values and compile options (``config.Constexprs.layout``, memoized per
  layout by each kernel's ``launch_config``) and the per-call ``ALIGNED`` flag;
* the pointers' element types (one ``dtype`` read per tensor argument);
* the current device (Triton keeps one kernel cache per device).

``Launcher`` keys its own table on exactly those. A key's first launch goes through
``kernel[grid](...)`` (Triton binds, compiles or finds the kernel, launches, and returns the
compiled kernel); later launches of the key launch that compiled kernel themselves, with the
arguments and constexprs in signature order: the launch Triton's ``run`` ends with, without the
binder and the key. That a key never mixes two Triton compile keys is checked on the CPU for the
``gpu`` profile's cases (``tests/test_compile_keys.py``: every launch through the table is given the
key Triton's binder computes for it).

How a compiled kernel is launched (``_launch``). Its runner, ``compiled[grid](*args, stream=)``, is
Python that builds the launch metadata for Triton's launch hooks (a ``LazyDict``) and calls the C
launcher ``compiled.run(*grid, stream, compiled.function, compiled.packed_metadata, metadata,
enter_hook, exit_hook, *args)``, which calls the hooks. While no launch hook is registered (Triton's
``knobs.runtime.launch_enter_hook`` and ``launch_exit_hook`` are ``HookChain`` objects with no calls; a
profiler such as Proton adds one) the launcher calls ``compiled.run`` itself with no metadata and no
hooks: with nothing in the hooks that is the same launch (Triton 3.6 through 3.9: the same method,
the same arguments, read in each release's source). With a hook registered, or on a Triton whose
compiled kernel or hooks differ, it calls the runner, so a hook sees every launch.

A launch is described by its layout's ``Plan`` (grid, sizes and strides, constexprs, ``ALIGNED``,
computed once per layout: ``config.planned``). A plan kept in a layout's slot is the plan of one
set of addresses, sizes, strides and dtypes (the slot's key holds them all), so once it has launched
through the table it keeps the launch itself (``Plan.again``): the device, the compiled kernel and
its launcher, the grid, and the arguments with every pointer given as its address. A later call of
that layout on the same current device launches those arguments, building nothing: no fp8 view, no
key, and Triton's C launcher takes each address as it is, where for a tensor it calls ``data_ptr()``
and the driver's ``cuPointerGetAttribute`` (Triton 3.6 through 3.9 accept an ``int`` for a pointer
argument). Another current device takes the table path (Triton's kernels are per device).

A key's first launch in a process holds a lock while Triton compiles or loads its kernel: a file
lock in Triton's cache directory (``triton.knobs.cache.dir``, ``$TRITON_CACHE_DIR``), named by the
kernel's source hash and the key without the device. Triton's file cache has no lock of its own,
so processes that meet a kernel another is still compiling compile it again: the workers of a
``pytest -n 16`` gate, the 8 ranks of a tensor-parallel engine. With the lock one process compiles
and the others wait for it, then load it from the cache; different kernels still compile in
parallel (POSIX ``fcntl.flock``; where there is none, each process compiles what it does not find).

What is not kept: Triton's check that the globals a kernel read at compile time are unchanged (our
kernels read module constants only) and its ``pre_run_hooks`` (none are registered on our kernels).
On the interpreter nothing is compiled and every launch is ``kernel[grid](...)``.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
from typing import Callable

import torch

try:
    import fcntl
except ImportError:  # not POSIX: no lock between processes (each compiles what it does not find)
    fcntl = None

from triton import knobs
from triton.runtime.driver import driver

from mla_fuse.kernels import INTERPRETED

try:
    from triton.knobs import HookChain
except ImportError:  # a Triton without launch hook chains: every launch calls the runner
    HookChain = None


def _current_device() -> int:
    """The device Triton launches on (its kernel caches are per device)."""
    _resolve()
    return current_device()


def _current_stream(device: int) -> int:
    """The stream Triton launches on: the current torch stream of ``device``."""
    _resolve()
    return current_stream(device)


def _resolve() -> None:
    """Bind ``current_device`` and ``current_stream`` to Triton's active driver's (chosen on first use)."""
    global current_device, current_stream
    current_device, current_stream = driver.active.get_current_device, driver.active.get_current_stream


#: ``() -> int``: the current device, as Triton's ``run`` reads it (Triton's own getter after the first call).
current_device: Callable[[], int] = _current_device
#: ``(device) -> int``: the current stream of a device, likewise.
current_stream: Callable[[int], int] = _current_stream


class Plan:
    """A layout's launch: ``grid``, the ``sizes`` (sizes and strides, after the tensors in the kernel's
    signature), the ``constexprs`` (a ``config.Constexprs``), ``aligned`` (the ``ALIGNED`` constexpr)
    and ``code_bits`` (the positions of the tensors the kernel stores code bits into: fp8 caches, of
    either dtype, viewed as ``torch.uint8``). ``kept``: whether it is a layout slot's plan (set by
    ``config.planned``), the plan of one set of addresses; only such a plan keeps ``again``, its launch
    after its layout's first launch on the GPU (module docstring; None before). Plans are equal when
    they launch the same (``kept`` and ``again`` aside)."""

    __slots__ = ("grid", "sizes", "constexprs", "aligned", "code_bits", "kept", "again")

    def __init__(self, grid: tuple, sizes: tuple, constexprs, aligned: bool, code_bits: tuple[int, ...] = ()):
        self.grid, self.sizes, self.constexprs, self.aligned, self.code_bits = (grid, sizes, constexprs, aligned,
                                                                                code_bits)
        self.kept = False
        self.again = None

    def _fields(self) -> tuple:
        """What a launch is made of: the fields two equal plans share."""
        return self.grid, self.sizes, self.constexprs, self.aligned, self.code_bits

    def __eq__(self, other) -> bool:
        return isinstance(other, Plan) and self._fields() == other._fields()

    __hash__ = None

    def __repr__(self) -> str:
        return f"Plan{self._fields()}"

    def arguments(self, tensors) -> tuple:
        """The kernel's runtime arguments for ``tensors`` (in signature order): the tensors, code bits
        viewed as ``torch.uint8`` (same storage and strides), then the sizes."""
        if self.code_bits:
            tensors = [t.view(torch.uint8) if i in self.code_bits else t for i, t in enumerate(tensors)]
        return (*tensors, *self.sizes)


class Launcher:
    """``launcher(plan, *tensors)`` launches ``kernel[plan.grid](*plan.arguments(tensors),
    **plan.constexprs, ALIGNED=plan.aligned)``."""

    def __init__(self, kernel):
        self.kernel = kernel
        parameters = list(inspect.signature(kernel.fn).parameters.values())
        runtime = [p for p in parameters if "constexpr" not in str(p.annotation)]
        #: positions of the pointer (tensor) arguments: the runtime ones with no type annotation
        self.pointers = tuple(i for i, p in enumerate(runtime) if p.annotation is inspect.Parameter.empty)
        #: per runtime argument up to the last pointer, whether it is a pointer (passed as its address when kept)
        self.is_pointer = tuple(i in self.pointers for i in range(max(self.pointers, default=-1) + 1))
        #: the constexprs in signature order (Triton's launcher takes them after the runtime arguments)
        self.constexpr_names = tuple(p.name for p in parameters if p not in runtime)
        if parameters[:len(runtime)] != runtime:
            raise TypeError(f"{kernel.fn.__name__}: constexprs must follow every runtime argument")
        if not INTERPRETED:
            names = {p.name for p in runtime}
            kept = names - set(kernel.do_not_specialize) | names - set(kernel.do_not_specialize_on_alignment)
            if kept:  # their values or alignment would be in Triton's key and not in ours
                raise TypeError(f"{kernel.fn.__name__}: arguments {sorted(kept)} are specialised by Triton; "
                                f"Launcher needs jit(do_not_specialize=EVERY_ARGUMENT, "
                                f"do_not_specialize_on_alignment=EVERY_ARGUMENT)")
        #: key -> (compiled kernel, constexpr values in signature order, its launcher and handles or None)
        self.compiled: dict[tuple, tuple] = {}

    def positions(self, *names: str) -> tuple[int, ...]:
        """The positions of the kernel's parameters ``names`` in its signature (a ``Plan``'s ``code_bits``)."""
        parameters = list(inspect.signature(self.kernel.fn).parameters)
        return tuple(parameters.index(name) for name in names)

    def __call__(self, plan: Plan, *tensors) -> None:
        again = plan.again
        if again is not None:
            device, compiled, direct, grid, arguments = again
            if current_device() == device:
                _launch(compiled, direct, grid, current_stream(device), arguments)
                return
        args = plan.arguments(tensors)
        grid, constexprs, aligned = plan.grid, plan.constexprs, plan.aligned
        if INTERPRETED:
            self.kernel[grid](*args, ALIGNED=aligned, **constexprs)
            return
        device = current_device()
        key = (constexprs.layout, aligned, device, *[args[i].dtype for i in self.pointers])
        found = self.compiled.get(key)
        first = found is None
        if first:  # Triton's own launch compiles or finds the kernel and launches it
            found = self._first(key, grid, args, dict(constexprs, ALIGNED=aligned))
            if found is None:
                return
        compiled, constants, direct = found
        grid = _grid3(grid)
        if not first:
            _launch(compiled, direct, grid, current_stream(device), (*args, *constants))
        if plan.kept:
            addresses = [a.data_ptr() if pointer else a for pointer, a in zip(self.is_pointer, args)]
            plan.again = (device, compiled, direct, grid, (*addresses, *args[len(self.is_pointer):], *constants))

    def _first(self, key: tuple, grid: tuple, args: tuple, constexprs: dict) -> tuple | None:
        """Triton's own launch; keeps the compiled kernel it returns for the key's later launches and
        returns what the table now holds for the key (None when Triton returned no kernel)."""
        with compiling(self.kernel, (key[:2], key[3:])):  # the key without the device
            compiled = self.kernel[grid](*args, **constexprs)
            if hasattr(compiled, "result"):  # Triton's asynchronous compile mode returns a future
                compiled = compiled.result()
        if compiled is not None:
            # the compiled kernel's launcher and the handles its runner passes it (None: none to call directly)
            direct = (getattr(compiled, "run", None), getattr(compiled, "function", None),
                      getattr(compiled, "packed_metadata", None))
            self.compiled[key] = (compiled, tuple(constexprs[name] for name in self.constexpr_names),
                                  None if HookChain is None or any(part is None for part in direct) else direct)
        return self.compiled.get(key)


def _launch(compiled, direct: tuple | None, grid: tuple, stream: int, arguments: tuple) -> None:
    """Launch ``compiled`` on ``grid`` (three dimensions): its C launcher itself (``direct``: the launcher
    and its handles) while no launch hook is registered, else its runner (module docstring)."""
    if direct is not None and _no_launch_hooks():
        run, function, metadata = direct
        run(*grid, stream, function, metadata, None, None, None, *arguments)
    else:
        compiled[grid](*arguments, stream=stream)


def _no_launch_hooks() -> bool:
    """Whether Triton's launch hooks are empty ``HookChain`` objects: a launch then calls none."""
    runtime = knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return type(enter) is HookChain and type(leave) is HookChain and not (enter.calls or leave.calls)


@contextlib.contextmanager
def compiling(kernel, key: tuple):
    """Hold the machine-wide lock of ``kernel``'s variant ``key`` (module docstring): a file in
    ``<Triton's cache directory>/mla_fuse_locks`` named by a hash of the kernel's source hash and
    ``key``; the lock goes with the file's descriptor, so a process that dies releases it. Where the
    directory cannot be written (a read-only cache Triton only loads from) nothing is locked."""
    if fcntl is None:
        yield
        return
    directory = os.path.join(knobs.cache.dir, "mla_fuse_locks")
    name = hashlib.sha256(repr((kernel.cache_key, key)).encode()).hexdigest()[:32]
    try:
        os.makedirs(directory, exist_ok=True)
        held = open(os.path.join(directory, name + ".lock"), "a")
    except OSError:  # a cache directory this process cannot write (a read-only, prebuilt cache): no lock
        yield
        return
    with held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def _grid3(grid: tuple) -> tuple:
    """A grid as the compiled kernel's launcher takes it: three dimensions."""
    return grid if len(grid) == 3 else (*grid, 1, 1)[:3]


__all__ = ["Launcher", "Plan", "compiling", "current_device", "current_stream"]
