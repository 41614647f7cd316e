"""Experiment tracking beside the metrics file: TensorBoard events, a Weights & Biases run, an MLflow run.

Every backend has the same three calls, so the training loop (and its evaluation) talks to one object whatever the
user asked for: `start(config)` once, `log(step, scalars)` on every logged step with any dict of named scalars
(`train/loss`, `eval/ppl`, ...), `finish(summary)` once. Only rank 0 tracks; the other ranks get a `Tracking` with
no backend, whose calls do nothing, so the loop calls it unconditionally.

The config a run is stored with is what the run is an experiment about: the plan (the compiler's plan.json beside
program.py, less its per-collective ledger and per-parameter placements, which MLflow keeps whole as an artifact),
the compiler's predictions (step time, tokens/s, the largest rank's peak memory: `CONFIG.speed` and
`CONFIG.memory`), the program's settings after the command line's overrides, and where the weights came from
(`init = from(...)`: runtime.hf.Loaded). The summary compares what was measured with what was predicted.

A backend is optional in two ways: a missing package is one line naming the pip command, and a backend that fails
(a tracking server gone, a full disk) is one line and is dropped; neither stops the training it only records.

A resumed run (a checkpoint loaded) continues the tracked run when it can: the run ids are kept in the checkpoint
directory (`tracking.json`, rank 0), W&B resumes by id and MLflow reopens the run; otherwise one line says a new run
starts. Runtime only: nothing here imports the compiler."""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import statistics
import string
import time

from runtime import progress

IDS_FILE = "tracking.json"
"""The file in the checkpoint directory that keeps the tracked runs' ids for a resumed run."""

_MLFLOW_VALUE = 6000
"""The longest parameter value MLflow stores (mlflow.utils.validation's MAX_PARAM_VAL_LENGTH)."""
_MLFLOW_BATCH = 100
"""Parameters per log_batch call (MLflow refuses more in one call)."""


def _say(text: str) -> None:
    print(f"scalec: {text}", flush=True)


def _reason(exc: BaseException) -> str:
    """An exception in one line: its type and its message's first line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


class Tracker:
    """One backend. A failure in any call is caught by `Tracking`, which drops the backend with one line."""

    flag = ""
    """The command-line flag that asked for it, as the one-line messages name it."""

    def start(self, config: dict) -> None:
        """Record the run's config (nested dicts of JSON values)."""

    def log(self, step: int, scalars: dict) -> None:
        """Record named scalars at an optimizer step."""

    def finish(self, summary: dict, failed: bool = False) -> None:
        """Record the run's summary and close the run (`failed`: the training ended with an error)."""


class TensorBoard(Tracker):
    """TensorBoard events on rank 0: each scalar under its own name (`train/loss`); the config is not written (the
    events hold scalars only, as they did before this interface)."""

    def __init__(self, writer, logdir: str):
        self.writer, self.flag = writer, f"--tensorboard {logdir}"

    def log(self, step: int, scalars: dict) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def finish(self, summary: dict, failed: bool = False) -> None:
        self.writer.close()


class WandB(Tracker):
    """A W&B run, offline unless the environment's WANDB_MODE says otherwise (a cluster's nodes often reach no
    network; `wandb sync DIR` uploads an offline run later). Resuming: online, W&B continues the run with the same id
    (`resume="allow"`) and ignores steps it already has; offline, the resumed part is a new directory with the same
    run id, and `wandb sync` uploads the parts into one run."""

    def __init__(self, wandb, project: str, directory: str, name: str, run_id: str | None, resume: bool):
        self.wandb, self.project, self.directory, self.name = wandb, project, directory, name
        self.mode = os.environ.get("WANDB_MODE") or "offline"
        self.run_id = run_id or _new_id()
        self.resume = resume
        self.flag = f"--wandb {project}"
        self.run = None
        self.floor = 0  # steps below it are the resumed run's own already (online)

    def start(self, config: dict) -> None:
        os.makedirs(self.directory, exist_ok=True)
        self.run = self.wandb.init(project=self.project, dir=self.directory, name=self.name, id=self.run_id,
                                   mode=self.mode, resume="allow" if self.resume else None, config=config,
                                   allow_val_change=self.resume)
        if self.resume and self.run.resumed:
            self.floor = self.run.starting_step

    def log(self, step: int, scalars: dict) -> None:
        if step >= self.floor:
            self.run.log(dict(scalars), step=step)

    def finish(self, summary: dict, failed: bool = False) -> None:
        self.run.summary.update(summary)
        self.run.finish(exit_code=1 if failed else 0)


class MLflow(Tracker):
    """An MLflow run in the experiment named after the program. MLflow's parameters are flat strings, so the
    config is flattened (`plan.axes.dp`), and the nested config is also stored whole as the artifact `config.json`
    (with plan.json itself). MLflow has no run summary: the summary's figures are metrics `summary/<name>` at the
    last step. A parameter cannot change in a run, so a resumed run keeps the values it started with and names the
    ones now different."""

    def __init__(self, client, uri: str, experiment: str, name: str, run_id: str | None, plan_path: str | None,
                 flag: str):
        self.client, self.uri, self.experiment, self.name, self.flag = client, uri, experiment, name, flag
        self.plan_path = plan_path
        self.resume_id = run_id
        self.run_id = None
        self.last_step = 0

    def start(self, config: dict) -> None:
        from mlflow.entities import Param
        client = self.client
        known: dict = {}
        if self.resume_id:
            from mlflow.exceptions import MlflowException
            try:
                known = dict(client.get_run(self.resume_id).data.params)
                client.update_run(self.resume_id, status="RUNNING")
                self.run_id = self.resume_id
            except MlflowException:
                _say(f"{self.flag}: the run {self.resume_id} to resume is not in {self.uri}: a new run")
        if self.run_id is None:
            exp = client.get_experiment_by_name(self.experiment)
            eid = exp.experiment_id if exp is not None else client.create_experiment(self.experiment)
            self.run_id = client.create_run(eid, run_name=self.name).info.run_id
        flat = flatten(config)
        changed = sorted(k for k, v in flat.items() if k in known and known[k] != v)
        if changed:
            _say(f"{self.flag}: the resumed run keeps the parameters it started with; now different: "
                 + ", ".join(changed))
        params = [Param(k, v) for k, v in flat.items() if k not in known]
        for i in range(0, len(params), _MLFLOW_BATCH):
            client.log_batch(self.run_id, params=params[i:i + _MLFLOW_BATCH])
        client.log_dict(self.run_id, config, "config.json")
        if self.plan_path:
            client.log_artifact(self.run_id, self.plan_path)

    def log(self, step: int, scalars: dict) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in scalars.items()])
        self.last_step = step

    def finish(self, summary: dict, failed: bool = False) -> None:
        numbers = {f"summary/{k}": v for k, v in summary.items() if isinstance(v, (int, float))}
        if numbers:
            self.log(self.last_step, numbers)
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def _new_id() -> str:
    """A W&B run id (8 lowercase letters and digits, as W&B makes its own), chosen here so that it can be kept for
    a resumed run before the run starts."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def flatten(config: dict, prefix: str = "") -> dict:
    """{"plan": {"axes": {"dp": 2}}} -> {"plan.axes.dp": "2"}: MLflow's flat string parameters. Lists are JSON
    text; a value longer than MLflow stores is cut, and says so."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
            continue
        text = value if isinstance(value, str) else json.dumps(value)
        if len(text) > _MLFLOW_VALUE:
            cut = " ... (cut)"
            text = text[:_MLFLOW_VALUE - len(cut)] + cut
        flat[name] = text
    return flat


class Tracking:
    """The backends of this rank (none off rank 0) behind the backends' own three calls. It also keeps what the
    summary needs from the logged scalars (the last loss, the step times), so the loop only passes what it alone
    knows (the measured peak memory)."""

    def __init__(self, trackers: list, predicted: dict | None = None):
        self.trackers = list(trackers)
        self.predicted = predicted or {}
        self.loss = None
        self.step = None
        self.step_times: list = []
        self.done = False

    def _each(self, call: str, *args, **kw) -> None:
        for tracker in list(self.trackers):
            try:
                getattr(tracker, call)(*args, **kw)
            except Exception as exc:  # a tracker records the training; its failure must not end it
                self.trackers.remove(tracker)
                _say(f"{tracker.flag}: {_reason(exc)}; tracking stops there")

    def start(self, config: dict) -> None:
        self._each("start", config)

    def log(self, step: int, scalars: dict) -> None:
        if "train/loss" in scalars:
            self.loss, self.step = scalars["train/loss"], step
        if "train/step_time" in scalars:
            self.step_times.append(scalars["train/step_time"])
        self._each("log", step, scalars)

    def summary(self, extra: dict | None = None) -> dict:
        """The final loss and step, and the measured step time (the median of the logged intervals after the first,
        which holds the start-up) beside the compiler's prediction; `extra`: figures only the loop knows."""
        out: dict = {}
        if self.loss is not None:
            out.update(final_loss=self.loss, final_step=self.step)
        times = self.step_times[1:] or self.step_times
        predicted = self.predicted.get("step_time_s") or 0.0
        if times:
            measured = statistics.median(times)
            out["measured_step_time_s"] = measured
            tokens = self.predicted.get("tokens_per_step")
            if tokens:
                out["measured_tokens_per_s"] = tokens / measured
            if predicted:
                out["predicted_step_time_s"] = predicted
                out["measured_over_predicted_step_time"] = measured / predicted
        if self.predicted.get("peak_memory_bytes"):
            out["predicted_peak_memory_bytes"] = self.predicted["peak_memory_bytes"]
        out.update(extra or {})
        return out

    def finish(self, extra: dict | None = None, failed: bool = False) -> None:
        if self.done:
            return
        self.done = True
        _OPEN.discard(self)
        self._each("finish", self.summary(extra), failed=failed)


_OPEN: set = set()
"""Tracking objects started and not finished: `abandon` closes them when the training fails."""


def abandon() -> None:
    """Close the runs of a training that failed (runtime.train.main, before the process exits): W&B and MLflow
    mark them failed rather than leaving them running for ever."""
    for track in list(_OPEN):
        track.finish(failed=True)


# -- what a run is stored with ---------------------------------------------------------------------------------------


def plan_path(program: str | None) -> str | None:
    """plan.json beside the generated program (the compiler writes both into one directory), or None."""
    if not program:
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(program)), "plan.json")
    return path if os.path.isfile(path) else None


def predictions(cfg, world_size: int) -> dict:
    """What the compiler predicted for this run, from the program's CONFIG (the figures `scalec plan --json`
    prints under `predicted` and `memory`): step time, tokens/s, MFU, the largest rank's peak memory."""
    speed, memory = cfg.speed, cfg.memory
    tokens = cfg.data.global_batch * cfg.data.seq_len
    out = {"tokens_per_step": tokens, "flops_per_step": speed.flops_per_step, "device": speed.device,
           "device_peak_flops": speed.peak_flops, "device_memory_bytes": memory.device_bytes,
           "peak_memory_bytes": memory.predicted_peak_bytes}
    if speed.predicted_step_s:
        out["step_time_s"] = speed.predicted_step_s
        out["tokens_per_s"] = tokens / speed.predicted_step_s
        mfu = progress.speed_figures(speed, world_size, speed.predicted_step_s).get("mfu")  # the log's formula
        if mfu is not None:
            out["mfu"] = mfu
    return out


def _jsonable(value):
    return json.loads(json.dumps(value))


def run_config(cfg, *, world_size: int, device: str, start: int, plan: str | None, loaded=()) -> dict:
    """The tracked config (module docstring). `plan`: plan.json's path or None; `loaded`: runtime.hf.Loaded of
    rank 0's modules."""
    settings = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
                if f.name not in ("sources", "memory", "speed")}
    config = {"program": _jsonable({k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                                    for k, v in settings.items()}),
              "run": {"world_size": world_size, "device": device, "start_step": start},
              "predicted": predictions(cfg, world_size)}
    if plan:
        with open(plan) as f:
            doc = json.load(f)
        # less the ledger and the placements (long lists) and the settings as compiled ("program" has them as run)
        config["plan"] = {k: v for k, v in doc.items() if k not in ("ledger", "parameters", "train")}
        config["plan"]["ledger_collectives"] = len(doc.get("ledger", ()))
    if loaded:
        config["init"] = {"path": loaded[0].path, "parameters": sum(len(x.names) for x in loaded),
                          "tensors": loaded[0].tensors, "bytes": loaded[0].bytes,
                          "tensors_read_rank0": sum(x.tensors_read for x in loaded),
                          "bytes_read_rank0": sum(x.bytes_read for x in loaded)}
    return config


# -- opening the backends the flags ask for --------------------------------------------------------------------------


def _read_ids(directory: str | None) -> dict:
    if not directory:
        return {}
    try:
        with open(os.path.join(directory, IDS_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _write_ids(directory: str | None, ids: dict) -> None:
    if directory and ids:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, IDS_FILE), "w") as f:
            json.dump(ids, f, indent=2, sort_keys=True)


def mlflow_uri(text: str) -> str:
    """An MLflow tracking URI as given (`file:./mlruns`, `http://host:5000`, `sqlite:///m.db`), or a plain directory
    path as its `file:` URI."""
    if ":" in text and not os.path.splitdrive(text)[0]:
        return text
    return "file:" + os.path.abspath(text)


def _tensorboard(logdir: str):
    writer = progress.tensorboard(logdir)
    return TensorBoard(writer, logdir) if writer is not None else None


def _wandb(args, cfg, start: int, ids: dict, ckpt_dir: str | None):
    flag = f"--wandb {args.wandb}"
    try:
        import wandb
    except ImportError:
        _say(f"{flag}: the wandb package is not installed (pip install wandb); tracking nothing to W&B")
        return None
    directory = args.wandb_dir or ckpt_dir or os.getcwd()
    run_id = ids.get("wandb") if start else None
    if start:
        mode = os.environ.get("WANDB_MODE") or "offline"
        if run_id and mode == "offline":
            _say(f"{flag}: resuming W&B run {run_id} at step {start} (offline: a new directory under {directory} "
                 "with the same run id; `wandb sync` uploads the parts into one run)")
        elif run_id:
            _say(f"{flag}: resuming W&B run {run_id} at step {start}")
        else:
            _say(f"{flag}: resumed at step {start} with no W&B run id in {ckpt_dir}/{IDS_FILE}: a new W&B run")
    return WandB(wandb, args.wandb, directory, cfg.name, run_id, resume=bool(run_id))


def _mlflow(args, cfg, start: int, ids: dict, ckpt_dir: str | None, plan: str | None):
    uri = mlflow_uri(args.mlflow)
    flag = f"--mlflow {args.mlflow}"
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        _say(f"{flag}: the mlflow package is not installed (pip install mlflow-skinny); tracking nothing to MLflow")
        return None
    if uri.startswith("file:"):  # asked for by name: MLflow 3 refuses its file store unless told it is wanted
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    saved = ids.get("mlflow") or {}
    run_id = saved.get("run_id") if start and saved.get("uri") == uri else None
    if start:
        _say(f"{flag}: resuming MLflow run {run_id} at step {start}" if run_id else
             f"{flag}: resumed at step {start} with no MLflow run of {uri} in {ckpt_dir}/{IDS_FILE}: a new run")
    return MLflow(MlflowClient(tracking_uri=uri), uri, cfg.name, cfg.name, run_id, plan, flag)


def open_tracking(args, cfg, *, world_size: int, device: str, start: int, program: str | None = None,
                  loaded=()) -> Tracking:
    """Rank 0's backends from the flags (`--tensorboard`, `--wandb`/`--wandb-dir`, `--mlflow`), started with the
    run's config; the run ids kept in the checkpoint directory for a resumed run."""
    ckpt_dir = cfg.checkpoint.dir or None
    ids = _read_ids(ckpt_dir)
    plan = plan_path(program)
    trackers = []
    for flag, make in (("tensorboard", lambda: _tensorboard(args.tensorboard)),
                       ("wandb", lambda: _wandb(args, cfg, start, ids, ckpt_dir)),
                       ("mlflow", lambda: _mlflow(args, cfg, start, ids, ckpt_dir, plan))):
        if getattr(args, flag, None):
            try:
                trackers.append(make())
            except Exception as exc:  # as Tracking._each: a tracker that cannot open is one line, not the run's end
                _say(f"--{flag} {getattr(args, flag)}: {_reason(exc)}; tracking nothing there")
    track = Tracking([t for t in trackers if t is not None], predictions(cfg, world_size))
    if not track.trackers:
        return track
    if plan is None and any(not isinstance(t, TensorBoard) for t in track.trackers):
        _say("no plan.json beside the program: the tracked config holds the program's settings and predictions only")
    track.start(run_config(cfg, world_size=world_size, device=device, start=start, plan=plan, loaded=loaded))
    _OPEN.add(track)
    new = dict(ids)
    for t in track.trackers:
        if isinstance(t, WandB):
            new["wandb"] = t.run_id
        elif isinstance(t, MLflow):
            new["mlflow"] = {"uri": t.uri, "run_id": t.run_id}
    if new != ids:
        try:
            _write_ids(ckpt_dir, new)
        except OSError as exc:
            _say(f"cannot keep the tracked run ids in {ckpt_dir}/{IDS_FILE} ({exc.strerror}): a resumed run "
                 "starts new ones")
    return track
