"""`scalec search`: the fastest plans for a file's model on its cluster, by predicted step time, with reasons.

One module per job:

    space.py   what is fixed and what is free; the candidates: mesh shapes, families, variants; `--fix`
    result.py  what a run returns (Winner, Counts, Result), below prune and report
    prune.py   the pruned best-first run (`search`, `Search`) and its eight pruning rules, each with why it is safe
               or what it may miss (its docstring)
    report.py  the reasons under each winner, the rejected-families lines, `text`, `to_json` and `scale_text`
               (the winner as a .scale file, printed by compiler/report/scale.py)
    written.py the file's own plan beside the ranking: costed as `plan` costs it, and what separates it from the best

`from compiler import search as SE` gives every name the command line, the tests and bench/ use.
"""
from __future__ import annotations

from compiler.search.prune import Search, search
from compiler.search.report import scale_text, text, to_json
from compiler.search.result import Counts, Result, Winner
from compiler.search.space import (DP_MODES, FIX_KEYS, GRAD_SYNCS, ORDER, RECOMPUTE, SCHEDULES, FixError, Space,
                                   parse_fixes)

__all__ = ["Counts", "DP_MODES", "FIX_KEYS", "FixError", "GRAD_SYNCS", "ORDER", "RECOMPUTE", "Result", "SCHEDULES",
           "Search", "Space", "Winner", "parse_fixes", "scale_text", "search", "text", "to_json"]
