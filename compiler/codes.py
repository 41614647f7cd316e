"""Every diagnostic code, registered once: a title and a paragraph saying what it means and what to do.

`scalec explain CODE` prints an entry. tests/test_codes.py keeps this table honest: every code the compiler emits is
registered here, and every code registered is emitted somewhere or listed in RETIRED with the reason. A new code
is added here in the same change that first emits it.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    title: str
    explanation: str


CODES: dict[str, Code] = {
    # -- text -----------------------------------------------------------------------------------------------------
    "E0001": Code("syntax error", "The text does not follow the grammar of a .scale file: an unexpected token, a "
                  "missing brace, an expression nested deeper than the parser follows, or the file ending mid-way. "
                  "The caret marks where the parser stopped; the help says what it expected there."),
    "E0002": Code("number out of range", "A numeric literal is too large for a double, or so small that it reads as "
                  "0. Sizes are whole numbers of at most 2^31 - 1 and rates are ordinary floats: write the number "
                  "the setting means."),
    "E0003": Code("nested too deeply", "Blocks or an expression are nested deeper than the parser accepts (it "
                  "keeps the check fast and free of stack overflows). Flatten the structure: name an intermediate "
                  "size, or repeat a block with `repeat` instead of nesting it."),
    "E0004": Code("unknown string escape", "A string holds a backslash escape other than `\\\\`, `\\\"`, `\\n` or "
                  "`\\t`. Write `\\\\` for a literal backslash (in a Windows path, for instance)."),
    # -- sections, settings, values -------------------------------------------------------------------------------
    "E0101": Code("unknown section", "A file has the sections `model`, `mesh`, `plan` (optional) and `train`; "
                  "anything else is refused, with the closest name suggested."),
    "E0102": Code("written twice", "A section, setting, axis, argument or size name is given twice. The second is "
                  "marked and the help points at the first: keep one."),
    "E0103": Code("missing section", "The file lacks `model`, `mesh` or `train`. See samples/tiny_gpt.scale for a "
                  "complete file."),
    "E0110": Code("unknown size", "An expression names a size that is not defined before the line that uses it. "
                  "Sizes are defined in the model section (`hidden = 768`) in order; mesh axes, `global_batch` and "
                  "`seq_len` are sizes too."),
    "E0111": Code("unknown name", "A setting, layer kind, argument, axis, optimizer, schedule or dataset that does "
                  "not exist where it is written, or a name given where none is taken. The help lists the valid "
                  "names or suggests the closest."),
    "E0112": Code("wrong kind of value", "A setting or argument takes a number, a string, a choice, a tuple or a "
                  "call, and was given another kind. The message says what was expected."),
    "E0113": Code("missing setting", "A required setting or argument is absent (for example `devices_per_node`, "
                  "`steps`, an optimizer's `lr`, a model's name or the mesh's axes). Add it; the help shows how."),
    "E0120": Code("value out of range", "A value has the right kind but not an allowed value: a size that is not a "
                  "positive integer (a division with a remainder, a fraction), a negative rate, betas outside "
                  "[0, 1), a seed or count past its bound, a vocabulary too small for the synthetic task."),
    "E0130": Code("timeout too long", "`timeout` bounds how long a collective may wait before the watchdog ends the "
                  "job; the runtime holds it in timedeltas and thread waits that overflow past about 10^13 s, so a "
                  "huge value would pass the check and fail when the program starts. It is bounded at a week "
                  "(604800 s, \"7 days\"). `timeout = 0` turns the watchdog off."),
    "E0131": Code("schedule floor above its peak", "`cosine(min_lr = ...)` decays the learning rate from `lr` down "
                  "to `min_lr`; a floor above the peak would make the schedule rise instead. Make min_lr smaller "
                  "than the optimizer's lr (a tenth of it is usual)."),
    "E0132": Code("rope_scaling without rotary embeddings", "`rope_scaling = llama3(...)` rescales the frequencies "
                  "of rotary embeddings, which an attention has only with `rope_theta` > 0. Without it the scaling "
                  "would be ignored: add the rotary base (`rope_theta = 500000` for Llama 3) or remove the scaling."),
    "E0133": Code("evaluation without held-out data", "`eval_every` evaluates the model on data it never trains "
                  "on. With `data = tokens(...)` that data is the file's tail that `eval_split = F` holds out (the "
                  "last F of its windows; training permutes only the rest); without `eval_split` there is none. Add "
                  "`eval_split = 0.05`, or remove `eval_every`. Synthetic data needs no split: its held-out batches "
                  "are a seed stream of their own."),
    "W0130": Code("warm-up not over in the run", "A warning: the schedule's `warmup` is at least `steps`, so the "
                  "learning rate rises for the whole run and never reaches `lr` (and a cosine never decays). Use a "
                  "warm-up shorter than the run, usually a few percent of it."),
    "W0131": Code("learning rate far too high", "A warning: AdamW's peak learning rates lie between about 1e-6 and "
                  "1e-2; a rate above 1 is most likely a slip of the exponent's sign (`3e3` for `3e-3`) and "
                  "diverges in the first steps."),
    "W0132": Code("checkpoint interval without a directory", "A warning: `checkpoint_every` sets how often "
                  "checkpoints are written to `checkpoint_dir`; without a directory none is written. Add "
                  "`checkpoint_dir = \"...\"` or remove the interval."),
    "W0133": Code("checkpoint interval longer than the run", "A warning: the last step is always checkpointed; an "
                  "interval of at least `steps` adds no checkpoint, so it has no effect."),
    "W0134": Code("restarts without checkpoints", "A warning: torchrun restarts a failed job `restarts` times, and "
                  "each restart resumes from the last checkpoint in `checkpoint_dir`; without one it begins again "
                  "at step 0, repeating the work done. Add `checkpoint_dir`."),
    "W0135": Code("log interval longer than the run", "A warning: the first and last steps are always logged; a "
                  "`log_every` larger than `steps` logs nothing more, so it has no effect."),
    "W0136": Code("recompute without blocks", "A warning: activation recomputation applies to each block of the "
                  "model's `repeat`; a model without one has nothing to recompute."),
    "W0137": Code("qkv_bias equal to bias", "A warning: `qkv_bias` defaults to `bias` and differs from it only for "
                  "the q, k and v projections (Qwen 2: `bias = false, qkv_bias = true`). Written equal to `bias` it "
                  "changes nothing."),
    "W0138": Code("positions encoded twice", "A warning: the model has learned absolute positions (`positional`) "
                  "and rotary embeddings (`rope_theta` of an attention) at once. Both run, but models use one or the "
                  "other (GPT-2 the first, Llama the second): remove one."),
    "W0142": Code("asynchronous checkpoints with nothing to overlap", "A warning: `checkpoint_async` writes a "
                  "checkpoint's files in the background while the next steps run; a run waits for its last "
                  "checkpoint (and for one forced by SIGTERM) before it ends. Without `checkpoint_dir`, or with "
                  "`checkpoint_every` at 0 or not shorter than the run, every checkpoint written is a last one: the "
                  "setting changes nothing. Write checkpoints every few steps, or remove it."),
    "W0143": Code("qk_norm_eps without a q/k norm", "A warning: `qk_norm_eps` is the epsilon of the per-head "
                  "query and key norm that `qk_norm = rmsnorm` adds; with `qk_norm = none` (the default) there is no "
                  "such norm and the setting changes nothing."),
    "W0139": Code("device figure in other units", "A warning: a device figure of the mesh (peak_tflops, memory_gb, "
                  "a bandwidth or a latency) is far outside any device, most likely written in other units (bytes "
                  "for GB, FLOP/s for TFLOP/s, seconds for µs). The cost model would plan for it as written: the "
                  "memory check would pass plans no device can hold. The help gives the unit."),
    "W0140": Code("timeout too short", "A warning: `timeout` bounds the rendezvous of all ranks at start-up and "
                  "every collective of a step; below a few seconds the watchdog would end a healthy run (a bare "
                  "number is seconds: `timeout = 0.5` is half a second, not half a minute). Give at least 5 s, or "
                  "`timeout = 0` to turn the watchdog off."),
    "W0141": Code("evaluation setting with no effect", "A warning: `eval_batches` and `eval_split` shape the "
                  "evaluation that `eval_every` asks for; without `eval_every` no evaluation runs, and a token file "
                  "is trained on whole (nothing held out). `eval_split` with synthetic data does nothing either: "
                  "synthetic held-out batches are a seed stream of their own. Add `eval_every = N`, or remove the "
                  "setting."),
    # -- the resilience section -----------------------------------------------------------------------------------
    "W0150": Code("straggler action without detection", "A warning: `on_straggler` says what the run does about a "
                  "rank named slow, and `stragglers = off` names none: the action never runs. Write `stragglers = "
                  "detect(...)` (the default), or remove `on_straggler`."),
    "E0151": Code("excluding the only node", "`on_straggler = restart(exclude = node)` ends the attempt and rejoins "
                  "without the straggler's node, and `replan` searches again on the nodes left: on a one-node mesh "
                  "none would be left to run on. Use `on_straggler = report` there, or a mesh of several nodes."),
    "E0152": Code("re-plan without checkpoints", "`on_straggler = replan` reshards the last checkpoint onto the plan "
                  "searched for the nodes left and resumes from it; without `checkpoint_dir` there is no checkpoint. "
                  "Add `checkpoint_dir = \"...\"` to the train section, or use `report` or `restart(...)`."),
    "W0151": Code("restart without checkpoints", "A warning: `on_straggler = restart(...)` ends the attempt and "
                  "rejoins without the straggler's node, resuming from the last checkpoint; without "
                  "`checkpoint_dir` the new attempt begins again at step 0, repeating the work done. Add "
                  "`checkpoint_dir`."),
    "W0152": Code("straggler window longer than the run", "A warning: rank 0 gathers the ranks' timings and scores "
                  "them every `window` steps; a window longer than `steps` scores no rank in the run, so detection "
                  "does nothing. Use a shorter window (20 is the default), or `stragglers = off`."),
    # -- the model ------------------------------------------------------------------------------------------------
    "E0201": Code("heads do not divide the width", "An attention's heads must divide its hidden size: each head "
                  "gets hidden / heads features. The help lists head counts near the one written that divide it. "
                  "An attention with `head_dim` written has heads of that width, whatever the hidden size."),
    "E0202": Code("key/value heads do not divide the heads", "Grouped-query attention shares each key/value head "
                  "among heads / kv_heads query heads, so kv_heads must divide heads."),
    "E0203": Code("width mismatch", "Every layer of the residual stream works on the embedding's width, and the LM "
                  "head predicts the embedding's vocabulary. A layer written with another width or vocabulary is "
                  "marked."),
    "E0204": Code("layer out of place", "The model's structure is embedding, optional positional, blocks (one "
                  "`repeat` of residuals at the top level), norm, LM head, loss. A layer that may appear once "
                  "appears twice, sits inside a block, or a container is empty or misplaced."),
    "E0205": Code("sequence longer than the positions", "A learned positional embedding has `positions` rows; "
                  "`seq_len` may not exceed it. Raise `positions` or shorten the sequences."),
    "E0206": Code("odd head dimension under rotary embeddings", "Rotary embeddings turn each head's query and key "
                  "by pairs of dimensions (i, i + D/2), so the head dimension D (`head_dim`, or hidden / heads) must "
                  "be even when `rope_theta` is set."),
    "W0207": Code("window covers the sequence", "A warning: an attention's sliding `window` lets each query see "
                  "itself and the window - 1 keys before it; with a window at least as long as the training "
                  "sequences (`seq_len`) every earlier key is inside it, so the attention is the full causal one and "
                  "the setting changes nothing. Remove it, or train on sequences longer than the window."),
    "W0208": Code("query_scale is the head width", "A warning: `query_scale = Q` divides an attention's scores by "
                  "√Q instead of √D, D its head width (`head_dim`, or hidden / heads); written equal to D it is the "
                  "default scaling and changes nothing. Remove it (Gemma 2 27B is the family's one whose "
                  "query_pre_attn_scalar differs from its head_dim)."),
    # -- the mesh and the batch -----------------------------------------------------------------------------------
    "E0301": Code("mesh does not match the machines", "The product of the mesh axes must equal nodes × "
                  "devices_per_node: every process holds exactly one coordinate of the mesh. `ep` counts like `dp` "
                  "(the batch is split over dp × ep ranks)."),
    "W0301": Code("data_parallel with dp = 1", "A warning: `zero1`, `zero2` and `fsdp` shard the model state over "
                  "the dp ranks; with dp = 1 there is nothing to shard and the program runs as with `ddp`. Add dp "
                  "ranks or remove the setting."),
    "W0302": Code("grad_reduce under fp32", "A warning: `grad_reduce` chooses the dtype a `precision = bf16` "
                  "program accumulates and reduces its gradients in (fp32 main gradients by default, as Megatron-LM; "
                  "bf16 halves the bytes reduced). Under `precision = fp32` gradients are fp32 whatever it says."),
    "W0303": Code("fp32_residual under fp32", "A warning: `fp32_residual = true` keeps the residual stream of a "
                  "`precision = bf16` program in fp32 (Megatron-LM's --fp32-residual-connection); under "
                  "`precision = fp32` every activation is fp32 already."),
    "W0306": Code("fsdp_grad_sync with no effect", "A warning: `fsdp_grad_sync` chooses when FSDP2 reduce-scatters "
                  "the gradients of a step of several micro-batches (`step`: once, in the last micro-batch's "
                  "backward, the ones before accumulating whole gradients; `micro_batch`: in each, the gradients "
                  "staying sharded). It acts only with `data_parallel = fsdp` or `zero2`, dp > 1, micro_batches > 1 "
                  "and no pp (the pipeline schedule reduce-scatters once, after its last micro-batch)."),
    "E0390": Code("fp8 without torchao", "`precision = fp8(...)` trains with torchao's float8 training "
                  "(runtime/fp8.py: each chosen linear becomes a Float8Linear), and torchao does not import where the "
                  "file is checked. Install it (`pip install 'scalec[fp8]'`, torchao >= 0.18), or train in "
                  "`precision = bf16`."),
    "E0391": Code("fp8 matmuls do not run on this CPU", "A `device = cpu` plan under `precision = fp8(...)` runs "
                  "torch's CPU float8 matmul (torch._scaled_mm), which torch 2.13 runs; the torch installed "
                  "failed a 16 × 16 product. Install torch 2.13, or train in `precision = bf16`."),
    "E0392": Code("fp8 on a device without FP8 matmuls", "FP8 tensor cores start with compute capability 8.9 (Ada, "
                  "Hopper, Blackwell); an A100 has none, and torch._scaled_mm refuses to run there. Train in "
                  "`precision = bf16` on it, or plan for a device that has them (h100, h200, b200, gb200)."),
    "W0390": Code("fp8 chooses no linear", "A warning: `precision = fp8(filter = auto)` converts only the blocks' "
                  "linears whose local shape gains from FP8 (runtime.choices.fp8_pays: torchao's thresholds from "
                  "its H100 benchmarks; the casts cost more than a small matmul saves), with both dims multiples of "
                  "16. When none does, the program trains in plain bf16. `filter = all` converts every linear "
                  "whose dims FP8 kernels take (slower where they are small); or write `precision = bf16`."),
    "W0391": Code("fp8 predicted slower than bf16", "A warning: on a device with FP8 matmuls, the linears "
                  "`precision = fp8(...)` converts are predicted to spend more on their casts (each operand read "
                  "twice and written once more, compiler/cost/fp8.py) than their faster matmuls save: FP8 makes "
                  "the step slower, as it did small models in torchtitan#1207. `filter = auto` keeps the small "
                  "linears in bf16; or write `precision = bf16`."),
    "E0310": Code("sequence does not cut into 2·cp chunks", "Context parallelism (`axis cp`) gives each cp rank "
                  "chunks i and 2·cp − 1 − i of every sequence, so that under the causal mask every rank has as "
                  "much work: seq_len must divide into 2·cp equal chunks. Choose a cp that fits, or a seq_len that "
                  "is a multiple of 2·cp."),
    "E0312": Code("layer not built under context parallelism", "The context-parallel pass runs causal "
                  "`attention` over keys gathered over cp, at each token's true position. Sliding windows, soft-capped "
                  "scores, multi-head latent attention and `moe` layers with a capacity (which choices they drop "
                  "depends on the whole sequence's order, and a cp rank holds 1/cp of it) are not built under cp yet "
                  "and are refused. A dropless `moe` (`capacity_factor = none`) runs under cp, its aux loss over "
                  "the whole sequence. Remove the axis (give its ranks to dp), or use plain causal attention."),
    "E0315": Code("compiled ring attention", "Compiling (`compile = true`, the default on GPUs) a program with "
                  "`context_parallel = ring` is not built yet. `all_gather` and `all_to_all` compile: their "
                  "gathers and all-to-alls are traced into each block's region like the tensor-parallel ones. The "
                  "ring's sends are torch.distributed P2P (batch_isend_irecv) inside its autograd function, which "
                  "dynamo cannot trace: it breaks each block's region there and compiles the pieces of the ring's "
                  "loop as frames of their own around eager sends (measured exact without recomputation, but "
                  "not the one region per block a compiled program is, nor tried with recomputation). Set "
                  "`compile = false`, or use `context_parallel = all_gather` or `all_to_all`."),
    "E0317": Code("heads do not divide over cp for all_to_all", "`context_parallel = all_to_all` (DeepSpeed-"
                  "Ulysses) exchanges the queries, keys and values over cp so that each rank holds heads / cp of the "
                  "heads over the whole sequence: both the attention heads and the key/value heads of every "
                  "attention layer (under tp, those of each tp rank: heads / tp and kv_heads / tp) must divide by cp. Choose a cp that divides both, or `context_parallel = ring` "
                  "(or `all_gather`), which do not split heads."),
    "E0319": Code("layer not built with packed documents", "Packed documents (`data = tokens(..., "
                  "document_separator = ID)`) run each attention block-diagonally, one document at a time, at "
                  "positions restarting at each document (runtime/packed.py). Sliding windows, soft-capped scores and "
                  "multi-head latent attention are not built with them yet and are refused. Remove "
                  "`document_separator` (the file is then one stream), or use plain causal `attention`."),
    "E0318": Code("packed documents with a plan not built", "Packed documents carry each micro-batch's document "
                  "ids beside its tokens to every attention layer; through expert parallelism (`axis ep`), ring "
                  "attention (`context_parallel = ring`: its blocks are masked by position only) and a compiled "
                  "program (`compile = true`, the default on GPUs) that is not built yet, and the plan is refused "
                  "rather than run without them. Packed documents compose with dp (every data_parallel), tp (with "
                  "or without sequence parallelism), pp (every schedule), cp (all_gather and all_to_all) and "
                  "recomputation."),
    "W0310": Code("context_parallel without cp", "A warning: `context_parallel` chooses how attention runs over a "
                  "sequence sharded over the `cp` axis, and the mesh has none (or cp = 1), so it does nothing. Add "
                  "`axis cp = 2` (or more), or remove the setting."),
    "E0320": Code("a network shape these machines cannot have", "The mesh's `topology` (or `scale_up`) describes "
                  "a network the cluster's nodes do not fill: a leaf, rail group, pod or switch that does not divide "
                  "the nodes above it, a torus whose x × y × z is not the node count, dragonfly groups × "
                  "nodes_per_group that are not the nodes, an oversubscription below 1 or with another count of "
                  "ratios than uplink levels, a scale-up domain that neither divides a node nor spans whole nodes "
                  "dividing the cluster, a Slurm switch tree of other nodes. The error sits at the argument at "
                  "fault; the help gives what would fit."),
    "E0321": Code("unusable topology file", "`topology = from(\"topology.conf\")` reads a Slurm topology.conf "
                  "(the topology/tree plugin's `SwitchName=... Nodes=...` and `Switches=...` lines), relative to "
                  "the .scale file. The file is missing or unreadable, or it does not describe one tree: a line "
                  "without SwitchName, a switch described twice or with two parents, a node under two switches, a "
                  "switch listed but never described, a loop, no node at all. Each problem names the file's line."),
    "E0322": Code("placement that is not an order of the mesh's axes", "`placement = order(tp, pp, dp)` lists the "
                  "mesh's axes innermost first (the first varies fastest over the ranks): each axis once, every "
                  "axis of the mesh, none it lacks. `placement = auto` chooses the order (and the nodes) itself."),
    "W0320": Code("network setting with no effect", "A warning: `fabric` and `topology` describe the links "
                  "between nodes; on a single node no traffic crosses them. `scale_up` equal to devices_per_node "
                  "is a node's own NVLink domain, the default. Remove the setting, or describe the cluster's nodes."),
    "W0323": Code("auto placement predicted slower than the mesh's order", "A warning: `placement = auto` puts the "
                  "fewest bytes over the most oversubscribed level of the described network first, then, among "
                  "placements tied there, the least time of the step's collectives. The step-time model prices each "
                  "ring at its slowest link, which a byte count does not weigh: moving a small axis (pp) onto the "
                  "oversubscribed tier to take a larger one's (dp) crossings off it can save bytes there and still "
                  "predict a slower step. `plan` names both times. Write the mesh's order (`placement = "
                  "order(...)`, innermost first, or no placement) to keep the faster prediction, or keep auto for "
                  "the fewer bytes over the oversubscribed tier."),
    "W0321": Code("placement with no effect", "A warning: `placement` says which rank each mesh coordinate gets. "
                  "With at most one axis larger than 1 every order puts the ranks alike (`auto` still orders the "
                  "nodes of a torus), and on one node that is one NVLink domain every pair of ranks crosses the "
                  "same link. Remove it."),
    "E0330": Code("parameter offload without FSDP2", "`offload = params` is FSDP2's CPUOffloadPolicy: each unit's "
                  "parameter shards, their gradients and the optimizer's state live on the host, copied to the device "
                  "for the unit's all-gather. It needs FSDP2: `data_parallel = fsdp` (or zero2) over dp > 1. Under ddp "
                  "or zero1, `offload = optimizer(fraction = ...)` moves the optimizer's state instead."),
    "E0331": Code("optimizer offload under FSDP2", "`offload = optimizer` steps a share of the optimizer's state on "
                  "the host beside DDP's or zero1's optimizer. Under fsdp and zero2 (FSDP2) that state belongs to the "
                  "parameter shards, and FSDP2's own CPUOffloadPolicy (`offload = params`) puts shards, gradients "
                  "and state on the host together (all of them: it has no fraction)."),
    "E0332": Code("activation offload under recomputation", "`offload = activations` sends the tensors each block "
                  "saves for its backward to the host. Under `recompute = full` a block saves only its input, and "
                  "under `selective` the matmul outputs torch's checkpoint keeps itself: the offload would move "
                  "nothing. Choose one: `recompute = none` with the offload, or recomputation without it."),
    "E0333": Code("activation offload in a compiled program", "The hooks that choose which module's saved tensors "
                  "go to the host (attention's, the MLP's) run per call only in an eager block: a plan with "
                  "`offload = activations` is not compiled, and a written `compile = true` is refused. Leave "
                  "`compile` out or write `compile = false`."),
    "W0330": Code("offload with no effect", "A warning: the `offload` written moves nothing: "
                  "`optimizer(fraction = 0)` keeps the whole optimizer on the device, and `activations(modules = "
                  "...)` names modules no block of the model holds (or the model has no `repeat`)."),
    "E0302": Code("global batch does not divide", "The global batch is split over dp × ep ranks and then into "
                  "micro_batches on each; it must divide evenly. The help gives the next multiple that does. A "
                  "generated candidate plan is named in words instead of pointed at."),
    # -- tensor parallelism ---------------------------------------------------------------------------------------
    "E0401": Code("tp does not divide the heads", "Tensor parallelism gives each tp rank whole attention heads, so "
                  "tp must divide every attention's heads (or leave attention out of `tp_layers`)."),
    "E0402": Code("tp does not divide the key/value heads", "Each tp rank needs whole key/value heads for the "
                  "query heads it computes, so tp must divide kv_heads too."),
    "E0403": Code("tp does not divide the vocabulary", "The embedding, LM head and loss are split over tp along the "
                  "vocabulary. Either pad it (`pad_vocab = true`: padded logits are masked, the loss is unchanged) "
                  "or leave the vocabulary out of `tp_layers`."),
    "E0404": Code("tp does not divide the MLP width", "Each tp rank holds a slice of the MLP's inner width `ffn`, "
                  "so tp must divide it (or leave mlp out of `tp_layers`)."),
    "E0405": Code("sequence parallelism needs tp to divide the sequence", "Under `sequence_parallel` the norms and "
                  "residuals are split along the sequence over tp, so tp must divide seq_len; under context parallelism "
                  "(`axis cp`) the sequence each tp group splits is a cp rank's seq_len / cp tokens, which tp must "
                  "divide."),
    "E0406": Code("sequence parallelism needs every layer kind sharded", "Sequence parallelism replaces the "
                  "all-reduces of attention, MLP and vocabulary with reduce-scatter/all-gather pairs; it needs all "
                  "three in `tp_layers`."),
    "E0407": Code("tp cannot shard this layer", "The tensor-parallel pass shards a layer by pairing its column "
                  "linears (split by output) with its row linear (split by input) through operations known to keep a "
                  "head or inner-width shard whole (head split and merge, attention, activations, the SwiGLU "
                  "product). An operation outside that list between them (for instance the cat, slicing and "
                  "negation of a rotary embedding) would need its own rule; rather than run the layer replicated "
                  "while the plan says tp, the compiler refuses the plan at the layer. Leave the layer kind out of "
                  "`tp_layers`, or use tp = 1."),
    "W0410": Code("sequence parallelism without tp", "A warning: `sequence_parallel` splits norms and residuals "
                  "along the sequence over the tp ranks; without a tp axis (or with tp = 1) it does nothing."),
    "W0411": Code("pad_vocab with nothing to pad", "A warning: `pad_vocab` pads a vocabulary that tp does not "
                  "divide; without tp, with the vocabulary left out of `tp_layers`, or when tp divides it, nothing "
                  "is padded."),
    "W0413": Code("tp placed across nodes", "A warning: the mesh's axes are listed outermost first and the last "
                  "varies fastest over the ranks (ranks 0..7 on the first node of 8), so an axis's group takes ranks "
                  "as far apart as the product of the axes listed after it. tp is listed before other axes so that "
                  "its groups span nodes, though tp fits in one node: its all-reduces, on every layer's critical "
                  "path, then run over the network instead of NVLink. List `axis tp` last (innermost), as Megatron "
                  "orders tp first-fastest; `scalec plan` shows each axis's link."),
    "W0412": Code("tp_layers without tp", "A warning: `tp_layers` chooses what a tp axis shards; without a tp axis "
                  "(or with tp = 1) it does nothing."),
    # -- memory ---------------------------------------------------------------------------------------------------
    "E0501": Code("the predicted peak memory does not fit", "The fullest rank's predicted peak (weights, gradients, "
                  "optimizer state, the activations its micro-batches in flight keep for backward, and the working "
                  "set at that moment: the logits and their gradients, communication buffers) exceeds the memory of "
                  "its device. `compile` and `run` refuse such a plan unless --force; `plan` shows the breakdown per "
                  "rank and what single change would make it fit (recompute, more micro-batches of fewer sequences, "
                  "a ZeRO stage, more tp or pp)."),
    "W0502": Code("the predicted peak memory fits with little to spare", "A warning: the fullest rank's predicted "
                  "peak is within 10% of its device's memory. The CUDA context, NCCL's buffers and the caching "
                  "allocator's fragmentation need some of it, so the run may still run out of memory."),
    # -- pipeline parallelism -------------------------------------------------------------------------------------
    "E0601": Code("more stages than blocks", "pp × virtual_stages stages each need at least one block of the "
                  "model's `repeat`. Use fewer stages or more blocks."),
    "E0602": Code("too few micro-batches for the pipeline", "1F1B-style schedules need at least pp micro-batches "
                  "to fill the pipeline; more shrink the bubble, (pp-1)/(micro_batches+pp-1)."),
    "E0603": Code("interleaving needs micro-batches in groups of pp", "interleaved-1f1b runs the micro-batches in "
                  "rounds of pp, so micro_batches must be a multiple of pp."),
    "E0604": Code("virtual stages without interleaving", "`virtual_stages` > 1 gives each pp rank several stages, "
                  "which only the interleaved-1f1b schedule runs. Set `schedule = \"interleaved-1f1b\"` or "
                  "`virtual_stages = 1`."),
    "E0605": Code("the model cannot be cut into these stages", "A pipeline cuts the blocks of the model's `repeat`s, "
                  "concatenated in order, into stages: the repeats must follow one another (a layer between two "
                  "`repeat`s is refused; layers before the first and after the last are the first and last stages'), "
                  "and the search proposes interleavings only where the blocks divide into pp × virtual_stages "
                  "equal stages (a written plan may interleave uneven ones: the cost-balanced cut or its `layout`)."),
    "E0607": Code("invalid stage layout", "A manual `layout` gives one (first, end) range of blocks per stage: as "
                  "many ranges as stages, each non-empty, in order, covering every block once."),
    "E0615": Code("pipeline schedule too long", "`compile` builds the schedule's per-rank action lists and proves "
                  "them action by action (in time linear in their number), and each rank of the program builds its "
                  "list at start-up; more than 4,194,304 actions per step (about ten times Korthikanti et al.'s "
                  "1T configuration) is refused. Use fewer micro-batches, each of more sequences."),
    "E0610": Code("selective recomputation under zero-bubble", "The zero-bubble schedule splits each backward in "
                  "two passes over a stage's graph (input gradients, then weight gradients); torch's selective "
                  "activation checkpointing lets a recomputed region be read back once. Use `recompute = full`, "
                  "which recomputes the block in each pass, or a schedule without the split."),
    "E0611": Code("compile under zero-bubble", "A compiled region is one autograd node: the zero-bubble schedule's "
                  "split backward (input gradients, then weight gradients) would run each block's whole backward in "
                  "both halves. Under zero-bubble `compile` defaults to false; written true, it is this error. Use "
                  "another schedule (1f1b, interleaved-1f1b) to compile."),
    "E0616": Code("dualpipev needs two stages per rank and 2·pp micro-batches", "DualPipeV (DeepSeek-V3's "
                  "DualPipe in its V-shaped form) folds the model over the pp ranks in a V: each rank holds two "
                  "stages, r and 2·pp-1-r, so `virtual_stages` is 2 (its default under this schedule; leave it out), "
                  "and the schedule's warm-up runs 2·pp micro-batches before its first backward, so micro_batches "
                  "must be at least 2·pp (as torch's ScheduleDualPipeV requires)."),
    "W0612": Code("pipeline schedule without pp", "A warning: `schedule` orders the micro-batches over pipeline "
                  "stages; without a pp axis (or with pp = 1) there are no stages and it does nothing."),
    "W0613": Code("virtual stages without pp", "A warning: `virtual_stages` gives each pp rank several interleaved "
                  "stages; without a pp axis it does nothing."),
    "W0614": Code("stage layout without pp", "A warning: `layout` gives the blocks of each pipeline stage; without a "
                  "pp axis it does nothing."),
    "E0609": Code("the pipeline schedule fails verification", "Before any process starts, `compile` and `run` build "
                  "the per-rank action lists the runtime will execute and prove them: every send has its receive, "
                  "no rank waits forever, each stage computes each micro-batch once. A failure is a defect of "
                  "scalec's schedule builder, not of the file; another schedule or micro-batch count avoids it."),
    # -- expert parallelism and MoE -------------------------------------------------------------------------------
    "E0701": Code("ep does not divide the experts", "Each ep rank holds a whole number of every `moe` layer's "
                  "experts, so ep must divide the experts. The help lists ep sizes that do."),
    "E0702": Code("top_k larger than the experts", "Each token is routed to top_k distinct experts of its `moe` "
                  "layer, so top_k may not exceed the number of experts."),
    "E0703": Code("capacity factor not positive", "The capacity factor scales the slots each expert has per "
                  "sequence; at 0 or below no expert could take a token."),
    "E0704": Code("ep without experts", "An `ep` axis shards the experts of `moe` layers; a model without them has "
                  "nothing to shard. Remove the axis (give its ranks to dp) or add `moe` layers."),
    "E0705": Code("moe outside a residual", "A `moe` layer drops the tokens over capacity to the residual stream; "
                  "outside a `residual` they would vanish. Put it inside one."),
    "W0709": Code("dropped under dropless routing", "A warning: `dropped` says what a choice over an expert's "
                  "capacity contributes; with `capacity_factor = none` (dropless) no choice is ever over capacity, "
                  "so it does nothing."),
    "W0710": Code("load-balancing loss that cannot balance", "A warning: with top_k equal to the experts every "
                  "token goes to every expert, the load is always balanced and the auxiliary loss is the constant "
                  "1: its weight changes nothing. Use a smaller top_k, or `aux_loss = 0`."),
    "W0712": Code("renormalised top-1 gates", "A warning: `renormalize = true` divides each gate by the sum of "
                  "the token's top_k gates; with top_k = 1 every gate becomes 1, so the router's probabilities no "
                  "longer scale the expert's output and the router learns from the load-balancing loss alone. "
                  "Remove the setting (top-1 gates are the probability, as in Switch) or route to more experts."),
    "E0713": Code("expert groups that do not divide the experts", "Group-limited routing (`groups = G`, DeepSeek-V3's "
                  "n_group) cuts a `moe`'s experts into G groups of equal size and lets each token choose only "
                  "among the experts of its `topk_groups` best groups; G must divide the experts, and each group "
                  "hold at least two (a group's score is the sum of its two best experts' scores)."),
    "E0714": Code("too few experts in the groups a token may choose from", "Each token chooses its top_k experts "
                  "among the experts of its `topk_groups` best groups (topk_groups · experts / groups of them), and "
                  "`topk_groups` is at most `groups`: raise topk_groups, or lower top_k."),
    "W0715": Code("group-limited routing that limits nothing", "A warning: `topk_groups` says how many of the "
                  "`groups` expert groups a token may choose from; without groups (groups = 1), or with topk_groups "
                  "equal to groups, every expert may be chosen and the setting changes nothing."),
    "W0716": Code("expert bias that changes no choice", "A warning: `bias_update` moves a per-expert bias that "
                  "shifts which experts a token chooses (DeepSeek-V3's auxiliary-loss-free balancing); when every "
                  "token goes to all the experts (top_k = experts) there is no choice to shift, and the bias does "
                  "nothing."),
    "E0717": Code("grouped dispatch with a capacity", "`dispatch = grouped` sorts every choice to its expert and "
                  "runs the experts on exactly the rows they received: it is dropless, and a capacity factor would "
                  "say how many choices to drop. Write `capacity_factor = none` with it, or remove `dispatch` to "
                  "keep the capacity (padded buffers, choices over capacity dropped)."),
    "E0719": Code("rebalance settings out of range", "`rebalance = replicate(every = N, extra = R)` re-places the "
                  "experts every N steps, giving the hottest R replicas: N is a number of steps, at least 1 (0 would "
                  "never re-place), and R a number of replicas, at least 0."),
    "E0720": Code("rebalance with padded dispatch", "Re-placement evens out the rows each ep rank's experts compute. "
                  "Under padded dispatch every expert computes its whole buffer of capacity slots whatever its load, "
                  "and the all-to-alls move the whole buffers: there is nothing to even out. Use `dispatch = "
                  "grouped` with `capacity_factor = none` (rows sorted by expert, variable splits), or remove "
                  "`rebalance`."),
    "W0721": Code("rebalance without expert parallelism", "A warning: re-placement moves experts and their replicas "
                  "between the ep ranks; with ep = 1 one rank holds every expert and nothing moves. Add an `ep` "
                  "axis, or remove `rebalance`."),
    "E0722": Code("rebalance replicas that do not fit", "Under `rebalance = replicate(extra = R)` each ep rank holds "
                  "(experts + R) / ep slots, each one expert's copy: experts + R must divide over ep, and no expert "
                  "can have more copies than there are ep ranks (R ≤ experts × (ep - 1))."),
    "E0723": Code("rebalance on a plan the runtime does not re-place", "Re-placement moves each expert's weights "
                  "and AdamW state whole between ep ranks and sums its replicas' gradients. It is served for fp32 "
                  "training under ddp, without pipeline or context parallelism, optimizer offload or a Hugging Face "
                  "`init`; the other plans (ZeRO and FSDP shards, bf16's main gradients and masters, pipeline "
                  "stages) are not moved yet."),
    "W0725": Code("ep_dispatch with no effect", "A warning: `ep_dispatch` chooses how a `moe` with `dispatch = "
                  "grouped` sends tokens to experts on other nodes (`nodes`: each token once to each node its choices "
                  "lie on, then over the node to its experts' ranks; `direct`: each choice to its expert's rank). It "
                  "acts only where the ep group spans nodes in whole nodes' worth of consecutive ranks, on a mesh "
                  "without a written `placement`, for a grouped `moe` without `rebalance` (whose re-placed experts "
                  "are sent directly)."),
    "W0724": Code("rebalance no sooner than the run ends", "A warning: `rebalance = replicate(every = N)` "
                  "re-places the experts after every N steps from the load those steps measured; with N at least "
                  "the run's steps no step runs on a re-placed layout. Use an `every` shorter than the run, or remove "
                  "`rebalance`."),
    "W0718": Code("a capacity that drops most choices", "A warning: `capacity_factor` gives each expert "
                  "capacity_factor × top_k × seq_len / experts slots per sequence (rounded up, at least 1), and "
                  "every choice past an expert's slots is dropped. Here all the experts' slots together hold less "
                  "than a tenth of a sequence's top_k × seq_len choices, so even a perfectly balanced router drops "
                  "nine in ten: a factor meant as a percentage (0.05 for 5% headroom), or a slip of a digit. 1.0 "
                  "keeps every choice of a balanced load, 1.25 leaves room for imbalance, `none` is dropless."),
    "W0711": Code("shared gate without a shared expert", "A warning: `shared_gate` scales the output of the "
                  "shared expert, and this `moe` has none (`shared_ffn` is not given), so it does nothing. Give the "
                  "shared expert a width with `shared_ffn`, or remove `shared_gate`."),
    # -- data -----------------------------------------------------------------------------------------------------
    "E0801": Code("bad data file", "The token file of `data = tokens(path = ...)` is missing, a directory, empty, "
                  "not a whole number of ids of its dtype, or too short for one sequence. A relative path is "
                  "relative to the .scale file's directory."),
    "E0814": Code("Megatron index of ids we do not read", "The token file PREFIX.bin has no sidecar and a "
                  "Megatron index beside it (PREFIX.idx, MMIDIDX), which says the dtype of its ids; the index is "
                  "of a version other than 1, or gives the ids as uint8, int8, int16 or floats, which are not read "
                  "as token ids (uint16, int32 and int64 are; Megatron has no uint32). Write the dataset again with "
                  "uint16 ids (a vocabulary up to 65536) or int32, as Megatron's preprocess_data.py and `scalec "
                  "data` do."),
    "E0812": Code("document separator outside the vocabulary", "`document_separator` of `data = tokens(...)` "
                  "is the id that ends each document of the token file; an id outside the model's vocabulary "
                  "(0 .. vocab − 1) never occurs in a file the run accepts, so every window would be one document. "
                  "Give the tokenizer's end-of-document id (`scalec data --separator TOKEN` prints the files it "
                  "writes)."),
    "E0802": Code("bad checkpoint to start from", "The Hugging Face checkpoint of `init = from(...)` is missing, a "
                  "directory without .safetensors files, or not a .safetensors file. A relative path is relative to "
                  "the .scale file's directory."),
    "E0803": Code("token file of another dtype", "The token file's sidecar (FILE.json beside FILE, written by "
                  "runtime.data.write_tokens), its .npy header (np.save's) or its Megatron index (PREFIX.idx "
                  "beside PREFIX.bin) records the dtype its ids were written "
                  "in, and it is not the one `data = tokens(..., dtype = ...)` declares (uint16 when not written; "
                  "a .npy file or a Megatron dataset without a written dtype is read in the recorded one). Read in "
                  "another dtype, every id "
                  "would be garbage that may still fall inside the vocabulary. Declare the recorded dtype."),
    "E0813": Code("unusable .npy token file", "The token file is a .npy file (it starts with numpy's header, "
                  "whatever its name), or is named .npy, and is not what a token file can be: a header that cannot "
                  "be read (or of a version other than 1.0 and 2.0), values that are not uint16, uint32, int32 or "
                  "int64 ids (floats, int8, uint64, objects), big-endian ids, an array of more than one dimension, "
                  "bytes after the header other than its shape says (cut short), or no header at all under the "
                  ".npy name. A .npy file is read by its header, never as a flat file (its header's bytes would be "
                  "read as ids). Save one flat little-endian array: np.save(path, ids.reshape(-1).astype(np.int64)), "
                  "or write a flat file and declare its dtype."),
    "E0804": Code("token ids outside the model's vocabulary", "The data's ids go past the model's vocabulary: its "
                  "sidecar records a larger vocabulary than the embedding's, or an id of the first MiB of a bare "
                  "file is outside it (the run would stop there; when the same bytes read in another dtype all fit, "
                  "the help names that dtype). Make the model's `vocab` hold the tokenizer's ids, or use the data "
                  "the model was made for."),
    "E0805": Code("unusable token-file sidecar", "The sidecar beside the token file is not valid JSON, not a "
                  "scalec-tokens/1 sidecar (format, dtype, vocab_size, tokens), or says another length than the "
                  "file's (tokens × the dtype's size in bytes): the file was changed or cut short after the sidecar "
                  "was written. Write both again with runtime.data.write_tokens, or remove the sidecar."),
    "E0806": Code("unreadable checkpoint", "A safetensors file of the checkpoint of `init = from(...)` is not "
                  "readable: shorter than its header says, a header that is not JSON or lacks a tensor's dtype, "
                  "shape or data offsets, a tensor whose bytes lie past the end of the file (a download cut short), "
                  "or an index (model.safetensors.index.json) or config.json that is not readable or names a shard "
                  "that is not there. Download or save the checkpoint again."),
    "E0807": Code("checkpoint tensors do not match the model", "The checkpoint of `init = from(...)` lacks tensors "
                  "the model reads under Hugging Face's names (model.layers.N.self_attn.q_proj.weight, ...), or holds "
                  "tensors the model has no place for, which the run would ignore: a checkpoint of another "
                  "architecture (GPT-2's h.0.attn.c_attn.weight), of more layers, with biases the model lacks or "
                  "the other way round, or an untied head for a tied model. `scalec import CONFIG.json` writes the "
                  "model section of the checkpoint's own architecture."),
    "E0808": Code("checkpoint tensor of another shape", "A tensor of the checkpoint of `init = from(...)` has "
                  "another shape than the model's parameter it initialises: the checkpoint is of another width, "
                  "vocabulary, MLP width or number of key-value heads. The label says which size the first "
                  "difference implies; make the model's sizes the checkpoint's."),
    "E0809": Code("checkpoint config disagrees with the model", "The tensors of the checkpoint of `init = "
                  "from(...)` fit the model's shapes, but its config.json says the model computes otherwise: another "
                  "number of attention or key-value heads (which shapes cannot show), rotary base, norm epsilon, "
                  "tied head, experts per token, or an architecture outside Llama, Mistral, Qwen 2 and Mixtral. "
                  "Write the model section from the config (`scalec import`)."),
    "E0810": Code("model without a Hugging Face layout", "`init = from(...)` reads checkpoints of Llama, Mistral, "
                  "Qwen 2 and Mixtral, whose layout has no learned positions, no LayerNorm biases, one stack of "
                  "blocks of `residual { rmsnorm  attention }  residual { rmsnorm  mlp | moe }` and no head bias. "
                  "The model has parameters with no name in that layout. Write the model in it (`scalec import` "
                  "does), or start from `init = normal`."),
    "E0811": Code("held-out split too small", "`eval_split = F` holds out the last floor(W × F) of the token "
                  "file's W windows of seq_len + 1 tokens, and each evaluation reads eval_batches × global_batch of "
                  "them, each once, the same ones every time; the split holds fewer (or leaves no window to train "
                  "on). Hold out a larger share, read fewer `eval_batches`, or use a larger file. Checked where the "
                  "file's length is known (its sidecar, or its size); the run checks again when it opens the file."),
    "W0803": Code("token file looks like another dtype", "A warning: the file has no sidecar, and its first MiB "
                  "looks like ids of another dtype than the declared one: declared uint16, every odd uint16 is 0 "
                  "(the high halves of little-endian uint32 ids below 65536), or three of every four are (int64 "
                  "ids, as numpy writes them by default); declared uint32 or int32, every odd one is 0 (int64 ids). "
                  "Declare the file's dtype, or write it with a sidecar (runtime.data.write_tokens) or as a .npy "
                  "file (np.save), which record the dtype and end the guessing."),
    # -- resharding -----------------------------------------------------------------------------------------------
    "E0901": Code("models differ", "`scalec reshard` maps a checkpoint between two plans of the same model; the "
                  "two files define parameters of different names or shapes. `scalec export` refuses the same way, "
                  "before anything is read or written, a checkpoint whose model (its manifest's fingerprint of the "
                  "parameters' names and whole shapes, or DCP's metadata) is not the .scale file's: its weights "
                  "would be written beside a config.json of another model. A run resuming from such a checkpoint "
                  "stops with the same words."),
    # -- importing a Hugging Face config.json (`scalec import`) --------------------------------------------------
    "E0951": Code("not a Hugging Face config", "`scalec import` reads a Hugging Face config.json: one JSON object. "
                  "The file is not valid JSON (the caret marks where the reader stopped), or its top level is not an "
                  "object."),
    "E0952": Code("architecture not importable", "`scalec import` maps LlamaForCausalLM, MistralForCausalLM, "
                  "Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, MixtralForCausalLM, Qwen2MoeForCausalLM "
                  "and Qwen3MoeForCausalLM, named by `architectures` (or by `model_type` when that is absent), and "
                  "refuses a model_type that contradicts them. Another architecture may differ in ways its keys do "
                  "not show, so it is refused; write its model section by hand (docs/language.md). For the "
                  "families people fine-tune that it cannot write yet (Gemma 1-3, DeepSeek-V2/V3) the "
                  "refusal names what the language lacks for each."),
    "E0953": Code("unknown config key", "Every key of the config.json is either mapped into the model section (the "
                  "line that uses it names it), or listed as irrelevant to training the architecture (token ids, "
                  "dtype, the generation cache, ...) with the reason, in compiler/importer.py. A key in neither list "
                  "might change the architecture, so the import stops at it rather than ignore it. If it does not "
                  "change the model, remove it from the file."),
    "E0954": Code("config value not expressible", "A known key of the config.json holds a value the language cannot "
                  "express, or a value of the wrong type: sliding windows on some layers only (Qwen 2's "
                  "max_window_layers), attention dropout, an "
                  "activation other than silu, a rope type other than default and llama3, router jitter noise, a "
                  "head_dim other than hidden_size / num_attention_heads, heads that do not divide the width. The "
                  "help says which values map."),
}

# Codes once emitted and removed: never reused for another meaning.
RETIRED: dict[str, str] = {
    "E0314": "zero1, zero2 and fsdp with both cp and ep refused as not built: built since (the dense weights shard "
             "over dp × cp × ep, the experts over dp × cp)",
    "E0316": "selective recomputation with `context_parallel = ring` refused as not modelled (its measured "
             "activations 19% above the model): built since (the ring's forward is one operator whose output and "
             "log-sum-exp the policy saves, as a collective's, so nothing is sent again and none of its steps' "
             "scores and partial products is kept, which were the 19%)",
    "E0313": "context parallelism with expert parallelism refused as not built: built since (a dropless moe routes "
             "each rank's S/cp tokens, its aux loss's counts summed over cp; the experts' gradients summed over "
             "dp × cp)",
    "E0311": "`context_parallel = ring` and `all_to_all` refused as not built: both built since (ring attention with "
             "the keys and values passed around cp; Ulysses' all-to-alls of heads and sequence)",
    "E0707": "`moe` layers under sequence parallelism: supported since a moe gathers its input's sequence over tp "
             "and routes whole sequences, as without sequence parallelism",
    "E0706": "FSDP over dp together with ep: supported since FSDP shards the dense weights over dp × ep and the "
             "experts over dp (torchtitan's folding)",
    "E0708": "zero1 and zero2 over dp together with ep: supported since zero1 partitions over dp and zero2 shards "
             "as fsdp does",
    "E0606": "checkpoints of a pipeline-parallel plan: supported since checkpoints became layout-independent",
    "E0608": "a cap of 16,384 stage × micro-batch slots on pipelines: replaced by E0615, a bound of "
             "4,194,304 on the schedule's actions (the cap allowed about 100,000), since the check is linear in them",
}


def explain(code: str) -> str | None:
    """The text `scalec explain CODE` prints, or None for a code that was never registered."""
    code = code.strip().upper()
    if code in CODES:
        c = CODES[code]
        return f"{code}: {c.title}\n\n" + textwrap.fill(c.explanation, 100) + "\n"
    if code in RETIRED:
        return f"{code}: retired ({RETIRED[code]})\n"
    return None
