"""A module imported on first use: the front door (`scalec check`, `--help`) stays free of torch.

`M = lazy("compiler.model")` at the top of a module that only needs the model's builder inside functions keeps
`import` of that module cheap; the first `M.something` imports compiler.model (and torch) for real.
"""
from __future__ import annotations

import importlib


class lazy:  # noqa: N801 - reads like the import it stands for
    def __init__(self, name: str):
        self.__dict__["_name"] = name

    def __getattr__(self, attr: str):
        module = importlib.import_module(self.__dict__["_name"])
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.__dict__['_name']}>"
