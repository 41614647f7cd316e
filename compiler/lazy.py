"""A module imported on first use: the front door (`scalec check`, `--help`) stays free of torch.

`M = lazy("compiler.model")` at the top of a module that only needs the model's builder inside functions keeps
`import` of that module cheap; the first `M.something` imports compiler.model (and torch) for real.
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import sys


class lazy:  # noqa: N801 - reads like the import it stands for
    def __init__(self, name: str):
        self.__dict__["_name"] = name

    def __getattr__(self, attr: str):
        module = importlib.import_module(self.__dict__["_name"])
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.__dict__['_name']}>"


@contextlib.contextmanager
def imports_frozen():
    """Heavy imports (torch, sympy, lark: millions of objects that live as long as the process) made without the
    cyclic collector, and what they leave moved out of its reach (`gc.freeze`): collected under the default
    thresholds they made the collector walk the whole heap again and again, and a search's collections walked them
    after (0.2 s of the 175B search's 5.2 s of CPU, measured here with the search's own thresholds). The collector is
    back as it was after; objects made later are collected as before. A process that holds torch already (the
    tests, a notebook) has made these imports: nothing is frozen there, where what it froze would be kept for
    good."""
    if "torch" in sys.modules:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
