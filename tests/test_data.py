"""Token files: what `check` says about the file a plan names, and the one-line errors the runtime gives when it
opens one (runtime.data.open_tokens), ids against the vocabulary included."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compiler.check import check_text
from compiler.diagnostics import ScaleError
import torch

from runtime import data
from runtime.errors import FatalError

ROOT = Path(__file__).resolve().parents[1]


def _check(tmp_path: Path, dtype: str | None = "uint16"):
    """tiny_gpt (vocabulary 128, seq_len 64) reading tok.bin beside it; the Spec (its warnings) or ScaleError."""
    args = 'path = "tok.bin"' + (f", dtype = {dtype}" if dtype else "")
    text = (ROOT / "samples" / "tiny_gpt.scale").read_text().replace(
        "log_every    = 5", f"log_every    = 5\n  data = tokens({args})")
    return check_text(text, str(tmp_path / "tiny.scale"))


def _errors(tmp_path: Path, dtype: str | None = "uint16") -> list:
    with pytest.raises(ScaleError) as info:
        _check(tmp_path, dtype)
    return info.value.diagnostics


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
    ids = np.random.default_rng(0).integers(0, 128, 400)
    for dtype in ("uint16", "uint32", "int32"):
        (tmp_path / "tok.bin").write_bytes(ids.astype(dtype).tobytes())
        assert _check(tmp_path, dtype).warnings == ()


# -- bare files: what the first MiB says -------------------------------------------------------------------------

def test_a_uint32_file_declared_uint16_is_named_by_a_warning_at_the_dtype(tmp_path):
    (tmp_path / "tok.bin").write_bytes((np.arange(200) % 128).astype(np.uint32).tobytes())
    (w,) = _check(tmp_path, "uint16").warnings
    assert w.code == "W0803" and w.severity == "warning"
    assert w.message == (f"`dtype = uint16`, but every odd uint16 of the first 800 bytes of {tmp_path / 'tok.bin'} "
                         "is 0: the file looks like uint32")
    assert w.span.line == 34 and w.span.end_col - w.span.col == len("uint16")  # at the dtype written
    (w,) = _check(tmp_path, None).warnings  # a defaulted dtype: at the path
    assert w.code == "W0803" and w.span.end_col - w.span.col == len('"tok.bin"')
    assert _check(tmp_path, "uint32").warnings == ()


def test_a_uint16_file_declared_uint32_is_an_error_that_names_uint16(tmp_path):
    (tmp_path / "tok.bin").write_bytes((np.arange(400) % 128).astype(np.uint16).tobytes())
    (d,) = _errors(tmp_path, "uint32")
    assert d.code == "E0804" and d.span.end_col - d.span.col == len("uint32")
    assert f"data file {tmp_path / 'tok.bin'}: token id 65536 at position 0 is outside the vocabulary of 128" \
        in d.message
    assert "read as uint16, every id of those bytes is inside the vocabulary" in d.help
    assert d.help.endswith("Write `dtype = uint16`")


def test_an_id_outside_the_vocabulary_in_the_sample_is_an_error_at_the_path(tmp_path):
    ids = np.arange(300) % 128
    ids[150] = 200
    (tmp_path / "tok.bin").write_bytes(ids.astype(np.uint16).tobytes())
    (d,) = _errors(tmp_path, "uint16")
    assert d.code == "E0804" and "token id 200 at position 150 is outside the vocabulary of 128" in d.message
    assert d.span.end_col - d.span.col == len('"tok.bin"') and d.label == "in its first 600 bytes"


def test_check_reads_a_bounded_sample_of_a_large_file(tmp_path, monkeypatch):
    """However large the file, check reads SAMPLE_BYTES of it: an id past them is the run's to find."""
    from compiler import files
    reads = []
    real_open = open

    def spy(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        if str(path).endswith("tok.bin") and "b" in mode:
            real_read = f.read
            f.read = lambda n=-1: reads.append(n) or real_read(n)
        return f
    ids = (np.arange(3 << 20) % 128).astype(np.uint16)  # 6 MiB
    ids[-1] = 500
    (tmp_path / "tok.bin").write_bytes(ids.tobytes())
    monkeypatch.setattr("builtins.open", spy)
    assert _check(tmp_path, "uint16").warnings == ()
    assert reads == [files.SAMPLE_BYTES]


# -- sidecars: what the file says of itself ----------------------------------------------------------------------

def test_write_tokens_writes_the_file_and_its_sidecar(tmp_path):
    import json
    side = data.write_tokens(str(tmp_path / "t.bin"), [3, 1, 2], "uint32", 50257, tokenizer="gpt2")
    assert json.loads((tmp_path / "t.bin.json").read_text()) == side == {
        "format": "scalec-tokens/1", "dtype": "uint32", "vocab_size": 50257, "tokens": 3, "tokenizer": "gpt2"}
    assert np.fromfile(tmp_path / "t.bin", dtype="<u4").tolist() == [3, 1, 2]
    from compiler import files  # the check's reader reads what the runtime writes
    assert files.read_sidecar(str(tmp_path / "t.bin")) == files.Sidecar(
        dtype="uint32", vocab_size=50257, tokens=3, tokenizer="gpt2", path=str(tmp_path / "t.bin.json"))
    with pytest.raises(ValueError, match="token id 9 at position 1 is outside the vocabulary of 8"):
        data.write_tokens(str(tmp_path / "u.bin"), [1, 9], "uint16", 8)
    with pytest.raises(ValueError, match="does not fit uint16"):
        data.write_tokens(str(tmp_path / "u.bin"), [1], "uint16", 70000)


def test_a_sidecar_dtype_other_than_the_declared_one_is_an_error_at_the_dtype(tmp_path):
    data.write_tokens(str(tmp_path / "tok.bin"), np.arange(200) % 128, "uint32", 128)
    (d,) = _errors(tmp_path, "uint16")
    assert d.code == "E0803" and d.message == (f"data file {tmp_path / 'tok.bin'} holds uint32 ids, but the file "
                                               "declares uint16")
    assert d.span.end_col - d.span.col == len("uint16") and "`dtype = uint32`" in d.help
    (d,) = _errors(tmp_path, None)  # the default uint16: at the path
    assert d.code == "E0803" and d.span.end_col - d.span.col == len('"tok.bin"')
    assert _check(tmp_path, "uint32").warnings == ()


def test_a_sidecar_vocabulary_larger_than_the_model_is_an_error(tmp_path):
    data.write_tokens(str(tmp_path / "tok.bin"), np.arange(200) % 128, "uint32", 50257, tokenizer="gpt2")
    (d,) = _errors(tmp_path, "uint32")
    assert d.code == "E0804" and "has a vocabulary of 50257 tokens (gpt2), the model 128" in d.message
    assert "make `vocab` at least 50257" in d.help


def test_a_sidecar_that_disagrees_with_the_file_size_is_an_error(tmp_path):
    data.write_tokens(str(tmp_path / "tok.bin"), np.arange(200) % 128, "uint16", 128)
    with open(tmp_path / "tok.bin", "ab") as f:
        f.write(b"\0\0")
    (d,) = _errors(tmp_path, "uint16")
    assert d.code == "E0805" and "holds 402 bytes, but its sidecar says 200 uint16 ids (400 bytes)" in d.message


@pytest.mark.parametrize("text,message", [
    ("{", "is not readable JSON"),
    ('{"format": "other"}', "is not a token-file sidecar"),
    ('{"format": "scalec-tokens/1", "dtype": "int8", "vocab_size": 8, "tokens": 1}', '"dtype" is \'int8\''),
    ('{"format": "scalec-tokens/1", "dtype": "uint16", "vocab_size": 0, "tokens": 1}', '"vocab_size" is 0'),
], ids=["json", "format", "dtype", "vocab"])
def test_an_unreadable_sidecar_is_an_error(tmp_path, text, message):
    (tmp_path / "tok.bin").write_bytes(np.zeros(200, np.uint16).tobytes())
    (tmp_path / "tok.bin.json").write_text(text)
    (d,) = _errors(tmp_path, "uint16")
    assert d.code == "E0805" and message in d.message


@pytest.mark.parametrize("dtype,vocab,extra,message", [
    ("uint32", 256, b"", "holds uint32 ids (its sidecar says so), but the program reads uint16"),
    ("uint16", 50257, b"", "has a vocabulary of 50257 tokens (its sidecar says so), the model 256"),
    ("uint16", 256, b"\0\0", "holds 42 bytes, but its sidecar says 20 uint16 ids"),
], ids=["dtype", "vocab", "length"])
def test_open_tokens_refuses_a_sidecar_that_disagrees(tmp_path, dtype, vocab, extra, message):
    path = str(tmp_path / "t.bin")
    data.write_tokens(path, np.arange(20), dtype, vocab)
    with open(path, "ab") as f:
        f.write(extra)
    with pytest.raises(FatalError) as info:
        data.open_tokens(path, "uint16", 256)
    assert str(info.value) == f"scalec: data file {path} {message}"
    data.write_tokens(path, np.arange(20), "uint16", 200)
    assert len(data.open_tokens(path, "uint16", 256)) == 20  # an agreeing sidecar (a smaller vocabulary) opens


def _write(tmp_path: Path, ids, dtype="uint16") -> str:
    path = tmp_path / "t.bin"
    np.asarray(ids, dtype=dtype).tofile(path)
    return str(path)


def test_open_tokens_names_the_first_id_outside_the_vocabulary(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "CHUNK", 7)  # the id sits in a later chunk than the first
    ids = [1] * 20 + [300, 5, 301]
    with pytest.raises(FatalError) as info:
        data.open_tokens(_write(tmp_path, ids), "uint16", 256)
    assert str(info.value) == (f"scalec: data file {tmp_path / 't.bin'}: token id 300 at position 20 is outside "
                               "the vocabulary of 256 (ids 0..255)")
    assert len(data.open_tokens(_write(tmp_path, ids[:20] + [255]), "uint16", 256)) == 21


def test_open_tokens_rejects_negative_int32_ids(tmp_path):
    with pytest.raises(FatalError, match="token id -1 at position 2 is outside"):
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
    with pytest.raises(FatalError) as info:
        data.TokenFile(str(path), "uint16", 16, 0, 256)
    text = str(info.value)
    assert text.startswith(f"scalec: data file {path}") and message in text and "\n" not in text


def test_resolve_is_relative_to_the_program(tmp_path):
    program = str(tmp_path / "build" / "program.py")
    assert data.resolve("../data/t.bin", program) == str(tmp_path / "data" / "t.bin")
    assert data.resolve("/abs/t.bin", program) == "/abs/t.bin"
    assert data.resolve("", program) == ""


def test_the_dtype_guess_for_a_vocabulary_past_uint16(tmp_path):
    """Llama 3's 128256 ids written as uint32 and read as uint16: the high halves are 0 or 1, never more; real
    uint16 data of the same vocabulary size is not taken for uint32."""
    from compiler import files
    rng = np.random.default_rng(0)
    path = tmp_path / "t.bin"
    path.write_bytes(rng.integers(0, 128256, 4096).astype("<u4").tobytes())
    got = files.sample(str(path), "uint16", 128256)
    assert (got.looks_like, got.high, got.outside) == ("uint32", 1, None)
    path.write_bytes(rng.integers(0, 65536, 8192).astype("<u2").tobytes())
    assert files.sample(str(path), "uint16", 128256).looks_like is None


def test_a_positional_dtype_is_where_the_warning_points(tmp_path):
    (tmp_path / "tok.bin").write_bytes((np.arange(200) % 128).astype(np.uint32).tobytes())
    text = (ROOT / "samples" / "tiny_gpt.scale").read_text().replace(
        "log_every    = 5", 'log_every    = 5\n  data = tokens("tok.bin", uint16)')
    (w,) = check_text(text, str(tmp_path / "tiny.scale")).warnings
    assert w.code == "W0803" and w.span.col == text.splitlines()[33].index("uint16") + 1


# -- the held-out split (`eval_split`, runtime.split) ---------------------------------------------------------------


def _positions(tmp_path: Path, n: int = 1000) -> str:
    """A uint32 file whose id at each position is that position: a sample's ids say where it was read."""
    path = str(tmp_path / "pos.bin")
    data.write_tokens(path, np.arange(n), "uint32", n)
    return path


def test_held_out_windows_are_never_trained_on(tmp_path):
    """Over three epochs every token training reads lies before the held-out tail, every training window is read
    once an epoch, and evaluation reads whole windows of the tail, in order, each once."""
    path, seq, batch = _positions(tmp_path), 10, 5
    source = data.TokenFile(path, "uint32", seq, seed=7, vocab=1000, eval_split=0.2, eval_sequences=2 * batch)
    split = data.split_windows(1000, seq, 0.2)
    assert (split.eval_windows, split.eval_first, source.windows) == (19, 809, 80)  # 99 windows, floor(19.8)
    held = set(range(split.eval_first, 1000))
    for epoch in range(3):
        starts = []
        for step in range(epoch * 16, epoch * 16 + 16):  # 80 windows = 16 steps of 5
            tokens, targets = source.samples(step, batch, 0, batch)
            seen = set(tokens.flatten().tolist()) | set(targets.flatten().tolist())
            assert not seen & held, f"step {step} trained on held-out tokens"
            starts += tokens[:, 0].tolist()
        assert sorted(starts) == [w * seq for w in range(80)]  # each training window once per epoch
    got = torch.cat([source.eval_samples(b, batch, 0, batch)[0] for b in range(2)])
    assert got[:, 0].tolist() == [809 + k * seq for k in range(10)]
    assert set(got.flatten().tolist()) <= held


def test_held_out_batches_are_the_same_every_time_and_on_every_plan(tmp_path):
    """Evaluation batch b is a function of the file and b alone: two opens agree, and any split of it over batch
    ranks and micro-batches (data.micro_batch) concatenates to the single device's; the same for synthetic data."""
    path = _positions(tmp_path)
    one = data.TokenFile(path, "uint32", 10, seed=1, vocab=1000, eval_split=0.5, eval_sequences=16)
    again = data.TokenFile(path, "uint32", 10, seed=2, vocab=1000, eval_split=0.5, eval_sequences=16)  # any seed
    synthetic = data.Synthetic(vocab=64, seq_len=10, seed=3)
    for source, other in ((one, again), (synthetic, data.Synthetic(vocab=64, seq_len=10, seed=3))):
        for b in range(2):
            whole = source.eval_samples(b, 8, 0, 8)
            assert all(torch.equal(x, y) for x, y in zip(whole, other.eval_samples(b, 8, 0, 8)))
            for dp, m in ((2, 1), (2, 2), (4, 2), (1, 4)):
                parts = [data.micro_batch(source, b, 8, r, dp, j, m, held_out=True) for r in range(dp)
                         for j in range(m)]
                assert torch.equal(torch.cat([t for t, _ in parts]), whole[0])
                assert torch.equal(torch.cat([t for _, t in parts]), whole[1])


def test_synthetic_held_out_batches_are_a_stream_of_their_own():
    source = data.Synthetic(vocab=1000, seq_len=8, seed=5)
    held = {tuple(x) for b in range(4) for x in source.eval_samples(b, 16, 0, 16)[0].tolist()}
    trained = {tuple(x) for t in range(4) for x in source.samples(t, 16, 0, 16)[0].tolist()}
    assert len(held) > 50 and len(held & trained) < 3  # 4000 distinct sequences: overlaps are chance only


def test_a_held_out_split_too_small_is_a_fatal_error_when_opened(tmp_path):
    path = _positions(tmp_path)  # 99 windows of 10: 0.1 holds out 9
    with pytest.raises(FatalError, match=r"eval_split = 0.1 holds out 9 sequence\(s\) of 10, fewer than the 16"):
        data.TokenFile(path, "uint32", 10, seed=1, vocab=1000, eval_split=0.1, eval_sequences=16)
    data.TokenFile(path, "uint32", 10, seed=1, vocab=1000, eval_split=0.1, eval_sequences=9)  # exactly enough


def test_check_refuses_a_held_out_split_too_small_as_the_run_would(tmp_path):
    """check uses the run's own formula (runtime.split) on the file's length: 400 uint16 ids of tiny_gpt's seq_len
    64 are 6 windows, of which 0.5 holds out 3, fewer than one batch of 8."""
    (tmp_path / "tok.bin").write_bytes(np.random.default_rng(0).integers(0, 128, 400).astype("uint16").tobytes())
    text = (ROOT / "samples" / "tiny_gpt.scale").read_text().replace(
        "log_every    = 5", 'log_every    = 5\n  data = tokens(path = "tok.bin")\n  eval_every = 10  '
        'eval_batches = 1  eval_split = 0.5')
    with pytest.raises(ScaleError) as info:
        check_text(text, str(tmp_path / "tiny.scale"))
    (d,) = info.value.diagnostics
    assert d.code == "E0811" and "holds out 3 sequence(s) of 64" in d.message and d.span.line == 35
    assert "use a larger file" in d.help


# -- files that say what they are: .npy headers, int64 ids (issue 37) -----------------------------------------------


def _check_file(tmp_path: Path, name: str, dtype: str | None = None):
    """tiny_gpt (vocabulary 128, seq_len 64) reading `name` beside it."""
    args = f'path = "{name}"' + (f", dtype = {dtype}" if dtype else "")
    text = (ROOT / "samples" / "tiny_gpt.scale").read_text().replace(
        "log_every    = 5", f"log_every    = 5\n  data = tokens({args})")
    return check_text(text, str(tmp_path / "tiny.scale"))


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "int32", "int64"])
def test_a_npy_file_is_read_by_its_header_by_check_and_by_the_run_alike(tmp_path, dtype):
    """np.save's file: check takes its dtype and length from the header (none written in the .scale file), and the
    program, told what check found, reads exactly the saved ids, not the header's bytes."""
    ids = np.random.default_rng(0).integers(0, 128, 1000).astype(dtype)
    path = tmp_path / "tok.npy"
    np.save(path, ids)
    spec = _check_file(tmp_path, "tok.npy")
    d = spec.train.data
    assert (d.format, d.dtype, d.reading.tokens, d.reading.dtype_from) == ("npy", dtype, 1000, "its .npy header")
    assert d.reading.seen == (int(ids.min()), int(ids.max()))
    got = data.open_tokens(str(path), d.dtype, 128, d.format)
    assert got.dtype == np.dtype(dtype) and np.array_equal(np.asarray(got), ids)
    src = data.TokenFile(str(path), d.dtype, 64, seed=1, vocab=128, format=d.format)
    x, y = src.samples(0, 2, 0, 2)
    for row, targets in zip(x, y):  # every window is a run of the saved ids
        s = int(np.flatnonzero(np.lib.stride_tricks.sliding_window_view(ids, 64).astype(np.int64)
                               .__eq__(row.numpy()).all(1))[0])
        assert np.array_equal(targets.numpy(), ids[s + 1:s + 65])


def test_a_npy_file_declared_another_dtype_is_refused_at_the_dtype(tmp_path):
    np.save(tmp_path / "tok.npy", np.arange(1000) % 128)  # int64, numpy's default
    with pytest.raises(ScaleError) as info:
        _check_file(tmp_path, "tok.npy", "uint16")
    (d,) = info.value.diagnostics
    assert d.code == "E0803" and "holds int64 ids (its .npy header says so), but the file declares uint16" in d.message
    assert d.span.end_col - d.span.col == len("uint16")
    assert _check_file(tmp_path, "tok.npy", "int64").train.data.dtype == "int64"  # declared as it is: fine


@pytest.mark.parametrize("make,message", [
    (lambda p: np.save(p, (np.arange(1000) % 128).astype(np.float32)), "holds float32 values, not token ids"),
    (lambda p: np.save(p, (np.arange(1000) % 128).astype(np.uint64)), "holds uint64 values, not token ids"),
    (lambda p: np.save(p, (np.arange(1000) % 128).reshape(10, 100)), "holds an array of shape (10, 100)"),
    (lambda p: np.save(p, (np.arange(1000) % 128).astype(">u2")), "holds big-endian uint16 ids"),
    (lambda p: (np.save(p, np.arange(1000) % 128), p.write_bytes(p.read_bytes()[:-8])),
     "but its header says 1000 int64 ids (8000 bytes): the file is cut short"),
    (lambda p: (np.arange(1000) % 128).astype("<u2").tofile(p), "is named .npy but has no .npy header"),
], ids=["float", "uint64", "2d", "big_endian", "cut", "no_header"])
def test_a_npy_file_that_is_no_flat_array_of_ids_is_refused_at_the_path(tmp_path, make, message):
    make(tmp_path / "tok.npy")
    with pytest.raises(ScaleError) as info:
        _check_file(tmp_path, "tok.npy")
    (d,) = info.value.diagnostics
    assert d.code == "E0813" and message in d.message and str(tmp_path / "tok.npy") in d.message
    assert d.span.end_col - d.span.col == len('"tok.npy"')


def test_a_npy_header_is_found_by_its_magic_whatever_the_name(tmp_path):
    np.save(tmp_path / "x.npy", (np.arange(1000) % 128).astype(np.uint32))
    (tmp_path / "x.npy").rename(tmp_path / "tok.bin")
    d = _check_file(tmp_path, "tok.bin").train.data
    assert (d.format, d.dtype, d.reading.tokens) == ("npy", "uint32", 1000)


def test_the_run_refuses_a_token_file_that_changed_kind_since_check(tmp_path):
    """open_tokens holds the file to what check found: a flat file that became a .npy file, a .npy file that
    became flat or whose header now gives another dtype, are one-line errors, never ids of another width."""
    path = tmp_path / "tok.bin"
    np.save(tmp_path / "x.npy", np.arange(1000) % 128)
    (tmp_path / "x.npy").rename(path)
    with pytest.raises(FatalError, match="is a .npy file, but the program reads it as a flat file"):
        data.open_tokens(str(path), "uint16", 128, "raw")
    with pytest.raises(FatalError, match=r"holds <i8 values \(its .npy header says so\), but the program reads "
                                         r"uint32 ids"):
        data.open_tokens(str(path), "uint32", 128, "npy")
    (np.arange(1000) % 128).astype("<u2").tofile(path)
    with pytest.raises(FatalError, match="has no .npy header, but the program was compiled for a .npy file"):
        data.open_tokens(str(path), "uint16", 128, "npy")


def test_int64_ids_are_a_dtype_read_at_their_width(tmp_path):
    ids = (np.arange(1000) * 7) % 128
    ids.astype("<i8").tofile(tmp_path / "tok.bin")
    spec = _check_file(tmp_path, "tok.bin", "int64")
    assert spec.warnings == () and spec.train.data.reading.tokens == 1000
    assert np.array_equal(np.asarray(data.open_tokens(str(tmp_path / "tok.bin"), "int64", 128)), ids)
    side = data.write_tokens(str(tmp_path / "s.bin"), ids, "int64", 128)
    assert side["dtype"] == "int64" and (tmp_path / "s.bin").stat().st_size == 8000
    with pytest.raises(FatalError, match="token id -1 at position 3"):
        bad = ids.copy()
        bad[3] = -1
        bad.astype("<i8").tofile(tmp_path / "neg.bin")
        data.open_tokens(str(tmp_path / "neg.bin"), "int64", 128)


@pytest.mark.parametrize("declared,which", [
    ("uint16", "the last 3 uint16 of every 4"), (None, "the last 3 uint16 of every 4"),
    ("uint32", "every odd uint32"), ("int32", "every odd int32")])
def test_the_dtype_guess_knows_int64(tmp_path, declared, which):
    """numpy's default int64 ids, bare: read as uint16 they are [id, 0, 0, 0], which is not uint32's [id, 0]; read
    as uint32 (what the guess used to advise) they are [id, 0]. Real uint32 data is still named uint32."""
    (np.arange(1000) % 128).astype("<i8").tofile(tmp_path / "tok.bin")
    (w,) = _check_file(tmp_path, "tok.bin", declared).warnings
    assert w.code == "W0803" and w.message.endswith("the file looks like int64") and which in w.message
    from compiler import files
    rng = np.random.default_rng(0)
    path = tmp_path / "t.bin"
    path.write_bytes(rng.integers(0, 128256, 4096).astype("<i8").tobytes())  # Llama 3's ids, int64
    assert files.sample(str(path), "uint16", 128256).looks_like == "int64"
    path.write_bytes(rng.integers(0, 128256, 4096).astype("<u4").tobytes())
    assert files.sample(str(path), "uint16", 128256).looks_like == "uint32"
    path.write_bytes(rng.integers(0, 65536, 8192).astype("<u2").tobytes())
    assert files.sample(str(path), "uint16", 128256).looks_like is None


def test_check_prints_how_it_reads_the_token_file(tmp_path):
    """`scalec check` says the file's format, dtype and where it came from, its tokens and the ids it saw."""
    import io
    from contextlib import redirect_stdout
    from compiler.cli import main
    np.save(tmp_path / "tok.npy", 3 + np.arange(1000) % 120)
    args = 'path = "tok.npy"'
    text = (ROOT / "samples" / "tiny_gpt.scale").read_text().replace(
        "log_every    = 5", f"log_every    = 5\n  data = tokens({args})")
    (tmp_path / "tiny.scale").write_text(text)
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["check", str(tmp_path / "tiny.scale")]) == 0
    assert out.getvalue().splitlines()[1] == (
        f"  data: {tmp_path / 'tok.npy'}: a .npy file of int64 ids (its .npy header), 1,000 tokens; ids 3..122 seen "
        "in its first 8000 bytes (the model's vocabulary: 128)")


def _megatron(tmp_path: Path, ids, vocab: int = 100_000, code: int | None = None) -> Path:
    """PREFIX.bin and PREFIX.idx as Megatron's preprocess_data.py writes them (no sidecar); `code`: another dtype
    code in the index's header."""
    from runtime.indexed import Writer
    w = Writer(str(tmp_path / "tok"), vocab_size=vocab)
    w.add(ids)
    w.close()
    (tmp_path / "tok.bin.json").unlink()
    if code is not None:
        idx = bytearray((tmp_path / "tok.idx").read_bytes())
        idx[17] = code
        (tmp_path / "tok.idx").write_bytes(bytes(idx))
    return tmp_path / "tok.bin"


def test_a_megatron_dataset_is_read_in_the_dtype_its_index_gives(tmp_path):
    """int32 ids (a vocabulary past 65536) with no sidecar: check and the run read the index's dtype; a dtype
    written otherwise is E0803 at the dtype, and a program reading another is a one-line error."""
    ids = (np.arange(1000) * 5) % 128
    path = _megatron(tmp_path, ids)
    d = _check_file(tmp_path, "tok.bin").train.data
    assert (d.format, d.dtype, d.reading.dtype_from, d.reading.tokens) == ("raw", "int32", "its index tok.idx", 1000)
    assert np.array_equal(np.asarray(data.open_tokens(str(path), d.dtype, 128)), ids)
    with pytest.raises(ScaleError) as info:
        _check_file(tmp_path, "tok.bin", "uint16")
    (e,) = info.value.diagnostics
    assert e.code == "E0803"
    assert "holds int32 ids (its index tok.idx says so), but the file declares uint16" in e.message
    with pytest.raises(FatalError, match=r"holds int32 ids \(its index .*tok.idx says so\), but the program reads "
                                         "uint16"):
        data.open_tokens(str(path), "uint16", 128)


def test_a_megatron_index_of_ids_we_do_not_read_is_refused(tmp_path):
    _megatron(tmp_path, np.arange(1000) % 128, code=3)  # int16
    with pytest.raises(ScaleError) as info:
        _check_file(tmp_path, "tok.bin")
    (e,) = info.value.diagnostics
    assert e.code == "E0814" and "gives its ids as int16, which is not read as token ids" in e.message
    with pytest.raises(FatalError, match="gives its ids as int16"):
        data.open_tokens(str(tmp_path / "tok.bin"), "uint16", 128)


@pytest.mark.parametrize("code", range(0, 10))
def test_check_and_the_run_read_a_megatron_index_alike(tmp_path, code):
    """compiler.files.index_dtype (check, which imports no runtime) and runtime.indexed.index_dtype (the run) give
    the same dtype, or both refuse, for every dtype code."""
    from compiler import files
    from runtime import indexed
    path = str(_megatron(tmp_path, np.arange(100) % 128, code=code))
    try:
        ours = ("ok", files.index_dtype(path))
    except files.IndexFileError as exc:
        ours = ("refused", str(exc))
    try:
        theirs = ("ok", indexed.index_dtype(path))
    except ValueError as exc:
        theirs = ("refused", str(exc))
    assert ours == theirs
    assert (ours[0] == "ok") == (code in (4, 5, 8))


def test_the_program_is_told_what_check_found(tmp_path):
    """`scalec compile` of a .scale file reading a .npy file without a written dtype: the program's contract holds
    the header's dtype and the format, which the run holds the file to (open_tokens)."""
    from compiler.cli import main
    np.save(tmp_path / "tok.npy", (np.arange(1000) % 128).astype(np.uint32))
    text = (ROOT / "samples" / "tiny_gpt.scale").read_text().replace(
        "log_every    = 5", 'log_every    = 5\n  data = tokens(path = "tok.npy")')
    (tmp_path / "tiny.scale").write_text(text)
    assert main(["compile", str(tmp_path / "tiny.scale"), "-o", str(tmp_path / "build")]) == 0
    program = (tmp_path / "build" / "program.py").read_text()
    assert "dtype='uint32'" in program and "format='npy'" in program
