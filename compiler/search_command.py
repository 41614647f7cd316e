"""`scalec search`: its command line (`add`) and what it does (`cmd_search`): the search of compiler/search/, or
with `--minimize cost | energy`, `--max-devices`, `--deadline` or `--budget` the sweep over allocations of
compiler/search/objective.py; then the table or JSON, `-o BEST.scale` and `--html`."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from compiler.lazy import imports_frozen, lazy
from compiler.report import commands as R

check = lazy("compiler.check")


def add(sub, positive_int) -> None:
    """The `search` subcommand on argparse's `sub` (`positive_int`: the command line's count type)."""
    c = sub.add_parser("search", help="the fastest plans for the model on the cluster, with reasons",
                       description="Search the plans of FILE's model on FILE's cluster (the mesh's nodes, "
                                   "devices_per_node, device and its figures; the train section as written) and "
                                   "print the fastest by predicted step time, each with its reasons, then the "
                                   "families rejected and why. Free: dp, tp, pp, ep (MoE models), virtual stages, "
                                   "micro-batch size and count, schedule, sequence parallelism, recompute, "
                                   "data_parallel. The file's own axes and plan settings are not constraints (the "
                                   "mesh may give only nodes, devices_per_node and device; the plan section may be "
                                   "absent): --fix says what is fixed. Where the file writes a plan, it is costed as "
                                   "`plan` costs it and printed under the ranking: its step against the best's, its "
                                   "mesh's rank, and the parts of the step that differ most. Exit status 1 when no "
                                   "plan fits.")
    c.add_argument("file", metavar="FILE")
    c.add_argument("--top", type=positive_int, default=5, metavar="K", help="how many plans to print (default 5)")
    c.add_argument("--nodes", type=positive_int, metavar="N",
                   help="search on N nodes instead of the mesh's (the same devices per node and device): planning "
                        "for a smaller or larger allocation, or re-planning on the nodes left")
    c.add_argument("--fix", action="append", default=[], metavar="KEY=VALUE",
                   help="fix a setting (repeatable; one value per key): dp, tp, pp, ep, cp, virtual_stages, "
                        "micro_batches, micro_batch_size, schedule, sequence_parallel, recompute, data_parallel, "
                        "fsdp_grad_sync, context_parallel, dispatch, offload, precision (bf16 or fp8)")
    c.add_argument("-o", "--output", metavar="BEST.scale",
                   help="write the fastest plan as a complete .scale file (FILE's other sections kept as written)")
    c.add_argument("--headroom", type=_headroom, default=None, metavar="SHARE",
                   help="the share of each device's memory no plan may use, as 0.1 or 10%% (default 10%%: the "
                        "margin within which `plan`, `compile` and `run` warn, W0502)")
    c.add_argument("--minimize", choices=("time", "cost", "energy"), default="time",
                   help="what the chosen plan minimises: the run's wall time (default: the fastest plan on the "
                        "file's nodes), its dollars or its energy (both searched on smaller allocations too)")
    c.add_argument("--deadline", metavar="TIME", help="the run's wall time at most TIME, with its unit: 30d, 36h, "
                   "2w, 90min")
    c.add_argument("--budget", metavar="DOLLARS", help="the run's price at most DOLLARS: 2M$, $2M, 250k$, 2000000")
    c.add_argument("--max-devices", metavar="N", help="search every allocation of the file's machines up to N "
                   "devices (whole nodes)")
    c.add_argument("--json", action="store_true", help="print the result as JSON (keys described in docs/planning.md)")
    c.add_argument("--html", metavar="OUT", help="write the ranking as one self-contained HTML page, with the best "
                   "plan's memory, step time, timeline and collectives")
    c.set_defaults(func=cmd_search)


def cmd_search(args) -> int:
    with imports_frozen():
        from compiler import check as _  # noqa: F401  (the parser's and the Spec's modules)
        from compiler import search as SE
        from compiler.search import objective as OBJ
    refused = R.html_with_json(args)
    if refused is not None:
        return refused
    try:
        fixed = SE.parse_fixes(args.fix)
        deadline = OBJ.parse_deadline(args.deadline) if args.deadline is not None else None
        budget = OBJ.parse_budget(args.budget) if args.budget is not None else None
        max_devices = _max_devices(args.max_devices, args.nodes)
    except (SE.FixError, OBJ.ObjectiveError) as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    spec = check.check_path(args.file, cluster_only=True)  # the axes and the plan are the search's to choose
    sys.stderr.write(R.warnings_text(spec))
    if args.nodes is not None and args.nodes == spec.cluster.nodes:
        sys.stderr.write(f"warning: --nodes {args.nodes} is the mesh's own node count: it changes nothing\n")
    elif args.nodes is not None:
        spec = spec.on(dataclasses.replace(spec.cluster, nodes=args.nodes))
    from compiler.search import precision as PR
    try:
        PR.variants(spec, fixed.get("precision"))  # a precision the search cannot give this file
    except SE.FixError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    per = spec.cluster.devices_per_node
    if max_devices is not None and max_devices < per:
        sys.stderr.write(f"error: --max-devices {max_devices} is less than one node ({per} devices per node, "
                         f"{args.file}'s mesh)\n")
        return 2
    cons = OBJ.Constraints(deadline_s=deadline, budget_usd=budget, max_devices=max_devices)
    if args.minimize == "time" and max_devices is None:
        result = SE.search(spec, top=args.top, fixed=fixed, headroom=args.headroom)
        from compiler.search.written import written  # the file's own plan beside the ranking
        result.written = written(args.file, spec, result.limit_bytes)  # None on another node count (--nodes)
        if deadline is None and budget is None:  # the search as it always was
            return _search_written(args, spec, result, result.winners[0] if result.winners else None, None)
        out = OBJ.single(spec, result, "time", cons, top=args.top)
        shown = SE.text(result) + OBJ.text(out)
    else:
        most = max_devices // per if max_devices is not None else spec.cluster.nodes
        progress = (lambda line: print(line, file=sys.stderr, flush=True))
        out = OBJ.sweep(spec, args.minimize, cons, top=args.top, fixed=fixed, headroom=args.headroom, most=most,
                        progress=progress)
        result = out.result()
        shown = OBJ.text(out) if out.options else SE.text(result)  # none fits the most nodes: the search's reasons
    if args.json:
        shown = R.json_text(OBJ.to_json(out, SE.to_json(result)))
    c = out.chosen
    if c is None and out.options:
        sys.stdout.write(shown)
        unwritten = [o for o in (args.output, args.html) if o]
        sys.stderr.write(f"error: {OBJ.no_plan_line(out)}"
                         + (f"; nothing written to {' or '.join(unwritten)}" if unwritten else "") + "\n")
        return 1
    o = out.options[c] if c is not None else None
    what = None
    if o is not None and (out.swept or o.rank != 1):
        what = (f"the plan of least {args.minimize} found on {o.nodes} node{'s' if o.nodes != 1 else ''}"
                + (f" ({cons.words()})" if cons.words() else ""))
    return _search_written(args, o.spec if o else spec, result, o.winner if o else None, what, shown)


def _search_written(args, spec, result, winner, chosen: str | None, shown: str | None = None) -> int:
    """`search`'s output (`shown`, or the search's table or JSON), then `-o`'s file of `winner` on `spec`'s nodes
    (`chosen` says how it was chosen where it is not simply the fastest) and `--html`'s page; exit 1 when no plan
    fits."""
    from compiler import search as SE
    sys.stdout.write(shown if shown is not None else R.search_output(result, args.json))
    if winner is None:  # the reasons are printed above, under `rejected`
        sys.stderr.write(R.search_failure(result.fixed, *(o for o in (args.output, args.html) if o)))
        return 1
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(SE.scale_text(spec, winner, chosen=chosen))
        if not args.json:
            print(f"wrote {args.output}")
    if args.html:
        from compiler.report import html
        R.write_html(args.html, html.search_html(result))
    return 0


def _max_devices(text: str | None, nodes: int | None) -> int | None:
    """`search --max-devices N`: a positive count of devices, not with --nodes (each says how many nodes)."""
    from compiler.search.objective import ObjectiveError
    if text is None:
        return None
    if nodes is not None:
        raise ObjectiveError("--max-devices and --nodes: choose one (--nodes searches one count, --max-devices "
                             "every count up to it)")
    try:
        n = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise ObjectiveError(f"--max-devices {text!r}: expected a count of devices such as 512") from None
    if n < 1:
        raise ObjectiveError(f"--max-devices {text!r}: expected a positive count of devices")
    return n


def _headroom(text: str) -> float:
    """argparse type of `search --headroom`: a share of each device kept free, as `0.15` or `15%`; at least 0 and
    below 1 (a usage error, exit 2, otherwise)."""
    value = text.strip()
    try:
        share = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share of the device such as 0.1 or 10%, not {text!r}") from None
    if not 0 <= share < 1:
        raise argparse.ArgumentTypeError(f"expected a share from 0 (none) to below 1 (or 0% to below 100%), "
                                         f"not {text!r}")
    return share
