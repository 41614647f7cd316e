"""What the training settings need of the file system and of the model, whatever the plan: the token file (it
exists, its .npy header, sidecar or Megatron index agrees with the declared dtype, its first MiB with the
vocabulary, its held-out tail with the evaluation), packed documents' separator, and the checkpoint of
`init = from(...)` (its safetensors headers and config.json against the model, compiler/hf_header.py). Each file
is found where the program will look: a relative path is relative to the .scale file's directory.
"""
from __future__ import annotations

import os

from runtime.split import split_windows  # torch-free: the held-out split, as the program cuts it

from compiler import ast
from compiler import files as F
from compiler import hf_header as H
from compiler import spec as S
from compiler.binder import Checker, span_of
from compiler.diagnostics import Span
from compiler.language import DATASETS, INITS, MAX_EVAL_SPLIT


def file_checks(c: Checker, model: S.Model, train: S.Train, spans: dict, imported_model) -> F.Reading | None:
    """What the training settings need of the files and the model, whatever the plan; how the token file will be
    read (None without one, or when it cannot be)."""
    reading = None
    if train.data.document_separator is not None:
        _packed_checks(c, model, train, spans["data"])
    if train.data.kind == "tokens":
        reading = _data_checks(c, model, train, spans["data"], {k: span_of(v) for k, v in spans.items()})
    if train.init_from:
        _init_checks(c, model, train, spans["init"], imported_model)
    if train.data.kind == "synthetic" and int(c.number(model.embedding.vocab)) < 4:
        c.error("E0120", "the synthetic task needs a vocabulary of at least 4 tokens", model.embedding.span)
    return reading


def _packed_checks(c: Checker, model: S.Model, train: S.Train, call: ast.Call) -> None:
    """Packed documents (runtime/packed.py): a separator inside the vocabulary, and attention they run with."""
    at = _arg_span(call, "document_separator", tuple(DATASETS["tokens"]))
    sep, vocab = train.data.document_separator, int(c.number(model.embedding.vocab))
    if not 0 <= sep < vocab:
        c.error("E0812", f"document separator {sep} is outside the vocabulary of {vocab} tokens", at,
                label=f"not in 0..{vocab - 1}", help="give the id that ends each document of the token file (the "
                                                     "tokenizer's end-of-document token)")
    for x in S.walk(model.layers):
        why = ("multi-head latent attention (`mla`)" if isinstance(x, S.MLA) else
               "sliding-window attention (`window`)" if isinstance(x, S.Attention) and x.window is not None else
               "soft-capped attention (`softcap`)" if isinstance(x, S.Attention) and x.softcap is not None else None)
        if why:
            c.error("E0319", f"packed documents with {why} are not built yet (the layer at {x.span})", at,
                    label="each document attends only to itself",
                    help="remove `document_separator` (the file is then one stream), or use causal `attention` "
                         "without a window or soft cap")
            break


def _data_checks(c: Checker, model: S.Model, train: S.Train, call: ast.Call, written_at: dict) -> F.Reading | None:
    """The token file exists and fits `dtype` and the model, found where the program will look: a relative path is
    relative to this .scale file's directory. A .npy file's header says its dtype and length (a dtype written
    otherwise is an error); a sidecar (compiler/files.py), when the file has one, says its dtype, vocabulary and
    length, and a Megatron index (PREFIX.idx beside PREFIX.bin) its dtype; without any, the first MiB says what it
    can (every id is checked when the run opens the file).
    Returns how the file will be read (`scalec check` prints it, the program reads exactly that), None when it
    cannot be."""
    order = tuple(DATASETS["tokens"])
    at = _arg_span(call, "path", order)
    at_dtype = _arg_span(call, "dtype", order, at)  # a defaulted dtype: at the path
    written = _has_arg(call, "dtype", order)
    shown = os.path.join(os.path.dirname(c.file.path), train.data.path)
    where = f"a relative path is relative to the .scale file's directory ({os.path.dirname(c.file.path) or '.'})"
    dtype = train.data.dtype
    vocab = int(c.number(model.embedding.vocab))
    if not os.path.exists(shown):
        c.error("E0801", f"data file {shown} does not exist", at, label="no such file", help=where)
        return None
    if os.path.isdir(shown):
        c.error("E0801", f"data file {shown} is a directory", at, label="not a file of token ids",
                help="name the binary file of token ids itself")
        return None
    size = os.path.getsize(shown)
    start = F.read_start(shown) if size else b""
    try:
        header = F.npy_header(start, size, named_npy=shown.lower().endswith(".npy"))
    except F.NpyError as exc:
        c.error("E0813", f"data file {shown} {exc}", at, label="not a flat array of token ids",
                help="a .npy token file holds one flat array of uint16, uint32, int32 or int64 ids, as "
                     "np.save(path, ids) writes it")
        return None
    fmt, offset, dtype_from = "raw", 0, "declared" if written else "the default"
    if header is not None:
        if written and dtype != header.dtype:
            c.error("E0803", f"data file {shown} holds {header.dtype} ids (its .npy header says so), but the file "
                    f"declares {dtype}", at_dtype, label=f"its header says {header.dtype}",
                    help=f"write `dtype = {header.dtype}`, or leave `dtype` out: a .npy file is read in the dtype "
                         "its header gives")
            return None
        fmt, offset, dtype, dtype_from = "npy", header.offset, header.dtype, "its .npy header"
    item = F.ITEMSIZE[dtype]
    try:
        side = F.read_sidecar(shown)
    except F.SidecarError as exc:
        c.error("E0805", f"the sidecar of data file {shown} cannot be read: {exc}", at, label="its sidecar",
                help=f"rewrite it with runtime.data.write_tokens, or remove {F.sidecar_path(shown)} to use the file "
                     "bare")
        return None
    if side is not None and not _sidecar_checks(c, side, shown, size - offset, dtype, model, at, at_dtype):
        return None
    if side is not None and header is None:
        dtype_from = "its sidecar"
    indexed = None
    if side is None and header is None:  # a Megatron dataset (PREFIX.bin): its PREFIX.idx says the dtype
        try:
            indexed = F.index_dtype(shown)
        except F.IndexFileError as exc:
            c.error("E0814", f"data file {shown}: {exc}", at, label="its index",
                    help="write the dataset with uint16 ids (a vocabulary up to 65536) or int32, as Megatron's "
                         "preprocess_data.py and `scalec data` do")
            return None
        if indexed is not None and written and indexed != dtype:
            c.error("E0803", f"data file {shown} holds {indexed} ids (its index {os.path.basename(shown)[:-4]}.idx "
                    f"says so), but the file declares {dtype}", at_dtype, label=f"its index says {indexed}",
                    help=f"write `dtype = {indexed}`, or leave `dtype` out: a Megatron dataset is read in the dtype "
                         "its index gives")
            return None
        if indexed is not None:
            dtype, dtype_from = indexed, f"its index {os.path.basename(shown)[:-4]}.idx"
            item = F.ITEMSIZE[dtype]
    payload = size - offset
    if payload == 0:
        c.error("E0801", f"data file {shown} is empty", at, label="no tokens")
    elif payload % item:
        c.error("E0801", f"data file {shown} holds {size} bytes, not a whole number of {dtype} ids", at,
                label=f"{size} % {item} == {size % item}",
                help=f"`dtype = {dtype}` reads {item} bytes per id: is it the file's dtype (uint16, "
                     "uint32, int32 or int64), and is the file whole?")
    elif payload // item <= (seq := int(c.number(train.seq_len))) + 1:
        c.error("E0801", f"data file {shown} holds {payload // item} tokens, too few for one sequence of {seq}", at,
                help=f"a training window is seq_len + 1 tokens; the file needs more than {seq + 1}")
    else:
        got = _sample_checks(c, shown, dtype, vocab, at, at_dtype, start, offset, guess=side is None and
                             header is None and indexed is None)
        _held_out_checks(c, train, shown, payload // item, seq, written_at)
        return F.Reading(path=shown, format=fmt, dtype=dtype, dtype_from=dtype_from, tokens=payload // item,
                         seen=got.seen, sampled=got.nbytes, vocab=side.vocab_size if side is not None else None)
    return None


def _has_arg(call: ast.Call, name: str, order: tuple) -> bool:
    """Whether argument `name` of a call whose parameters are `order` is written (by name or by position)."""
    return any((a.name.id if a.name else order[i] if i < len(order) else None) == name
               for i, a in enumerate(call.args))


def _held_out_checks(c: Checker, train: S.Train, shown: str, tokens: int, seq: int, at: dict) -> None:
    """The held-out tail of `eval_split` (runtime.split, the runtime's own formula) holds the sequences of every
    evaluation (eval_batches × global_batch, read without repeating one), and leaves some to train on."""
    split = train.eval_split
    if not train.eval_every or not split or not 0 < split <= MAX_EVAL_SPLIT:
        return
    got = split_windows(tokens, seq, split)
    need = train.eval_batches * int(c.number(train.global_batch))
    if got.eval_windows < need:
        c.error("E0811", f"eval_split = {split:g} of {shown} holds out {got.eval_windows} sequence(s) of {seq}, "
                f"fewer than one evaluation reads (eval_batches {train.eval_batches} × global_batch "
                f"{int(c.number(train.global_batch))} = {need})", at["eval_split"],
                label=f"{got.eval_windows} of the file's {(tokens - 1) // seq} windows",
                help=_held_out_help(tokens, seq, need, int(c.number(train.global_batch))))
    elif got.train_windows < 1:
        c.error("E0811", f"eval_split = {split:g} of {shown} leaves no sequence of {seq} to train on",
                at["eval_split"], label="nothing left to train on", help="hold out less, or use a larger file")


def _held_out_help(tokens: int, seq: int, need: int, batch: int) -> str:
    """What would hold out enough: the least share that does, else the most batches the largest share gives."""
    least = next((k / 1000 for k in range(1, int(MAX_EVAL_SPLIT * 1000) + 1)
                  if split_windows(tokens, seq, k / 1000).eval_windows >= need), None)
    if least is not None:
        return f"hold out more (`eval_split = {least:g}` holds out {need}), or read fewer `eval_batches`"
    held = split_windows(tokens, seq, MAX_EVAL_SPLIT).eval_windows
    most = held // batch
    return (f"even eval_split = {MAX_EVAL_SPLIT:g} holds out {held} sequence(s): " +
            (f"read at most `eval_batches = {most}`, or use a larger file" if most else "use a larger file"))


def _sidecar_checks(c: Checker, side: F.Sidecar, shown: str, size: int, dtype: str, model: S.Model, at: Span,
                    at_dtype: Span) -> bool:
    """The sidecar against the declared dtype, the file's size and the model's vocabulary; False when it disagrees."""
    ok = True
    vocab = int(c.number(model.embedding.vocab))
    if side.dtype != dtype:
        c.error("E0803", f"data file {shown} holds {side.dtype} ids, but the file declares {dtype}", at_dtype,
                label=f"its sidecar says {side.dtype}",
                help=f"write `dtype = {side.dtype}` (read as {dtype}, every id would be garbage); the dtype is "
                     f"recorded in {side.path}")
        ok = False
    need = side.tokens * F.ITEMSIZE[side.dtype]
    if need != size:
        c.error("E0805", f"data file {shown} holds {size} bytes, but its sidecar says {side.tokens} {side.dtype} ids "
                f"({need} bytes)", at, label="file and sidecar disagree",
                help="the file was changed or cut short after its sidecar was written: write both again "
                     "(runtime.data.write_tokens)")
        ok = False
    if side.vocab_size > vocab:
        tok = f" ({side.tokenizer})" if side.tokenizer else ""
        c.error("E0804", f"data file {shown} has a vocabulary of {side.vocab_size} tokens{tok}, the model "
                f"{vocab}", at, label=f"ids up to {side.vocab_size - 1}",
                help=f"the model's vocabulary must hold every id of the data: make `vocab` at least "
                     f"{side.vocab_size} (the embedding at {model.embedding.span})")
        ok = False
    return ok


def _sample_checks(c: Checker, shown: str, dtype: str, vocab: int, at: Span, at_dtype: Span, start: bytes,
                   offset: int, guess: bool) -> F.Sample:
    """What the first MiB of a token file says: ids outside the vocabulary, or (`guess`: a bare file, whose dtype
    nothing records) a file of another dtype."""
    got = F.sample(shown, dtype, vocab, start=start, offset=offset)
    read = F.shown_bytes(got.nbytes)
    if got.outside is not None:
        pos, tid = got.outside
        fits_as = got.fits_as if guess else None
        also = (f"read as {fits_as}, every id of those bytes is inside the vocabulary: is the file {fits_as}? "
                f"Write `dtype = {fits_as}`" if fits_as else
                "the model's vocabulary must hold every id of the data; the run would stop at this id")
        c.error("E0804", f"data file {shown}: token id {tid} at position {pos} is outside the vocabulary of {vocab} "
                f"(ids 0..{vocab - 1})", at_dtype if fits_as else at,
                label=f"read as {dtype}" if fits_as else f"in its first {read}", help=also)
    elif guess and got.looks_like is not None:
        seen = ("is 0" if got.parts == 2 else "are 0") if got.high == 0 else (
            f"is at most {got.high}" if got.parts == 2 else f"are at most {got.high}")
        which = f"every odd {dtype}" if got.parts == 2 else f"the last {got.parts - 1} {dtype} of every {got.parts}"
        c.warn("W0803", f"`dtype = {dtype}`, but {which} of the first {read} of {shown} {seen}: the file "
               f"looks like {got.looks_like}", at_dtype, label=f"{dtype} declared",
               help=f"if it was written as {got.looks_like}, write `dtype = {got.looks_like}`; a sidecar "
                    f"({os.path.basename(F.sidecar_path(shown))}, written by runtime.data.write_tokens) or a .npy "
                    "header (np.save) records the dtype and silences this guess")
    return got


def _arg_span(call: ast.Call, name: str, order: tuple, default: Span | None = None) -> Span:
    """The span of argument `name` of a call whose parameters are `order` (positional arguments stand for them in
    that order), else `default` or the call's."""
    for i, a in enumerate(call.args):
        if (a.name.id if a.name else order[i] if i < len(order) else None) == name:
            return span_of(a.value)
    return default or call.span


def _init_checks(c: Checker, model: S.Model, train: S.Train, call: ast.Call, imported_model) -> None:
    """The checkpoint of `init = from(...)` exists and holds safetensors, found where the program will look (a
    relative path is relative to this .scale file's directory), and its headers (names, shapes; no tensor data)
    and config.json fit the model (compiler/hf_header.py): a checkpoint of another architecture or size is
    refused here, before any process starts, rather than on every rank after launch."""
    at = _arg_span(call, "path", tuple(INITS["from"]))
    shown = os.path.join(os.path.dirname(c.file.path), train.init_from)
    where = f"a relative path is relative to the .scale file's directory ({os.path.dirname(c.file.path) or '.'})"
    if not os.path.exists(shown):
        c.error("E0802", f"checkpoint {shown} does not exist", at, label="no such file or directory", help=where)
    elif os.path.isdir(shown) and not any(f.endswith(".safetensors") for f in os.listdir(shown)):
        c.error("E0802", f"checkpoint directory {shown} holds no .safetensors file", at,
                label="no weights here", help="name the directory `save_pretrained` wrote, or its .safetensors file")
    elif os.path.isfile(shown) and not shown.endswith(".safetensors"):
        c.error("E0802", f"checkpoint {shown} is not a .safetensors file", at, label="not safetensors",
                help="Hugging Face checkpoints in safetensors (model.safetensors, or a directory of shards)")
    else:
        try:
            tensors, config = H.checkpoint_tensors(shown), H.read_config(shown)
        except H.HeaderError as exc:
            c.error("E0806", f"checkpoint {shown} cannot be read: {exc}", at, label="unreadable",
                    help="download or save it again (a safetensors file is a length, a JSON header, then the data)")
            return
        for p in H.compare(model, c.number, shown, tensors, config, imported_model):
            c.error(p.code, p.message, at, label=p.label, help=p.help)
