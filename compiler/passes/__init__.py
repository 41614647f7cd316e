"""Compiler passes, one per module: `<name>_pass(traced, spec) -> traced`, listed in order in compiler/pipeline.py.

A pass takes the decisions of a policy (from the plan or the cost model) and only performs the graph surgery: it
builds new nodes copying `node.meta`, records each collective it inserts in the ledger, and ends with
`gm.graph.lint(); gm.recompile()`. Data parallelism needs no pass: DDP or FSDP2 carry it out at run time.
"""
