"""`scalec reshard OLD NEW`: each tensor's pieces under both plans and the bytes each rank of NEW reads, derived from
the compiled plans; plans of different models refused with a diagnostic located in NEW."""
from __future__ import annotations

from pathlib import Path

from compiler.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_reshard_3d_to_pp2_matches_golden(golden, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["reshard", "samples/gpt_3d.scale", "samples/gpt_pp.scale"]) == 0
    out = capsys.readouterr().out
    golden.check("reshard/gpt_3d_to_gpt_pp.txt", out)
    # Rank 0 holds stage 0 (embedding, positions, blocks 0-1), rank 1 stage 1 (blocks 2-3, norm, the tied
    # embedding's copy): every parameter once, the tied embedding twice, each with two moments, fp32.
    reads = [int(line.rsplit(": ", 1)[1].split(" tensors, ")[1].removesuffix(" B").replace(",", ""))
             for line in out.splitlines() if line.startswith("  rank ")]
    assert sum(reads) == (210_304 + 128 * 64) * 3 * 4


def test_reshard_padded_vocabulary_shows_uneven_pieces(tmp_path, capsys, monkeypatch):
    text = (ROOT / "samples" / "gpt_tp.scale").read_text().replace("vocab  = 128", "vocab  = 127").replace(
        "micro_batches = 1", "micro_batches = 1  pad_vocab = true")
    (tmp_path / "pad.scale").write_text(text)
    (tmp_path / "one.scale").write_text(text.replace("axis tp = 2", "axis dp = 1").replace(
        "devices_per_node = 2", "devices_per_node = 1").replace("pad_vocab = true", ""))
    monkeypatch.chdir(tmp_path)
    assert main(["reshard", "pad.scale", "one.scale"]) == 0
    out = capsys.readouterr().out
    assert "embed.weight              127×64  tp dim 0 in 2 (64/63)" in out
    assert "rank 0 (the one device): 36 tensors, 1,323,264 B" in out  # 110,272 parameters × 3 × 4 B


def test_reshard_refuses_another_model(tmp_path, capsys, monkeypatch):
    narrow = (ROOT / "samples" / "gpt_dp.scale").read_text().replace("ffn    = 4 * hidden", "ffn    = 2 * hidden")
    (tmp_path / "narrow.scale").write_text(narrow)
    (tmp_path / "tp.scale").write_text((ROOT / "samples" / "gpt_tp.scale").read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["reshard", "tp.scale", "narrow.scale"]) == 1
    err = capsys.readouterr().err
    assert "error[E0901]: the models differ: `blocks.0.mlp_up.weight` is 128×64 here and 256×64 in tp.scale" in err
    assert "--> narrow.scale:16:35" in err and "mlp(hidden, ffn, act = gelu)" in err
    assert main(["reshard", str(ROOT / "samples" / "gpt_pp.scale"), "tp.scale"]) == 1
    err = capsys.readouterr().err
    assert "has `blocks.2.norm_1.weight` and 31 more parameters that this model lacks" in err
    assert "--> tp.scale:15:3" in err


def test_reshard_places_the_blocks_of_two_repeats_on_their_stages(tmp_path, capsys, monkeypatch):
    """A dense `repeat 1` then a MoE `repeat 3` (tests/test_pipeline_split.py): under pp 2 with stages (0, 2), (2, 4)
    the dense block and the first MoE block (`blocks_2.0`, global block 1) are stage 0's, `blocks_2.1` stage 1's."""
    from tests.test_pipeline_split import PP2, _dense_first
    (tmp_path / "pp.scale").write_text(_dense_first(**PP2, micro_batches=2, layout=((0, 2), (2, 4))))
    (tmp_path / "one.scale").write_text(_dense_first(axes=(("dp", 1),), devices_per_node=1, micro_batches=2))
    monkeypatch.chdir(tmp_path)
    assert main(["reshard", "one.scale", "pp.scale"]) == 0
    out = capsys.readouterr().out
    row = {line.split()[0]: line for line in out.splitlines() if line.startswith("blocks")}
    assert row["blocks.0.attn_q.weight"].endswith("stage 0"), row["blocks.0.attn_q.weight"]
    assert row["blocks_2.0.moe_router.weight"].endswith("stage 0")
    assert row["blocks_2.1.moe_router.weight"].endswith("stage 1")
