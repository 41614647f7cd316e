"""The Layout: how a plan sits on the machines (docs/internals.md), computed once per plan and cluster and read by
the cost model, codegen, the search and the runtime's contract.

    groups.py      every process group the program uses, by name: its axes and ranks (a stride pattern, expanded
                   on demand), from the mesh's axes alone; read by the cost model (cost/links.py, the ZeRO group),
                   the Plan's batch counts and codegen, which writes them into the runtime contract.
    cluster.py     the machines (Spec.cluster): nodes, devices per node, the device's figures, the link tiers and
                   which tier each group crosses.
    devices.py     every device kind's figures, with their sources; the checker resolves a mesh's device here.
    state.py       one row per kind of model state × parameter class: dtype, shard group, location, when alive
                   (cost/rank_memory.py's peak per rank).
    placements.py  each parameter's placement per group (Replicate, Shard(dim), Partial), behind plan.json and
                   reshard.
    topology.py    the network's shape: which level two ranks' traffic crosses (fat-tree, rails, torus,
                   dragonfly, a Slurm switch tree, a scale-up domain over nodes), the share there, impossible shapes.
    placement.py   the `.scale` placement: which rank each mesh coordinate gets (order, auto), the groups' rank
                   lists under it and the bytes each level carries; partition.py, the minimum cuts auto uses.

Torch-free: the front end and the search read it, and it imports nothing of compiler.cost.
"""
