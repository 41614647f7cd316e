"""Everything scalec prints, apart from the decisions it prints about (issue 23, "split by job").

    units.py     the one formatter each of counts, bytes, FLOPs and seconds that every report uses
    plan.py      `scalec plan` (text, --json, --svg): parameters, FLOPs, step time, memory, MoE, pipeline, ledger
    html.py      `plan --html` and `search --html`: one self-contained page drawn from `--json`'s figures
                 (page.html.j2 lays it out)
    commands.py  the short outputs of the other commands: check's verdict, warnings, graphs, search's glue
    scale.py     a Plan as .scale text: its mesh and plan sections from its fields (`scalec search -o`)

The package imports no torch and nothing of the compiler on import (plan.py reads the cost model, the step-time
model and the schedule on first use; scale.py reads the torch-free AST), so that the command line and `scalec check`
stay light, and so that the cost model and the search can format with `units` without an import cycle.
"""
