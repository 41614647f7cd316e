"""`scalec data` (compiler/datasets.py, runtime/indexed.py): text and JSONL files tokenized with a local Hugging Face
tokenizer into Megatron-LM's indexed dataset (.bin/.idx) and our sidecar; the .bin trains as a token file."""
from __future__ import annotations

import io
import json
import re
import struct
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from compiler.cli import main
from runtime import data, indexed

TEXTS = ["the cat sat on the mat", "a dog ran", "the mat is on the dog é"]


def _tokenizer(tmp_path: Path) -> Path:
    """A word-level tokenizer trained here on the texts (tokenizers trains offline), with `</s>` and `[UNK]`. The
    tests that need one are skipped where tokenizers is missing (a dev extra), naming what to install."""
    pytest.importorskip("tokenizers", reason="tokenizers is not installed: pip install -e '.[dev]' (or '.[data]')")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(TEXTS, trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"]))
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    tok.save(str(path))
    return path


def _run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["data", *map(str, argv)])
    return rc, out.getvalue(), err.getvalue()


def test_documents_are_tokenized_into_megatron_s_layout(tmp_path):
    from tokenizers import Tokenizer
    tok_path = _tokenizer(tmp_path)
    (tmp_path / "a.txt").write_text(TEXTS[0], encoding="utf-8")
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(TEXTS[1:]))
                                      + "\n\n", encoding="utf-8")
    rc, out, err = _run(tmp_path / "a.txt", tmp_path / "b.jsonl", "--tokenizer", tok_path.parent,
                        "--separator", "</s>", "-o", tmp_path / "out" / "corpus", "--quiet")
    assert rc == 0, err
    tok = Tokenizer.from_file(str(tok_path))
    eod = tok.token_to_id("</s>")
    want = [tok.encode(t, add_special_tokens=False).ids + [eod] for t in TEXTS]
    assert f"({sum(map(len, want))} uint16 tokens in 3 documents, each ended by id {eod})" in out, out
    prefix = str(tmp_path / "out" / "corpus")
    got = indexed.Reader(prefix)
    assert len(got) == 3 and [list(got[i]) for i in range(3)] == want
    # the index, byte by byte as Megatron-Core's _IndexReader reads it
    raw = Path(prefix + ".idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00" and struct.unpack("<QBQQ", raw[9:34]) == (1, 8, 3, 4)
    lengths = np.frombuffer(raw, "<i4", 3, 34)
    pointers = np.frombuffer(raw, "<i8", 3, 34 + 12)
    docs = np.frombuffer(raw, "<i8", 4, 34 + 12 + 24)
    assert list(lengths) == [len(w) for w in want] and list(docs) == [0, 1, 2, 3]
    assert list(pointers) == [0, 2 * len(want[0]), 2 * (len(want[0]) + len(want[1]))]
    # the flat .bin is a token file with its sidecar: the separators keep the boundaries in the stream
    side = json.loads(Path(prefix + ".bin.json").read_text())
    assert side["dtype"] == "uint16" and side["vocab_size"] == tok.get_vocab_size() and side["documents"] == 3
    assert side["tokenizer"] == str(tok_path) and side["document_separator"] == eod
    ids = data.open_tokens(prefix + ".bin", "uint16", tok.get_vocab_size())
    assert list(ids) == [i for w in want for i in w]


def test_the_written_file_checks_as_training_data(tmp_path):
    """A .scale file whose `tokens(path = ...)` names the .bin, with the tokenizer's vocabulary, checks; a model
    with a smaller vocabulary is refused by the sidecar."""
    tok_path = _tokenizer(tmp_path)
    (tmp_path / "a.txt").write_text(" ".join(TEXTS * 50), encoding="utf-8")
    rc, out, err = _run(tmp_path / "a.txt", "--tokenizer", tok_path, "-o", tmp_path / "corpus", "--quiet")
    assert rc == 0, err
    vocab = json.loads((tmp_path / "corpus.bin.json").read_text())["vocab_size"]
    assert f"vocab = {vocab}" in out
    sample = (Path(__file__).parents[1] / "samples" / "tiny_gpt.scale").read_text()
    text = re.sub(r"vocab\s*=\s*\d+", f"vocab = {vocab}", sample, count=1)
    assert "  log_every    = 5\n" in text
    text = text.replace("  log_every    = 5\n", '  log_every    = 5\n  data = tokens(path = "corpus.bin")\n')
    (tmp_path / "ok.scale").write_text(text)
    buf = io.StringIO()
    with redirect_stdout(buf), redirect_stderr(buf):
        assert main(["check", str(tmp_path / "ok.scale")]) == 0, buf.getvalue()
    (tmp_path / "small.scale").write_text(text.replace(f"vocab = {vocab}", f"vocab = {vocab - 1}", 1))
    with redirect_stdout(buf), redirect_stderr(buf):
        assert main(["check", str(tmp_path / "small.scale")]) == 1


@pytest.mark.parametrize("case,want", [
    ("no tokenizer", "no tokenizer at"),
    ("unknown separator", "has no token '<eos>'"),
    ("jsonl without the key", "b.jsonl:2: no string under \"text\""),
    ("other file", "not a .txt or .md (one document) or .jsonl (one a line) file"),
])
def test_bad_inputs_are_one_line_errors(tmp_path, case, want):
    tok_path = _tokenizer(tmp_path)
    (tmp_path / "b.jsonl").write_text('{"text": "a dog"}\n{"body": "the cat"}\n', encoding="utf-8")
    (tmp_path / "c.csv").write_text("x\n")
    args = {"no tokenizer": (tmp_path / "b.jsonl", "--tokenizer", tmp_path / "nowhere"),
            "unknown separator": (tmp_path / "b.jsonl", "--tokenizer", tok_path, "--separator", "<eos>"),
            "jsonl without the key": (tmp_path / "b.jsonl", "--tokenizer", tok_path),
            "other file": (tmp_path / "c.csv", "--tokenizer", tok_path)}[case]
    rc, out, err = _run(*args, "-o", tmp_path / "x", "--quiet")
    assert rc == 1 and want in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not list(tmp_path.glob("x.*"))  # nothing half-written is left


def test_without_tokenizers_one_line_names_what_to_install(tmp_path, monkeypatch):
    """`pip install .` without the `data` extra: `scalec data` says in one line what to install, exit 1, and
    writes nothing."""
    monkeypatch.setitem(__import__("sys").modules, "tokenizers", None)  # import tokenizers -> ImportError
    (tmp_path / "a.txt").write_text(TEXTS[0])
    rc, out, err = _run(tmp_path / "a.txt", "--tokenizer", tmp_path / "tokenizer.json", "-o", tmp_path / "out" / "d")
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and "pip install 'scalec[data]'" in err, err
    assert not (tmp_path / "out").exists()
