"""The Layout: how a plan sits on the machines, computed once per plan and read by cost, codegen, search and the
runtime's contract. Torch-free.

    state.py    one row per kind of model state × parameter class: dtype, shard group, location, when alive
"""
