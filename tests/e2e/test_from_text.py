"""The three commands of docs/running.md from raw text to a trained, evaluated model (`data`, `run`, `export`), run
as the page writes them (only `--steps` shortens the run), in a copy of what they read: the exported directory loads
in transformers with its tokenizer."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    page = (ROOT / "docs" / "running.md").read_text(encoding="utf-8")
    section = page.split("## From text to a trained model", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```sh\n(.*?)```", section, re.S)[0]
    return [line.strip() for line in block.replace("\\\n", " ").strip().splitlines()]


def test_the_three_commands(tmp_path):
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    commands = readme_commands()
    assert [c.split()[1] for c in commands] == ["data", "run", "export"]
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")  # the text is the README and pages of docs/
    shutil.copytree(ROOT / "samples" / "text", tmp_path / "samples" / "text")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    outputs = []
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "scalec"
        if argv[1] == "run":
            argv += ["--steps", "60"]
        done = subprocess.run([sys.executable, "-m", "compiler.cli", *argv[1:]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout + done.stderr)
    evals = re.findall(r"^eval +(\d+)/60 \| loss +([\d.]+) \| ppl", outputs[1], re.M)
    assert [int(s) for s, _ in evals] == [50, 60], outputs[1]
    first = float(re.search(r"^step +1/60 \| loss +([\d.]+)", outputs[1], re.M).group(1))
    assert float(evals[-1][1]) < first, "the held-out loss should fall below the first step's loss"
    hf = tmp_path / "build" / "text" / "hf"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in hf.iterdir()}
    model = transformers.AutoModelForCausalLM.from_pretrained(hf)
    tok = transformers.AutoTokenizer.from_pretrained(hf)
    assert model.config.vocab_size == len(tok) == 512
    plan = subprocess.run([sys.executable, "-m", "compiler.cli", "plan", "samples/text/llama_text.scale", "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert sum(p.numel() for p in model.parameters()) == json.loads(plan.stdout)["parameters"]
