"""Third-party warnings the suite filters while it is in use, as pytest ``filterwarnings`` lines.

Each names the warning by its message, category and the module that issues it, so the same
message from another module (the user's own code) still shows. The plugin adds them when the
suite is in use (``plugin.start_suite``); this repository's ``pyproject.toml`` lists them for its
own tests. Only deprecations of code that is not ours belong here: a warning our code causes is
fixed where it comes from.
"""

from __future__ import annotations

FILTERWARNINGS = (
    # torch/utils/mkldnn.py decorates its modules' methods with torch.jit.script_method at import
    # (14 warnings per process); torch._inductor imports it (fx_passes.pre_grad ->
    # torch.fx.experimental.optimization), and so does mla_fuse.compile, which imports Inductor.
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning:torch.jit._script",
)
