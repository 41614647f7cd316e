"""dualpipev through runtime.pipeline.Pipeline on two gloo ranks: stages placed in a V (0 and 3 on rank 0, 1 and 2 on
rank 1, handed over locally at the V's bottom), the loss and gradients those of one process running the four stages
in order; and runtime.overlap.Overlap, the function CUDA runs each overlapped pair with, run here without streams
(`side=None`), giving the very numbers torch's own in-order path gives."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each rank builds the pipeline twice (torch's path, then Overlap registered for OVERLAP_F_B), one step each from the
# same weights; rank 0 and rank 1 print their largest differences from a single-process reference of the 4 stages.
_SCRIPT = r'''
import sys, types
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining.schedules import OVERLAP_F_B
from runtime import pipeline as RP
from runtime.overlap import Overlap
rank, store_path = int(sys.argv[1]), sys.argv[2]
m = 4
dist.init_process_group("gloo", rank=rank, world_size=2, store=dist.FileStore(store_path, 2))
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("pp",))
class Stage(torch.nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s = s
        self.lin = torch.nn.Linear(16, 64 if s == 3 else 16)
    def forward(self, x):
        y = self.lin(x)
        return y if self.s == 3 else x + torch.tanh(y)
def prepare(mod):
    mod = mod.to_empty(device="cpu")
    torch.manual_seed(mod.s)
    mod.lin.reset_parameters()
    return mod
loss_fn = lambda logits, t: torch.nn.functional.cross_entropy(logits, t)
ctx = types.SimpleNamespace(axis_size=lambda a: 2, coords={"pp": rank}, device=torch.device("cpu"), mesh=mesh,
                            rank=rank)
par = types.SimpleNamespace(virtual_stages=2, micro_batches=m, schedule="dualpipev", tied_embedding=False)
torch.manual_seed(1)
x, t = torch.randn(2 * m, 16), torch.randint(0, 64, (2 * m,))
ref = [prepare(Stage(s)) for s in range(4)]
losses = []
for xs, ts in zip(x.chunk(m), t.chunk(m)):
    h = xs
    for mod in ref:
        h = mod(h)
    losses.append(loss_fn(h, ts))
want = torch.stack(losses).mean()
want.backward()
out = []
for overlap in (False, True):
    pipe = RP.Pipeline(Stage, types.SimpleNamespace(parallel=par), ctx, loss_fn, prepare)
    assert pipe.ids == [rank, 3 - rank] and pipe.stages[0].stage_index_to_group_rank == {0: 0, 1: 1, 2: 1, 3: 0}
    if overlap:
        pipe.schedule.register_custom_function(OVERLAP_F_B, Overlap())
    loss = pipe.step(x, t)
    grad = max(float((mod.lin.weight.grad - ref[s].lin.weight.grad).abs().max())
               for mod, s in zip(pipe.modules, pipe.ids))
    out += [float((loss - want).abs()), grad]
print("diffs", *out)
dist.destroy_process_group()
sys.stdout.flush()
import os; os._exit(0)
'''


def test_dualpipev_on_two_ranks_equals_one_process(tmp_path):
    store = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _SCRIPT, str(r), str(store)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    for stdout, _ in outs:
        diffs = [float(v) for v in stdout.split()[1:]]
        assert len(diffs) == 4 and max(diffs) < 1e-6, diffs
