"""The training of a generated program (torchtitan's `Trainer`): set-up, step, evaluate, log and save, and the loop
that calls them (`train`). runtime.train parses the program's flags, starts the mesh and runs one Trainer.

A step waits for the device only where it must: the loss and the gradient norm stay on the device and are read on
logged steps (every step with `--metrics`); the preemption vote is read without waiting for the step's end
(faults.StopVote); the next step's batch is prepared while a step runs (data.Prefetcher). Between logged steps the
host queues work ahead of the device, so the time a logged line shows is the mean over the steps since the last one.
"""
from __future__ import annotations

import json
import time

import torch
import torch.distributed as dist
from torch import nn

from runtime import (checkpoint, collectives, data, energy, faults, hf, leaving, memory, mesh, moe, node_record,
                     offload, optimizer, parallelize, precision, progress, rebalance, sections, startup, stragglers,
                     tracking)
from runtime import tensor_parallel as tp
from runtime.config import Config
from runtime.layers import init_parameters
from runtime.model_parts import PipelineStages, WholeModel


class Trainer:
    """One run of `cfg` on this rank of `ctx`'s mesh, with the program's flags `args` (runtime.train): built by
    `setup` (the constructor), then `train` runs its steps from the checkpoint it resumed (or step 0) to the last
    one, evaluating, logging and saving on the way; returns the losses it read."""

    def __init__(self, model_cls, cfg: Config, ctx: mesh.Context, args, loss_fn=None, program: str | None = None):
        self.cfg, self.ctx, self.args, self.program = cfg, ctx, args, program
        self.setup(model_cls, loss_fn)

    # -- set-up ----------------------------------------------------------------------------------------------------

    def setup(self, model_cls, loss_fn) -> None:
        """Check the start-up, build this rank's model parts, its optimizer and schedule, resume the latest
        checkpoint, and open the data, the metrics file and the trackers."""
        cfg, ctx, args = self.cfg, self.ctx, self.args
        startup.check_contract(cfg, ctx)
        startup.check_metrics(args.metrics, ctx)
        if cfg.checkpoint.dir:
            startup.legacy_checkpoints(cfg, ctx, args)
        torch.manual_seed(cfg.seed)
        par = cfg.parallel
        self.shards = tp.Shards(par.tp_shards, par.tp_partial_grads, par.ep_shards)
        self.fsdp = par.shards_grads  # FSDP2 (zero2, fsdp) holds the weights, gradients and optimizer state sharded
        self.mixed = precision.main_grads(cfg.precision, par)  # bf16 weights, main gradients, masters
        self.loaded = []  # runtime.hf.Loaded of each module this rank prepared from `init`
        # A run that resumes (or stops: none intact) takes its weights from the checkpoint: `init = from(...)` is not
        # read, and the log says so after "resumed from"
        self.skip_init = bool(cfg.init.path and cfg.checkpoint.dir and startup.has_checkpoint(cfg.checkpoint.dir, ctx))
        if par.compile and args.count_bytes and ctx.is_logger:
            print("scalec: --count-bytes runs the program uncompiled: a compiled region counts no bytes per call",
                  flush=True)
        self.parts = (PipelineStages(model_cls, cfg, ctx, loss_fn, self.prepare, self.shards)
                      if ctx.axis_size("pp") > 1 else WholeModel(model_cls, cfg, ctx, self.prepare))
        self.opt, mains, self.sched = optimizer.build(self.parts, cfg, ctx, self.shards, self.mixed)
        self.parts.mains = mains
        if isinstance(self.parts, PipelineStages):
            self.parts.pipe.mains = mains
        self._resume()
        self._gradients(mains)
        self._open()

    def prepare(self, module: nn.Module, ddp: bool = True) -> nn.Module:
        """One module of the model (the whole model, or a pipeline stage) from the meta device to this rank's
        device: parallelized (runtime.parallelize), materialised, its weights initialised by name or loaded from
        `init`, then (`ddp`, a whole model) wrapped in DDP when its data parallelism replicates it."""
        cfg, ctx, shards = self.cfg, self.ctx, self.shards
        # uncompiled under --count-bytes: compiled regions count no bytes per call (runtime.compile)
        compiled = cfg.parallel.compile and not self.args.count_bytes
        module = parallelize.apply(module, cfg, ctx, shards, compiled=compiled)
        module.to_empty(device=ctx.device)
        moe.reset_expert_bias(module)  # buffers come out of to_empty uninitialised: the expert biases start at 0
        rebalance.reset(module)  # re-placed experts start in the canonical placement (runtime/rebalance.py)
        if cfg.init.path and not self.skip_init:  # a Hugging Face checkpoint: each rank reads its part of each tensor
            self.loaded.append(hf.load(module, cfg.init.path, shard_of=shards.of, axis_rank=collectives.axis_rank,
                                       stack=cfg.init.stack))
        else:  # by name, as the single-device model would be, so every layout starts from the same weights
            init_parameters(module, seed=cfg.seed, std=cfg.init.std, residual_out=cfg.init.residual_out,
                            layers=cfg.init.layers, shard_of=shards.of, local_slice=tp.local_slice)
        if self.fsdp or not ddp or self.mixed:
            return module
        return parallelize.wrap_data_parallel(module, ctx, cfg, shards)

    def _resume(self) -> None:
        """The checkpoint directory's latest checkpoint loaded into the model parts, the optimizer and the schedule
        (`start`: its step, or 0), and where this run stops (`stop`)."""
        cfg, ctx, args = self.cfg, self.ctx, self.args
        ckpt = cfg.checkpoint
        # Checkpoints hold the single-device model's tensors: this rank's modules, by name (runtime.checkpoint).
        # Asynchronous checkpoints: DCP's writer thread coordinates the ranks over a gloo group used by nothing else
        # (a collective of the training on the same group from another thread would interleave with it).
        self.save_group = dist.new_group(backend="gloo") if ckpt.dir and ckpt.asynchronous else None
        self.saving = None  # runtime.checkpoint.Saving still being written in the background
        self.contract = startup.contract(cfg, ctx, args) if ckpt.dir else None
        with faults.op("loading the latest checkpoint", faults.scale("checkpoint_dir", "checkpoint_every")):
            self.start = (checkpoint.load_latest(ckpt.dir, self.parts.modules, self.opt, self.sched, ctx, cfg.steps,
                                                 self.shards, contract=self.contract)
                          if ckpt.dir else 0)
        if self.skip_init and ctx.is_logger:
            print(f"scalec: init = from({cfg.init.path}) was not read: the run resumed from its checkpoint (step "
                  f"{self.start}), whose weights it continues", flush=True)
        self.stop = min(cfg.steps, args.stop_after) if args.stop_after else cfg.steps

    def _gradients(self, mains) -> None:
        """What the gradient code of a step reads, listed once, not walked every step: the parameters keep their
        identity through the run (FSDP2 registers the same sharded DTensors again at each reshard; checkpoints load
        in place). Under bf16 without FSDP, `mains` (runtime.precision.MainGrads): the main gradients."""
        parts = self.parts
        self.named = list(parts.named_parameters())
        self.named_once = list(parts.named_parameters(counted_once=True))
        self.params = [p for _, p in self.named]
        if mains is not None:
            self.named, self.named_once = mains.named(self.named), mains.named(self.named_once)
        self.partial = [(name, p) for name, p in self.named if self.shards.partial(name)]
        # DeepSeek-V3's expert biases (moe.ExpertBias), moved after each optimizer step: listed once, as the parameters
        self.biases = [m for module in parts.modules for m in module.modules() if isinstance(m, moe.ExpertBias)]
        self.clip = optimizer.Clipping(self.cfg, self.ctx, self.shards, pp_group=parts.pp_group)
        # re-placed experts (`moe(..., rebalance = ...)`): their replicas' gradients, norm and moves
        self.rebalance = rebalance.Rebalancer(parts.modules, self.opt, self.ctx, nodes=rebalance.ep_nodes(self.ctx))
        moe.set_aux_loss_scale(parts.aux_loss_scale)

    def _open(self) -> None:
        """The token source, the metrics file, the start-up lines, the trackers, and the loop's state."""
        cfg, ctx, args, parts = self.cfg, self.ctx, self.args, self.parts
        d, ev = cfg.data, cfg.eval
        self.source = (data.Synthetic(d.vocab, d.seq_len, cfg.seed) if d.kind == "synthetic"
                       else data.TokenFile(d.path, d.dtype, d.seq_len, cfg.seed, d.vocab, eval_split=ev.split,
                                           eval_sequences=ev.batches * d.global_batch if ev.every else 0,
                                           format=d.format))
        self.tokens_per_step = d.global_batch * d.seq_len
        # A resumed run (a restart after a failure) keeps the records up to its checkpoint and appends.
        self.metrics = progress.open_metrics(args.metrics, self.start) if (args.metrics and ctx.is_logger) else None
        if ctx.is_logger:
            self._announce()
        # TensorBoard, W&B, MLflow (rank 0; the others' calls do nothing): started with the plan and these settings
        self.track = (tracking.open_tracking(args, cfg, world_size=ctx.world_size, device=ctx.device.type,
                                             start=self.start, program=self.program, loaded=self.loaded)
                      if ctx.is_logger else tracking.Tracking([]))
        # Peak memory: CUDA's allocator counters every step (cheap); the tracker only for --memory-report's last step.
        self.cuda = ctx.device.type == "cuda"
        if ctx.is_logger and not self.cuda:
            print("scalec: peak memory is measured on CUDA only"
                  + (" (and by runtime.memory's tracker in the last step, --memory-report)" if args.memory_report
                     else ""), flush=True)
        self.run_peak, self.report = None, None  # this rank's largest measured peak; the --memory-report record
        self.losses = []
        self.job_start = progress.launch_time()
        # each rank's energy counter (NVML on CUDA, RAPL on CPU) read at the logged steps, from the moment the clock
        # starts: the meters' start-up (a gather, its line) before both, or step 1's time would hold it and not its
        # energy (3 ms of a 25 ms step in a loaded suite run)
        self.energy = energy.Energy(cfg, ctx, self.start)
        self.clock, self.finished = progress.Clock(self.start), self.start
        self.loader = data.Prefetcher(lambda t: parts.batches(self.source, t), ctx.device, self.stop)
        self.vote = faults.StopVote(ctx.device)  # SIGTERM on any rank: all stop after the same step
        # zero1's step broadcasts: timed (the others' is no collective: not marked)
        self.zero1 = optimizer.zero1_group(cfg, ctx) is not None
        # each rank's step timed by section, scored on rank 0 every window (runtime.stragglers); None: detect = false
        self.stragglers = (stragglers.Detector(cfg, ctx, self.track) if cfg.resilience.detect
                           else None)

    def _announce(self) -> None:
        """Rank 0's start-up lines: the model, the mesh, the steps; where the weights came from; the MFU's basis."""
        cfg, ctx, parts, par, speed = self.cfg, self.ctx, self.parts, self.cfg.parallel, self.cfg.speed
        n = sum(tp.numel_full(p, name, self.shards) for name, p in parts.named_parameters(counted_once=True))
        print(f"scalec: {cfg.name} from {cfg.source}: {n:,} parameters{parts.where}, mesh "
              f"{' × '.join(f'{a}={k}' for a, k in par.axes)}{' (sequence parallel)' if par.sequence_parallel else ''}"
              f" on {ctx.world_size} {ctx.device.type} process(es), {cfg.steps} steps of {self.tokens_per_step:,} "
              "tokens", flush=True)
        said = offload.describe(par, self.opt, parts.modules)
        if said:
            print(f"scalec: {said}", flush=True)
        for got in self.loaded:  # where the weights came from (`init = from(...)`), or nothing: initialised
            print(f"scalec: {got.describe()}", flush=True)
        record = node_record.NodeRecord.at(cfg.checkpoint.dir)
        seen = record and node_record.startup_line(record)  # the nodes earlier attempts found slow, unhealthy, left out
        if seen:
            print(seen, flush=True)
        if speed.flops_per_step and speed.peak_flops:
            predicted = f"; predicted {speed.predicted_step_s * 1e3:,.1f} ms/step" if speed.predicted_step_s else ""
            print(f"scalec: {speed.flops_per_step:.3e} model FLOP per step; MFU against the plan's device "
                  f"({speed.device}: {speed.peak_flops / 1e12:g} TFLOP/s peak per device){predicted}", flush=True)

    # -- the loop --------------------------------------------------------------------------------------------------

    def train(self) -> list[float]:
        """Steps `start` to `stop`, each evaluated (every `eval_every`), logged (every `log_every`, every step with
        `--metrics`) and saved (every `checkpoint_every`, the last, a preemption's) as the settings ask; then
        `finish`. Returns the losses read."""
        cfg, ctx = self.cfg, self.ctx
        for step in range(self.start, self.stop):
            if self.stragglers:
                self.stragglers.begin(step)
            log_now = (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps or step == self.start
            read_now = log_now or bool(self.args.metrics)  # the steps whose figures are read (a host-device sync)
            total, norm, peak = self.step(step, read_now)
            # After the step's optimizer update and its measurement, before its record: steps N, 2N, ... and the
            # last. Its time is not the step's: the clock skips it (the step's queued device work finished first).
            evaluated = self._evaluate_if_due(step)
            if read_now:
                self.log(step, total, norm, peak, evaluated, log_now)
            if evaluated:  # below the step's own line, logged or not
                if ctx.is_logger:
                    print(progress.eval_line(evaluated, cfg.steps), flush=True)
                if not read_now:  # else its scalars went with the step's record
                    self.track.log(step + 1, progress.train_scalars(evaluated))
            self.energy.say()  # a logged step's energy line (rank 0), below its line and its evaluation's
            preempted = self.vote.result()
            self.save(step, preempted)
            if self.stragglers:  # every window: the ranks' sections gathered, scored and named on rank 0
                self.stragglers.end(step)
            leave = leaving.decode(self.vote.value) if preempted else None
            if leave is not None:  # a node left out (on_straggler = restart | replan): saved above, every rank
                self.finish()
                raise SystemExit(leaving.finish(leave, self.stragglers.world, ctx.rank, cfg.checkpoint.dir,
                                                step + 1, faults.attempt(), self.stragglers.verdict))
            if preempted:
                if ctx.is_logger:
                    print(f"scalec: stopped by {faults.stop_signal()} after step {step + 1}"
                          + (f"; checkpoint saved in {cfg.checkpoint.dir}" if cfg.checkpoint.dir else
                             " (no checkpoint_dir: nothing saved)"), flush=True)
                break
        self.finish()
        return self.losses

    def step(self, step: int, read_now: bool):
        """Optimizer step `step` (from 0): forward and backward of this rank's share of the batch, the gradient
        syncs left to the loop (experts', partial ones), clipping, the update and the schedule. Returns the loss
        and the gradient norm (on the device) and, on a `read_now` step measured, (peak bytes, rank) over ranks."""
        ctx, args, parts = self.ctx, self.args, self.parts
        faults.set_step(step + 1)
        faults.test_hooks(ctx.rank, step + 1)
        self.vote.start()  # this step's preemption vote, read at its end
        moe.stats_reset()
        offload.reset()  # the step's host <-> device copies (runtime.offload), reported with its record
        last = step == self.stop - 1
        if args.count_bytes and last:
            collectives.count_bytes(True)
        report_now = bool(args.memory_report) and last
        measure = memory.Measure(ctx.device, track=report_now, reread=self.fsdp) if (self.cuda or report_now) else None
        if measure is not None:
            measure.begin(self.params, [p.grad for _, p in self.named if p.grad is not None],
                          memory.optimizer_tensors(self.opt))
            parts.measure = measure
        with sections.section("data"):
            batches = self.loader.get(step)
        total = parts.step(batches)
        with faults.op("the expert and partial-gradient all-reduces over dp and tp",
                       faults.scale("axis ep", "axis tp"), "grad_reduce"):
            if self.cfg.parallel.ep_shards and not self.fsdp:  # under FSDP the experts' own units reduce them
                moe.sync_expert_grads(self.named, self.shards.expert, self.clip.expert_group, ctx.batch_size)
            tp.sync_partial_grads(self.partial, self.shards)
            self.rebalance.sync_grads()  # every copy of a replicated expert the sum of the copies' gradients
        if args.count_bytes and last:
            _write_counts(args.count_bytes, ctx)
        if args.dump_grads and step == self.start:
            _dump_grads(self.named, args.dump_grads, ctx, self.shards)
        with faults.op("the gradient-norm all-reduce (clipping)", faults.scale("grad_clip"), "all_reduce"):
            norm = self.clip(self.rebalance.counted(self.named_once), self.named)
        with (faults.op("the optimizer step (zero1's parameter broadcasts over dp)",
                        faults.scale("data_parallel", "axis dp"), "optimizer") if self.zero1
              else sections.section("optimizer")):
            sections.slow_work("optimizer")  # the straggler drill's extra work (SCALEC_TEST_SLOW), if any
            self.opt.step()  # zero1: each rank broadcasts the partition it updated
        if args.count_bytes and last and any(offload.COPIED.values()):
            _add_offload_counts(args.count_bytes, ctx)
        if self.biases:  # moved against the step's load summed over the batch ranks
            with faults.op("the expert-load all-reduce (auxiliary-loss-free balancing)", faults.scale("axis ep")):
                moe.update_expert_bias(self.biases, ctx.batch_group)
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        if self.rebalance.layers:
            with faults.op("the re-placement of the experts (load all-reduce, moves over ep)", faults.scale("axis ep")):
                self.rebalance.after_step(step)
        self.finished = step + 1
        return total, norm, self._measured(measure, report_now, read_now)

    def _measured(self, measure, report_now: bool, read_now: bool):
        """The step's memory measurement ended: this rank's run peak and --memory-report record kept; on a
        `read_now` step the largest peak over the ranks (every rank joins: the same condition everywhere)."""
        if measure is None:
            return None
        measure.end()
        self.parts.measure = None
        self.run_peak = max(self.run_peak or 0, measure.peak)
        if report_now:
            self.report = measure.record(self.ctx.rank, self.ctx.coords)
        if not read_now:
            return None
        with faults.op("the peak-memory all-reduce (MAX over ranks)", faults.scale()):
            return memory.largest(measure.peak, self.ctx)

    # -- evaluate --------------------------------------------------------------------------------------------------

    def _evaluate_if_due(self, step: int) -> dict | None:
        """The evaluation record after step `step` when it is due (every `eval_every` steps and the last), else
        None; the time it takes is left out of the steps' clock."""
        ev = self.cfg.eval
        if not (ev.every and ((step + 1) % ev.every == 0 or step + 1 == self.cfg.steps)):
            return None
        if self.cuda:
            torch.cuda.synchronize(self.ctx.device)
        began = time.perf_counter()
        self.energy.pause()  # the evaluation's energy left out, as its time is
        with sections.section("eval"):
            evaluated = progress.eval_record(step + 1, self.evaluate())  # read: the device is done with it
        self.energy.resume()
        self.clock.skip(time.perf_counter() - began)
        return evaluated

    def evaluate(self) -> float:
        """The evaluation loss: the mean cross entropy over every token of `cfg.eval.batches` held-out global batches
        (the same ones at every evaluation: runtime.data's `eval_samples`), the model's forward only. Each batch is
        split over the batch ranks and micro-batches as a step's is; each rank sums its tokens' losses (float64),
        one all-reduce over the batch ranks adds them, and the sum is divided by the tokens: on any plan the figure
        the single device computes. The MoE auxiliary loss is not in it (it is a training signal for the router,
        not a loss of the data), and its statistics are left to the training log (moe.not_recording). Nothing here
        draws from a random stream or moves the training data's position, so training goes on as if it had not
        run."""
        cfg, ctx, parts = self.cfg, self.ctx, self.parts
        total = torch.zeros((), dtype=torch.float64, device=ctx.device)
        with torch.no_grad(), moe.not_recording():
            for b in range(cfg.eval.batches):
                batches = [tuple(t.to(ctx.device) for t in pair)
                           for pair in parts.batches(self.source, b, held_out=True)]
                total += parts.eval_loss(batches)
        if self.fsdp:  # zero2 keeps a unit gathered after a forward until its backward: free it now
            parallelize.reshard(parts.modules)
        if ctx.batch_size > 1:
            with faults.op("the evaluation loss all-reduce over the batch ranks", faults.scale("axis dp", "axis ep")):
                dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.batch_group)
        with faults.device_wait("reading the evaluation loss"):
            return total.item() / (cfg.eval.batches * cfg.data.global_batch * cfg.data.seq_len)

    # -- log -------------------------------------------------------------------------------------------------------

    def log(self, step: int, total: torch.Tensor, norm: torch.Tensor, peak, evaluated: dict | None,
            log_now: bool) -> None:
        """Step `step`'s figures read (a host-device sync): the loss averaged over the global batch, the norm, the
        time since the last read, the MoE statistics, the peak memory, the evaluation's; written to the metrics file
        and the trackers, and printed on `log_now` steps (rank 0)."""
        cfg, ctx = self.cfg, self.ctx
        faults.test_hooks(ctx.rank, step + 1, "loss")
        if ctx.batch_size > 1:  # the logged loss is the mean over the global batch
            with faults.op("the loss all-reduce over the batch ranks", faults.scale("axis dp", "axis ep"),
                           "loss_reduce"):
                dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.batch_group)
            total /= ctx.batch_size
        with faults.device_wait("reading the step's loss"):
            loss_value, norm_value = total.item(), float(norm)
        self.losses.append(loss_value)
        dt = self.clock.lap(step + 1)  # mean seconds per step since the last read
        # joules per step since the last logged step, every rank's gathered to rank 0 (where any rank measures)
        joules = self.energy.lap(step + 1) if log_now else {}
        # Every rank joins the (small) reduction of the MoE counters; each layer counted once (tp ranks repeat it).
        with faults.op("the MoE statistics all-reduces over all ranks", faults.scale("axis ep")):
            experts = moe.stats_read(ctx.device, duplicates=ctx.axis_size("tp")) if cfg.moe else None
        record = {"step": step + 1, "loss": loss_value, "grad_norm": norm_value, "lr": self.sched.get_last_lr()[0],
                  "step_time": dt, "tokens_per_s": self.tokens_per_step / dt,
                  **progress.speed_figures(cfg.speed, ctx.world_size, dt),
                  "elapsed_s": time.time() - self.job_start, "eta_s": dt * (self.stop - step - 1)}
        if experts:
            record.update({f"moe_{k}": v for k, v in experts.items()})
        if cfg.parallel.offload in ("optimizer", "activations"):  # this rank's copies in this step (runtime.offload)
            record.update({f"offload_{k}_bytes": n for k, n in offload.counts().items()})
        if peak:
            record.update(peak_memory_bytes=peak[0], peak_memory_rank=peak[1])
        if evaluated:  # the step's record gains eval_loss and eval_ppl
            record.update({k: v for k, v in evaluated.items() if k != "step"})
        if self.stragglers:  # the scores of the window that ended before this record, once
            record.update(self.stragglers.record())
        record.update(joules)  # only what was measured: no energy field where nothing was
        if self.metrics:
            self.metrics.write(json.dumps(record) + "\n")
            self.metrics.flush()
        self.track.log(step + 1, progress.train_scalars(record))
        if ctx.is_logger and log_now:
            print(progress.log_line(record, cfg.steps), flush=True)

    # -- save ------------------------------------------------------------------------------------------------------

    def save(self, step: int, preempted: bool) -> None:
        """A checkpoint after step `step` when one is due (every `checkpoint_every`, the run's last step, a
        preemption): asynchronous when the settings say so, one in flight at a time; the last one finished before
        the run ends."""
        ckpt, ctx = self.cfg.checkpoint, self.ctx
        if not (ckpt.dir and ((ckpt.every and (step + 1) % ckpt.every == 0) or step + 1 == self.stop or preempted)):
            return
        with faults.op("saving the checkpoint", faults.scale("checkpoint_dir", "checkpoint_every"), "checkpoint"):
            if self.saving is not None:  # one in flight at a time: the previous one finishes first
                self.saving.finish()
            # a run ends only once its last checkpoint is on disk: the last save (the loop's last step, or
            # SIGTERM's, which breaks out) is finished here, so none is left in flight after the loop
            last = step + 1 == self.stop or preempted
            with self.rebalance.canonical():  # re-placed experts saved in their canonical order
                self.saving = checkpoint.begin(ckpt.dir, step + 1, self.parts.modules, self.opt, self.sched, ctx,
                                               self.cfg.steps, self.shards, skip_on_save=self.parts.tied_elsewhere,
                                               group=None if last else self.save_group, run=self.contract.record)
            if last or self.save_group is None:
                self.saving.finish()
                self.saving = None

    def finish(self) -> None:
        """After the loop: the prefetcher stopped, the weights saved if asked (runtime.faults), the run's peak
        memory and --memory-report, the closing line, the metrics file and the trackers closed."""
        cfg, ctx = self.cfg, self.ctx
        self.loader.close()
        if self.stragglers:
            self.stragglers.close()
        faults.save_weights_if_asked(lambda: self.parts.named_parameters(counted_once=True), ctx)
        measured = {}  # what the trackers' summary gets beside what they saw logged
        if self.run_peak is not None:  # measured on every rank or on none
            with faults.op("the peak-memory all-reduce (MAX over ranks)", faults.scale()):
                peak, at = memory.largest(self.run_peak, ctx)
            measured = {"peak_memory_bytes": peak, "peak_memory_rank": at}
            if ctx.is_logger:
                print("scalec: " + memory.summary(cfg.memory.predicted_peak_bytes, cfg.memory.device_bytes, peak, at,
                                                   "" if self.cuda else "the last step, runtime.memory's tracker"),
                      flush=True)
        if self.report is not None:
            with faults.op("gathering the memory report", faults.scale()):
                memory.write_report(self.args.memory_report, self.report, ctx, self.stop,
                                    cfg.memory.predicted_peak_bytes, cfg.memory.device_bytes)
        if ctx.is_logger:
            print(f"scalec: done in {time.time() - self.job_start:.1f} s since the job started "
                  f"({self.finished - self.start} step(s) in {time.perf_counter() - self.clock.t_loop:.1f} s)",
                  flush=True)
        if self.metrics:
            self.metrics.close()
        self.track.finish(measured)


def _dump_grads(named_params, path: str, ctx: mesh.Context, shards: tp.Shards) -> None:
    """Whole gradients (gathered over dp, tp and ep); under pp each stage's rank writes `path.ppN`."""
    grads = tp.full_grads(named_params, shards)
    if ctx.axis_size("pp") > 1:
        if all(ctx.coords.get(a, 0) == 0 for a in ("dp", "cp", "tp", "ep")):
            torch.save(grads, f"{path}.pp{ctx.coords['pp']}")
    elif ctx.is_logger:
        torch.save(grads, path)


def _add_offload_counts(path: str, ctx: mesh.Context) -> None:
    """`--count-bytes`: the last step's host <-> device copies (runtime.offload) beside the collectives' counts, as
    `d2h/host` and `h2d/host` (rank 0's, as the collectives')."""
    if not ctx.is_logger:
        return
    with open(path) as f:
        counts = json.load(f)
    counts.update({f"{k}/host": n for k, n in offload.counts().items() if n})
    with open(path, "w") as f:
        json.dump(counts, f, indent=2, sort_keys=True)


def _write_counts(path: str, ctx: mesh.Context) -> None:
    """`--count-bytes`: the bytes each runtime collective moved during the last step, by op and axis (rank 0)."""
    counts = {f"{op}/{axis}": n for (op, axis), n in sorted(collectives.BYTES.items())}
    collectives.count_bytes(False)
    if ctx.is_logger:
        with open(path, "w") as f:
            json.dump(counts, f, indent=2, sort_keys=True)
