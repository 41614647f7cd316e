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
             "E0901": "scalec reshard OLD NEW on two different models: tests/test_reshard.py",
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
             "E0812": "a token file beside the .scale file: tests/mistakes/files_packed_separator_outside_vocab.scale",
             "E0319": "a token file beside the .scale file: tests/mistakes/files_packed_sliding_window.scale",
             "E0318": "a token file beside the .scale file: tests/mistakes/files_packed_with_tp.scale, "
                      "tests/mistakes/files_packed_with_pp.scale",
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
