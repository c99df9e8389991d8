"""``mla_fuse.kernels.launcher.Launcher`` refuses a kernel whose Triton compile key its own key could miss.

The launcher keys its table of compiled kernels on the layout, ``ALIGNED``, the device and the
pointers' dtypes; that stands for Triton's compile key only when no runtime argument is specialised
by Triton (its value, its alignment) and every constexpr follows the runtime arguments (they are
passed to the compiled kernel's launcher by position). A kernel built otherwise is refused when the
launcher is made, by name. That the key is right for our own kernels on the ``gpu`` profile's cases is
``tests/test_compile_keys.py``'s. GPU kernels are built in a subprocess (``TRITON_INTERPRET=0``, as
``test_aot_compile.py``): nothing compiles or runs.
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
