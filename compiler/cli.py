"""scalec: check, plan, compile and run .scale training plans.

  scalec check FILE              report every problem in FILE, or say it is fine
  scalec explain CODE            what a diagnostic code (E0401, ...) means and what to do about it
  scalec plan FILE               parameters, FLOPs, memory per rank, mesh and collectives (--html OUT: as a page)
  scalec compile FILE [-o DIR]   write DIR (default build/<model name>): program.py, plan.json, launch.sh
  scalec search FILE [-o BEST]   the fastest plans for FILE's model on its cluster, with reasons (--html OUT too)
  scalec network FILE            what one collective reaches on FILE's cluster, per NCCL algorithm (--op, --size,
                                 --ranks N or --group dp, --json; --measured OUTPUT fits nccl-tests' output)
  scalec reshard OLD NEW         before resuming OLD's checkpoint on NEW's plan: each tensor's pieces under both
                                 plans and the bytes each rank of NEW reads; refused when the models differ
  scalec import CONFIG [-o FILE] the .scale model section of a Hugging Face config.json (Llama, Mistral, Qwen 2,
                                 Mixtral); -o writes a whole file, with placeholder mesh and train sections
  scalec export FILE CKPT -o DIR a checkpoint of FILE's model as Hugging Face safetensors and config.json
  scalec run FILE [-- FLAGS]     compile, then launch under torchrun with as many processes as this node runs;
                                 FLAGS go to the program (e.g. -- --checkpoint-dir ckpt --seed 7), torchrun's own
                                 flags in one quoted string: --torchrun-args "--redirects 3 --log-dir 'my logs'"

Exit status: 0 on success, 1 when the input has errors (printed as diagnostics), 2 on a usage error, 3 on an
internal error (a bug in scalec: one line; SCALEC_BACKTRACE=1 prints the Python trace too).
"""
from __future__ import annotations

import argparse
import codecs
import os
import subprocess
import sys
import traceback

from compiler import __version__
from compiler.diagnostics import ScaleError
from compiler.lazy import lazy
from compiler.report import commands as R
from compiler import run_command, search_command
from compiler.run_command import UsageError, launch_command  # noqa: F401 (the run command's, used here and by tests)

# The driver, read on first use: `--help` and `explain` load no .scale file and skip the parser and the rules.
pipeline = lazy("compiler.pipeline")
RP = lazy("compiler.report.plan")  # reads the cost model, which imports torch
fit = lazy("compiler.fit")
check = lazy("compiler.check")


def _load(path: str, budget: bool = True, show=None):
    """Compile `path` (which proves its pipeline schedule); with `budget`, also refuse a plan whose predicted peak
    memory does not fit (compile, run, unless --force); `show` sees each segment's graph after each pass."""
    compiled = pipeline.compile_checked(path, memory=budget, show=show)
    sys.stderr.write(R.warnings_text(compiled.spec))
    return compiled


def _show_graph(after: str, cls: str, gm) -> None:
    """`--show-graphs`: on stderr, so that stdout keeps the command's output."""
    sys.stderr.write(R.graph_text(after, cls, gm))


def cmd_check(args) -> int:
    spec = check.check_path(args.file)
    sys.stderr.write(R.warnings_text(spec))
    sys.stdout.write(R.check_verdict(args.file, spec))
    return 0


def cmd_explain(args) -> int:
    from compiler.codes import explain
    text = explain(args.code)
    if text is None:
        sys.stderr.write(f"error: unknown diagnostic code `{args.code}` (codes look like E0401)\n")
        return 2
    sys.stdout.write(text)
    return 0


_html_with_json, _write_html = R.html_with_json, R.write_html  # shared with compiler/search_command.py


def cmd_plan(args) -> int:
    refused = _html_with_json(args)
    if refused is not None:
        return refused
    compiled = _load(args.file, budget=False)
    sys.stdout.write(R.json_text(RP.plan_json(compiled)) if args.json else RP.plan_text(compiled))
    if args.svg:  # with --json too (stdout then holds only the JSON: the note goes to stderr)
        with open(args.svg, "w", encoding="utf-8") as f:
            f.write(RP.schedule_svg(compiled))
        sys.stderr.write(RP.schedule_svg_note(compiled, args.svg) or "")
        print(f"wrote {args.svg}", file=sys.stderr if args.json else sys.stdout)
    if args.html:
        from compiler.report import html
        _write_html(args.html, html.plan_html(compiled))
    return 0


def _build_dir(compiled, out: str | None) -> str:
    return out or os.path.join("build", compiled.spec.model.name)


def cmd_compile(args) -> int:
    from compiler import codegen
    compiled = _load(args.file, budget=not args.force, show=_show_graph if args.show_graphs else None)
    _forced(args, compiled)
    out = _build_dir(compiled, args.output)
    for path in codegen.emit(compiled, out):
        print(f"wrote {path}")
    return 0


def cmd_reshard(args) -> int:
    from compiler import reshard
    old, new = _load(args.old, budget=False), _load(args.new, budget=False)
    sys.stdout.write(reshard.report(old, new, args.old, args.new))
    return 0


def cmd_export(args) -> int:
    from compiler import export as X
    compiled = _load(args.file, budget=False)
    spec = compiled.spec
    try:
        def chosen(checkpoint: str, skipped: list) -> None:
            for why in skipped:
                print(f"scalec export: passing over a damaged checkpoint: {why}", file=sys.stderr)
            if checkpoint != args.checkpoint:
                print(f"scalec export: {checkpoint}, the newest checkpoint in {args.checkpoint}", flush=True)
        written = X.export(spec, args.checkpoint, args.out, config_from=args.config, chosen=chosen,
                           guard=lambda step: X.check_same_model(compiled, step))
    except X.ExportError as err:
        print(f"scalec export: {err}", file=sys.stderr)
        return 1
    print(f"wrote {', '.join(os.path.join(args.out, w) for w in written)}")
    return 0


def cmd_data(args) -> int:
    from compiler import datasets as D
    try:
        got = D.build(args.inputs, args.tokenizer, args.output, text_key=args.text_key, separator=args.separator,
                      progress=not args.quiet)
    except D.DataError as err:
        sys.stderr.write(f"error: {err}\n")
        return 1
    sys.stdout.write(R.data_written(got))
    return 0


def cmd_import(args) -> int:
    from compiler.importer import complete, import_config
    if os.path.isdir(args.file):  # a checkpoint's directory, as save_pretrained writes it
        config = os.path.join(args.file, "config.json")
        if not os.path.isfile(config):
            sys.stderr.write(f"error: {args.file} is a directory without a config.json: name a Hugging Face "
                             "checkpoint's directory or its config.json\n")
            return 1
        args.file = config
    with open(args.file, encoding="utf-8-sig") as f:  # a leading byte-order mark is not part of the text
        text = f.read()
    model = import_config(text, args.file)
    if args.output is None:
        sys.stdout.write(model)
        return 0
    whole = complete(model)
    spec = check.check_text(whole, args.output)  # what is written checks
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(whole)
    sys.stdout.write(R.imported(args.output, spec, args.file))
    return 0


def _positive_int(text: str) -> int:
    """argparse type of a count (`--steps`, `--top`): 0 or a negative number is a usage error (exit 2) before
    anything is compiled or launched, not a run that trains nothing."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {n}")
    return n


def _program_steps(program_args: list[str]) -> None:
    """`scalec run FILE -- --steps N`: the program's own --steps, held to what `scalec run --steps` takes."""
    for i, a in enumerate(program_args):
        value = a.partition("=")[2] if a.startswith("--steps=") else (
            program_args[i + 1] if a == "--steps" and i + 1 < len(program_args) else None)
        if value is not None:
            try:
                _positive_int(value)
            except argparse.ArgumentTypeError as err:
                raise UsageError(f"--steps (after `--`): {err}") from None


HTML_COMMANDS = ("plan", "search")  # the commands with a report to draw as a page


def _html_elsewhere(argv: list[str]) -> str | None:
    """`--html` given to a command with no report (check, compile, run, ...): one line saying which have one,
    rather than argparse's usage and "unrecognized arguments"."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is None or command in HTML_COMMANDS:
        return None
    if any(a == "--html" or a.startswith("--html=") for a in argv):
        return (f"error: --html: `scalec {command}` has no report to draw; only "
                f"{' and '.join(f'`scalec {c}`' for c in HTML_COMMANDS)} write an HTML page\n")
    return None


def _forced(args, compiled) -> None:
    """--force: the memory error becomes a warning the user still sees."""
    if args.force:
        for d in fit.budget(compiled):
            if d.severity == "error":
                sys.stderr.write(f"warning (--force): {d.message}\n")


def cmd_network(args) -> int:
    from compiler.report.network import network_output
    spec = check.check_path(args.file)
    sys.stderr.write(R.warnings_text(spec))
    try:
        sys.stdout.write(network_output(spec, args))
    except ValueError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    return 0


def cmd_run(args) -> int:
    from compiler import codegen
    try:
        _program_steps(args.program_args)
    except UsageError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    compiled = _load(args.file, budget=not args.force)
    _forced(args, compiled)
    out = _build_dir(compiled, args.output)
    m = compiled.spec.cluster
    try:
        cmd, env = launch_command(args, m.nodes, out, os.environ)
    except UsageError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    codegen.emit(compiled, out)

    def launch(cmd, env) -> int:
        nodes, per = compiled_now[0].spec.cluster.nodes, compiled_now[0].spec.cluster.devices_per_node
        here = nodes * per if env.get("LOCAL_NODES") or nodes == 1 or args.slurm else per
        sys.stdout.write(R.launching(cmd, here, env["TORCHRUN_ARGS"]))
        sys.stdout.flush()
        return subprocess.call(cmd, env=env)

    def load(path):  # a re-planned file, compiled as the first was
        compiled_now[0] = _load(path, budget=not args.force)
        return compiled_now[0]

    compiled_now = [compiled]
    status = launch(cmd, env)
    return run_command.replanning(args, compiled, out, status, launch, load, codegen.emit, os.environ)


def _undecodable_as_bytes(err: UnicodeError):
    """Error handler of stdout and stderr: a file name's byte that is not UTF-8 (kept by Python as a lone surrogate)
    is written back as that byte, as the user typed it; any other character the stream cannot encode, escaped."""
    ch = err.object[err.start] if isinstance(err, UnicodeEncodeError) else ""
    if ch and 0xdc80 <= ord(ch) <= 0xdcff:
        return bytes([ord(ch) - 0xdc00]), err.start + 1
    return codecs.backslashreplace_errors(err)


codecs.register_error("scalec.undecodable", _undecodable_as_bytes)


def _parser() -> argparse.ArgumentParser:
    """`scalec`'s arguments: one sub-command each."""
    p = argparse.ArgumentParser(prog="scalec", description="Compile .scale training plans into torch.distributed "
                                "programs.", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"scalec {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _compile_commands(sub)
    _network_command(sub)
    _run_commands(sub)
    return p


def _compile_commands(sub) -> None:
    """The commands that read a .scale file and write or print what it compiles to."""
    c = sub.add_parser("check", help="report every problem in a .scale file",
                       description="Parse and check FILE; print every problem found, each located in the source.")
    c.add_argument("file", metavar="FILE")
    c.set_defaults(func=cmd_check)
    c = sub.add_parser("explain", help="what a diagnostic code means",
                       description="Print the title and explanation of a diagnostic code, e.g. `scalec explain "
                                   "E0401`.")
    c.add_argument("code", metavar="CODE")
    c.set_defaults(func=cmd_explain, file=None)
    c = sub.add_parser("plan", help="parameters, FLOPs, memory per rank, mesh and collectives",
                       description="Build the model on the meta device (no weights are allocated) and print what "
                                   "the plan costs: parameters, FLOPs per step, model-state memory per rank, the "
                                   "mesh and the collectives of one step.")
    c.add_argument("file", metavar="FILE")
    c.add_argument("--svg", metavar="OUT", help="write the pipeline schedule's timeline as an SVG")
    c.add_argument("--json", action="store_true", help="print everything as JSON (keys described in docs/planning.md)")
    c.add_argument("--html", metavar="OUT", help="write the report as one self-contained HTML page: memory per rank, "
                   "step time, the pipeline timeline, every collective")
    c.set_defaults(func=cmd_plan)
    c = sub.add_parser("compile", help="write the program, plan.json and launch script",
                       description="Compile FILE into DIR: program.py (the same file on every rank), plan.json and "
                                   "launch.sh (the torchrun command).")
    c.add_argument("file", metavar="FILE")
    c.add_argument("-o", "--output", metavar="DIR", help="output directory (default build/<model name>)")
    c.add_argument("--show-graphs", action="store_true",
                   help="print every segment's graph after each pass (to stderr)")
    c.add_argument("--force", action="store_true", help="compile even if the predicted peak memory does not fit")
    c.set_defaults(func=cmd_compile)
    c = sub.add_parser("reshard", help="what moving a checkpoint from one plan to another reads",
                       description="Compile OLD and NEW (plans of one model) and print, for each tensor of the "
                                   "checkpoint, its pieces under both plans (axis, dim, pieces, pipeline stage) and "
                                   "the bytes each rank of NEW reads. Runs nothing.")
    c.add_argument("old", metavar="OLD")
    c.add_argument("new", metavar="NEW")
    c.set_defaults(func=cmd_reshard, file=None)
    c = sub.add_parser("export", help="a checkpoint of FILE's model as a Hugging Face checkpoint",
                       description="Read CHECKPOINT (a step_N directory the program saved, under any plan, or the run's "
                                   "checkpoint_dir, whose newest intact step_N is read) and write "
                                   "DIR/config.json and DIR/model*.safetensors in Hugging Face's layout of FILE's "
                                   "model (Llama, Qwen 2 or Mixtral), loadable by transformers and by "
                                   "`init = from(DIR)`.")
    c.add_argument("file", metavar="FILE")
    c.add_argument("checkpoint", metavar="CHECKPOINT")
    c.add_argument("-o", "--output", dest="out", required=True, metavar="DIR")
    c.add_argument("--config", metavar="CONFIG",
                   help="the config.json (or checkpoint directory) the model was imported from: its keys the model "
                        "does not set (token ids, ...) are kept, its generation config and tokenizer copied "
                        "(default: the directory of the train section's `init = from(...)`, if it holds one)")
    c.set_defaults(func=cmd_export)


NETWORK_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
"""compiler/cost/network.py's OPS (tests/test_network.py holds them equal): written here so that building the
parser, which `scalec --help` and `check` do, imports nothing of compiler/cost/ (and so no torch)."""


def _network_command(sub) -> None:
    """`scalec network`: what one collective reaches on the file's cluster."""
    c = sub.add_parser("network", help="what one collective reaches on the cluster, per NCCL algorithm",
                       description="Price one collective on FILE's cluster (nodes, devices_per_node, device; its "
                                   "fabric and topology when written) per NCCL algorithm (ring; tree for all_reduce "
                                   "across nodes; NVLS inside an NVLink domain of an H100, H200, B200 or GB200) and "
                                   "name the one NCCL would pick, in nccl-tests' terms: time, algbw and busbw. "
                                   "Large messages are modelled well, small ones roughly (docs/planning.md, "
                                   "The network).")
    c.add_argument("file", metavar="FILE")
    c.add_argument("--op", choices=NETWORK_OPS, default="all_reduce", help="the collective (default all_reduce)")
    c.add_argument("--size", metavar="BYTES",
                   help="the buffer, nccl-tests' size: 1GB (10^9), 1GiB or 1G (2^30), 256MB, 4096 (default 1GB)")
    who = c.add_mutually_exclusive_group()
    who.add_argument("--ranks", type=_positive_int, metavar="N", help="the first N ranks (default: every rank)")
    who.add_argument("--group", metavar="NAME", help="the mesh's groups of that name (dp, tp, dp×cp, ...): the "
                     "slowest of them")
    c.add_argument("--json", action="store_true", help='one object: {"op", "ranks", "bytes", "algorithms": [{"name", '
                   '"seconds", "algbw_gbps", "busbw_gbps", "tier"}, ...], "chosen"}')
    c.add_argument("--measured", metavar="OUTPUT", help="nccl-tests' output of --op over these ranks: fit the "
                   "fabric's NIC efficiency to its largest sizes and print the figure to put in the file")
    c.set_defaults(func=cmd_network)


def _run_commands(sub) -> None:
    """The commands that search, prepare data, import, and train."""
    search_command.add(sub, _positive_int)
    c = sub.add_parser("data", help="tokenize text or JSONL files into an indexed token dataset",
                       description="Tokenize INPUT files (.txt and .md: one document each; .jsonl: one document a line) with "
                                   "a Hugging Face tokenizer into PREFIX.bin and PREFIX.idx (Megatron-LM's indexed "
                                   "dataset) and PREFIX.bin.json (the sidecar: dtype, vocabulary, tokenizer, "
                                   "documents). PREFIX.bin trains as `tokens(path = \"PREFIX.bin\")`.")
    c.add_argument("inputs", nargs="+", metavar="INPUT", help=".txt, .md or .jsonl files, read in the order given")
    c.add_argument("--tokenizer", required=True, metavar="PATH",
                   help="a tokenizer.json, or a model directory holding one (nothing is downloaded)")
    c.add_argument("-o", "--output", required=True, metavar="PREFIX", help="writes PREFIX.bin, PREFIX.idx, "
                   "PREFIX.bin.json")
    c.add_argument("--text-key", default="text", metavar="KEY", help="the field of a JSONL line holding its text")
    c.add_argument("--separator", metavar="TOKEN", help='a token of the tokenizer ending every document (e.g. '
                   '"</s>"): the flat PREFIX.bin then keeps the boundaries too')
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.set_defaults(func=cmd_data, file=None)
    c = sub.add_parser("import", help="the .scale model section of a Hugging Face config.json",
                       description="Print the .scale model section equivalent to CONFIG, a Hugging Face config.json "
                                   "(or the checkpoint directory holding it) of LlamaForCausalLM, "
                                   "MistralForCausalLM, Qwen2ForCausalLM or MixtralForCausalLM; each line's comment "
                                   "names the JSON keys it came from. A key "
                                   "that is neither mapped nor known to be irrelevant, or a value the language "
                                   "cannot express, is an error located at the key.")
    c.add_argument("file", metavar="CONFIG", help="a config.json, or the directory holding one")
    c.add_argument("-o", "--output", metavar="FILE",
                   help="write a whole .scale file: the model section and placeholder mesh and train sections")
    c.set_defaults(func=cmd_import)
    c = sub.add_parser("run", help="compile, then train under torchrun",
                       description="Compile FILE, then launch it under torchrun with this node's processes. "
                                   "Arguments after `--` go to the program (see `build/<name>/program.py --help`: "
                                   "--checkpoint-dir, --seed, --debug, ...), each kept whole; torchrun's own flags "
                                   "go in one string, split as a shell would: --torchrun-args \"--log-dir 'my "
                                   "logs'\". A mesh of several nodes runs this node's share: set NODE_RANK and "
                                   "MASTER_ADDR (and MASTER_PORT) on each machine, or pass --local-nodes.")
    c.add_argument("file", metavar="FILE")
    c.add_argument("-o", "--output", metavar="DIR", help="build directory (default build/<model name>)")
    c.add_argument("--steps", type=_positive_int, help="train for this many steps instead of the file's")
    c.add_argument("--metrics", metavar="FILE", help="write one JSON line per step to FILE")
    c.add_argument("--resume-changed", metavar="KEY,...",
                   help="resume the checkpoint in checkpoint_dir although these settings changed since it was "
                        "written (seed, global_batch, seq_len, data, eval_split, lr, betas, weight_decay, eps, "
                        "grad_clip, lr_schedule, warmup, min_lr, steps); the log says what changed. Without it such "
                        "a resume is refused, naming every difference")
    c.add_argument("--resume-schedule", choices=("keep", "reanchor"),
                   help="a resumed run with more steps than its checkpoint's: keep the schedule's curve (the "
                        "default: a cosine stays at min_lr after its old last step) or reanchor its decay to the "
                        "new last step")
    c.add_argument("--torchrun-args", dest="torchrun_string", metavar="'FLAGS'",
                   help="torchrun's own flags, in one string (e.g. \"--redirects 3 --log-dir logs\")")
    c.add_argument("--local-nodes", action="store_true",
                   help="on a mesh of several nodes, start every node's processes on this machine (testing)")
    c.add_argument("--slurm", action="store_true",
                   help="inside a SLURM allocation: launch launch.sbatch (srun, one torchrun agent per node); a "
                        "re-plan runs the new plan in the same allocation without the hosts left out")
    c.add_argument("--force", action="store_true", help="run even if the predicted peak memory does not fit")
    c.set_defaults(func=cmd_run)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    for stream in (sys.stdout, sys.stderr):  # file names are printed; one that is not UTF-8 must not crash us
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="scalec.undecodable")
    program_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, program_args = argv[:i], argv[i + 1:]
    p = _parser()
    refused = _html_elsewhere(argv)
    if refused:
        sys.stderr.write(refused)
        return 2
    args = p.parse_args(argv)
    args.program_args = program_args
    if program_args and args.command != "run":
        p.error("arguments after `--` are for `scalec run` only")
    return _dispatch(args)


def _dispatch(args) -> int:
    """Run the command; an error in the input is its diagnostic and exit 1, a bug of ours one line and exit 3."""
    try:
        return args.func(args)
    except ScaleError as err:
        sys.stderr.write(err.render())
        return 1
    except FileNotFoundError as err:
        sys.stderr.write(f"error: cannot read {err.filename}: no such file\n")
        return 1
    except IsADirectoryError as err:
        sys.stderr.write(f"error: {err.filename} is a directory, not a .scale file\n")
        return 1
    except OSError as err:
        sys.stderr.write(f"error: {err.strerror or err}: {err.filename or ''}\n")
        return 1
    except UnicodeDecodeError:
        sys.stderr.write(f"error: {args.file} is not UTF-8 text\n")
        return 1
    except Exception as exc:  # noqa: BLE001 - a bug of ours, not of the input: say so in one line
        try:
            detail = str(exc).strip().split("\n")[0][:200]
        except Exception:  # noqa: BLE001 - the message itself may fail to print
            detail = ""
        what = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        sys.stderr.write(f"error: internal compiler error: {what} (a bug in scalec, not in your file; please "
                         "report it, with the trace that SCALEC_BACKTRACE=1 prints)\n")
        if os.environ.get("SCALEC_BACKTRACE", "") not in ("", "0"):
            traceback.print_exc()
        return 3


def entry() -> None:
    """The `scalec` command (pyproject's console script, `python -m compiler.cli`): `main`, then, where torch was
    imported, leave without the interpreter's teardown of it once every output is flushed and closed: that
    teardown frees nothing a finished command needs and takes ~0.6 s (`python -c "import torch"` 1.77 s against
    1.14 s ending with os._exit, measured here), a tenth of a `scalec search`. Files the commands write are closed
    by then (`with` blocks); subprocesses (`run`) have been waited for."""
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if "torch" in sys.modules:
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    entry()
