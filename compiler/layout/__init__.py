"""The Layout: how a plan sits on the machines, computed once per plan and cluster, torch-free (docs: DESIGN.md)."""
