"""Devices the cost model knows, by the name a mesh's `device` setting takes.

Each is (dense bf16 peak TFLOP/s, memory GB, per-device GB/s inside a node, per-device GB/s between nodes); a mesh
may override any figure (`peak_tflops`, `memory_gb`, `intra_node_gbps`, `inter_node_gbps`). Torch-free: the checker
reads it to resolve the mesh.
"""

DEVICES = {
    "cpu": (0.1, 16.0, 10.0, 1.0),
    "a100": (312.0, 80.0, 300.0, 25.0),
    "h100": (989.0, 80.0, 450.0, 50.0),
    "h200": (989.0, 141.0, 450.0, 50.0),
}
