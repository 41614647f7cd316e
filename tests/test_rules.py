"""The rules beside the passes: `requires(spec, plan)` of each pass module and compiler.rules.check_plan.

A plan written in a file is checked with spans (golden renderings in tests/golden/diagnostics); these tests check
generated candidates, which have no source text: their diagnostics must describe the plan in words.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

from compiler.check import check_text
from compiler.diagnostics import render
from compiler.rules import RULES, check_plan
from compiler.symbols import capacity

SAMPLES = Path(__file__).parent.parent / "samples"


def _spec(name: str):
    path = SAMPLES / name
    return check_text(path.read_text(encoding="utf-8"), str(path))


def test_a_files_plan_passes_every_rule():
    spec = _spec("tiny_gpt.scale")
    assert check_plan(spec, spec.plan) == []
    assert [name for name, _ in RULES] == ["tensor_parallel", "pipeline_split", "expert_parallel", "context_parallel",
                                          "packed", "offload", "mesh"]


def test_a_candidate_breaking_a_rule_gets_a_readable_spanless_diagnostic():
    spec = _spec("tiny_gpt.scale")  # 4 heads, global batch 8
    plan = dataclasses.replace(spec.plan, axes=(("dp", 1), ("tp", 8)), spans=())
    diags = check_plan(spec, plan)
    heads = next(d for d in diags if d.code == "E0401")
    assert heads.span is None
    assert "tensor-parallel degree 8 does not divide the attention heads (4)" in heads.message
    assert "in the plan dp=1 × tp=8" in heads.message
    assert heads.help.startswith("4 % 8 == 4; each rank computes whole heads")
    text = render(heads, None)
    assert text.splitlines()[0].startswith("error[E0401]: tensor-parallel degree 8")
    assert "= help: 4 % 8 == 4" in text and "-->" not in text


def test_a_candidate_is_checked_from_the_plan_not_the_spec():
    spec = _spec("tiny_gpt.scale")
    base = spec.plan
    odd = dataclasses.replace(base, micro_batches=3, spans=())  # 8 sequences do not split into 3 micro-batches
    (d,) = check_plan(spec, odd)
    assert d.code == "E0302" and d.span is None and "global batch 8" in d.message and "3 micro-batches" in d.message
    # the same setting with the file's spans points at the text of `global_batch`
    (d,) = check_plan(spec, dataclasses.replace(base, micro_batches=3))
    assert d.span is not None and d.span.line == spec.source.splitlines().index(
        next(x for x in spec.source.splitlines() if "global_batch" in x)) + 1


def test_a_pipeline_candidate_with_a_bad_layout_names_its_stage():
    spec = _spec("gpt_pp.scale")
    plan = dataclasses.replace(spec.plan, layout=((0, 1), (0, 2)), spans=())
    codes = [d.code for d in check_plan(spec, plan)]
    assert "E0607" in codes
    d = next(d for d in check_plan(spec, plan) if d.code == "E0607")
    assert d.span is None and "in the plan" in d.message


def test_virtual_stages_without_interleaving_is_refused_for_a_candidate():
    spec = _spec("gpt_pp.scale")
    plan = dataclasses.replace(spec.plan, virtual_stages=2, schedule="1f1b", spans=())
    assert "E0604" in [d.code for d in check_plan(spec, plan)]


def test_the_compilers_capacity_agrees_with_the_runtimes():
    from runtime.moe import capacity as runtime_capacity
    for seq in (1, 2, 3, 7, 64, 100, 1000, 2048):
        for experts in (1, 2, 3, 8, 16, 64, 128):
            for top_k in (1, 2, 4):
                for factor in (0.5, 1.0, 1.25, 1.5, 2.0, 3.0):
                    assert capacity(seq, experts, top_k, factor) == runtime_capacity(seq, experts, top_k, factor)


def test_the_checker_agrees_with_check_plan_over_a_search_space():
    """rules.Checker skips a rule for settings it passed before (rules.READS): over every candidate a search
    enumerates, with every dp sharding (ZeRO over dp = 1 too), with and without vocabulary padding and with layer
    kinds left out of tp, in the search's order and in reverse, it must say exactly what check_plan says. A rule
    that starts reading a setting READS does not name fails here."""
    from compiler import search as SE
    from compiler.rules import READS, RULES, Checker, reads_all
    moe8 = (SAMPLES / "moe_gpt.scale").read_text(encoding="utf-8").replace("devices_per_node = 2",
                                                                           "devices_per_node = 8")
    assert "devices_per_node = 8" in moe8  # ep and dp > 1 together
    for name, text in (("gpt_3d.scale", (SAMPLES / "gpt_3d.scale").read_text(encoding="utf-8")),
                       ("moe_gpt.scale", moe8)):
        spec = check_text(text, str(SAMPLES / name), cluster_only=True)
        space = SE.Space(spec, {})
        plans = [dataclasses.replace(family, data_parallel=dp, fsdp_grad_sync=sync, recompute=rc, pad_vocab=pad,
                                     tp_layers=layers)
                 for sizes in space.shapes() for family in space.families(sizes)
                 for dp, sync in [(kind, "step") for kind in SE.DP_MODES] + [("fsdp", "micro_batch")]
                 for rc in space.recomputes() for pad in (False, True)
                 for layers in (family.tp_layers, ("attention", "mlp"), ("mlp", "vocab"))]
        wants = [check_plan(spec, plan) for plan in plans]
        for plan in plans[::7]:  # the Checker's keys, all at once, are READS'
            assert reads_all(plan) == tuple((name, READS[name](plan)) for name, _ in RULES), plan.describe()
        assert any(wants) and not all(wants)  # both verdicts met
        for order in (list(zip(plans, wants)), list(zip(plans, wants))[::-1]):
            checker = Checker(spec)
            for plan, want in order:
                assert checker(plan) == want, plan.describe()
        # a plan that differs from one every rule passed in its micro-batch count alone is legal wherever
        # passes_in_micro_batches says so (it reads only what rules.MICRO_BATCH_READERS read), and a refused one
        # never is (`checker`: the last order's, which has checked every plan)
        counts = sorted({p.micro_batches for p in plans})
        said = refused = 0
        for plan, want in list(zip(plans, wants))[::23]:
            if want:
                continue
            for m in counts:
                twin = dataclasses.replace(plan, micro_batches=m)
                legal = not check_plan(spec, twin)
                refused += not legal
                if checker.passes_in_micro_batches(twin):
                    said += 1
                    assert legal, twin.describe()
        assert said and refused
        # a refusal given again (rules.REUSABLE, for a search) differs from check_plan's in its message alone
        fields = lambda ds: [(d.code, d.brief, d.key, d.help, d.span, d.axis, d.rule) for d in ds]  # noqa: E731
        checker = Checker(spec)
        for plan, want in zip(plans, wants):
            assert fields(checker(plan, reuse=True)) == fields(want), plan.describe()


# What each rule module says its refusals are about (Diagnostic.axis): the search charges a refusal to the family
# key of that axis (compiler/search/prune.py OWN), never by its code. Packed documents' refusals go with cp's.
RULE_AXES = {"tensor_parallel": "tp", "pipeline_split": "pp", "expert_parallel": "ep", "context_parallel": "cp",
             "packed": "cp", "mesh": None}


def _refusals_over_a_space():
    """(rule module, diagnostic) for every refusal of every rule over the candidates of two searches' spaces (a dense
    model with pp, a mixture of experts over 8 devices) and the MoE one's with packed documents, a few variants each."""
    from compiler import search as SE
    moe8 = (SAMPLES / "moe_gpt.scale").read_text(encoding="utf-8").replace("devices_per_node = 2",
                                                                           "devices_per_node = 8")
    out = []
    for name, text in (("gpt_3d.scale", (SAMPLES / "gpt_3d.scale").read_text(encoding="utf-8")),
                       ("moe_gpt.scale", moe8)):
        spec = check_text(text, str(SAMPLES / name), cluster_only=True)
        packed = dataclasses.replace(spec, train=dataclasses.replace(
            spec.train, data=dataclasses.replace(spec.train.data, document_separator=0)))
        space = SE.Space(spec, {})
        plans = [dataclasses.replace(family, data_parallel=dp, recompute=rc, pad_vocab=pad, compile=comp)
                 for sizes in space.shapes() for family in space.families(sizes)
                 for dp in ("ddp", "fsdp") for rc in ("none", "selective") for pad in (False, True)
                 for comp in (False, True)]
        odd = plans[0]  # and what no search candidate breaks: the experts over ep, the batch, the positions
        plans += [dataclasses.replace(odd, axes=(("dp", 1), ("ep", 3))), dataclasses.replace(odd, axes=(("ep", 2),)),
                  dataclasses.replace(odd, global_batch=odd.global_batch + 1),
                  dataclasses.replace(odd, seq_len=1 << 20)]
        for s in (spec, packed):
            for plan in plans[::3] + plans[-4:]:
                out += [(rule, d) for rule, requires in RULES for d in requires(s, plan)]
    return out


def test_every_refusal_says_its_axis_and_rule():
    """Each diagnostic a rule emits names the rule that raised it (`module.check`, a stable name) and the axis its
    module guards, so that code reading refusals (the search) keys on these, not on a code that may be renumbered
    (E0317 became E0319 once)."""
    got = _refusals_over_a_space()
    modules = {rule for rule, _ in got}
    assert modules == set(RULE_AXES), modules  # every rule refused something: the check below covers each
    for rule, d in got:
        assert d.rule and d.rule.startswith(rule + "."), (rule, d.code, d.rule)
        assert d.axis == RULE_AXES[rule], (rule, d.code, d.axis)


def test_renumbering_a_code_changes_nothing_the_search_reads():
    """The search's reading of a refusal (whose family key it is charged to, whether it holds for every
    micro-batch count, whether padding the vocabulary alone lifts it) is the same with every code renumbered."""
    from compiler import search as SE
    from compiler.rules import per_shape
    got = [d for _, d in _refusals_over_a_space()]
    renumbered = [dataclasses.replace(d, code=f"E9{i:03d}") for i, d in enumerate(got)]
    assert [per_shape(d) for d in got] == [per_shape(d) for d in renumbered]
    assert any(per_shape(d) for d in got) and not all(per_shape(d) for d in got)
    spec = _spec("gpt_3d.scale")
    keys = (("tp", 2), ("pp", 2), ("cp", 1), ("schedule", "1f1b"))
    charged = []
    for problems in (got, renumbered):
        s = SE.Search(spec, 5, {})
        for d in problems:
            s._count_refused(keys, [d, *problems[:3]], 1)
        charged.append({k: sum((Counter({(brief, own): n}) for (_, brief, own), n in s.stats[k]["refused"].items()),
                               Counter()) for k in keys})
    assert charged[0] == charged[1]
