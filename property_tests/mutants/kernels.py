"""Deliberately buggy implementations, for the verification suite's self-test: the registry.

``EagerImplementation`` (``eager.py``, its stages in ``eager_rope.py``, ``eager_fp8.py``,
``eager_cache_writes.py``) is a small, plain eager-torch implementation of the five
operations of CONTRACT §4. Each mutant switches on exactly one bug from ``docs/BUGS.md``;
``MUTANTS`` maps a name to its class, and ``mla_fuse_conformance.contract.implementation``
registers each as ``mutant:<name>``. ``mutant:none`` is the bug-free base: it must pass the
whole suite, which shows every other mutant is caught for its bug and not for a broken base.
The other ``HONEST`` variants declare and honour the other ``padded_rows`` and ``rounding``
values (vLLM- and FlashInfer-like behaviour); they must pass too.

``tests/test_mutants.py`` asserts that the properties catch every mutant within the
``ci`` profile. ``BUG_CLASSES`` (``bug_classes.py``) says which BUGS.md class each mutant
stands for; ``APPROXIMATED`` names the ones that model a kernel-only bug in eager code.

A new mutant: its name and BUGS.md class in ``bug_classes.BUG_CLASSES``, its switch
(``if self.bug == "..."``) in the stage it breaks. Nothing else.

Like every mutant module it imports the product's ``validation`` and the suite's lower layers only.
"""

from __future__ import annotations

from mla_fuse_conformance.mutants.bug_classes import APPROXIMATED, BUG_CLASSES, DECLARATIONS, HONEST
from mla_fuse_conformance.mutants.eager import EagerImplementation


def _mutant_class(bug: str) -> type:
    class_name = "Mutant_" + bug
    doc = f"Mutant '{bug}' ({BUG_CLASSES[bug][0]}): {BUG_CLASSES[bug][1]}."
    attributes = {"bug": "none" if bug in HONEST else bug, "name": f"mutant:{bug}", "__doc__": doc,
                  "__module__": __name__, **DECLARATIONS.get(bug, {})}
    return type(class_name, (EagerImplementation,), attributes)


MUTANTS: dict[str, type] = {bug: _mutant_class(bug) for bug in BUG_CLASSES}
CLASSES: dict[str, type] = {cls.__name__: cls for cls in MUTANTS.values()}


def __getattr__(name: str) -> type:
    """``Mutant_<bug>``: the class a spec ``mla_fuse_conformance.mutants.kernels:Mutant_<bug>`` names
    (``contract/implementation.py``), also for pickle and ``from ... import *``."""
    try:
        return CLASSES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


__all__ = ["APPROXIMATED", "BUG_CLASSES", "DECLARATIONS", "EagerImplementation", "HONEST", "MUTANTS",
           *(cls.__name__ for cls in MUTANTS.values())]
