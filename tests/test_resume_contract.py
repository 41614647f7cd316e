"""The resume contract (runtime/resume.py) and the start-up mistakes beside it, in one process (issue 37, items 1, 3,
5 and the smaller ones): the runtime counterpart of the mistake table (tests/test_mistakes.py) for what only a
running program sees. Each test is one plausible mistake and the outcome it now has; the launched versions are in
tests/e2e/test_resume_contract.py.

- a resume that changes the seed, the global batch, the sequence length, the data, the learning rate or the
  schedule is refused in one line naming every difference with its old and new value;
- `--resume-changed KEY,...` lets it through, and the log says what changed;
- more steps than the checkpoint's run is an extension: allowed, the schedule's meaning said (keep the curve by
  default, `--resume-schedule reanchor` re-anchors the cosine to the new last step), the anchor carried on in the
  checkpoints it writes;
- `checkpoint_dir` is relative to the .scale file, as `data` and `init` are;
- SIGINT stops after the step, as SIGTERM does; `--metrics DIR` is a one-line start-up error (exit 78)."""
from __future__ import annotations

import ast as pyast
import json
import os
import signal
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from runtime import checkpoint, data, faults, resume, startup, train
from runtime.config import Config, Data, Eval, Optim, Parallel
from runtime.errors import EXIT_CODE, FatalError
from runtime.tensor_parallel import Shards

STEPS = 4


def _cfg(**top) -> Config:
    base = Config(name="m", source="m.scale", steps=STEPS, seed=1234, parallel=Parallel(axes=(("dp", 1),)),
                  optim=Optim(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, lr_schedule="cosine", warmup=1,
                              min_lr=3e-4, grad_clip=1.0),
                  data=Data(global_batch=8, seq_len=64, vocab=128))
    return replace(base, **top)


def _record(cfg: Config, tokens: str | None = None) -> dict:
    d = cfg.data if tokens is None else replace(cfg.data, kind="tokens", path=tokens)
    return resume.record(cfg, resume.data_identity(d.kind, d.path, d.dtype, d.document_separator))


def _tokens(path, seed: int, n: int = 4096) -> str:
    ids = torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(seed))
    data.write_tokens(str(path), ids.numpy(), "uint16", 128)
    return str(path)


# -- decide: what is compared, and the one line --------------------------------------------------------------------


def test_every_change_of_the_trajectory_is_named_in_one_line(tmp_path):
    """The defect: seed, global batch, lr ×100, schedule, token file and seq_len changed, and the run resumed with
    exit 0. Now one line names each difference with its old and new value, and the flag that would allow it."""
    old = _record(_cfg(), _tokens(tmp_path / "a.bin", 0))
    new_cfg = _cfg(seed=7, data=Data(global_batch=4, seq_len=32, vocab=128),
                   optim=Optim(lr=3e-1, betas=(0.9, 0.95), weight_decay=0.1, lr_schedule="constant", warmup=1,
                               min_lr=3e-4, grad_clip=1.0))
    new = _record(new_cfg, _tokens(tmp_path / "b.bin", 1))
    with pytest.raises(resume.Refused) as err:
        resume.decide("ckpt/step_00000002", old, new, 2)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("scalec: ckpt/step_00000002 was written by another run: seed 1234 → 7; global_batch 8 → 4; "
                           "seq_len 64 → 32; data ")
    assert f"{tmp_path}/a.bin (uint16, 8,192 bytes, sha256 " in line and f"→ {tmp_path}/b.bin (uint16" in line
    assert "; lr 0.003 → 0.3; lr_schedule cosine → constant." in line
    assert line.endswith("resume with --resume-changed seed,global_batch,seq_len,data,lr,lr_schedule; else start "
                         "in an empty checkpoint directory")


@pytest.mark.parametrize("key,change", [
    ("seed", dict(seed=1)),
    ("global_batch", dict(data=Data(global_batch=16, seq_len=64, vocab=128))),
    ("seq_len", dict(data=Data(global_batch=8, seq_len=128, vocab=128))),
    ("lr", dict(optim=Optim(lr=3e-1, betas=(0.9, 0.95), weight_decay=0.1, warmup=1, min_lr=3e-4, grad_clip=1.0))),
    ("warmup", dict(optim=Optim(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, warmup=5, min_lr=3e-4,
                                grad_clip=1.0))),
    ("min_lr", dict(optim=Optim(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, warmup=1, min_lr=0.0,
                                grad_clip=1.0))),
    ("betas", dict(optim=Optim(lr=3e-3, betas=(0.8, 0.95), weight_decay=0.1, warmup=1, min_lr=3e-4,
                               grad_clip=1.0))),
    ("weight_decay", dict(optim=Optim(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0, warmup=1, min_lr=3e-4,
                                      grad_clip=1.0))),
    ("grad_clip", dict(optim=Optim(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, warmup=1, min_lr=3e-4,
                                   grad_clip=0.5))),
])
def test_each_setting_alone_is_refused_and_allowed_by_its_key(key, change):
    old, new = _record(_cfg()), _record(_cfg(**change))
    with pytest.raises(resume.Refused, match=rf"another run: {key} [^;]+ → [^;]+\. .*--resume-changed {key};"):
        resume.decide("p", old, new, 2)
    decision = resume.decide("p", old, new, 2, allowed=frozenset({key}))
    assert decision.lines == [f"scalec: resuming with changed settings (--resume-changed): "
                              f"{resume._difference(key, old[key], new[key])}"]
    assert decision.schedule_steps == STEPS


def test_the_same_run_resumes_without_a_word():
    assert resume.decide("p", _record(_cfg()), _record(_cfg()), 2).lines == []


def test_data_rewritten_in_place_or_its_sidecar_changed_is_another_data(tmp_path):
    a = _tokens(tmp_path / "a.bin", 0)
    old = _record(_cfg(), a)
    _tokens(tmp_path / "a.bin", 1)  # the same path and size, other ids
    with pytest.raises(resume.Refused, match="another run: data .*a.bin"):
        resume.decide("p", old, _record(_cfg(), a), 2)
    _tokens(tmp_path / "a.bin", 0)
    sidecar = json.loads((tmp_path / "a.bin.json").read_text())
    (tmp_path / "a.bin.json").write_text(json.dumps({**sidecar, "tokenizer": "another"}))
    with pytest.raises(resume.Refused, match="another run: data .*sidecar sha256"):
        resume.decide("p", old, _record(_cfg(), a), 2)


def test_the_same_data_moved_is_said_not_refused(tmp_path):
    a = _tokens(tmp_path / "a.bin", 0)
    old = _record(_cfg(), a)
    os.makedirs(tmp_path / "moved")
    os.rename(a, tmp_path / "moved" / "a.bin")
    os.rename(a + ".json", tmp_path / "moved" / "a.bin.json")
    decision = resume.decide("p", old, _record(_cfg(), str(tmp_path / "moved" / "a.bin")), 2)
    assert decision.lines == [f"scalec: resuming with the data file moved: {a} → {tmp_path}/moved/a.bin (the same "
                              "size and checksums)"]


def test_another_plan_or_precision_is_said_not_refused():
    """A checkpoint moves between plans (runtime/checkpoint.py) and holds fp32 masters whatever the precision: the
    same training, rounded differently."""
    other = _cfg(precision="bf16", parallel=Parallel(axes=(("dp", 2),), batch_ranks=2, micro_batches=2,
                                                    micro_batch_size=2))
    decision = resume.decide("p", _record(_cfg()), _record(other), 2)
    assert decision.lines == ["scalec: resuming with micro_batching 1 micro-batch(es) of 1 on 1 batch rank(s) → 2 "
                              "micro-batch(es) of 2 on 2 batch rank(s) (the same training, rounded differently); "
                              "precision fp32 → bf16 (the same training, rounded differently)"]


def test_unknown_keys_are_refused_and_unused_ones_noted():
    with pytest.raises(ValueError, match="unknown setting learning_rate: --resume-changed takes seed, "):
        resume.parse_keys("seed,learning_rate")
    assert resume.parse_keys(" seed, lr ") == {"seed", "lr"}
    decision = resume.decide("p", _record(_cfg()), _record(_cfg()), 2, allowed=frozenset({"seed"}))
    assert decision.lines == ["scalec: note: --resume-changed names seed, unchanged since the checkpoint"]


# -- steps: extending a run, and what the schedule then means --------------------------------------------------------


def test_extending_a_finished_cosine_run_keeps_its_curve_by_default():
    old, new = _record(_cfg()), _record(_cfg(steps=6))
    decision = resume.decide("p", old, new, STEPS)
    assert decision.schedule_steps == STEPS
    assert resume.decide("p", old, new, STEPS, allowed=frozenset({"steps"})).lines == decision.lines  # no flag needed
    (line,) = decision.lines
    assert line.startswith("scalec: steps 4 → 6: the cosine keeps its curve (--resume-schedule keep, the default): "
                           "it reaches min_lr at step 4, then stays at min_lr 0.0003 to step 6; the log's lr "
                           "0.0003 at step 4, 0.0003 at step 5; --resume-schedule reanchor decays to min_lr at step "
                           "6 instead")


def test_reanchor_decays_to_the_new_last_step_and_says_the_jump():
    decision = resume.decide("p", _record(_cfg()), _record(_cfg(steps=6)), STEPS, schedule="reanchor")
    assert decision.schedule_steps == 6
    after = 3e-3 * resume.multiplier(5, schedule="cosine", warmup=1, lr=3e-3, min_lr=3e-4, anchor=6)
    assert after > 5e-4  # the jump back up: the old curve had reached min_lr
    assert decision.lines == [f"scalec: steps 4 → 6: the cosine is re-anchored (--resume-schedule reanchor): it "
                              f"reaches min_lr 0.0003 at step 6, as a run of 6 steps would; the log's lr 0.0003 "
                              f"at step 4, {after:.4g} at step 5"]


def test_a_constant_schedule_extends_without_a_question():
    constant = Optim(lr=3e-3, lr_schedule="constant", warmup=1)
    decision = resume.decide("p", _record(_cfg(optim=constant)), _record(_cfg(optim=constant, steps=9)), STEPS)
    assert decision.lines == ["scalec: steps 4 → 9: the schedule is constant after its warm-up; the learning rate "
                              "stays 0.003"]


def test_fewer_steps_needs_the_override_and_fewer_than_done_is_refused():
    old = _record(_cfg(steps=10))
    with pytest.raises(resume.Refused, match=r"another run: steps 10 → 6\. .*--resume-changed steps;"):
        resume.decide("p", old, _record(_cfg(steps=6)), 4)
    assert resume.decide("p", old, _record(_cfg(steps=6)), 4, allowed=frozenset({"steps"})).lines[0] == (
        "scalec: resuming with changed settings (--resume-changed): steps 10 → 6")
    with pytest.raises(resume.Refused, match=r"p is at step 4, past the 3 steps of this run"):
        resume.decide("p", old, _record(_cfg(steps=3)), 4, allowed=frozenset({"steps"}))


# -- through runtime.checkpoint: refused before any tensor is read; the anchor carried on ---------------------------


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(8, 8)


@pytest.fixture
def ctx(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield SimpleNamespace(rank=0, world_size=1, is_logger=True)
    dist.destroy_process_group()


def _training(model, contract):
    opt = torch.optim.AdamW(model.parameters(), lr=contract.record["lr"])
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, contract.lr_lambda())


def _save(model, directory, step: int, contract, ctx) -> str:
    opt, sched = _training(model, contract)
    sum(p.sum() for p in model.parameters()).backward()  # every parameter gets AdamW state
    opt.step()
    for _ in range(step):
        sched.step()
    return checkpoint.save(str(directory), step, [model], opt, sched, ctx, contract.record["steps"],
                           Shards((), ()), run=contract.record)


def _load(model, directory, contract, ctx):
    opt, sched = _training(model, contract)
    step = checkpoint.load_latest(str(directory), [model], opt, sched, ctx, contract.record["steps"],
                                  Shards((), ()), contract=contract)
    return step, opt, sched


def test_a_changed_resume_stops_before_any_tensor_is_read(ctx, tmp_path, capsys):
    path = _save(Tiny(), tmp_path / "ckpt", 2, resume.Contract(_record(_cfg())), ctx)
    assert json.loads(open(os.path.join(path, checkpoint.MANIFEST)).read())["run"]["seed"] == 1234
    fresh = Tiny()
    before = fresh.w.weight.detach().clone()
    with pytest.raises(FatalError) as err:
        _load(fresh, tmp_path / "ckpt", resume.Contract(_record(_cfg(seed=5))), ctx)
    assert err.value.code == EXIT_CODE
    assert err.value.message.startswith(f"scalec: {path} was written by another run: seed 1234 → 5. ")
    assert torch.equal(fresh.w.weight, before) and "resumed" not in capsys.readouterr().out
    contract = resume.Contract(_record(_cfg(seed=5)), allowed=frozenset({"seed"}))
    step, _, _ = _load(fresh, tmp_path / "ckpt", contract, ctx)
    assert step == 2
    assert capsys.readouterr().out.splitlines() == [
        f"scalec: resumed from {path} (step 2)",
        "scalec: resuming with changed settings (--resume-changed): seed 1234 → 5"]


def test_an_extended_run_keeps_its_anchor_in_the_checkpoints_it_writes(ctx, tmp_path, capsys):
    first = resume.Contract(_record(_cfg()))
    _save(Tiny(), tmp_path / "ckpt", STEPS, first, ctx)
    longer = resume.Contract(_record(_cfg(steps=6)))
    step, opt, sched = _load(Tiny(), tmp_path / "ckpt", longer, ctx)
    assert step == STEPS and longer.record["schedule_steps"] == STEPS
    assert opt.param_groups[0]["lr"] == pytest.approx(3e-4)  # the old curve's end: min_lr
    sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(3e-4)
    assert "the cosine keeps its curve" in capsys.readouterr().out
    path = _save(Tiny(), tmp_path / "ckpt", 6, longer, ctx)
    run = json.loads(open(os.path.join(path, checkpoint.MANIFEST)).read())["run"]
    assert (run["steps"], run["schedule_steps"]) == (6, STEPS)
    again = resume.Contract(_record(_cfg(steps=6)))
    _load(Tiny(), tmp_path / "ckpt", again, ctx)
    assert again.record["schedule_steps"] == STEPS  # the same run: its anchor carried on, no line about steps
    assert "steps" not in capsys.readouterr().out.split("\n", 1)[1]


def test_reanchored_schedule_drives_the_optimizer(ctx, tmp_path):
    _save(Tiny(), tmp_path / "ckpt", STEPS, resume.Contract(_record(_cfg())), ctx)
    longer = resume.Contract(_record(_cfg(steps=8)), schedule="reanchor")
    _, opt, _ = _load(Tiny(), tmp_path / "ckpt", longer, ctx)
    want = 3e-3 * resume.multiplier(STEPS, schedule="cosine", warmup=1, lr=3e-3, min_lr=3e-4, anchor=8)
    assert opt.param_groups[0]["lr"] == pytest.approx(want) and want > 1e-3


def test_a_checkpoint_from_before_the_contract_compares_its_steps_only(ctx, tmp_path, capsys):
    path = _save(Tiny(), tmp_path / "ckpt", 2, resume.Contract(_record(_cfg())), ctx)
    manifest = json.loads(open(os.path.join(path, checkpoint.MANIFEST)).read())
    del manifest["run"]
    with open(os.path.join(path, checkpoint.MANIFEST), "w") as f:
        json.dump(manifest, f)
    capsys.readouterr()
    assert _load(Tiny(), tmp_path / "ckpt", resume.Contract(_record(_cfg(seed=9, steps=6))), ctx)[0] == 2
    out = capsys.readouterr().out
    assert "was written before checkpoints recorded their run's settings: only its number of steps" in out
    assert "steps 4 → 6: the cosine keeps its curve" in out


# -- paths: checkpoint_dir relative to the .scale file ---------------------------------------------------------------


def test_checkpoint_dir_is_relative_to_the_scale_file_not_the_current_directory(tmp_path):
    """The defect: data and init were found from the .scale file, checkpoint_dir from wherever the run started, so
    a rerun from another directory started again at step 1. Now the program holds it relative to itself, as it
    holds the data path, and resolves it from its own directory."""
    from compiler import codegen
    from compiler.check import check_text
    from compiler.pipeline import compile_spec
    text = (open(os.path.join(os.path.dirname(__file__), "..", "samples", "tiny_gpt.scale")).read()
            .replace("log_every    = 5", 'log_every    = 5\n  checkpoint_dir = "runs/ckpt"'))
    project = tmp_path / "project"
    project.mkdir()
    (project / "tiny.scale").write_text(text)
    out = tmp_path / "elsewhere" / "build"
    codegen.emit(compile_spec(check_text(text, str(project / "tiny.scale"))), str(out))
    program = (out / "program.py").read_text()
    config = next(n.value for n in pyast.walk(pyast.parse(program)) if isinstance(n, pyast.Assign)
                  and getattr(n.targets[0], "id", "") == "CONFIG")
    ckpt = next(k.value for c in pyast.walk(config) if isinstance(c, pyast.Call)
                and getattr(c.func, "attr", "") == "Checkpoint" for k in c.keywords if k.arg == "dir")
    assert pyast.literal_eval(ckpt) == "../../project/runs/ckpt"
    written = next(k.value for c in pyast.walk(config) if isinstance(c, pyast.Call)
                   and getattr(c.func, "attr", "") == "Checkpoint" for k in c.keywords if k.arg == "as_written")
    assert pyast.literal_eval(written) == "runs/ckpt"  # for a run that finds checkpoints where they used to be
    assert data.resolve("../../project/runs/ckpt", str(out / "program.py")) == str(project / "runs" / "ckpt")


# -- Ctrl-C and --metrics ------------------------------------------------------------------------------------------


def test_sigint_asks_for_a_stop_at_the_step_as_sigterm_does(monkeypatch):
    """The defect: Ctrl-C raised KeyboardInterrupt in every rank while the launcher said a checkpoint was being
    saved. Now, once the mesh is up, SIGINT sets the same flag as SIGTERM (the step ends, the checkpoint is saved)."""
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(faults, "_TERM", False)
    monkeypatch.setattr(faults, "_CTX", faults._CTX)
    monkeypatch.setattr(faults, "_STORE", faults._STORE)
    try:
        faults.configure(None, None)
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pytest.fail("SIGINT raised KeyboardInterrupt: the step would not finish, nothing would be saved")
        assert faults._TERM and faults.stop_signal() == "SIGINT"
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal changes nothing
        assert faults.stop_signal() == "SIGINT"
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def test_the_launcher_says_what_a_signal_does():
    from runtime.launch import stopped
    assert "finishes its step, saves a checkpoint when checkpoint_dir is set and exits" in stopped("SIGINT")
    assert "without that line nothing was saved" in stopped("SIGINT")
    assert "without finishing their step: nothing was saved" in stopped("SIGHUP")


def test_metrics_pointing_at_a_directory_is_a_one_line_start_up_error(ctx, tmp_path):
    with pytest.raises(FatalError) as err:
        startup.check_metrics(str(tmp_path), ctx)
    assert err.value.code == EXIT_CODE
    assert err.value.message == (f"scalec: --metrics {tmp_path} is a directory: give a file to write one JSON line "
                                 "per step to")
    with pytest.raises(FatalError, match=r"--metrics .*/missing/m.jsonl cannot be written \(No such file"):
        startup.check_metrics(str(tmp_path / "missing" / "m.jsonl"), ctx)
    startup.check_metrics(str(tmp_path / "m.jsonl"), ctx)  # a file it can write: nothing said


def test_the_run_record_holds_what_decides_the_trajectory(tmp_path):
    cfg = _cfg(eval=Eval(every=2, batches=1, split=0.1))
    rec = _record(cfg, _tokens(tmp_path / "a.bin", 0))
    assert {k for k in rec} >= set(resume.REFUSED) | set(resume.NOTED) | {"steps", "schedule_steps"}
    assert rec["data"]["bytes"] == 8192 and rec["data"]["sidecar_sha256"] and rec["eval_split"] == 0.1
    assert json.loads(json.dumps(rec)) == rec  # stored as JSON in the manifest, compared after the round trip


def test_scalec_run_passes_the_resume_flags_to_the_program(monkeypatch):
    from compiler.cli import launch_command, main
    seen = {}
    monkeypatch.setattr("compiler.cli.cmd_run", lambda args: seen.setdefault("args", args) and 0)
    assert main(["run", "f.scale", "--resume-changed", "seed,lr", "--resume-schedule", "reanchor"]) == 0
    cmd, _ = launch_command(seen["args"], 1, "out", {})
    assert cmd[2:] == ["--resume-changed", "seed,lr", "--resume-schedule", "reanchor"]


def test_the_program_refuses_an_unknown_resume_key_at_once(monkeypatch, capsys):
    import sys
    monkeypatch.setattr(sys, "argv", ["program.py", "--resume-changed", "seed,learning_rate"])
    with pytest.raises(SystemExit) as err:
        train._parse_args(_cfg())
    assert err.value.code == EXIT_CODE  # not restarted by the launcher
    assert "argument --resume-changed: unknown setting learning_rate: --resume-changed takes seed, global_batch" in (
        capsys.readouterr().err)


def test_checkpoints_left_where_earlier_versions_looked_stop_the_run_instead_of_a_fresh_start(ctx, tmp_path,
                                                                                             monkeypatch):
    """Upgrading: a relative checkpoint_dir used to be read from the current directory. A run whose checkpoints are
    only there would now start again at step 1 beside them; it stops with one line saying where they are."""
    from runtime.config import Checkpoint
    project, cwd = tmp_path / "project", tmp_path / "cwd"
    (cwd / "ckpt" / "step_00000002").mkdir(parents=True)
    (cwd / "ckpt" / "step_00000002" / ".metadata").write_bytes(b"")
    monkeypatch.chdir(cwd)
    cfg = _cfg(checkpoint=Checkpoint(dir=str(project / "ckpt"), as_written="ckpt"))
    args = SimpleNamespace(checkpoint_dir=None)
    with pytest.raises(FatalError) as err:
        startup.legacy_checkpoints(cfg, ctx, args)
    assert err.value.code == EXIT_CODE and "\n" not in err.value.message
    assert err.value.message == (
        f'scalec: checkpoint_dir = "ckpt" is relative to the .scale file: {project}/ckpt holds no checkpoint, but '
        f"{cwd}/ckpt (the same path from the current directory, where earlier versions looked) holds "
        f"{cwd}/ckpt/step_00000002: move its checkpoints to {project}/ckpt, or pass --checkpoint-dir {cwd}/ckpt to "
        "resume from there")
    startup.legacy_checkpoints(cfg, ctx, SimpleNamespace(checkpoint_dir=str(cwd / "ckpt")))  # the flag decides
    (project / "ckpt" / "step_00000001").mkdir(parents=True)
    (project / "ckpt" / "step_00000001" / ".metadata").write_bytes(b"")
    startup.legacy_checkpoints(cfg, ctx, args)  # the file's own directory has checkpoints: those are the run's
    monkeypatch.chdir(project)
    startup.legacy_checkpoints(_cfg(checkpoint=Checkpoint(dir=str(project / "ckpt"), as_written="ckpt")), ctx, args)
