"""The outputs of scalec's commands other than `plan`'s tables: what each prints on success, and the few lines it
writes to stderr beside its output (warnings, graphs, a search that found nothing).

Each returns text; the command line (compiler/cli.py) decides where it goes and with which exit status.
"""
from __future__ import annotations

import json
import os
import shlex
import sys


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def check_verdict(path: str, spec) -> str:
    """`scalec check FILE` on a file with no error: the model and the devices it was checked for."""
    warned = f", {_plural(len(spec.warnings), 'warning')}" if spec.warnings else ""
    return (f"{path}: ok{warned} (model `{spec.model.name}`, {_plural(spec.plan.world_size, 'device')})\n" +
            reading_text(spec.train.data.reading, spec))


def reading_text(reading, spec) -> str:
    """How the token file will be read, one line: its format, dtype and where that came from, its tokens and the
    ids seen in its first MiB against the vocabulary (the program reads exactly this; runtime/data.py)."""
    if reading is None:
        return ""
    from compiler.files import shown_bytes
    kind = "a .npy file" if reading.format == "npy" else "a flat file"
    seen = (f"ids {reading.seen[0]}..{reading.seen[1]} seen in its first {shown_bytes(reading.sampled)}"
            if reading.seen is not None else "no id sampled")
    side = f", a vocabulary of {reading.vocab:,} by its sidecar" if reading.vocab is not None else ""
    vocab = int(spec.value(spec.model.embedding.vocab))
    return (f"  data: {reading.path}: {kind} of {reading.dtype} ids ({reading.dtype_from}), {reading.tokens:,} "
            f"tokens{side}; {seen} (the model's vocabulary: {vocab:,})\n")


def warnings_text(spec) -> str:
    """The check's warnings (settings with no effect in this plan, ...), rendered like errors; empty without any."""
    if not spec.warnings:
        return ""
    from compiler.diagnostics import render_all
    return render_all(list(spec.warnings), {spec.path: spec.source}) + "\n"


def graph_text(after: str, cls: str, gm) -> str:
    """`compile --show-graphs`: a segment's graph as the pass left it, as FX prints it."""
    return f"# ---- {cls} after {after} ----\n{gm.code.strip()}\n\n"


def json_text(obj) -> str:
    """`--json` of `plan` and `search`: one object, indented by one space, a newline at the end."""
    return json.dumps(obj, indent=1) + "\n"


def search_output(result, as_json: bool) -> str:
    """`scalec search FILE [--json]`: the winners with their reasons, the families rejected and why
    (compiler/search/report.py writes the table: its rows come from the search's own bookkeeping)."""
    from compiler import search as SE
    return json_text(SE.to_json(result)) if as_json else SE.text(result)


def search_failure(fixed: dict, *outputs: str) -> str:
    """When no plan fits: the reasons are already printed under `rejected`; this says what was not written (`-o`'s
    file, `--html`'s page)."""
    fixing = " with the settings --fix fixes" if fixed else ""
    return (f"error: no plan{fixing} passes the rules and fits the devices"
            f"{'; nothing written to ' + ' or '.join(outputs) if outputs else ''}\n")


def imported(output: str, spec, config: str) -> str:
    """`scalec import CONFIG -o FILE`: what was written, and that its mesh and train sections are placeholders."""
    return (f"wrote {output}: model `{spec.model.name}` from {config}, with placeholder mesh and train "
            "sections\n")


def launching(cmd: list[str], processes: int, torchrun_args: str) -> str:
    """`scalec run`: the command about to run, as a shell would take it, and how many processes it starts here."""
    extra = f"; torchrun {torchrun_args}" if torchrun_args else ""
    return f"scalec: {shlex.join(cmd)}   ({processes} processes{extra})\n"


def data_written(got) -> str:
    """`scalec data`: what was written, and how a .scale file trains on it."""
    sep = f", each ended by id {got.separator}" if got.separator is not None else ""
    return (f"wrote {got.prefix}.bin ({got.tokens:,} {got.dtype} tokens in {got.documents:,} documents{sep}), "
            f"{got.prefix}.idx and {got.prefix}.bin.json (vocabulary {got.vocab_size:,})\n"
            f"train on it with `data = tokens(path = \"{os.path.basename(got.prefix)}.bin\""
            f"{'' if got.dtype == 'uint16' else ', dtype = ' + got.dtype})` and a model of "
            f"vocab = {got.vocab_size}\n")


def html_with_json(args) -> int | None:
    """`--html` with `--json`: one asks for a page, the other for stdout to hold only JSON; refused (exit 2)."""
    if args.html and args.json:
        sys.stderr.write(f"error: --html and --json: choose one (the page is drawn from the same figures as "
                         f"`scalec {args.command} --json`)\n")
        return 2
    return None


def write_html(path: str, page: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    print(f"wrote {path}")
