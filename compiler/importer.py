"""`scalec import config.json`: a Hugging Face config.json of a Llama, Mistral (Mistral 7B's sliding window and
Mistral-Nemo's head_dim included), Qwen 2, Qwen 3 (dense), Phi-3 (its sliding window; its checkpoints' fused
qkv_proj and gate_up_proj are runtime/hf_names.py's business, not the model's), Mixtral, Qwen2-MoE or Qwen3-MoE
causal LM, as the equivalent `.scale` model section.

`import_config(text, path)` is pure: JSON text in, `.scale` text out, or a ScaleError whose diagnostics are located
at the JSON keys (file:line:col, the line, a caret). Every key of the file is either mapped (the output line that
uses it names it in a comment), or listed below as irrelevant to training the architecture, with the reason; any
other key, or a known key whose value the language cannot express, is an error: nothing is silently ignored.

A key the file omits is read as transformers' default for its architecture (`DEFAULTS`, checked against
transformers' own config classes by tests/test_import.py), as transformers itself reads it; the output says so.
"""
from __future__ import annotations

import difflib
import json
import math
import textwrap

from compiler.diagnostics import Diagnostic, ScaleError, Span
from compiler.importer_deepseek import DEEPSEEK_TYPES, DeepseekLayout
from compiler.importer_gemma import GEMMA_TYPES, GemmaLayout
from compiler.importer_json import BadJson, Json, parse
from compiler.importer_keys import ARCHITECTURES, DEFAULTS, IRRELEVANT, NOT_YET, USED
from compiler.importer_text import TextWriter, fmt

__all__ = ("ARCHITECTURES", "DEFAULTS", "IRRELEVANT", "NOT_YET", "USED", "complete", "import_config")

# values a key must have to be expressible (the key is then used: it appears in a comment)
_LLAMA3_FIELDS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")

class _Importer(TextWriter):
    """The reading of a config's keys and its mapping, family by family (Llama, Mistral, Qwen 2/3, Phi-3,
    Mixtral, Qwen-MoE); the text is compiler/importer_text.py's."""

    def __init__(self, doc: Json, arch: str, model_type: str):
        self.doc, self.cfg, self.arch, self.type = doc, doc.value, arch, model_type
        self.defaults = DEFAULTS[model_type]
        self.diags: list[Diagnostic] = []

    # -- reading keys ---------------------------------------------------------------------------------------------

    def error(self, path: tuple, message: str, label: str = "", help: str = "", code: str = "E0954") -> None:
        span = self.doc.span(path, value=True) or self.doc.span(path[:1], value=True) or self.doc.start()
        self.diags.append(Diagnostic(code, message, span, label=label, help=help))

    def src(self, key: str) -> str:
        """How a comment names a key: itself, or `key (absent: default)`."""
        return key if key in self.cfg else f"{key} (absent: transformers' default)"

    def get(self, key: str):
        return self.cfg[key] if key in self.cfg else self.defaults.get(key)

    def pos_int(self, key: str, path: tuple | None = None, value=None) -> int | None:
        v = self.get(key) if path is None else value
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            self.error(path or (key,), f"`{key}` must be a positive integer, not {json.dumps(v)}",
                       label="not a positive integer")
            return None
        return v

    def number(self, key: str, path: tuple | None = None, value=None, positive: bool = True) -> float | None:
        v = self.get(key) if path is None else value
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or (positive and v <= 0):
            self.error(path or (key,), f"`{key}` must be a {'positive ' if positive else ''}number, not "
                       f"{json.dumps(v)}", label="not a number we can use")
            return None
        return v

    def boolean(self, key: str) -> bool | None:
        v = self.get(key)
        if not isinstance(v, bool):
            self.error((key,), f"`{key}` must be true or false, not {json.dumps(v)}", label="not a boolean")
            return None
        return v

    def must_be(self, key: str, ok, message: str, help: str) -> None:
        """A known key only some values of which the language can express (an absent key: transformers'
        default, which is located at the file's first brace)."""
        v = self.get(key)
        if not ok(v):
            absent = "" if key in self.cfg else f" (`{key}` absent: transformers' default for {self.arch})"
            self.error((key,), message.format(json.dumps(v)) + absent, label="not expressible in .scale",
                       help=help)

    # -- the mapping ----------------------------------------------------------------------------------------------

    fmt = staticmethod(fmt)

    def unknown_keys(self) -> None:
        """E0953 at each key neither used for this architecture nor irrelevant to training it; E0102 at each key
        written twice."""
        known = set(USED[self.type]) | set(IRRELEVANT)
        for key in self.cfg:
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
                self.error((key,), f"unknown key `{key}` in a {self.arch} config", code="E0953",
                           label="not known to `scalec import`",
                           help=(f"did you mean `{close[0]}`? " if close else "") +
                           "a key the importer does not know might change the architecture, so it is not ignored; "
                           "remove it if it does not (known keys: compiler/importer.py USED and IRRELEVANT)")
        for path, where in self.doc.duplicates:
            ks, ke, vs, ve = where
            line, col = self.doc.position(ks)
            self.diags.append(Diagnostic("E0102", f"key `{path[-1]}` is written twice", Span(
                self.doc.path, line, col, *self.doc.position(ke)), label="written again here",
                help="JSON readers keep the last one silently; keep one"))

    def header(self) -> list[str]:
        """The comment lines above the model section: where it came from, and the keys not mapped."""
        return [f"# {self.arch} from {self.doc.path}, by `scalec import`: each line names the config.json keys it "
                "came from;",
                "# \"(absent: transformers' default)\" marks a key the file omits, read as transformers reads it.",
                *textwrap.wrap("Irrelevant to training the architecture, so not mapped: " +
                               (", ".join(k for k in self.cfg if k in IRRELEVANT) or "none") +
                               " (compiler/importer.py says why).", 114, initial_indent="# ",
                               subsequent_indent="#   ")]

    def run(self) -> str | None:
        self.unknown_keys()
        sizes = {k: self.pos_int(k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                              "num_hidden_layers", "num_attention_heads",
                                              "max_position_embeddings")}
        kv = self.get("num_key_value_heads")
        kv = sizes["num_attention_heads"] if kv is None else self.pos_int("num_key_value_heads")
        eps = self.number("rms_norm_eps")
        tied = self.boolean("tie_word_embeddings")
        self.must_be("hidden_act", lambda v: v == "silu", "hidden_act {} is not expressible",
                     "the MLPs of .scale are gelu or swiglu (silu-gated, as `silu` here); only `silu` maps")
        self.must_be("attention_dropout", lambda v: v in (0, 0.0) and not isinstance(v, bool),
                     "attention dropout {} is not expressible",
                     "attention in .scale has no dropout; set it to 0.0 to train without it")
        h, n = sizes["hidden_size"], sizes["num_attention_heads"]
        head_dim = None if self.get("head_dim") is None else self.pos_int("head_dim")
        if h and n and h % n and self.get("head_dim") is None:
            self.error(("num_attention_heads",), f"{n} heads do not divide hidden_size {h}",
                       label=f"{h} % {n} == {h % n}", help="each head is hidden_size / num_attention_heads wide "
                       "when head_dim is absent or null; give head_dim")
        if head_dim is not None and head_dim % 2:  # every family imported here turns q and k by rotary embeddings
            self.error(("head_dim",), f"head_dim {head_dim} is odd", label="rotary embeddings turn pairs",
                       help="rotary embeddings turn pairs of each head's dimensions: head_dim must be even")
        if n and kv and n % kv:
            self.error(("num_key_value_heads",), f"{kv} key/value heads do not divide {n} heads",
                       label=f"{n} % {kv} == {n % kv}", help="grouped-query attention shares each key/value head "
                       "among num_attention_heads / num_key_value_heads query heads")
        rope = self.rope()
        attn_bias = mlp_bias = False
        if self.type == "llama":
            attn_bias, mlp_bias = self.boolean("attention_bias"), self.boolean("mlp_bias")
        if self.type in ("qwen3", "qwen3_moe"):
            attn_bias = self.boolean("attention_bias")
        if self.type == "phi3":
            self.phi3()
        window = self.window(sizes["num_hidden_layers"])
        moe = None
        if self.type == "mixtral":
            experts, top_k = self.pos_int("num_local_experts"), self.pos_int("num_experts_per_tok")
            if experts and top_k and top_k > experts:
                self.error(("num_experts_per_tok",), f"{top_k} experts per token out of {experts}",
                           label="more than num_local_experts", help="each token picks distinct experts")
            aux = self.number("router_aux_loss_coef", positive=False)
            if aux is not None and aux < 0:
                self.error(("router_aux_loss_coef",), "router_aux_loss_coef must not be negative",
                           label="negative")
            self.must_be("router_jitter_noise", lambda v: v in (0, 0.0) and not isinstance(v, bool),
                         "router jitter noise {} is not expressible",
                         "the router of .scale's moe adds no noise; set it to 0.0 to train without it")
            self.must_be("output_router_logits", lambda v: isinstance(v, bool),
                         "output_router_logits must be true or false, not {}", "true or false")
            moe = (experts, top_k, aux)
        if self.type in ("qwen2_moe", "qwen3_moe"):
            moe = self.qwen_moe()
        if self.diags or None in sizes.values() or None in (kv, eps, tied, attn_bias, mlp_bias) or rope is None \
                or (moe is not None and None in moe):
            return None
        return self.emit(sizes, kv, eps, tied, rope, attn_bias, mlp_bias, moe, head_dim, window)

    def phi3(self) -> None:
        """Phi-3's keys beyond Llama's: checked, as none changes the model when it has the one value .scale can
        write. Its residual dropout (`resid_pdrop`, on each block's attention and MLP output) and embedding dropout
        (`embd_pdrop`) must be 0 as attention_dropout must; a partial rotary factor (Phi-3.5-MoE, Phi-4-mini: only
        the first part of each head turned) is not expressible; `attention_bias` true claims biases transformers'
        Phi-3 never builds; `original_max_position_embeddings` is read by longrope scaling only."""
        for key, where in (("resid_pdrop", "the residual dropout of each block's attention and MLP output"),
                           ("embd_pdrop", "the dropout of the embeddings")):
            self.must_be(key, lambda v: v in (0, 0.0) and not isinstance(v, bool), f"{where} ({key} {{}}) is not "
                         "expressible", f".scale has no dropout; set {key} to 0.0 to train without it")
        self.must_be("partial_rotary_factor", lambda v: v is None or (v in (1, 1.0) and not isinstance(v, bool)),
                     "partial_rotary_factor {} (rotary embeddings on part of each head) is not expressible",
                     "rotary embeddings in .scale turn every dimension of each head: only 1.0 maps (Phi-3; "
                     "Phi-3.5 and Phi-4-mini turn a part)")
        self.must_be("attention_bias", lambda v: v in (None, False),
                     "attention_bias {} is not Phi-3's: transformers' Phi-3 attention has no biases",
                     "Phi3ForCausalLM builds qkv_proj and o_proj without biases whatever the file says: set it "
                     "to false (a checkpoint with biases is of another architecture)")
        self.pos_int("original_max_position_embeddings")

    def window(self, layers: int | None) -> int | None:
        """The sliding window of every layer's attention (transformers' sliding_window: a key is kept when
        q_idx - kv_idx < window), or None for attention over the whole sequence. Mistral, Mixtral and Phi-3 window
        every layer by `sliding_window` (null: none; Phi-3-mini-4k's 2047 is written as it is: transformers' mask,
        and its flash-attention window of sliding_window - 1 tokens before each query, keep 2047 keys). Qwen 2 and 3 window the layers transformers marks
        "sliding_attention": with use_sliding_window, those from max_window_layers on (or as `layer_types` lists
        them); a stack of both kinds is refused, since a `repeat` holds identical blocks."""
        if self.type in ("mistral", "mixtral", "phi3"):  # Phi-3: its every layer, create_sliding_window_causal_mask
            return None if self.get("sliding_window") is None else self.pos_int("sliding_window")
        if self.type in ("qwen2_moe", "qwen3_moe"):  # windows on alternate layers: none is expressible
            self.must_be("use_sliding_window", lambda v: v is False, "use_sliding_window = {} is not expressible",
                         "Qwen-MoE windows alternate layers, which one `repeat` of identical blocks cannot write: "
                         "set it to false")
            types = self.cfg.get("layer_types")
            if types is not None:
                if not isinstance(types, list):
                    self.error(("layer_types",), "`layer_types` must be a list", label="not a list")
                else:
                    for i, t in enumerate(types):
                        if t != "full_attention":
                            self.error(("layer_types", i), f"layer {i} is {json.dumps(t)}, not expressible",
                                       label="not expressible in .scale",
                                       help="Qwen-MoE's attention maps when it is over the whole sequence "
                                            "(\"full_attention\")")
                    if layers and len(types) != layers:
                        self.error(("layer_types",), f"`layer_types` names {len(types)} layers, not "
                                   f"num_hidden_layers = {layers}", label="wrong length")
            return None
        if self.type not in ("qwen2", "qwen3"):
            return None  # Llama has no sliding window
        use = self.boolean("use_sliding_window")
        if use is None:
            return None
        types = self.cfg.get("layer_types")
        if types is not None:
            if not isinstance(types, list):
                self.error(("layer_types",), "`layer_types` must be a list", label="not a list")
                return None
            for i, t in enumerate(types):
                if t not in ("full_attention", "sliding_attention"):
                    self.error(("layer_types", i), f"layer {i} is {json.dumps(t)}, not expressible",
                               label="not expressible in .scale",
                               help="attention in .scale is causal over the whole sequence (\"full_attention\") "
                                    "or within a window (\"sliding_attention\")")
                    return None
            if layers and len(types) != layers:
                self.error(("layer_types",), f"`layer_types` names {len(types)} layers, not "
                           f"num_hidden_layers = {layers}", label="wrong length")
                return None
        elif use and layers:
            first = self.get("max_window_layers")
            if isinstance(first, bool) or not isinstance(first, int) or first < 0:
                self.error(("max_window_layers",), f"`max_window_layers` must be an integer ≥ 0, not "
                           f"{json.dumps(first)}", label="not a layer count")
                return None
            types = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
        else:
            types = []
        kinds = set(types)
        if "sliding_attention" not in kinds:
            return None
        if not use:  # transformers sets sliding_window to null without use_sliding_window: no window to apply
            self.error(("layer_types",), "`layer_types` lists sliding_attention layers, but use_sliding_window is "
                       "false", label="no window", help="transformers gives these layers no window without "
                       "use_sliding_window; set it true, or list them as full_attention")
            return None
        if kinds != {"sliding_attention"}:
            where = ("layer_types",) if "layer_types" in self.cfg else ("max_window_layers",)
            n = types.count("sliding_attention")
            self.error(where, f"{n} of {len(types)} layers use sliding-window attention and the others full "
                       "attention: per-layer attention kinds are not expressible", label="not expressible in .scale",
                       help="a `repeat` holds identical blocks, so every layer's attention has the same window; "
                            "set max_window_layers to 0 (every layer windowed) or use_sliding_window to false")
            return None
        return self.pos_int("sliding_window")

    def experts_key(self) -> str:
        """The key naming a Qwen-MoE's expert count: `num_experts` (Qwen2-MoE, and the released Qwen3-MoE configs),
        or `num_local_experts` where a Qwen3-MoE file has only that (transformers 5's Qwen3MoeConfig writes it)."""
        if self.type == "qwen3_moe" and "num_local_experts" in self.cfg and "num_experts" not in self.cfg:
            return "num_local_experts"
        return "num_experts"

    def qwen_moe(self):
        """Qwen2-MoE's or Qwen3-MoE's mixture: (experts, top_k, aux_loss, expert width, shared expert width (0:
        none, Qwen3-MoE), norm_topk_prob, qkv_bias (false for Qwen3-MoE, whose biases are attention_bias)), None
        entries after an error. Every decoder layer must be sparse: the language's one `repeat` cannot write the
        dense layers `decoder_sparse_step` > 1 or `mlp_only_layers` would interleave."""
        key = self.experts_key()
        experts, top_k = self.pos_int(key), self.pos_int("num_experts_per_tok")
        if self.type == "qwen3_moe" and "num_experts" in self.cfg and "num_local_experts" in self.cfg \
                and self.cfg["num_experts"] != self.cfg["num_local_experts"]:
            self.error(("num_local_experts",), f"num_local_experts {json.dumps(self.cfg['num_local_experts'])} "
                       f"differs from num_experts {json.dumps(self.cfg['num_experts'])}", label="two different values",
                       help="both name the expert count (num_local_experts is transformers 5's name): keep one")
        if experts and top_k and top_k > experts:
            self.error(("num_experts_per_tok",), f"{top_k} experts per token out of {experts}",
                       label=f"more than {key}", help="each token picks distinct experts")
        ffn = self.pos_int("moe_intermediate_size")
        shared = self.pos_int("shared_expert_intermediate_size") if self.type == "qwen2_moe" else 0
        aux = self.number("router_aux_loss_coef", positive=False)
        if aux is not None and aux < 0:
            self.error(("router_aux_loss_coef",), "router_aux_loss_coef must not be negative", label="negative")
        self.must_be("decoder_sparse_step", lambda v: v == 1 and not isinstance(v, bool),
                     "decoder_sparse_step {} makes only every so many layers sparse, which is not expressible",
                     "every block of .scale's one `repeat` is the same: a mixture in every layer "
                     "(decoder_sparse_step 1) maps; dense MLP layers between sparse ones do not")
        self.must_be("mlp_only_layers", lambda v: v == [],
                     "mlp_only_layers {} gives some layers a dense MLP, which is not expressible",
                     "every block of .scale's one `repeat` is the same: only an empty list maps (a mixture in "
                     "every layer)")
        self.must_be("output_router_logits", lambda v: isinstance(v, bool),
                     "output_router_logits must be true or false, not {}", "true or false")
        norm = self.boolean("norm_topk_prob")
        qkv = self.boolean("qkv_bias") if self.type == "qwen2_moe" else False
        return experts, top_k, aux, ffn, shared, norm, qkv

    def theta_in(self, d: dict, where: str, theta, theta_src):
        """(rotary base, where it was read): `where`'s own rope_theta (transformers 5 writes it in
        rope_parameters), which must agree with a top-level one, else the top-level `theta`; None after an error."""
        if "rope_theta" not in d:
            return None if self.number("rope_theta") is None else (theta, theta_src)
        if "rope_theta" in self.cfg and self.cfg["rope_theta"] != d["rope_theta"]:
            self.error(("rope_theta",), f"rope_theta {json.dumps(self.cfg['rope_theta'])} differs from "
                       f"{where}.rope_theta {json.dumps(d['rope_theta'])}", label="two different values",
                       help="keep one")
            return None
        if self.number("rope_theta", (where, "rope_theta"), d["rope_theta"]) is None:
            return None
        return d["rope_theta"], f"{where}.rope_theta"

    def rope(self):
        """(theta, llama3 tuple or None, theta's source, scaling's source) from rope_theta / rope_scaling
        (transformers 4) or rope_parameters (transformers 5); None after an error."""
        params = self.cfg.get("rope_parameters")
        scaling = self.cfg.get("rope_scaling")
        if params is not None and scaling is not None:
            self.error(("rope_scaling",), "both rope_scaling and rope_parameters are given",
                       label="written twice", help="transformers 5 reads rope_parameters; keep one")
            return None
        d, where = (params, "rope_parameters") if params is not None else (scaling, "rope_scaling")
        theta, theta_src = self.get("rope_theta"), self.src("rope_theta")
        if d is None:
            ok = self.number("rope_theta")
            return (theta, None, theta_src, None) if ok else None
        if not isinstance(d, dict):
            self.error((where,), f"`{where}` must be an object or null", label="not an object")
            return None
        kind_key = "rope_type" if "rope_type" in d else "type"
        kind = d.get(kind_key, "default")
        if kind not in ("default", "llama3"):  # its own keys are not ours to list: the type itself is the blocker
            phi = kind in ("longrope", "su", "yarn") and self.type == "phi3"  # transformers reads su, yarn as longrope
            self.error((where, kind_key), f"rope type {json.dumps(kind)} is not expressible" +
                       (" (Phi-3's LongRoPE: rotary frequencies rescaled by long_factor and short_factor, as "
                        "Phi-3-mini-128k has)" if phi else ""),
                       label="not expressible in .scale",
                       help="rotary embeddings in .scale are unscaled (default) or Llama 3's llama3(...)" +
                       ("; the 4k-context Phi-3 models have rope_scaling null" if phi else ""))
            return None
        known = {"rope_type", "type", "rope_theta", *_LLAMA3_FIELDS}
        if self.type == "phi3":  # transformers 5's Phi3Config writes it into rope_parameters
            known.add("partial_rotary_factor")
            rotary = d.get("partial_rotary_factor", 1.0)
            if not (rotary in (1, 1.0) and not isinstance(rotary, bool)):
                self.error((where, "partial_rotary_factor"), f"partial_rotary_factor {json.dumps(rotary)} (rotary "
                           "embeddings on part of each head) is not expressible", label="not expressible in .scale",
                           help="rotary embeddings in .scale turn every dimension of each head: only 1.0 maps")
        for k in d:
            if k not in known:
                self.error((where, k), f"unknown key `{k}` in `{where}`", code="E0953",
                           label="not known to `scalec import`",
                           help="rope types that map: default, and llama3 with " + ", ".join(_LLAMA3_FIELDS))
        read = self.theta_in(d, where, theta, theta_src)
        if read is None:
            return None
        theta, theta_src = read
        if kind == "default":
            extra = [k for k in _LLAMA3_FIELDS if k in d]
            if extra:
                self.error((where, extra[0]), f"`{extra[0]}` is given for rope_type default",
                           label="not read by the default rope type", help="remove it, or set rope_type llama3")
            return None if self.diags else (theta, None, theta_src, None)
        missing = [k for k in _LLAMA3_FIELDS if k not in d]
        if missing:
            self.error((where, kind_key), "rope type llama3 without " + ", ".join(f"`{k}`" for k in missing),
                       label="incomplete", help="llama3 scaling needs " + ", ".join(_LLAMA3_FIELDS))
            return None
        vals = [self.number(k, (where, k), d[k]) for k in _LLAMA3_FIELDS[:3]]
        orig = self.pos_int("original_max_position_embeddings", (where, _LLAMA3_FIELDS[3]), d[_LLAMA3_FIELDS[3]])
        if None in vals or orig is None:
            return None
        return theta, (*vals, orig), theta_src, where


def _not_yet(arch: str, at: Span) -> Diagnostic:
    """The refusal of an architecture the language cannot write yet, naming what it lacks."""
    return Diagnostic("E0952", f"{arch} is not importable yet: the language cannot write {NOT_YET[arch][1]}", at,
                      label="not importable yet",
                      help=f"`scalec import` writes {', '.join(ARCHITECTURES)}; for this model, write the model "
                           "section by hand without what .scale lacks (it will not train equal to the checkpoint), "
                           "or wait for those layers")


def _architecture(doc: Json) -> tuple[str, str] | Diagnostic:
    cfg = doc.value
    names = ", ".join(ARCHITECTURES)
    archs = cfg.get("architectures")
    mtype = cfg.get("model_type")
    if archs is not None:
        if isinstance(archs, list) and len(archs) == 1 and archs[0] in NOT_YET:
            return _not_yet(archs[0], doc.span(("architectures",), value=True))
        if not (isinstance(archs, list) and len(archs) == 1 and archs[0] in ARCHITECTURES):
            return Diagnostic("E0952", f"architecture {json.dumps(archs)} is not importable",
                              doc.span(("architectures",), value=True), label="not importable",
                              help=f"`scalec import` writes {names}, one architecture a config")
        arch = archs[0]
        if mtype is not None and mtype != ARCHITECTURES[arch]:
            return Diagnostic("E0952", f"model_type {json.dumps(mtype)} does not match {arch}",
                              doc.span(("model_type",), value=True), label=f"{arch} is `{ARCHITECTURES[arch]}`",
                              help="a config of one architecture says `model_type` of that architecture")
        return arch, ARCHITECTURES[arch]
    by_type = {v: k for k, v in ARCHITECTURES.items()}
    if mtype in by_type:
        return by_type[mtype], mtype
    later = {t: a for a, (t, _) in NOT_YET.items()}
    if mtype in later:
        return _not_yet(later[mtype], doc.span(("model_type",), value=True))
    return Diagnostic("E0952", "the config names no importable architecture" if mtype is None else
                      f"model_type {json.dumps(mtype)} is not importable",
                      doc.span(("model_type",), value=True) or Span(doc.path, 1, 1, 1, 2),
                      label="not importable",
                      help=f"`scalec import` knows {names} (by `architectures`, else `model_type`: "
                           + ", ".join(ARCHITECTURES.values()) + ")")


class _GemmaImporter(GemmaLayout, _Importer):
    """Gemma 2 and Gemma 3 (text): their own model section (compiler/importer_gemma.py), this reading of keys."""


class _DeepseekImporter(DeepseekLayout, _Importer):
    """DeepSeek-V2 and V3: their own model section (compiler/importer_deepseek.py), this reading of keys."""


def import_config(text: str, path: str) -> str:
    """The `.scale` model section equivalent to the config.json `text` (read from `path`, which diagnostics
    name); raises ScaleError with every problem found, each located at its JSON key."""
    try:
        doc = parse(text, path)
    except BadJson as e:
        probe = Json(text=text, path=path)
        line, col = probe.position(min(e.offset, len(text)))
        raise ScaleError([Diagnostic("E0951", f"not valid JSON: {e.message}", Span(path, line, col, line, col + 1),
                                     label="the reader stopped here",
                                     help="a Hugging Face config.json is one JSON object")], {path: text}) from None
    if not isinstance(doc.value, dict):
        raise ScaleError([Diagnostic("E0951", "the top level is not a JSON object", Span(path, 1, 1, 1, 2),
                                     help="a Hugging Face config.json is one JSON object of settings")],
                         {path: text})
    found = _architecture(doc)
    if isinstance(found, Diagnostic):
        raise ScaleError([found], {path: text})
    imp = (_GemmaImporter if found[1] in GEMMA_TYPES else _DeepseekImporter if found[1] in DEEPSEEK_TYPES
           else _Importer)(doc, *found)
    out = imp.run()
    if out is None:
        raise ScaleError(sorted(imp.diags, key=lambda d: (d.span.line, d.span.col) if d.span else (0, 0)),
                         {path: text})
    return out


# Every imported mixture is dropless (transformers routes every choice): sorted by expert, not padded to a slot per
PLACEHOLDER = """
# Placeholder cluster and training settings, to replace with yours (`scalec search` finds a plan for a cluster).
mesh {
  axis dp = 1
  devices_per_node = 1
}

train {
  global_batch = 8
  seq_len      = seq
  steps        = 100
  optimizer    = adamw(lr = 3e-4, betas = (0.9, 0.95), weight_decay = 0.1)
}
"""


def complete(model_section: str) -> str:
    """A whole .scale file: the imported model section and placeholder mesh and train sections."""
    return model_section + PLACEHOLDER
