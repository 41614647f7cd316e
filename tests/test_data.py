"""Token files: what `check` says about the file a plan names, and the one-line errors the runtime gives when it
opens one (runtime.data.open_tokens), ids against the vocabulary included."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compiler.check import check_text
from compiler.diagnostics import ScaleError
from runtime import data

ROOT = Path(__file__).resolve().parents[1]


def _check(tmp_path: Path, dtype: str = "uint16") -> None:
    text = (ROOT / "samples" / "tiny_gpt.scale").read_text().replace(
        "log_every    = 5", f'log_every    = 5\n  data = tokens(path = "tok.bin", dtype = {dtype})')
    check_text(text, str(tmp_path / "tiny.scale"))


@pytest.mark.parametrize("content,dtype,message,label", [
    (None, "uint16", "does not exist", "no such file"),
    ("dir", "uint16", "is a directory", "not a file of token ids"),
    (b"", "uint16", "is empty", "no tokens"),
    (b"\0" * 301, "uint16", "holds 301 bytes, not a whole number of uint16 ids", "301 % 2 == 1"),
    (b"\0" * 302, "uint32", "holds 302 bytes, not a whole number of uint32 ids", "302 % 4 == 2"),
    (b"\0" * 60, "uint16", "holds 30 tokens, too few for one sequence of 64", ""),
], ids=["missing", "directory", "empty", "odd_uint16", "uint32", "short"])
def test_check_reports_the_data_file_at_its_path(tmp_path, content, dtype, message, label):
    f = tmp_path / "tok.bin"
    if content == "dir":
        f.mkdir()
    elif content is not None:
        f.write_bytes(content)
    with pytest.raises(ScaleError) as info:
        _check(tmp_path, dtype)
    (d,) = info.value.diagnostics
    assert d.code == "E0801" and f"data file {f} {message}" in d.message and d.label == label
    assert d.span.line == 34 and d.span.end_col - d.span.col == len('"tok.bin"')


def test_check_accepts_a_fitting_file_beside_the_scale_file(tmp_path):
    (tmp_path / "tok.bin").write_bytes(np.arange(200, dtype=np.uint32).tobytes())
    _check(tmp_path, "uint32")
    _check(tmp_path, "uint16")  # 800 bytes are 400 uint16 ids too: the size fits; ids are the run's to check


def _write(tmp_path: Path, ids, dtype="uint16") -> str:
    path = tmp_path / "t.bin"
    np.asarray(ids, dtype=dtype).tofile(path)
    return str(path)


def test_open_tokens_names_the_first_id_outside_the_vocabulary(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "CHUNK", 7)  # the id sits in a later chunk than the first
    ids = [1] * 20 + [300, 5, 301]
    with pytest.raises(SystemExit) as info:
        data.open_tokens(_write(tmp_path, ids), "uint16", 256)
    assert str(info.value) == (f"scalec: data file {tmp_path / 't.bin'}: token id 300 at position 20 is outside "
                               "the vocabulary of 256 (ids 0..255)")
    assert len(data.open_tokens(_write(tmp_path, ids[:20] + [255]), "uint16", 256)) == 21


def test_open_tokens_rejects_negative_int32_ids(tmp_path):
    with pytest.raises(SystemExit, match="token id -1 at position 2 is outside"):
        data.open_tokens(_write(tmp_path, [0, 1, -1, 2], "int32"), "int32", 256)


@pytest.mark.parametrize("make,message", [
    (lambda p: None, "no such file"),
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_bytes(b""), "is empty"),
    (lambda p: p.write_bytes(b"\0" * 7), "holds 7 bytes, not a whole number of uint16 token ids"),
], ids=["missing", "directory", "empty", "odd"])
def test_open_tokens_one_line_errors(tmp_path, make, message):
    path = tmp_path / "t.bin"
    make(path)
    with pytest.raises(SystemExit) as info:
        data.TokenFile(str(path), "uint16", 16, 0, 256)
    text = str(info.value)
    assert text.startswith(f"scalec: data file {path}") and message in text and "\n" not in text


def test_resolve_is_relative_to_the_program(tmp_path):
    program = str(tmp_path / "build" / "program.py")
    assert data.resolve("../data/t.bin", program) == str(tmp_path / "data" / "t.bin")
    assert data.resolve("/abs/t.bin", program) == "/abs/t.bin"
    assert data.resolve("", program) == ""
