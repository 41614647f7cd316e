"""What a run tells about itself: the log line of a logged step, the metrics file, the scalars the trackers get
(runtime.tracking), and the clock (the job's start, the device's pace between synchronisations, elapsed time and
ETA). runtime.trainer calls these; nothing here touches the model."""
from __future__ import annotations

import json
import math
import os
import time

from runtime import memory


def open_metrics(path: str, start: int):
    """The metrics file, appended to: the records of steps up to `start` (those a resumed run continues from) are
    kept, later ones (written after that checkpoint by the run that was interrupted) dropped, so that every step has
    one record; a run from step 0 starts the file afresh."""
    kept = []
    if start and os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    if json.loads(line)["step"] <= start:
                        kept.append(line if line.endswith("\n") else line + "\n")
                except (ValueError, KeyError, TypeError):  # a line cut short by a kill
                    pass
    f = open(path, "w")
    f.writelines(kept)
    f.flush()
    return f


LAUNCH_TIME = "SCALEC_LAUNCH_TIME"
"""The environment variable runtime.launch sets to the job's start (seconds since the epoch); torchrun passes it to
every worker of every attempt, so `done in` and `elapsed` count the start-up and any restarts."""
_IMPORTED = time.time()


def launch_time() -> float:
    """When the job started, seconds since the epoch: runtime.launch's SCALEC_LAUNCH_TIME; without it (a program
    started by torchrun or python directly) this process's own start (/proc/self/stat's start time, in clock ticks
    after boot, plus /proc/stat's boot time); without /proc, when this module was imported."""
    value = os.environ.get(LAUNCH_TIME)
    if value:
        try:
            return float(value)
        except ValueError:
            pass
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + float(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: the 20th after the name
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


class Clock:
    """Seconds per step between the steps whose figures are read: with no synchronisation in between, the host runs
    ahead of the device, and only the mean over an interval that ends in a synchronisation is the device's pace."""

    def __init__(self, start: int):
        self.t_loop = self.t_last = time.perf_counter()
        self.last = start

    def skip(self, seconds: float) -> None:
        """Leave `seconds` (an evaluation between steps) out of the interval being timed."""
        self.t_last += seconds

    def lap(self, step: int) -> float:
        now = time.perf_counter()
        dt = (now - self.t_last) / max(step - self.last, 1)
        self.t_last, self.last = now, step
        return dt


def speed_figures(speed, world: int, dt: float) -> dict:
    """Model TFLOP/s per device and MFU (against the plan's device peak, Speed) at `dt` seconds per step."""
    if not speed.flops_per_step:
        return {}
    per_device = speed.flops_per_step / world / dt
    return {"tflops": per_device / 1e12, **({"mfu": per_device / speed.peak_flops} if speed.peak_flops else {})}


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def log_line(record: dict, steps: int) -> str:
    """The line of a logged step, from its metrics record."""
    text = (f"step {record['step']:>5}/{steps} | loss {record['loss']:8.4f} | lr {record['lr']:.3e} | "
            f"grad-norm {record['grad_norm']:7.3f} | {record['tokens_per_s']:10,.0f} tok/s | "
            f"{record['step_time'] * 1000:7.1f} ms/step")
    if "tflops" in record:
        text += f" | {record['tflops']:.3g} TFLOP/s/device"
    if "mfu" in record:
        text += f" | MFU {record['mfu']:.1%}"
    if "moe_routed" in record:
        text += (f" | dropped {record['moe_dropped']:,}/{record['moe_routed']:,} choices | max expert load "
                 f"{record['moe_max_load']:.2f}× | aux {record['moe_aux_loss']:.4f}")
    if "peak_memory_bytes" in record:
        text += f" | peak {memory.gb(record['peak_memory_bytes'])} (rank {record['peak_memory_rank']})"
    return text + f" | elapsed {duration(record['elapsed_s'])} | ETA {duration(record['eta_s'])}"


# The scalars of a metrics record the trackers get (runtime.tracking: TensorBoard, W&B, MLflow), as `train/<name>`.
BOARD_SCALARS = ("loss", "grad_norm", "lr", "tokens_per_s", "step_time", "tflops", "mfu", "peak_memory_bytes",
                 "elapsed_s", "eta_s", "energy_j_per_step", "energy_j_per_step_sum", "energy_measured_over_predicted")
# (the energy figures only on the logged steps where some rank measured: runtime.energy; never a zero in their place)


def tensorboard(logdir: str):
    """A SummaryWriter on `logdir`, or None with one line when the `tensorboard` package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print(f"scalec: --tensorboard {logdir}: the tensorboard package is not installed (pip install tensorboard); "
              "writing no events", flush=True)
        return None
    return SummaryWriter(log_dir=logdir)


def train_scalars(record: dict) -> dict:
    """The scalars of a metrics record the trackers get: `train/<name>` (the MoE counters too), and an
    evaluation's `eval_<name>` fields as `eval/<name>` (eval/loss, eval/ppl)."""
    out = {}
    for key, value in record.items():
        if key in BOARD_SCALARS or key.startswith("moe_"):
            out[f"train/{key}"] = value
        elif key.startswith("eval_"):
            out[f"eval/{key.removeprefix('eval_')}"] = value
    return out


def eval_record(step: int, loss: float) -> dict:
    """An evaluation after `step`: {"step", "eval_loss", "eval_ppl"}; the loss and ppl fields join that step's
    metrics record (its train keys unchanged), and TensorBoard gets them as eval/loss and eval/ppl."""
    try:
        ppl = math.exp(loss)
    except OverflowError:  # a diverged model: exp(loss) is past a double
        ppl = math.inf
    return {"step": step, "eval_loss": loss, "eval_ppl": ppl}


def eval_line(record: dict, steps: int) -> str:
    """The line of an evaluation, under its step's line: the held-out loss and its perplexity."""
    return f"eval {record['step']:>5}/{steps} | loss {record['eval_loss']:8.4f} | ppl {record['eval_ppl']:.4g}"
