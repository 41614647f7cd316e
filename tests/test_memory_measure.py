"""runtime.memory measures what a rank allocates: exact bytes on a hand-computable case, and the activations of a
generated program's forward equal what autograd saves (both counted here, independently of the tracker)."""
from __future__ import annotations

import pytest

import importlib.util
from pathlib import Path

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from compiler import codegen
from compiler.check import check_text
from compiler.pipeline import compile_spec
from runtime import memory
from runtime.layers import init_parameters

ROOT = Path(__file__).resolve().parents[1]
F32 = 4


def test_peak_of_one_linear_is_state_plus_saved_plus_transients():
    """loss = tanh(x W^T + b).sum() with W 4×8, b 4, x 16×8 (fp32), by hand:
    state 144 B (W 128 + b 16) and the input x 512 B exist before; the forward keeps tanh's output (saved by
    TanhBackward, 256 B) and the loss (4 B), the pre-activation y (256 B) lives only until tanh has run, so the
    forward's peak is 144 + 512 + 256 (y) + 256 (tanh) = 1168. In backward the loss's gradient (ones, 4 B) and
    tanh_backward's output (256 B) join the saved output before it is released: 144 + 512 + 256 + 4 + 4 + 256 = 1176,
    the step's peak. After it: the state, x, the loss and the two gradients (144 B)."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 4)
    x = torch.randn(16, 8)
    tracker = memory.Tracker()
    assert tracker.start(list(lin.parameters())) == (8 * 4 + 4) * F32 == 144
    act = tracker.region()
    with tracker:
        act.open = True
        loss = torch.tanh(lin(x)).sum()
        act.open = False
        assert tracker.peak == 144 + 512 + 256 + 256
        assert act.live == 256 + 4  # tanh's saved output and the loss
        loss.backward()
    assert tracker.peak == 144 + 512 + 256 + 4 + 4 + 256 == 1176
    assert tracker.live == 144 + 512 + 4 + 144
    del loss
    assert act.live == 0  # its storages are freed, and the region knows


def test_storages_first_seen_late_count_from_the_start_if_they_outlive_the_step():
    """A buffer that existed before the step but is first touched late (DDP's buckets, the pipeline's receive
    buffers) was there all along: counted at the earlier peak too. A temporary the tracker never saw created (a
    collective's, made on gloo's own thread) and gone by the end counts only while seen."""
    kept, temporary = torch.zeros(100), torch.zeros(50)  # 400 B and 200 B, made before the tracker starts
    tracker = memory.Tracker()
    tracker.start([])
    with tracker:
        big = torch.ones(1000)  # 4000 B, freed before either is seen
        del big
        temporary.add_(1)
        kept.add_(1)
        del temporary
    assert tracker.found == 600 and tracker.live == 400
    assert tracker.peak == 4000 + 400


def test_optimizer_state_is_counted_once_per_storage():
    """Views of one storage count once; AdamW's state is two moments per parameter plus a 4-byte step each."""
    lin = nn.Linear(8, 4)
    opt = torch.optim.AdamW(lin.parameters())
    lin(torch.randn(2, 8)).sum().backward()
    opt.step()
    w = lin.weight
    assert memory.distinct_bytes([w, w.view(-1), w[0]]) == w.nbytes == 128
    assert memory.distinct_bytes(memory.optimizer_tensors(opt)) == 2 * 144 + 2 * F32


def test_measure_records_a_step_on_cpu():
    """Measure over a whole step (forward, backward, optimizer): state at its start, the peak the tracker saw
    (at least the state and the saved activations), the activations of the forward, and the record's form."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 4)
    opt = torch.optim.AdamW(lin.parameters())
    x = torch.randn(16, 8)
    for _ in range(2):  # the second step starts with optimizer state (gradients are set to None)
        m = memory.Measure(torch.device("cpu"), track=True)
        params = list(lin.parameters())
        m.begin(params, [p.grad for p in params if p.grad is not None], memory.optimizer_tensors(opt))
        m.forward_begin()
        loss = torch.tanh(lin(x)).sum()
        m.forward_end()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        m.end()
    rec = m.record(3, {"dp": 1, "tp": 0})
    assert rec["state_bytes"] == {"params": 144, "grads": 0, "optimizer": 2 * 144 + 2 * F32}
    assert rec["activation_bytes"] == 256 + 4
    assert rec["peak_bytes"] == rec["tracked_peak_bytes"] >= 144 + 296 + 512 + 256 + 4 + 144
    assert rec["rank"] == 3 and rec["coords"] == {"dp": 1, "tp": 0, "pp": 0, "ep": 0} and rec["device"] == "cpu"


def _tiny_program(tmp_path):
    text = (ROOT / "samples/tiny_gpt.scale").read_text()
    codegen.emit(compile_spec(check_text(text, "tiny_gpt.scale")), str(tmp_path))
    spec = importlib.util.spec_from_file_location("program_tiny_gpt_memory", tmp_path / "program.py")
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    return program


def saved_by_autograd(fn, outside) -> tuple[dict, object]:
    """Run `fn()` and return ({storage: bytes} of the distinct storages autograd saved for backward, counted with
    saved_tensors_hooks, but those of the tensors `outside` (parameters, inputs); fn's result)."""
    skip = {StorageWeakRef(st) for t in outside for st in memory.storages(t)}
    saved: dict = {}

    def pack(t):
        for st in memory.storages(t):
            if StorageWeakRef(st) not in skip:
                saved[StorageWeakRef(st)] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return saved, out


def test_activations_of_a_generated_program_are_what_autograd_saves(tmp_path):
    """The tiny GPT's Model: the bytes its forward creates and still holds after it (the tracker's region) are the
    distinct storages autograd saved for backward (counted with saved_tensors_hooks, parameters and the input
    tokens left out) plus the loss itself (4 bytes, alive but not saved)."""
    program = _tiny_program(tmp_path)
    cfg = program.CONFIG
    model = program.Model()
    init_parameters(model, seed=cfg.seed, std=cfg.init.std, residual_out=cfg.init.residual_out,
                    layers=cfg.init.layers)
    torch.manual_seed(0)
    tokens = torch.randint(0, cfg.data.vocab, (2, cfg.data.seq_len))
    targets = torch.randint(0, cfg.data.vocab, (2, cfg.data.seq_len))
    tracker = memory.Tracker()
    tracker.start(list(model.parameters()))
    act = tracker.region()

    def forward():
        act.open = True
        with tracker:
            loss = model(tokens, targets)
        act.open = False
        return loss

    saved, loss = saved_by_autograd(forward, [*model.parameters(), tokens, targets])
    assert len(saved) > 20  # every block's attention, norms, MLP and the head saved something
    assert act.live == sum(saved.values()) + loss.untyped_storage().nbytes()
    assert set(act.members) == set(saved) | {StorageWeakRef(loss.untyped_storage())}
    # The program's contract carries the compiler's prediction the run prints against what it measures.
    assert cfg.memory.predicted_peak_bytes > 0 and cfg.memory.device_bytes > 0


def test_peak_of_a_training_step_equals_torch_mem_tracker(tmp_path):
    """A whole training step of the tiny GPT (forward, backward, AdamW, in its steady state): the tracker's peak is
    the peak torch's own MemTracker (torch.distributed._tools.mem_tracker) reports, byte for byte."""
    from torch.distributed._tools.mem_tracker import MemTracker
    program = _tiny_program(tmp_path)
    cfg = program.CONFIG
    model = program.Model()
    init_parameters(model, seed=cfg.seed, std=cfg.init.std, residual_out=cfg.init.residual_out,
                    layers=cfg.init.layers)
    opt = torch.optim.AdamW(model.parameters())
    torch.manual_seed(0)
    tokens = torch.randint(0, cfg.data.vocab, (2, cfg.data.seq_len))
    targets = torch.randint(0, cfg.data.vocab, (2, cfg.data.seq_len))

    def step():
        model(tokens, targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # the optimizer's state exists from here on
    theirs = MemTracker()
    theirs.track_external(model, opt, tokens, targets)
    with theirs:
        step()
    ours = memory.Tracker()
    state = ours.start([*model.parameters(), *memory.optimizer_tensors(opt), tokens, targets])
    with ours:
        step()
    assert ours.peak == theirs.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"] > state


def _fsdp_rank(rank: int, _collectives) -> None:
    """One rank of the FSDP2 comparison (tests/multirank.py starts the group; FSDP2 builds its own mesh)."""
    import torch.distributed as dist
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(128, 128), nn.Tanh()) for _ in range(3)])
    for block in model:
        fully_shard(block, mesh=init_device_mesh("cpu", (world,)))
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(8, 128)

    def step():
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    # Both watch the same step (gloo's threads make the moment a collective's buffers die vary between steps).
    theirs = FSDPMemTracker(model, opt)
    theirs.track_inputs((x,))
    ours = memory.Tracker(reread=True)
    ours.start([*model.parameters(), *memory.optimizer_tensors(opt), x])
    with theirs, ours:
        step()
    total = theirs.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    assert ours.peak == total, (ours.peak, total)
    plain = memory.Tracker()  # without re-reading sizes, the freed gathered parameters would still count
    plain.start([*model.parameters(), *memory.optimizer_tensors(opt), x])
    with plain:
        step()
    assert plain.peak > total


@pytest.mark.e2e
def test_peak_under_fsdp2_equals_torch_fsdp_mem_tracker():
    """FSDP2 over 2 ranks (gloo): FSDP frees and regathers each block's parameters by resizing storages, which
    the tracker re-reads at each operator (`reread`); its peak over a training step equals torch's
    FSDPMemTracker's on every rank."""
    from tests import multirank
    multirank.spawn(_fsdp_rank, 2, axes=())


def _collective_rank(rank: int, collectives) -> None:
    """One rank of the collectives' settle test: every forward all-gathers and drops what it gathered."""
    m = memory.Measure(torch.device("cpu"), track=True)
    m.begin([], [], [])
    for _ in range(200):
        m.forward_begin()
        x = torch.randn(16, 2, 16, 16)  # a cp rank's keys: batch, kv heads, its 16 of 32 tokens, head dim
        gathered = collectives.all_gather_fwd_reduce_scatter_bwd(x, "tp", 2)
        assert gathered.shape == (16, 2, 32, 16)
        del x, gathered
        m.forward_end()
    m.end()
    assert m.activations.peak == 0, f"a forward that keeps nothing measured {m.activations.peak:,} bytes kept"


# Slow tier until its race is understood: in the full suite on a quiet 2-core machine it measured 65,536 and 98,304
# bytes kept (the all-gather's output, and its output with its input copy) in the last two runs of 2026-11-28,
# passing alone every time: Tracker.settle does not always see gloo's work let go (docs/testing.md, "Known flaky")
@pytest.mark.slow
@pytest.mark.e2e
def test_a_forward_that_keeps_nothing_measures_nothing_kept_after_collectives():
    """gloo's worker thread lets go of an all-gather's input and output after it wakes the waiter: when the forward
    has dropped them by then, they are freed on that thread, after the forward's end when it is descheduled (4-7%
    of 200 all-gathers on a loaded 2-core machine, 98,304 bytes each here). The activations are read once the
    collectives have let go (runtime.memory.Tracker.settle), so a forward that keeps nothing measures 0 bytes kept,
    every time (cp2_recompute_full measured 558,088 bytes against 464,000 predicted in one run of two: its last
    all-gather's values, 98,304 bytes, freed late)."""
    from tests import multirank
    multirank.spawn(_collective_rank, 2, axes=("tp",))
