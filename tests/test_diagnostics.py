"""Every diagnostic kind, pinned by a golden rendering and checked against inline `# error: CODE` markers.

Each tests/golden/diagnostics/<case>.scale marks the lines where diagnostics must point; the rendered output of
`scalec check` is pinned in <case>.err. Together they say both *what* the user reads and *where* it points.
"""
from __future__ import annotations

import io
import re
import subprocess
import sys
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from compiler.check import check_text
from compiler.cli import main
from compiler.diagnostics import ScaleError
from compiler.fit import budget
from compiler.pipeline import compile_spec

CASES = sorted((Path(__file__).parent / "golden" / "diagnostics").glob("*.scale"))
MARK = re.compile(r"#\s*error:\s*([E0-9, ]+)")


def _markers(text: str) -> list[tuple[int, str]]:
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        m = MARK.search(line)
        if m:
            out += [(i, code.strip()) for code in m.group(1).split(",") if code.strip()]
    return sorted(out)


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_diagnostic(case: Path, golden):
    text = case.read_text(encoding="utf-8")
    rel = f"diagnostics/{case.name}"
    with pytest.raises(ScaleError) as info:
        spec = check_text(text, rel)
        if case.stem.startswith("budget_"):  # found when compiling, still before any process starts
            problems = budget(compile_spec(spec))
            if problems:
                raise ScaleError(problems, {rel: text})
    found = sorted((d.span.line, d.code) for d in info.value.diagnostics)
    assert found == _markers(text), "diagnostics do not sit on the lines marked `# error: CODE`"
    rendered = info.value.render()
    assert "Traceback" not in rendered
    golden.check(f"diagnostics/{case.stem}.err", rendered)


# Codes that need more than one .scale file, golden-tested where they arise.
ELSEWHERE = {"E0407": "no layer of today's vocabulary reaches it (a model with an op the tp pass does not know, "
                      "made by monkeypatching): tests/test_tensor_parallel.py::test_tp_fails_closed_on_an_op_it_does_not_know",
             "E0901": "scalec reshard OLD NEW on two different models: tests/test_reshard.py; scalec export of "
                      "another model's checkpoint: tests/mistakes/cli_export_another_models_checkpoint.scale",
             "E0951": "a config.json, not a .scale file (scalec import): tests/test_import.py::test_each_refusal_is_located",
             "E0952": "a config.json (scalec import): tests/test_import.py::test_each_refusal_is_located",
             "E0953": "a config.json (scalec import): tests/test_import.py::test_unknown_key_is_located_at_the_key",
             "E0954": "a config.json (scalec import): "
                      "tests/test_import.py::test_unsupported_value_is_located_at_the_key",
             "E0803": "a token file with a sidecar beside the .scale file: tests/test_data.py, "
                      "tests/mistakes/files_uint32_declared_uint16_sidecar.scale",
             "E0804": "a token file beside the .scale file: tests/test_data.py, "
                      "tests/mistakes/files_sidecar_vocab_larger_than_model.scale",
             "E0805": "a token file with a sidecar beside the .scale file: tests/test_data.py",
             "E0806": "a checkpoint beside the .scale file: tests/test_hf_header.py",
             "E0807": "a checkpoint beside the .scale file: tests/test_hf_header.py, "
                      "tests/mistakes/files_init_from_gpt2.scale",
             "E0808": "a checkpoint beside the .scale file: tests/test_hf_header.py, "
                      "tests/mistakes/files_init_from_wider_llama.scale",
             "E0809": "a checkpoint beside the .scale file: tests/test_hf_header.py",
             "E0810": "a checkpoint beside the .scale file: tests/test_hf_header.py",
             "E0811": "a token file with a sidecar beside the .scale file: "
                      "tests/mistakes/files_eval_split_too_small.scale",
             "E0813": "a .npy token file beside the .scale file: tests/test_data.py, "
                      "tests/mistakes/files_npy_float_values.scale",
             "E0814": "a Megatron dataset beside the .scale file: "
                      "tests/test_data.py::test_a_megatron_index_of_ids_we_do_not_read_is_refused",
             "E0812": "a token file beside the .scale file: tests/mistakes/files_packed_separator_outside_vocab.scale",
             "E0319": "a token file beside the .scale file: tests/mistakes/files_packed_sliding_window.scale",
             "E0318": "a token file beside the .scale file: tests/mistakes/files_packed_with_compile.scale, "
                      "tests/mistakes/files_packed_with_ep.scale",
             "E0390": "torchao missing where the file is checked (installed here, and in CI): "
                      "tests/test_fp8.py::test_missing_torchao_is_refused_at_the_setting",
             "E0391": "a torch whose CPU float8 matmul fails (not torch 2.13, so not here): "
                      "tests/test_fp8.py::test_cpu_without_float8_matmul_is_refused",
             "E0609": "no .scale file reaches it (a defect of the schedule builder): "
                      "tests/test_cost.py::test_compile_refuses_a_schedule_that_fails_verification"}


def test_every_code_has_a_case():
    """Each diagnostic code the checker can emit has at least one golden case."""
    source = "".join(p.read_text() for p in (Path(__file__).parents[1] / "compiler").rglob("*.py")
                     if p.name != "codes.py")  # the register of codes emits none (it lists retired ones too)
    emitted = set(re.findall(r'"(E\d{4})"', source))
    covered = {code for case in CASES for _, code in _markers(case.read_text())} | set(ELSEWHERE)
    assert emitted - covered == set(), f"codes without a golden case: {sorted(emitted - covered)}"


def test_cli_reports_without_traceback(tmp_path):
    bad = tmp_path / "bad.scale"
    bad.write_text((Path(__file__).parent / "golden" / "diagnostics" / "heads_not_dividing_hidden.scale").read_text())
    proc = subprocess.run([sys.executable, "-m", "compiler.cli", "check", str(bad)], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1])
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"{bad}:5:" in proc.stderr and "error[E0201]" in proc.stderr and "^" in proc.stderr


def test_cli_missing_file_is_an_error_not_a_traceback(tmp_path):
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["plan", str(tmp_path / "nope.scale")])
    assert code == 1 and "no such file" in err.getvalue()


def test_corrupted_sample_gives_located_diagnostic():
    """Every sample, cut short anywhere, fails with a located diagnostic and never a Python exception."""
    for sample in sorted((Path(__file__).parents[1] / "samples").glob("*.scale")):
        text = sample.read_text()
        for cut in range(0, len(text), max(1, len(text) // 23)):
            try:
                check_text(text[:cut], "cut.scale")
            except ScaleError as e:
                assert all(d.span is not None for d in e.diagnostics)
                e.render()


# -- a converter's None: failure (reported) or the value None (a written `none`) ------------------------------------

def _none_at(span):
    from compiler import ast
    return ast.Name("none", span)


def test_a_failed_conversion_without_an_error_is_an_internal_error():
    """A converter returning None without reporting anything would drop its layer silently (`shared_ffn = none` once
    made the whole moe layer vanish): bind refuses it, and a converter meaning "absent" returns binder.NONE."""
    from compiler import ast
    from compiler.binder import NONE, Checker, Param, _Unreported
    from compiler.diagnostics import Span
    span = Span("t.scale", 1, 1, 1, 5)
    c = Checker(None, "")
    silent = {"x": Param(lambda c, e, w: None, 1, "a converter that fails without saying why")}
    with pytest.raises(_Unreported, match="without reporting an error"):
        c.bind((ast.Arg(None, _none_at(span), span),), silent, "`layer`", span)
    absent = {"x": Param(lambda c, e, w: NONE, 1, "a converter whose `none` means absent")}
    assert c.bind((ast.Arg(None, _none_at(span), span),), absent, "`layer`", span) == {"x": None}
    assert not c.diags
    reported = {"x": Param(lambda c, e, w: c.error("E0120", "bad", span), 1, "a converter that reports")}
    assert c.bind((ast.Arg(None, _none_at(span), span),), reported, "`layer`", span) is None
    assert [d.code for d in c.diags] == ["E0120"]


def test_every_argument_that_accepts_none_means_its_default():
    """Every argument and setting of the vocabulary, given `none`: either an error is reported, or its value is the
    argument's default (None: absent) — never a silent failure."""
    from compiler import check
    from compiler.binder import NONE, Checker
    from compiler.diagnostics import Span
    from compiler.layers import SCHEMAS
    span = Span("t.scale", 1, 1, 1, 5)
    tables = {**{f"layer {k}": v for k, v in SCHEMAS.items()}, "mesh": check.MESH_SETTINGS,
              "plan": check.PLAN_SETTINGS, "train": check.TRAIN_SETTINGS}
    accepting = []
    for what, table in tables.items():
        for key, p in table.items():
            c = Checker(None, "")
            v = p.convert(c, _none_at(span), f"`{key}`")
            if v is None:
                assert c.errors(), f"{what}: `{key} = none` failed without an error"
            else:
                assert not c.errors(), f"{what}: `{key} = none` gave {v!r} and an error"
                accepting.append(f"{what}.{key}")
                if v is NONE:
                    assert p.default is None, f"{what}: `{key} = none` is absent, but its default is {p.default!r}"
    assert {"layer moe.shared_ffn", "layer attention.rope_scaling"} <= set(accepting), accepting


def test_rope_scaling_none_keeps_the_attention():
    text = """
model m {
  vocab = 32
  hidden = 16
  heads = 2
  seq = 8
  embedding(vocab, hidden)
  residual { rmsnorm(hidden)  attention(hidden, heads, rope_theta = 10000ROPE) }
  rmsnorm(hidden)
  lm_head(vocab, hidden)
  cross_entropy
}
mesh { axis dp = 1  nodes = 1  devices_per_node = 1 }
train { global_batch = 2  seq_len = seq  steps = 1  optimizer = adamw(lr = 1e-3) }
"""
    plain = compile_spec(check_text(text.replace("ROPE", ""), "plain.scale"))
    none = compile_spec(check_text(text.replace("ROPE", ", rope_scaling = none"), "none.scale"))
    assert none.costs.params_n == plain.costs.params_n > 0
    assert [type(x).__name__ for x in none.spec.model.layers] == [type(x).__name__ for x in plain.spec.model.layers]
