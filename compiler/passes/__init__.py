"""Compiler passes, one per axis and module: its policy and `<name>_pass(traced, plan) -> traced`, run in order by
compiler/lower.py; what each pass requires of a plan is in compiler/rules/, under the same name.

A pass takes the decisions of a policy (carried by the Plan) and only performs the graph surgery: it builds new
nodes copying `node.meta`, records each collective it inserts in the ledger, and ends with
`gm.graph.lint(); gm.recompile()`. Data parallelism needs no pass: DDP or FSDP2 carry it out at run time. The pass
modules import torch at the top; nothing torch-free imports them (the rules are apart for that reason).
"""
