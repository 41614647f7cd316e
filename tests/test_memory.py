"""The memory model against what the program does: the bytes a forward keeps for backward, counted on CPU with
torch.autograd.graph.saved_tensors_hooks in the generated program itself, equal the formulas of
compiler/cost/activations.py; the predicted peaks of the H100 programs in ../shared/reference/gpu-measured.json;
ZeRO's Table 1."""
from __future__ import annotations

import contextlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from compiler.check import check_text
from compiler import codegen
from compiler.pipeline import compile_spec

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "reference"  # a copy of ../shared/reference: CI's fresh clone has no ../shared


def _program(tmp_path: Path, text: str, name: str = "m.scale"):
    compiled = compile_spec(check_text(text, name))
    out = tmp_path / "build"
    codegen.emit(compiled, str(out))
    spec = importlib.util.spec_from_file_location(f"prog_{abs(hash(str(out)))}", out / "program.py")
    prog = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prog)
    return compiled, prog


def count_saved(module: torch.nn.Module, run, precision: str) -> int:
    """Bytes of the distinct storages autograd keeps during `run()` (a forward), parameters excluded: what the
    program holds for backward. bf16: the module's weights made bf16 first, as the runtime does (runtime.precision)."""
    if precision == "bf16":
        from runtime.precision import to_compute
        to_compute([module])
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen.setdefault(st.data_ptr(), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def _precision(text: str, precision: str) -> str:
    import re
    text = re.sub(r"\n\s*precision\s*=\s*\w+", "", text)
    return text.replace("train {", f"train {{\n  precision = {precision}", 1)


GQA = (("attention(hidden, heads)", "attention(hidden, heads, kv_heads = 2, bias = false)"),
       ("layernorm(hidden)", "rmsnorm(hidden)"), ("act = gelu", "act = swiglu"), ("tied = true", "tied = false"))
GEMMA = (("embedding(vocab, hidden)", "embedding(vocab, hidden, scaled = true)"), ("positional(seq, hidden)", ""),
         ("residual { layernorm(hidden)  mlp(hidden, ffn, act = gelu) }",
          "residual { rmsnorm(hidden, zero_centered = true)  mlp(hidden, ffn, act = geglu, bias = false)\n"
          "rmsnorm(hidden, zero_centered = true) }"),
         ("layernorm(hidden)\n  lm_head(vocab, hidden, tied = true)",
          "rmsnorm(hidden, zero_centered = true)\n  lm_head(vocab, hidden, tied = true, softcap = 30)"))
_MLA = ("mla(hidden, heads, {}kv_lora_rank = 16, qk_nope_head_dim = 8, qk_rope_head_dim = 8, v_head_dim = 12{})")
WHOLE = {
    # DeepSeek's latent attention on CPU (value width 12 ≠ query width 16: the math path, fp32 whatever the compute
    # dtype): the rotation's half-width cosines and sines, q and kᵀ scaled, the probabilities, v; the kv latent kept
    # whole by its norm (a piece of kv_a's output)
    "mla_v3": ("tiny_gpt.scale", (("positional(seq, hidden)", ""),
                                  (GQA[0][0], _MLA.format("q_lora_rank = 32, ", ""))) + GQA[1:]),
    "mla_v2_lite_halves": ("tiny_gpt.scale", (("positional(seq, hidden)", ""),
                                              (GQA[0][0], _MLA.format("", ", rope_interleave = false"))) + GQA[1:]),
    "gpt": ("tiny_gpt.scale", ()),
    "gqa_rmsnorm_swiglu_untied": ("tiny_gpt.scale", GQA),
    "rope_llama3_qkv_bias": ("tiny_gpt.scale", ((GQA[0][0], "attention(hidden, heads, kv_heads = 2, bias = false, "
                                                "qkv_bias = true, rope_theta = 500000, rope_scaling = llama3)"),)
                             + GQA[1:]),
    "head_dim_qk_norm_rope": ("tiny_gpt.scale", ((GQA[0][0], "attention(hidden, heads, kv_heads = 2, bias = false, "
                                                 "head_dim = 24, qk_norm = rmsnorm, rope_theta = 10000)"),)
                              + GQA[1:]),
    "moe_top2_swiglu_dropped_identity": ("moe_gpt.scale", (("axis ep = 2", "axis ep = 1"),
                                                           ("devices_per_node = 2", "devices_per_node = 1"),
                                                           ("dropped = residual", "dropped = identity"))),
    # a sigmoid-gated shared expert (its linears, SwiGLU and the sigmoid's output) and gates not renormalised
    "moe_shared_expert_sigmoid_unrenormalised": ("moe_gpt.scale", (
        ("axis ep = 2", "axis ep = 1"), ("devices_per_node = 2", "devices_per_node = 1"),
        ("dropped = residual)", "dropped = residual, renormalize = false, shared_ffn = ffn / 2,\n"
                                "shared_gate = sigmoid)"))),
    # DeepSeek-V3's router: sigmoid scores, group-limited choice (8 experts in 4 groups, the best 2), gates scaled
    "moe_sigmoid_grouped_scaled": ("moe_gpt.scale", (
        ("axis ep = 2", "axis ep = 1"), ("devices_per_node = 2", "devices_per_node = 1"),
        ("dropped = residual)", "dropped = residual, scoring = sigmoid, groups = 4,\n"
                                "topk_groups = 2, routed_scale = 2.5)"))),
    # Gemma 2/3's pieces: scaled embeddings, zero-centred norms before and after each sub-layer (composite: fp32
    # copies), soft-capped scores written out on CPU (GQA's repeated keys and values, the capped scores, the fp32
    # probabilities), a window, q/k norms, GeGLU and capped logits
    "gemma_softcap_gqa_window_geglu": ("tiny_gpt.scale", GEMMA + (
        ("residual { layernorm(hidden)  attention(hidden, heads) }",
         "residual { rmsnorm(hidden, zero_centered = true)\n"
         "attention(hidden, heads, kv_heads = 2, bias = false, rope_theta = 10000, window = 16, softcap = 50,\n"
         "query_scale = 8, qk_norm = zero_centered_rmsnorm)  rmsnorm(hidden, zero_centered = true) }"),)),
    "gemma_softcap_mha": ("tiny_gpt.scale", GEMMA + (
        ("residual { layernorm(hidden)  attention(hidden, heads) }",
         "residual { rmsnorm(hidden, zero_centered = true)  attention(hidden, heads, bias = false, softcap = 50)\n"
         "rmsnorm(hidden, zero_centered = true) }"),)),
}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("case", sorted(WHOLE))
def test_whole_model_keeps_what_the_formula_says(tmp_path, case, precision):
    """One forward of the generated Model (what every dp rank runs, ddp or fsdp, at its micro-batch size) keeps
    exactly the bytes the node-by-node formula gives: every saved tensor in its dtype (bf16: runtime.precision's bf16
    weights, no casts), the log-sum-exp of attention and no s×s scores."""
    sample, edits = WHOLE[case]
    text = (ROOT / "samples" / sample).read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    compiled, prog = _program(tmp_path, _precision(text, precision))
    torch.manual_seed(0)
    model = prog.Model()
    b, cfg = compiled.plan.micro_batch_size, prog.CONFIG
    tokens, targets = (torch.randint(0, cfg.data.vocab, (b, cfg.data.seq_len)) for _ in range(2))
    got = count_saved(model, lambda: model(tokens, targets), precision)
    want = compiled.costs.memory[0].activations
    # the loss's total weight (a 4-byte scalar) is not modelled
    assert got == pytest.approx(want, rel=1e-3, abs=8), (got, want)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_each_pipeline_stage_keeps_what_the_formula_says(tmp_path, precision, schedule):
    """Each pipeline stage's forward of one micro-batch (the first with the embedding, the last with the head and
    the loss) keeps what the formula of that stage gives; the schedule multiplies it by the micro-batches in
    flight (tests/test_cost.py)."""
    text = (ROOT / "samples" / "gpt_pp.scale").read_text()
    if schedule == "interleaved":
        text = text.replace('schedule = "1f1b"', 'schedule = "interleaved-1f1b"  virtual_stages = 2')
    compiled, prog = _program(tmp_path, _precision(text, precision))
    from compiler.cost import CostModel
    model = CostModel(compiled.spec, compiled.traced, compiled.plan)
    b, cfg = compiled.plan.micro_batch_size, prog.CONFIG
    tokens, targets = (torch.randint(0, cfg.data.vocab, (b, cfg.data.seq_len)) for _ in range(2))
    x = torch.randn(b, cfg.data.seq_len, compiled.spec.value(compiled.spec.model.embedding.hidden),
                    dtype=torch.bfloat16 if precision == "bf16" else torch.float32,  # the residual stream
                    requires_grad=True)
    n = len(prog.STAGES)
    for k in range(n):
        torch.manual_seed(0)
        stage = prog.Stage(k)
        inp = tokens if k == 0 else x

        def run():
            out = stage(inp)
            if k == n - 1:
                prog.loss_fn(out, targets)
        got = count_saved(stage, run, precision)
        want = model.kept_per_micro_batch(compiled.plan, k)
        assert got == pytest.approx(want, rel=1e-3, abs=8), (k, got, want)


@pytest.mark.parametrize("layout", [((0, 2), (2, 4)), ((0, 1), (1, 4))])
def test_stages_over_two_repeats_hold_and_keep_their_own_blocks(tmp_path, layout):
    """A dense `repeat 1` then a MoE `repeat 3` under pp 2: each stage's parameters are those its program's module
    holds, and what its forward keeps is the formula of its own blocks (a dense block keeps less than a MoE one),
    not a count of blocks times one block."""
    from tests.test_pipeline_split import PP2, _dense_first
    compiled, prog = _program(tmp_path, _dense_first(**PP2, micro_batches=2, layout=layout), "dense_first.scale")
    from compiler.cost import CostModel
    model = CostModel(compiled.spec, compiled.traced, compiled.plan)
    b, cfg = compiled.plan.micro_batch_size, prog.CONFIG
    tokens, targets = (torch.randint(0, cfg.data.vocab, (b, cfg.data.seq_len)) for _ in range(2))
    x = torch.randn(b, cfg.data.seq_len, compiled.spec.value(compiled.spec.model.embedding.hidden),
                    requires_grad=True)
    kept = []
    for k, st in enumerate(compiled.costs.stages):
        assert st.blocks == layout[k]
        torch.manual_seed(0)
        stage = prog.Stage(k)
        assert st.params == sum(p.numel() for p in stage.parameters()), k

        def run():
            out = stage(tokens if k == 0 else x)
            if k == 1:
                prog.loss_fn(out, targets)
        got = count_saved(stage, run, "fp32")
        kept.append(model.kept_per_micro_batch(compiled.plan, k))
        assert got == pytest.approx(kept[-1], rel=1e-3, abs=8), (k, got, kept[-1])
    # the dense block and a MoE block differ: the stages are not costed as equal blocks
    fo = model.formulas
    env = (1, 1, 1, 2, b, 1)
    dense, moe = (f(env) for f in fo.params.block)
    assert dense != moe and compiled.costs.stages[0].params - fo.params.prologue(env) == \
        fo.within(fo.params.block, *layout[0], env) == dense + (layout[0][1] - 1) * moe


@pytest.mark.skip(reason="tests/reference/gpu-measured.json measured the bf16-autocast programs (2026-11-22); bf16 "
                         "programs now hold bf16 weights, fp32 main gradients and masters (runtime/precision.py): "
                         "re-measure on an H100 (bench/gpu.py) before this comparison means anything again")
def test_reference_h100_peaks_are_predicted_within_10_percent(tmp_path):
    """The three programs measured on an H100 (peak torch.cuda.max_memory_allocated, bf16, one device; the
    reference file's specs and method): the predicted peak is within 10% of each."""
    ref = json.loads((REFERENCE / "gpu-measured.json").read_text())
    assert len(ref["rows"]) == 3
    for row in ref["rows"]:
        compiled = compile_spec(check_text(row["spec"], f"{row['name']}.scale"))
        predicted = compiled.costs.peak_bytes
        assert predicted == pytest.approx(row["peak_allocated_bytes"], rel=0.10), row["name"]


# ZeRO (Rajbhandari et al. 2020), Table 1: per-device model-state memory in GB for mixed-precision Adam (K = 12)
# over Nd data-parallel ranks, stages Pos, Pos+g, Pos+g+p, for Ψ = 7.5B, 128B and 1T: as published.
ZERO_TABLE1 = {
    # Nd: (7.5B: Pos, Pos+g, Pos+g+p), (128B: ...), (1T: ...)
    1: ((120, 120, 120), (2048, 2048, 2048), (16000, 16000, 16000)),
    4: ((52.5, 41.3, 30), (896, 704, 512), (7000, 5500, 4000)),
    16: ((35.6, 21.6, 7.5), (608, 368, 128), (4750, 2875, 1000)),
    64: ((31.4, 16.6, 1.88), (536, 284, 32), (4187, 2218, 250)),
    256: ((30.4, 15.4, 0.47), (518, 263, 8), (4046, 2054, 62.5)),
    1024: ((30.1, 15.1, 0.12), (513, 257, 2), (4011, 2013, 15.6)),
}


ZERO_MODEL = """
model zero_{name} {{
  vocab = {vocab}
  hidden = {hidden}
  heads = {heads}
  layers = {layers}
  seq = 1024
  embedding(vocab, hidden)
  positional(seq, hidden)
  repeat layers {{
    residual {{ layernorm(hidden)  attention(hidden, heads) }}
    residual {{ layernorm(hidden)  mlp(hidden, 4 * hidden, act = gelu) }}
  }}
  layernorm(hidden)
  lm_head(vocab, hidden, tied = true)
  cross_entropy
}}
mesh {{
  axis dp = 4
  nodes = 1
  devices_per_node = 4
  device = h100
}}
plan {{
  data_parallel = zero1
}}
train {{
  global_batch = 1024
  seq_len = seq
  steps = 1
  precision = bf16
  optimizer = adamw(lr = 1e-4)
}}
"""
# GPTs of ZeRO's three sizes, within 0.3% of Ψ = 7.5B, 128B and 1T (the test reads each plan's own Ψ).
ZERO_MODELS = {7.5e9: dict(name="7_5b", vocab=61440, hidden=4096, heads=32, layers=36),
               128e9: dict(name="128b", vocab=51200, hidden=10240, heads=80, layers=101),
               1e12: dict(name="1t", vocab=51200, hidden=25600, heads=160, layers=127)}
ZERO_STAGES = {1: "zero1", 2: "zero2", 3: "fsdp"}


def _zero_states(psi_target: float, grad_reduce: str):
    """{(Nd, mode): (Ψ of the plan, its Estimate.model_state)} for the GPT of about `psi_target` parameters, each
    plan checked from .scale text (bf16) and costed at dp = Nd."""
    from dataclasses import replace

    from compiler import plan as P
    from compiler.candidates import Candidates
    spec = check_text(ZERO_MODEL.format(**ZERO_MODELS[psi_target]), "zero.scale")
    cands = Candidates(spec)
    base = spec.plan
    out = {}
    for nd in ZERO_TABLE1:
        for mode in ("ddp",) + tuple(ZERO_STAGES.values()):
            plan = replace(base, axes=(("dp", nd),), data_parallel=mode,
                           grad_reduce=grad_reduce)
            est = cands.estimate(cands.decide(plan))
            out[(nd, mode)] = (est.params_n, est.model_state)
    return out


def test_zero_table1_all_54_cells_from_plans():
    """ZeRO's Table 1 (Rajbhandari et al. 2020: Ψ = 7.5B, 128B, 1T; Nd = 1 ... 1024; stages 1, 2, 3 as zero1,
    zero2, fsdp) from plans: each .scale checked and costed under `precision = bf16`, `grad_reduce = bf16` (the
    paper's 2-byte weights and gradients). Every cell within 1% of the published GB (or its printed rounding,
    0.12 for 0.1172), once the one thing our program holds that the paper's formula does not is itemised:
    zero2 is FSDP2, whose sharded gradient is fp32 (the reduce-scatter's bf16 output cast to the parameter's fp32
    dtype, torch _fsdp_collectives.foreach_reduce): 4Ψ/Nd where ZeRO-2 counts 2Ψ/Nd, 2Ψ/Nd bytes more. Cells
    missing 1% without that: zero2 at Nd = 4, 16 and 64 for each Ψ (2/Nd beside 2 + 14/Nd: 9% at Nd = 4, 5.6% at
    16, 1.7% at 64; 0.4% at 256): MISS below; stages 1 and 3 match the paper's formula exactly."""
    cells, missed = 0, set()
    for psi_paper, models in zip((7.5e9, 128e9, 1e12), zip(*ZERO_TABLE1.values())):
        states = _zero_states(psi_paper, "bf16")
        for nd, row in zip(ZERO_TABLE1, models):
            for stage, want in zip((1, 2, 3), row):
                psi, st = states[(nd, ZERO_STAGES[stage])]
                assert abs(psi / psi_paper - 1) < 0.003  # the plan's model is ZeRO's size
                # the plan's bytes for the paper's Ψ (the plan's model is within 0.3% of it)
                got = st.total * psi_paper / psi
                extra = 2 * psi_paper / nd if stage == 2 and nd > 1 else 0  # FSDP2's fp32 gradient shard
                per = st.total / psi
                assert per - extra / psi_paper == pytest.approx(
                    [16, 4 + 12 / nd, 2 + 14 / nd, 16 / nd][stage] if nd > 1 else 16, rel=1e-12), (nd, stage)
                decimals = len(repr(float(want)).split(".")[1].rstrip("0")) if float(want) % 1 else 0
                tol = dict(rel=0.01, abs=0.5 * 10 ** -decimals if want < 1 else 0)
                assert (got - extra) / 1e9 == pytest.approx(want, **tol), (nd, psi_paper, stage, got, want)
                if got / 1e9 != pytest.approx(want, **tol):
                    missed.add((psi_paper, nd, stage))
                cells += 1
        # Nd = 1 (ddp): 2 + 2 + 12
        psi, st = states[(1, "ddp")]
        assert st.total / psi == 16
    assert cells == 54
    MISS = {(p, nd, 2) for p in (7.5e9, 128e9, 1e12) for nd in (4, 16, 64)}
    assert missed == MISS


@pytest.mark.parametrize("mode,key", [("ddp", "plain_dp"), ("zero1", "stage1"), ("zero2", "stage2"),
                                      ("fsdp", "stage3")])
def test_zero_paper_example_from_a_plan(mode, key):
    """ZeRO's 7.5B example (Nd = 64: 120, 31.4, 16.6, 1.88 GB) from the plan of a 7.5B GPT under bf16 with
    `grad_reduce = bf16`: within the published rounding, zero2 once FSDP2's fp32 gradient shard (2Ψ/Nd more than
    ZeRO-2's bf16 one: 0.234 GB) is itemised."""
    ex = json.loads((REFERENCE / "calibration.json").read_text())["zero_2020_example"]
    states = _zero_states(7.5e9, "bf16")
    psi, st = states[(ex["Nd"], mode)]
    extra = 2 * ex["psi"] / ex["Nd"] if mode == "zero2" else 0
    got = (st.total * ex["psi"] / psi - extra) / 1e9
    published = ex[key]
    decimals = len(repr(float(published)).split(".")[1].rstrip("0")) if float(published) % 1 else 0
    assert abs(got - published) <= 0.5 * 10 ** -decimals, (mode, got, published)


def test_megatron_distributed_optimizer_bytes_from_a_plan():
    """Megatron-LM's accounting of bf16 training with fp32 gradients (`grad_reduce = fp32`, the default): 18
    bytes per parameter without the distributed optimizer (bf16 weights 2, fp32 gradients 4, fp32 master 4,
    moments 8), 6 + 12/Nd with it (zero1); and fp32 programs keep today's 4 + 4 + 8 with zero1 sharding only the
    moments."""
    states = _zero_states(7.5e9, "fp32")
    for nd in ZERO_TABLE1:
        psi, ddp = states[(nd, "ddp")]
        assert (ddp.params / psi, ddp.grads / psi, ddp.optimizer / psi) == (2, 4, 12)
        psi, z1 = states[(nd, "zero1")]
        assert z1.total / psi == pytest.approx(6 + 12 / nd if nd > 1 else 18, rel=1e-12)
        psi, z2 = states[(nd, "zero2")]  # FSDP2: whole bf16 units at the peak, fp32 shards of the rest
        assert z2.total / psi == pytest.approx(2 + 16 / nd if nd > 1 else 18, rel=1e-12)
    spec = check_text(ZERO_MODEL.format(**ZERO_MODELS[7.5e9]).replace("precision = bf16", "precision = fp32"),
                      "zero.scale")
    compiled = compile_spec(spec)
    psi, st = compiled.costs.params_rank, compiled.costs.model_state
    assert (st.params / psi, st.grads / psi, st.optimizer / psi) == (4, 4, 8 / 4)


class _Alive:
    """Bytes of the tensor storages created while active and still alive (parameters' storages excluded: a view
    of a weight is not an allocation): what a forward leaves allocated for its backward, checkpoints included."""

    def __init__(self, module):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.multiprocessing.reductions import StorageWeakRef
        params = {p.untyped_storage().data_ptr() for p in module.parameters()}
        refs: dict = {}

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        st = t.untyped_storage()
                        old = refs.get(st.data_ptr())
                        if st.data_ptr() not in params and (old is None or old[0].expired()):
                            refs[st.data_ptr()] = (StorageWeakRef(st), st.nbytes())
                return out

        self.mode, self.refs = Mode(), refs

    def bytes(self) -> int:
        return sum(n for ref, n in self.refs.values() if not ref.expired())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
def test_recomputation_keeps_what_the_formula_says(tmp_path, mode, precision):
    """With each recomputation mode (runtime/recompute.py: full keeps each block's input, selective also its
    matmuls' and collectives' outputs), what a forward leaves allocated, counted by a dispatch mode over every op
    (saved_tensors_hooks cannot see inside a checkpoint), equals the formula. The token ids (made before the
    forward) are the formula's only extra bytes."""
    from runtime.parallelize import apply_recompute
    text = _precision((ROOT / "samples" / "tiny_gpt.scale").read_text(), precision)
    text = text.replace("mesh {", f"plan {{\n  recompute = {mode}\n}}\n\nmesh {{", 1)
    compiled, prog = _program(tmp_path, text)
    torch.manual_seed(0)
    model = apply_recompute(prog.Model(), mode)
    if precision == "bf16":  # the weights made bf16, as the runtime does (runtime.precision)
        from runtime.precision import to_compute
        to_compute([model])
    b, cfg = compiled.plan.micro_batch_size, prog.CONFIG
    tokens, targets = (torch.randint(0, cfg.data.vocab, (b, cfg.data.seq_len)) for _ in range(2))
    alive = _Alive(model)
    with alive.mode:
        loss = model(tokens, targets)
    got = alive.bytes() - loss.untyped_storage().nbytes() + tokens.untyped_storage().nbytes()
    assert got == pytest.approx(compiled.costs.memory[0].activations, rel=1e-3, abs=8)


# Korthikanti et al. 2022, Table 3: the configurations their measurements use (s = 2048): heads, hidden, layers,
# t, p, GPUs, global batch, micro-batch; 175B and 530B interleaved with 3 model chunks per device (the chunk
# counts for which their in-flight factor 1 + (p-1)/(p·v) is 1.2917 and 1.3238).
KORTHIKANTI_TABLE3 = {
    "22B": dict(a=64, h=6144, L=48, t=8, p=1, v=1, gpus=8, B=4, b=4),
    "175B": dict(a=96, h=12288, L=96, t=8, p=8, v=3, gpus=64, B=64, b=1),
    # 530B: their global batch is 280; 70 micro-batches (B = 70) keep it within the compiler's schedule check
    # (E0608) and change nothing here: a rank's in-flight count does not depend on m once m ≥ p
    "530B": dict(a=128, h=20480, L=105, t=8, p=35, v=3, gpus=280, B=70, b=1),
}


def _korthikanti_plan(cfg, tmp_path=None):
    text = (ROOT / "samples" / "gpt3_175b.scale").read_text()
    dp = cfg["gpus"] // (cfg["t"] * cfg["p"])
    for old, new in (("hidden = 12288", f"hidden = {cfg['h']}"), ("heads  = 96", f"heads  = {cfg['a']}"),
                     ("layers = 96", f"layers = {cfg['L']}"), ("axis dp = 24", f"axis dp = {dp}"),
                     ("axis pp = 8", f"axis pp = {cfg['p']}"), ("axis tp = 8", f"axis tp = {cfg['t']}"),
                     ("nodes = 192", f"nodes = {cfg['gpus'] // 8}"), ("global_batch = 1536", f"global_batch = {cfg['B']}"),
                     ("micro_batches = 64", f"micro_batches = {cfg['B'] // (dp * cfg['b'])}"),
                     ("virtual_stages = 3", f"virtual_stages = {cfg['v']}"), ("recompute = full", "recompute = none"),
                     ("sequence_parallel = true", "sequence_parallel = false")):
        assert old in text, old
        text = text.replace(old, new)
    if cfg["p"] == 1:
        text = text.replace('  schedule = "interleaved-1f1b"\n  virtual_stages = 1\n', "")
    return compile_spec(check_text(text, "korthikanti.scale"))


@pytest.mark.parametrize("model", sorted(KORTHIKANTI_TABLE3))
def test_korthikanti_table3(model):
    """Their formulas against ours for their Table 3 configurations:
    - layers in flight on the first pipeline rank: their eq. 5 (× (1 + (p-1)/(p·v)) interleaved) equals what the
      schedule our runtime executes keeps on pp rank 0 (31 chunks of 4 layers for 175B, 139 of 1 for 530B), within
      0.1%;
    - one layer's activations: ours (node by node, bf16, our program) equals theirs (Megatron's program) plus the
      differences of the two programs, itemised below, within 0.1%: Megatron keeps 1-byte dropout masks (3 of
      them, one s×s) and the s×s softmax, our attention keeps a log-sum-exp per row and head (fp32), and our
      norms keep their mean and reciprocal std per row (fp32). The rest is the same: bf16 weights, bf16 residual
      stream and activations, no casts (runtime/precision.py, Megatron's policy)."""
    from compiler.cost.memory import korthikanti_first_stage_bytes, korthikanti_layer_bytes, rank_peaks
    cfg = KORTHIKANTI_TABLE3[model]
    s, b, h, a, t, L, p, v = 2048, cfg["b"], cfg["h"], cfg["a"], cfg["t"], cfg["L"], cfg["p"], cfg["v"]
    compiled = _korthikanti_plan(cfg)
    theirs = korthikanti_layer_bytes(s, b, h, a, t)
    if p > 1:
        layout = tuple(st.blocks for st in compiled.costs.stages)
        held = rank_peaks(compiled.plan.schedule, p, compiled.plan.micro_batches, v, layout)[0]
        layers = sum(n * (layout[k][1] - layout[k][0]) for k, n in held.items())
        assert layers == pytest.approx(korthikanti_first_stage_bytes(theirs, L, p, v) / theirs, rel=1e-3)
    import sympy
    from compiler.cost.activations import saved_bytes
    from compiler.spec import axis_values
    from compiler.symbols import MICRO_BATCH
    (gm,) = compiled.traced.blocks.values()  # one transformer layer per block
    values = {**compiled.spec.values, **axis_values(compiled.plan), MICRO_BATCH: b}
    ours = float(saved_bytes(gm, "bf16", "cuda").xreplace({k: sympy.Integer(v) for k, v in values.items()}))
    sbh = s * b * h
    masks = 2 * sbh + a * s * s * b / t                        # attention-output, MLP and scores dropout masks
    scores = 4 * a * s * s * b / t                             # softmax output and dropout output, 16-bit
    lse = 4 * a * s * b / t                                    # ours: log-sum-exp per row and head, fp32
    stats = 2 * 2 * 4 * s * b                                  # ours: the norms' mean and rstd, fp32
    assert ours == pytest.approx(theirs - masks - scores + lse + stats, rel=1e-3)



def test_plan_json_carries_everything_plan_prints(capsys):
    """`scalec plan FILE --json`: the keys tools read (docs/planning.md: `plan --json`), the numbers the text prints."""
    from compiler.cli import main
    from compiler.report.plan import plan_text
    from compiler.pipeline import compile_path
    path = str(ROOT / "samples" / "gpt3_175b.scale")
    assert main(["plan", path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    compiled = compile_path(path)
    costs = compiled.costs
    assert out["parameters"] == costs.params_n == 174_615_846_912 and isinstance(out["parameters"], int)
    assert out["flops_per_step"] == costs.flops_step_n and out["hardware_flops_per_step"] == costs.flops_step_hw_n
    assert len(out["ledger"]) == len(costs.ledger.entries) and all(isinstance(c["bytes"], int) for c in out["ledger"])
    mem = out["memory"]
    assert mem["peak_bytes"] == int(costs.peak_bytes) == max(r["peak_bytes"] for r in mem["ranks"])
    assert mem["fits"] and mem["device_bytes"] == 80 * 10**9 and len(mem["ranks"]) == 8
    assert {"who", "weights", "gradients", "optimizer", "activations", "working", "moment"} <= set(mem["ranks"][0])
    assert out["pipeline"]["virtual_stages"] == 3 and out["plan"]["recompute"] == "full"
    text = plan_text(compiled)
    # AdamW fused on CUDA: no temporaries
    assert f"{mem['ranks'][0]['who']}" in text and "fits: 65% of the 80 GB" in text


def test_compile_and_run_refuse_a_plan_that_does_not_fit_unless_forced(tmp_path, capsys):
    """A plan over its devices' memory: `compile` and `run` stop before anything starts (E0501 with the fixes);
    `compile --force` writes the program and warns."""
    from compiler.cli import main
    # bf16 as Megatron (runtime/precision.py) fits 175B without recomputation; without sequence parallelism too it
    # does not (full-sequence activations, and the receive buffers and sent outputs of those in flight)
    text = (ROOT / "samples" / "gpt3_175b.scale").read_text().replace("recompute = full", "recompute = none")
    text = text.replace("sequence_parallel = true", "sequence_parallel = false")
    src = tmp_path / "big.scale"
    src.write_text(text)
    assert main(["compile", str(src), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "error[E0501]" in err and "pp rank 0 (stages 0, 8, 16)" in err and "`data_parallel = zero1`" in err
    assert not (tmp_path / "out").exists()
    assert main(["run", str(src), "-o", str(tmp_path / "out")]) == 1 and not (tmp_path / "out").exists()
    capsys.readouterr()
    assert main(["compile", str(src), "-o", str(tmp_path / "out"), "--force"]) == 0
    assert "warning (--force): the predicted peak of pp rank 0" in capsys.readouterr().err
    assert (tmp_path / "out" / "program.py").exists()


def test_a_plan_near_the_device_warns(tmp_path):
    """Within 10% of the device: W0502, a warning (compile goes on). The 175B sample peaks at 52.2 GB."""
    from compiler.fit import budget
    text = (ROOT / "samples" / "gpt3_175b.scale").read_text().replace("device = a100", "device = a100  memory_gb = 57")
    compiled = compile_spec(check_text(text, "tight.scale"))
    (d,) = budget(compiled)
    assert (d.code, d.severity) == ("W0502", "warning") and "less than 10%" in d.message


def test_schedule_states_repeat_after_two_p_micro_batches():
    """rank_peaks reads the states of m = 2p for any larger m (memory._steady): the states, in order, are the same."""
    from compiler.cost.memory import _moments, _steady
    for schedule, vs in (("1f1b", (1,)), ("zero-bubble", (1,)), ("interleaved-1f1b", (2, 3))):
        for p in (2, 3, 4, 8):
            for v in vs:
                step = p if schedule == "interleaved-1f1b" else 1
                for m in range(2 * p, 8 * p + 1, step):
                    assert _steady(schedule, p, m) == 2 * p
                    got = [states for states, _ in _moments(schedule, p, m, v)]
                    assert got == [states for states, _ in _moments(schedule, p, 2 * p, v)], (schedule, p, v, m)
    assert _steady("gpipe", 4, 64) == 64


@pytest.mark.parametrize("case", ["gpt", "gqa_rmsnorm_swiglu_untied"])
def test_fp32_residual_keeps_what_the_formula_says(tmp_path, case):
    """bf16 with `fp32_residual = true` (runtime/precision.py): the stream each block reads and the adds keep are
    fp32, the blocks' own activations bf16; the formula (trace.DTYPE's "res") gives the bytes the forward keeps."""
    sample, edits = WHOLE[case]
    text = (ROOT / "samples" / sample).read_text()
    for old, new in edits:
        text = text.replace(old, new)
    text = _precision(text, "bf16").replace("mesh {", "plan {\n  fp32_residual = true\n}\n\nmesh {", 1)
    compiled, prog = _program(tmp_path, text)
    torch.manual_seed(0)
    model = prog.Model()
    from runtime.precision import apply_policy
    apply_policy(model, fp32_residual=True)
    b, cfg = compiled.plan.micro_batch_size, prog.CONFIG
    tokens, targets = (torch.randint(0, cfg.data.vocab, (b, cfg.data.seq_len)) for _ in range(2))
    got = count_saved(model, lambda: model(tokens, targets), "bf16")
    want = compiled.costs.memory[0].activations
    bf16 = compile_spec(check_text(text.replace("fp32_residual = true", "fp32_residual = false"), "m.scale"))
    # the fp32 stream is counted (on CPU torch's composite RMSNorm keeps an fp32 copy of a bf16 input anyway)
    assert want > bf16.costs.memory[0].activations if case == "gpt" else want >= bf16.costs.memory[0].activations
    assert got == pytest.approx(want, rel=1e-3), (got, want)


def test_fsdp_holds_the_root_and_the_plans_prefetched_blocks_gathered():
    """FSDP's forward and backward hold the root and 1 + Plan.fsdp_prefetch blocks gathered (the block running and
    those whose all-gathers it issued ahead, runtime.parallelize.fsdp_prefetch): one block more per unit of depth. A
    Llama-3 8B block is 4096·(4096 + 1024 + 1024 + 4096) + 3·4096·14336 + 2·4096 = 218,112,000 parameters,
    gathered in bf16."""
    import dataclasses
    from compiler.cost import CostModel
    spec = check_text((ROOT / "samples" / "llama3_8b.scale").read_text(), "llama3_8b.scale")
    compiled = compile_spec(spec)
    assert compiled.plan.data_parallel == "fsdp" and compiled.plan.fsdp_prefetch == 1
    cm = CostModel(spec, compiled.traced, compiled.plan)
    one, two = (cm.estimate(dataclasses.replace(compiled.plan, fsdp_prefetch=d)).memory[0] for d in (1, 2))
    assert "FSDP's gathered units (root + 2 blocks)" in one.working_what
    assert "FSDP's gathered units (root + 3 blocks)" in two.working_what
    assert two.weights - one.weights == 2 * 218_112_000


def test_the_staging_copy_shows_only_for_checkpoint_async():
    """checkpoint_async adds the staging copy (memory.checkpoint_staging) to each rank row of `plan --json` and one
    line to `plan`, and changes no device figure; without it neither appears (the goldens pin that)."""
    from compiler.report.plan import plan_json, plan_text
    text = (ROOT / "samples" / "gpt_dp.scale").read_text()
    plain = compile_spec(check_text(text, "gpt_dp.scale"))
    asynchronous = compile_spec(check_text(text.replace("train {", "train {\n  checkpoint_async = true\n"
                                                        "  checkpoint_every = 1", 1), "gpt_dp.scale"))
    rows, rows_async = plan_json(plain)["memory"]["ranks"], plan_json(asynchronous)["memory"]["ranks"]
    assert all("checkpoint_host" not in r for r in rows)
    assert [{k: v for k, v in r.items() if not k.startswith("checkpoint_")} for r in rows_async] == rows
    n = plain.costs.params_n  # ddp, fp32: weights and two moments, a `step` per tensor, three progress scalars
    assert rows_async[0]["checkpoint_host"] > 12 * n and rows_async[0]["checkpoint_device"] == 0
    assert "checkpoint_async" not in plan_text(plain)
    assert "staging copy takes" in plan_text(asynchronous)


def test_staging_rules_by_dp_mode():
    """checkpoint_staging itemised on three tensors, (name, elements, rows, dims, sharded): a 5×4 matrix, a 7-vector
    and a 3×2 matrix sharded over tp; dp = 2."""
    from compiler.cost import memory as MEM
    t = [("a", 20, 5, 2, False), ("b", 7, 7, 1, False), ("c", 6, 3, 2, True)]
    fixed = MEM.PROGRESS_BYTES + 3 * MEM.STEP_BYTES
    assert MEM.checkpoint_staging(t, "fp32", "ddp", 2) == (12 * 33 + fixed, 0)
    # FSDP2: padded chunks ceil(5/2) = 3 rows of 4, ceil(7/2) = 4; the tp-sharded one gathered whole, on the device
    assert MEM.checkpoint_staging(t, "fp32", "fsdp", 2) == (12 * (12 + 4) + 12 * 6 + fixed, 12 * 6)
    # zero1 fp32: every weight; moments of rank 0's partition (matrices 20 | 6, then the vector to rank 1: 6 + 7)
    assert MEM.checkpoint_staging(t, "fp32", "zero1", 2) == (4 * 33 + 8 * 20 + 4 + MEM.PROGRESS_BYTES, 0)
    # zero1 bf16: owners by elements over all (20 | 7, 6): master and moments of the owned ones only
    assert MEM.checkpoint_staging(t, "bf16", "zero1", 2) == (12 * 20 + 4 + MEM.PROGRESS_BYTES, 0)
