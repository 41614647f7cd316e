"""Leaving out a node (`restart(exclude = node)`, the launcher's half): torchrun agents on loopback, one process
each, SCALEC_NODE naming each agent's node, --max-restarts 0 (a restart that counted would end the job). The worker
is a wrapper around gpt_dp's program (dp = 2 on two nodes of one): in the first attempt it trains to step 2 (saved
there by the SIGTERM hook) and then ends the attempt as the straggler detector's act will (rank 0 marks rank 1's
node `excluded` in the node record; every worker exits with runtime.node_record.leave_out's code); once the record
names a node left out, it runs the program to step 4. What each case shows:

- a spare (3 agents, --nnodes 2): the node left out leaves and exits 0, the spare takes its place, the plan resumes
  from step 2 on the same world, and its losses are a run never interrupted's, bitwise;
- no spare, a smaller minimum (2 agents, --nnodes 1:2): the job re-forms on one node, and the program refuses the
  world (the plan needs 2) with the line saying a `replan` is needed, never starting a wrong mesh;
- no spare at the minimum (2 agents, --nnodes 2): every agent ends the job with EXIT_EXCLUDE, the node left out's
  host in SCALEC_EXCLUDED_HOSTS' file (what launch.sbatch submits again without);
- and a spare never needed (launch.sh's SPARE_NODES=1) leaves with the job, status 0.

Slow tier (about 3 minutes here): test_node_record.py's `test_the_launcher_s_decisions` and test_sbatch.py's
exclusion cases hold the decisions and the batch job's resubmission in CI; this drills torch's rendezvous itself.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from compiler import codegen
from compiler.check import check_text
from compiler.pipeline import compile_spec
from runtime import errors
from runtime.node_record import NodeRecord
from tests.e2e.runner import ROOT, _free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PLAN = (ROOT / "samples" / "gpt_dp.scale").read_text().replace("nodes = 1", "nodes = 2").replace(
    "devices_per_node = 2", "devices_per_node = 1").replace("log_every    = 5", "log_every    = 1")

WRAPPER = '''
import os, subprocess, sys, time
from runtime import node_record
ckpt = os.environ["DRILL_CKPT"]
record = node_record.NodeRecord(os.path.join(ckpt, node_record.FILE))
program = [sys.executable, os.environ["DRILL_PROGRAM"], *sys.argv[1:]]
if not record.excluded():  # the first attempt: train to step 2 (saved there: the SIGTERM hook), leave out rank 1's node
    code = subprocess.call(program, env=dict(os.environ, SCALEC_TEST_TERM_AT="0:2"))
    if code:
        sys.exit(code)
    victim, rank = os.path.join(ckpt, "victim"), int(os.environ["RANK"])
    if rank == 1:
        with open(victim + ".tmp", "w") as f:
            f.write(node_record.node_name())
        os.replace(victim + ".tmp", victim)
    while not os.path.exists(victim):
        time.sleep(0.05)
    name = open(victim).read()
    if rank == 0:  # as the straggler detector's act will: rank 0 records, then every worker leaves
        record.mark(name, "excluded", {"rank": 1, "why": "drill"}, attempt=0)
    sys.exit(node_record.leave_out(name))
with open(os.path.join(ckpt, "ran"), "a") as f:
    f.write(node_record.node_name() + "\\n")
sys.exit(subprocess.call(program))
'''


def _drill(tmp_path: Path, agents: int, nnodes: str, timeout: int = 240) -> dict:
    build = tmp_path / "build"
    codegen.emit(compile_spec(check_text(PLAN, "drill.scale")), str(build))
    (tmp_path / "wrapper.py").write_text(WRAPPER)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    port = _free_port()
    procs = []
    for i in range(agents):
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", SCALEC_NODE=f"n{i}",
                   DRILL_CKPT=str(ckpt), DRILL_PROGRAM=str(build / "program.py"),
                   SCALEC_EXCLUDED_HOSTS=str(tmp_path / "excluded_hosts"))
        cmd = [sys.executable, "-m", "runtime.launch", "--nnodes", nnodes, "--nproc-per-node", "1",
               "--max-restarts", "0", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", "drill", "--rdzv-conf", "last_call_timeout=5", "--monitor-interval", "0.2",
               str(tmp_path / "wrapper.py"), "--steps", "4", "--checkpoint-dir", str(ckpt),
               "--metrics", str(tmp_path / "metrics.jsonl")]
        procs.append(subprocess.Popen(cmd, cwd=build, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    out = {}
    try:
        for i, p in enumerate(procs):
            text, _ = p.communicate(timeout=timeout)
            out[f"n{i}"] = (p.returncode, text)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    left = NodeRecord(ckpt / "nodes.json").excluded()
    ran = (ckpt / "ran").read_text().split() if (ckpt / "ran").exists() else []
    hosts = (tmp_path / "excluded_hosts").read_text().split() if (tmp_path / "excluded_hosts").exists() else []
    return {"out": out, "left": left, "ran": ran, "hosts": hosts, "losses": _losses(tmp_path / "metrics.jsonl")}


def _losses(path: Path) -> dict:
    by_step = {}
    for line in path.read_text().splitlines() if path.exists() else ():
        r = json.loads(line)
        by_step[r["step"]] = r["loss"]
    return by_step


def _say(result: dict) -> str:
    return "\n".join(f"--- {n} (exit {rc})\n{text[-3000:]}" for n, (rc, text) in result["out"].items())


def test_a_spare_takes_the_place_of_the_node_left_out(tmp_path):
    r = _drill(tmp_path, agents=3, nnodes="2")
    assert len(r["left"]) == 1, _say(r)
    gone = r["left"][0]
    assert all(rc == 0 for rc, _ in r["out"].values()), _say(r)
    assert f"scalec: node {gone} is left out" in r["out"][gone][1], _say(r)
    rejoined = [n for n, (_, text) in r["out"].items() if "restarts its workers with the nodes left" in text]
    assert len(rejoined) == 1 and rejoined[0] in r["ran"] and rejoined[0] != gone, _say(r)  # the spare never ran
    assert sorted(r["ran"]) == sorted(n for n in r["out"] if n != gone), _say(r)  # the spare and the one left
    assert r["hosts"] == [socket.gethostname()]
    logs = "".join(text for _, text in r["out"].values())
    assert "resumed from" in logs and "(step 2)" in logs, _say(r)
    # the same world on the same plan, resumed: the losses of a run never interrupted, bitwise
    build = tmp_path / "build"
    ref = tmp_path / "ref.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT), LOCAL_NODES="1", MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(build / "launch.sh"), "--steps", "4", "--metrics", str(ref)], cwd=build,
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert r["losses"] == _losses(ref) and sorted(r["losses"]) == [1, 2, 3, 4], (r["losses"], _losses(ref))


def test_a_spare_never_needed_ends_with_the_job(tmp_path):
    """launch.sh's SPARE_NODES: the third agent waits in torch's redundancy list; when the job ends it leaves with
    status 0 (torch 2.13's agent returns None there, which its launcher would fail on: runtime.launch.Agent.run)."""
    build = tmp_path / "build"
    codegen.emit(compile_spec(check_text(PLAN, "drill.scale")), str(build))
    env = dict(os.environ, PYTHONPATH=str(ROOT), LOCAL_NODES="1", SPARE_NODES="1", MASTER_PORT=str(_free_port()),
               OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(build / "launch.sh"), "--steps", "1"], cwd=build, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_no_spare_and_a_smaller_minimum_refuses_the_world_saying_replan(tmp_path):
    r = _drill(tmp_path, agents=2, nnodes="1:2")
    assert len(r["left"]) == 1, _say(r)
    gone = r["left"][0]
    (stay,) = [n for n in r["out"] if n != gone]
    assert r["out"][gone][0] == 0, _say(r)
    rc, text = r["out"][stay]
    assert rc == errors.EXIT_CODE, _say(r)
    assert "this program needs 2 processes (dp=2), but torchrun started 1: 1 node was left out" in text, _say(r)
    assert "a `replan` is needed" in text and r["ran"] == [stay], _say(r)


def test_no_spare_at_the_minimum_ends_the_job_for_the_batch_job_to_resubmit(tmp_path):
    r = _drill(tmp_path, agents=2, nnodes="2")
    assert len(r["left"]) == 1 and r["ran"] == [], _say(r)
    for rc, text in r["out"].values():
        assert rc == errors.EXIT_EXCLUDE, _say(r)
        assert "the job ended to leave out a node" in text, _say(r)
    assert r["hosts"] == [socket.gethostname()]
