"""Compiled output of every sample: pinned by goldens, deterministic, valid, and closed to injection."""
from __future__ import annotations

import ast as pyast
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compiler import codegen
from compiler.check import check_text
from compiler.report.plan import plan_text
from compiler.pipeline import compile_spec

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "samples").glob("*.scale"))


def _compile(path: Path, out: Path):
    rel = path.relative_to(ROOT).as_posix()
    compiled = compile_spec(check_text(path.read_text(encoding="utf-8"), rel), check_between=True)
    codegen.emit(compiled, str(out))
    return compiled


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.stem for s in SAMPLES])
def test_sample_output_matches_golden(sample, tmp_path, golden):
    compiled = _compile(sample, tmp_path)
    for name in ("program.py", "plan.json", "launch.sh", "launch.sbatch"):
        golden.check(f"samples/{sample.stem}/{name}", (tmp_path / name).read_text(encoding="utf-8"))
    golden.check(f"samples/{sample.stem}/plan.txt", plan_text(compiled))
    # Semantic pairing of the goldens: the program is valid Python and the launcher valid bash.
    compile((tmp_path / "program.py").read_text(), "program.py", "exec")
    for script in ("launch.sh", "launch.sbatch"):
        assert subprocess.run(["bash", "-n", str(tmp_path / script)]).returncode == 0
        assert os.access(tmp_path / script, os.X_OK)


def _digest(out: Path, hashseed: str) -> str:
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    subprocess.run([sys.executable, "-m", "compiler.cli", "compile", "samples/gpt_dp.scale", "-o", str(out)],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    h = hashlib.sha256()
    for f in sorted(out.iterdir()):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def test_compiling_twice_is_byte_identical(tmp_path):
    """Two processes with different hash seeds write the same bytes."""
    assert _digest(tmp_path / "a", "1") == _digest(tmp_path / "b", "2")


def test_program_does_not_grow_with_world_size(tmp_path):
    """Rank-generic output: the same model on 2 and on 1536 ranks emits the same program, but for its header and
    mesh constants."""
    text = (ROOT / "samples" / "gpt_dp.scale").read_text()
    small = _compile_text(text, tmp_path / "small")
    big = _compile_text(text.replace("axis dp = 2", "axis dp = 1536").replace("nodes = 1", "nodes = 192")
                        .replace("devices_per_node = 2", "devices_per_node = 8")
                        .replace("global_batch = 16", "global_batch = 1536"), tmp_path / "big")
    assert len(small.splitlines()) == len(big.splitlines())


def _compile_text(text: str, out: Path) -> str:
    compiled = compile_spec(check_text(text, "samples/gpt_dp.scale"))
    codegen.emit(compiled, str(out))
    return (out / "program.py").read_text()


HOSTILE = 'x\\"); import os; os.system(\\"echo pwned\\") #'


def test_user_strings_cannot_inject_code(tmp_path):
    text = (ROOT / "samples" / "gpt_dp.scale").read_text()
    text = text.replace("data         = synthetic", f'data = tokens(path = "{HOSTILE}")\n'
                        f'  checkpoint_dir = "{HOSTILE}\\n import os"')
    # The data file exists (check looks for it beside the .scale file), under the hostile name itself.
    (tmp_path / 'x"); import os; os.system("echo pwned") #').write_bytes(bytes(1024))
    compiled = compile_spec(check_text(text, str(tmp_path / "gpt_dp.scale")))
    codegen.emit(compiled, str(tmp_path))
    program = (tmp_path / "program.py").read_text()
    tree = pyast.parse(program)
    calls = {n.func.attr for n in pyast.walk(tree) if isinstance(n, pyast.Call)
             and isinstance(n.func, pyast.Attribute)}
    assert "system" not in calls
    strings = [n.value for n in pyast.walk(tree) if isinstance(n, pyast.Constant) and isinstance(n.value, str)]
    assert 'x"); import os; os.system("echo pwned") #' in strings
    assert 'x"); import os; os.system("echo pwned") #\n import os' in strings
    assert not any(line.startswith(" import os") for line in program.splitlines())


def test_comments_and_paths_cannot_inject_code(tmp_path):
    """A .scale comment and the file's own path reach generated files only as one-line `#` comments."""
    text = (ROOT / "samples" / "gpt_dp.scale").read_text().replace(
        "repeat layers {", "repeat layers {  # \"\"\"; import os; os.system('touch PWNED'); \"\"\"")
    evil_dir = tmp_path / "a\ntouch PWNED\n#"
    evil_dir.mkdir()
    src = evil_dir / "x\n__import__('os').system('touch PWNED')\n.scale"
    src.write_text(text)
    compiled = compile_spec(check_text(text, str(src)))
    codegen.emit(compiled, str(tmp_path / "out"))
    program = (tmp_path / "out" / "program.py").read_text()
    tree = pyast.parse(program)
    assert not [n for n in pyast.walk(tree) if isinstance(n, pyast.Call) and getattr(n.func, "attr", "") == "system"]
    launch = (tmp_path / "out" / "launch.sh").read_text()
    assert not any(line.lstrip().startswith("touch") for line in launch.splitlines())
    assert not any(line.lstrip().startswith(("touch", "__import__")) for line in program.splitlines())


def test_output_does_not_depend_on_how_the_path_is_spelt(tmp_path):
    text = (ROOT / "samples" / "gpt_dp.scale").read_text()
    outs = []
    for i, path in enumerate(("gpt_dp.scale", "./gpt_dp.scale", "/somewhere/else/gpt_dp.scale")):
        compiled = compile_spec(check_text(text, path))
        codegen.emit(compiled, str(tmp_path / str(i)))
        outs.append([(tmp_path / str(i) / f).read_bytes()
                     for f in ("program.py", "plan.json", "launch.sh", "launch.sbatch")])
    assert outs[0] == outs[1] == outs[2]


def test_imports_follow_the_code_not_the_file_name(tmp_path):
    """A dense model compiled from a file whose name mentions `moe` imports no MoE runtime: the provenance comments
    (`my_moe.scale:14`) are not code."""
    text = (ROOT / "samples" / "gpt_dp.scale").read_text()
    compiled = compile_spec(check_text(text, "my_moe.scale"))
    codegen.emit(compiled, str(tmp_path))
    program = (tmp_path / "program.py").read_text()
    assert "my_moe.scale:" in program and "from runtime import train\n" in program
