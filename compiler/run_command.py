"""`scalec run`: the launch command of a compiled program, and the loop that re-plans when a run asks for it.

The program is launched by its generated launch.sh (torchrun, runtime/launch.py). A run whose `resilience` says
`on_straggler = replan` ends its attempt on purpose once it has named a node to leave out: it saves a checkpoint,
writes what it wants into `<checkpoint_dir>/replan.json` (`REQUEST`: the nodes of the attempt, the node ranks to
leave out, why, at which step) and every worker exits with runtime.errors.REPLAN_CODE. This loop then re-plans
(compiler/replan.py: the search on the nodes left, its plan written beside the file), compiles that file into a
build directory of its own, and launches it with the same program flags; the program resumes from the same
checkpoint directory on the new plan. It does so at most `MAX_REPLANS` times in one `scalec run`.

On a job of several machines (NODE_RANK set), each machine's `scalec run` re-plans alike (the search is
deterministic) from the request it reads in the shared checkpoint directory; a machine left out ends with one line,
the others take their new NODE_RANK (their rank among the nodes left). Node 0 holds the rendezvous (MASTER_ADDR):
where it is the one left out, the job stops with one line saying to start again with another MASTER_ADDR.

On SLURM (`--slurm`, run inside the allocation: `sbatch --no-kill --nodes=N --wrap "scalec run FILE --slurm --
FLAGS"`; without --no-kill Slurm revokes the allocation when a node fails, and nothing is left to re-plan in), the
launch is the build's launch.sbatch (srun, one torchrun agent per node); under `replan` a node that fails does not
end the allocation, the nodes left ask for the re-plan, and the new plan's launch.sbatch runs in the same allocation
without the hosts left out (SLURM_EXCLUDE: `srun --exclude`).
"""
from __future__ import annotations

import json
import os
import shlex
import sys

MAX_REPLANS = 3
SLURM_EXCLUDE = "SCALEC_SLURM_EXCLUDE"
"""With `--slurm`, the hosts of the allocation the re-plans left out (comma-separated), which launch.sbatch's srun
excludes."""
LOCAL_NAMES = "SCALEC_LOCAL_NODE_NAMES"
"""With `--local-nodes`, the names launch.sh gives its agents (runtime.node_record.node_name): after a re-plan the
nodes left keep theirs, and the one left out is not started again under its name."""


class UsageError(Exception):
    """A command line that cannot run: printed as one line, exit status 2."""


def launch_command(args, nodes: int, out: str, environ: dict) -> tuple[list[str], dict]:
    """The launch.sh command and environment of `scalec run`: program flags (`--steps`, `--metrics`, everything
    after `--`) as arguments, each kept whole; `--torchrun-args` split as a shell would into TORCHRUN_ARGS; on a
    mesh of several nodes, this node's share (NODE_RANK, MASTER_ADDR from the environment) or, with
    `--local-nodes`, every node here."""
    env = dict(environ)
    # The program imports the same runtime this compiler came with.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        torchrun = shlex.split(args.torchrun_string or "")
    except ValueError as err:
        raise UsageError(f"--torchrun-args: {err} in {args.torchrun_string!r}") from None
    env["TORCHRUN_ARGS"] = shlex.join(torchrun)
    env.pop("LOCAL_NODES", None)
    if getattr(args, "slurm", False):
        if args.local_nodes:
            raise UsageError("--slurm and --local-nodes: choose one (SLURM starts each node's share on its host)")
        if not environ.get("SLURM_JOB_NODELIST"):
            raise UsageError("--slurm runs inside a SLURM allocation (SLURM_JOB_NODELIST is not set): submit it, "
                             "e.g. sbatch --no-kill --nodes=N --wrap \"scalec run FILE --slurm -- FLAGS\" "
                             "(--no-kill: a node that fails does not end the allocation the re-plan runs in)")
        env["SCALEC_BUILD_DIR"] = os.path.abspath(out)
    elif nodes > 1 and args.local_nodes:
        env["LOCAL_NODES"] = "1"
    elif nodes > 1 and not (environ.get("NODE_RANK") and environ.get("MASTER_ADDR")):
        raise UsageError(f"this mesh spans {nodes} nodes: run `scalec run` on each with NODE_RANK=<0..{nodes - 1}> "
                         "and MASTER_ADDR=<address of node 0> set, or pass --local-nodes to start every node on "
                         "this machine")
    program_args = []
    if args.steps is not None:
        program_args += ["--steps", str(args.steps)]
    if args.metrics:
        program_args += ["--metrics", args.metrics]
    if args.resume_changed:
        program_args += ["--resume-changed", args.resume_changed]
    if args.resume_schedule:
        program_args += ["--resume-schedule", args.resume_schedule]
    script = "launch.sbatch" if getattr(args, "slurm", False) else "launch.sh"
    return ["bash", os.path.join(out, script), *program_args, *args.program_args], env


def checkpoint_dir(spec, program_args: list[str]) -> str | None:
    """Where the program keeps its checkpoints: `--checkpoint-dir` among the program flags (relative to the current
    directory, as the program reads it), else the file's `checkpoint_dir` (relative to the .scale file); None
    without either."""
    for i, a in enumerate(program_args):
        if a.startswith("--checkpoint-dir="):
            return a.partition("=")[2]
        if a == "--checkpoint-dir" and i + 1 < len(program_args):
            return program_args[i + 1]
    written = spec.train.checkpoint_dir
    if not written:
        return None
    return written if os.path.isabs(written) else os.path.join(os.path.dirname(os.path.abspath(spec.path)), written)


def read_request(directory: str | None) -> dict | None:
    """The run's re-plan request (`REQUEST` in its checkpoint directory), consumed: renamed to
    `replan.stepN.json` so that a later start does not read it again; None where there is none or it is unreadable
    (a line on stderr says which)."""
    if not directory:
        return None
    # read here, not at import: `scalec check` and `--help` load this module and import nothing of runtime/ beyond
    # the light names (tests/test_front_door.py)
    from runtime.leaving import REQUEST
    path = os.path.join(directory, REQUEST)
    try:
        with open(path, encoding="utf-8") as f:
            got = json.load(f)
        nodes, leave = int(got["nodes"]), sorted({int(n) for n in got["exclude"]})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        sys.stderr.write(f"scalec: {path} cannot be read ({err}): no re-plan\n")
        return None
    os.replace(path, os.path.join(directory, f"replan.step{int(got.get('step', 0))}.json"))
    return {**got, "nodes": nodes, "exclude": leave}


def this_node(request: dict, environ: dict) -> tuple[str | None, str | None]:
    """(this machine's NODE_RANK among the nodes left, or None where the job runs every node here; a line to end
    with where this machine is the one left out or node 0 is, else None)."""
    rank = environ.get("NODE_RANK")
    if rank is None or environ.get("LOCAL_NODES") == "1":
        return None, None
    me, leave = int(rank), request["exclude"]
    if me in leave:
        return None, f"scalec: this node ({me}) is left out of the re-planned job; it ends here"
    if 0 in leave:
        return None, ("scalec: node 0, which holds the rendezvous (MASTER_ADDR), is left out: start the re-planned "
                      "job again with MASTER_ADDR set to one of the nodes left")
    return str(me - sum(1 for n in leave if n < me)), None


def replanning(args, compiled, out: str, status: int, launch, load, emit, environ: dict) -> int:
    """After a launch that ended with `status`: while the run asks for a re-plan (runtime.errors.REPLAN_CODE and a
    request in its checkpoint directory), re-plan on the nodes left, compile, emit into `OUT.nodesN` and launch
    again (`launch(cmd, env)`, `load(path)` compiles, `emit(compiled, out)`); the last launch's status."""
    from compiler.replan import ReplanError, replan
    from runtime.errors import REPLAN_CODE

    done = 0
    while status == REPLAN_CODE and done < MAX_REPLANS:
        request = read_request(checkpoint_dir(compiled.spec, args.program_args))
        if request is None:
            sys.stderr.write("scalec: the run asked for a re-plan but left no request in its checkpoint directory; "
                             "not re-planned\n")
            return status
        left = request["nodes"] - len(request["exclude"])
        node_rank, end = this_node(request, environ)
        if end is not None:
            print(end, flush=True)
            return 0 if "left out of" in end else status
        try:
            step = compiled.costs.step  # the plan running now, as `scalec run` compiled it
            planned = replan(compiled.spec.path, left, old_step_s=step.step_time_s if step else None)
        except ReplanError as err:
            sys.stderr.write(f"scalec: cannot re-plan: {err}\n")
            return status
        print(planned.line(request.get("why", "")), flush=True)
        compiled = load(planned.path)
        out = f"{out.rstrip(os.sep)}.nodes{left}"
        env = dict(environ)
        if node_rank is not None:
            env["NODE_RANK"] = node_rank
        elif getattr(args, "slurm", False):  # the same allocation, without the hosts left out
            gone = [h for h in environ.get(SLURM_EXCLUDE, "").split(",") if h] + list(request.get("hosts", ()))
            environ = {**environ, SLURM_EXCLUDE: ",".join(dict.fromkeys(gone))}
            env[SLURM_EXCLUDE] = environ[SLURM_EXCLUDE]
        elif args.local_nodes:  # every node here: the agents keep the names of the nodes left (launch.sh)
            names = environ.get(LOCAL_NAMES, "").split() or [f"node{i}" for i in range(request["nodes"])]
            environ = {**environ, LOCAL_NAMES: " ".join(n for n in names if n not in request.get("hosts", ()))}
            env[LOCAL_NAMES] = environ[LOCAL_NAMES]
        cmd, env = launch_command(args, compiled.spec.cluster.nodes, out, env)
        emit(compiled, out)
        status = launch(cmd, env)
        done += 1
    return status
