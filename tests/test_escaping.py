"""Nothing a user writes runs: hostile file names, model names, strings and comments reach program.py, launch.sh and
plan.json only through the escaping functions of compiler/codegen/escape.py, and the generated files stay valid and
inert (program.py parses and its --help creates nothing; launch.sh passes `bash -n` and passes its words through
unchanged; plan.json is JSON holding the values as written).
"""
from __future__ import annotations

import ast as pyast
import dataclasses
import functools
import io
import json
import math
import os
import random
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from compiler import codegen
from compiler.check import check_text
from compiler.diagnostics import ScaleError
from compiler.pipeline import compile_spec

ROOT = Path(__file__).resolve().parents[1]
MARKER = "PWNED"
RUN = f'__import__("os").system("touch {MARKER}")'

# A small model over two nodes, so launch.sh has its multi-node branch (the one naming the model in --rdzv-id).
TEXT = (ROOT / "samples" / "tiny_gpt.scale").read_text().replace(
    "axis dp = 1\n  devices_per_node = 1", "axis dp = 2\n  nodes = 2\n  devices_per_node = 1")
assert "nodes = 2" in TEXT

HOSTILE = [
    f'x""";{RUN};"""y',
    f"x''';{RUN};'''y",
    "\\N{DIGIT ONE}\\x41\\u0041\\U00000041\\",
    'ends with a quote"',
    'ends with a backslash\\',
    f"$(touch {MARKER})`touch {MARKER}`$HOME ${{x}} !! \\$",
    f"a\n{RUN}\n#",
    f"a\r{RUN}\r",
    f"a\r\n{RUN}\r\n",
    f"a\u2028{RUN}\u2029{RUN}\x85{RUN}",
    f"a\x0b{RUN}\x0c{RUN}\x1c\x1d\x1e\x1f",
    "a\x1b[31mred\x1b[0m\x7f\x00\x01",
    "{{ 7 * 7 }}{% raw %}{# not a comment #}{{",
    "\u202e\u200b\u00a0\ufeffé×→",
    "'\"'''\"\"\"'",
    "\\",
    "",
]


def _display(name: str) -> str:
    """How a generated file shows a file name: a byte that was not UTF-8 (a lone surrogate under Python's
    surrogateescape) as the text `\\xNN`."""
    return re.sub("[\udc80-\udcff]", lambda m: f"\\x{ord(m[0]) - 0xdc00:02x}", name)


@functools.lru_cache(maxsize=None)
def _compiled(text: str, path: str):
    return compile_spec(check_text(text, path))


def _emit(text: str, path: str, out: Path, model_name: str | None = None):
    compiled = _compiled(text, path)
    spec = compiled.spec
    if model_name is not None:  # not writable in .scale (a NAME), but codegen must not rely on the grammar
        spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, name=model_name))
    codegen.emit(dataclasses.replace(compiled, spec=spec), str(out))
    return {f: (out / f).read_text(encoding="utf-8") for f in ("program.py", "plan.json", "launch.sh", "launch.sbatch")}


def _strings_blanked(tree: pyast.AST) -> str:
    """The program's syntax tree with every string constant emptied: equal for two programs iff they differ in
    string values at most (so no comment, docstring or literal turned into code)."""
    for node in pyast.walk(tree):
        if isinstance(node, pyast.Constant) and isinstance(node.value, str):
            node.value = ""
    return pyast.dump(tree)


def _docstrings(tree: pyast.Module) -> dict:
    return {n.name: pyast.get_docstring(n, clean=False) for n in tree.body if isinstance(n, pyast.ClassDef)}


def _config(tree: pyast.Module) -> dict:
    (call,) = [n.value for n in tree.body if isinstance(n, pyast.Assign) and isinstance(n.targets[0], pyast.Name)
               and n.targets[0].id == "CONFIG"]
    return _keywords(call)


def _keywords(call: pyast.Call) -> dict:
    """A call's keyword arguments as values; a nested group (`train.Data(...)`) as a dict of its own."""
    return {k.arg: _keywords(k.value) if isinstance(k.value, pyast.Call) else pyast.literal_eval(k.value)
            for k in call.keywords}


def _code_lines(launch: str) -> list[str]:
    return [ln for ln in launch.split("\n") if not ln.startswith("#")]


def _run_helps(programs: list[Path], cwd: Path) -> None:
    """`python3 program.py --help` for each program, in one interpreter (torch is imported once); nothing may be
    created in `cwd`."""
    driver = ("import runpy, sys\n"
              "for p in sys.argv[1:]:\n"
              "    sys.argv = [p, '--help']\n"
              "    try:\n"
              "        runpy.run_path(p, run_name='__main__')\n"
              "    except SystemExit as e:\n"
              "        assert e.code in (0, None), (p, e.code)\n"
              "    else:\n"
              "        raise AssertionError(p + ' --help did not exit')\n")
    before = sorted(p.name for p in cwd.rglob("*"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", driver, *map(str, programs)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("usage:") == len(programs)
    assert sorted(p.name for p in cwd.rglob("*")) == before, "running --help created files"
    assert not list(cwd.rglob(MARKER))


def _bash_n(path: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


HOSTILE_COMMENTS = [f'# """; {RUN}; """', f'# " \r{RUN}', f'# " \u2028{RUN}\u2029{RUN}\x85{RUN}',
                    '# " {{ 7*7 }} {% raw %}', '# " \\', f'# " \x0c{RUN}\x0b{RUN}']


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Every hostile build, made once: an ordinary one to compare with, then one per hostile file name, model name
    (plain and pipeline program) and source comment."""
    root = tmp_path_factory.mktemp("hostile")
    pp = (ROOT / "samples" / "gpt_pp.scale").read_text()
    out = {"base": _emit(TEXT, "samples/base.scale", root / "base"), "file": [], "model": [], "comment": [],
           "base_pp": _emit(pp, "samples/base.scale", root / "base_pp")}
    for i, h in enumerate(HOSTILE + ["\udcff\udcfe"]):  # the last: bytes that are not UTF-8
        name = h + ".scale"
        for kind, text in (("dp", TEXT), ("pp", pp))[:2 if i % 4 == 0 else 1]:  # the Stage class: a few names
            d = root / f"file_{kind}{i}"
            out["file"].append((name, kind, d, _emit(text, "some/dir/" + name, d)))
    names = [h for h in HOSTILE if h and "\x00" not in h] + [f"m$(touch {MARKER})"]
    for i, name in enumerate(names):
        for kind, text in (("dp", TEXT), ("pp", pp))[:2 if i % 4 == 0 else 1]:  # the Stage class: a few names
            d = root / f"model_{kind}{i}"
            out["model"].append((name, kind, d, _emit(text, f"{kind}.scale", d, model_name=name)))
    for i, c in enumerate(HOSTILE_COMMENTS):
        d = root / f"comment{i}"
        out["comment"].append((c, d, _emit(TEXT.replace("repeat layers {", "repeat layers {  " + c),
                                           "samples/base.scale", d)))
    return out


def test_hostile_file_names(builds):
    """The .scale file's base name reaches the header comments, the Block docstring, the provenance comments and
    plan.json; none of them lets it out."""
    for name, kind, out, files in builds["file"]:
        base = builds["base" if kind == "dp" else "base_pp"]
        shown = _display(name)
        tree = pyast.parse(files["program.py"])
        docs = _docstrings(tree)
        line = 13 if kind == "dp" else 14
        assert docs["Block"] == f"One block of the `repeat` at {shown}:{line}: the residual stream in and out.", name
        assert _config(tree)["source"] == shown
        assert _strings_blanked(tree) == _strings_blanked(pyast.parse(base["program.py"])), name
        for line in files["program.py"].split("\n"):  # no line is cut short by the name: comments are one line
            assert "\r" not in line and "\u2028" not in line and "\x85" not in line and "\x00" not in line
        assert files["program.py"].count("\n") == base["program.py"].count("\n"), name
        assert _code_lines(files["launch.sh"]) == _code_lines(base["launch.sh"]), name
        _bash_n(out / "launch.sh")
        assert _code_lines(files["launch.sbatch"]) == _code_lines(base["launch.sbatch"]), name
        _bash_n(out / "launch.sbatch")
        plan = json.loads(files["plan.json"])
        assert plan["source"] == shown
        assert all(c["source"].startswith(shown + ":") for c in plan["ledger"] if c["source"])


def test_hostile_model_names(builds, tmp_path):
    """The model name is a NAME in the grammar; codegen escapes it anyway, in every context it reaches (header
    comment, docstrings, CONFIG, plan.json, launch.sh's --rdzv-id), for plain and pipeline programs."""
    fake = tmp_path / "fake" / "runtime"  # launch.sh's torchrun is `python3 -m runtime.launch`: record its arguments
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "launch.py").write_text('import os, sys\nwith open(os.path.join(os.environ["ARGS_DIR"], f"args.{os.getpid()}"), '
                                    '"wb") as f:\n    f.write(b"".join(a.encode() + b"\\0" for a in sys.argv[1:]))\n')
    for i, (name, kind, out, files) in enumerate(builds["model"]):
        tree = pyast.parse(files["program.py"])
        docs = _docstrings(tree)
        assert _config(tree)["name"] == name
        if kind == "pp":
            assert docs["Stage"].startswith(f"One pipeline stage of `{name}`: the embedding"), repr(name)
        else:
            assert docs["Model"].startswith(f"The whole model `{name}`: token ids"), repr(name)
        assert json.loads(files["plan.json"])["name"] == name
        _bash_n(out / "launch.sh")
        _bash_n(out / "launch.sbatch")  # the name reaches only the job name, made of characters sbatch reads as such
        job = [line for line in files["launch.sbatch"].splitlines() if line.startswith("#SBATCH --job-name=")]
        assert len(job) == 1 and re.fullmatch(r"#SBATCH --job-name=scalec-[A-Za-z0-9_.-]*", job[0]), job
        if kind == "pp":
            continue
        # launch.sh, run with a torchrun that records its arguments: the rendezvous id arrives as one word.
        args_dir = tmp_path / f"args{i}"
        args_dir.mkdir()
        env = dict(os.environ, PYTHONPATH=str(fake.parent), ARGS_DIR=str(args_dir), LOCAL_NODES="1")
        proc = subprocess.run(["bash", str(out / "launch.sh"), "--steps", "1"], cwd=args_dir,
                              env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        calls = [f.read_bytes().decode("utf-8").split("\0")[:-1] for f in sorted(args_dir.glob("args.*"))]
        assert len(calls) == 2, calls
        for argv in calls:
            assert argv[argv.index("--rdzv-id") + 1] == f"scalec-{name}"
            assert Path(argv[-3]).resolve() == (out / "program.py").resolve()
            assert argv[-2:] == ["--steps", "1"]
    assert not list(tmp_path.rglob(MARKER))


def test_hostile_comments(builds):
    """A source line's comment can reach a provenance comment (when the line holds a `"`); it stays one line."""
    base = builds["base"]
    for c, out, files in builds["comment"]:
        tree = pyast.parse(files["program.py"])
        assert _strings_blanked(tree) == _strings_blanked(pyast.parse(base["program.py"])), repr(c)
        comments = [t.string for t in tokenize.generate_tokens(io.StringIO(files["program.py"]).readline)
                    if t.type == tokenize.COMMENT]
        assert any('repeat layers {  # "' in s for s in comments), comments  # the comment did reach one
        assert files["program.py"].count("\n") == base["program.py"].count("\n")
        _bash_n(out / "launch.sh")


def test_hostile_programs_run_nothing(builds, tmp_path):
    """`python3 program.py --help` of every hostile build creates no file."""
    programs = [b[-2] / "program.py" for kind in ("file", "model", "comment") for b in builds[kind]]
    _run_helps(programs, tmp_path)


# .scale spellings of hostile strings, and the values they must arrive at.
STRINGS = [
    (r'"C:\\new\\table"', "C:\\new\\table"),
    (r'"x\"\"\"; __import__(\"os\").system(\"touch PWNED\"); \"\"\""',
     'x"""; __import__("os").system("touch PWNED"); """'),
    (r'"\\N{DIGIT ONE}\\x41\\"', "\\N{DIGIT ONE}\\x41\\"),
    ('"$(touch PWNED)`touch PWNED`"', "$(touch PWNED)`touch PWNED`"),
    (r'"a\nimport os\nos.system(\"touch PWNED\")\t#"', 'a\nimport os\nos.system("touch PWNED")\t#'),
    ('"a\u2028b\rc\x85d\x0ce\u202ef"', "a\u2028b\rc\x85d\x0ce\u202ef"),
    ('"{{ 7*7 }}{% if x %}"', "{{ 7*7 }}{% if x %}"),
    (r'"\\\\server\\share\\"', "\\\\server\\share\\"),
]


@pytest.mark.parametrize("spelt,value", STRINGS, ids=[f"s{i}" for i in range(len(STRINGS))])
def test_hostile_strings(tmp_path, spelt, value):
    """data paths and checkpoint_dir arrive in CONFIG and plan.json as the values the .scale string spells."""
    text = TEXT.replace("  log_every    = 5", f"  log_every = 5\n  data = tokens(path = {spelt})\n"
                        f"  checkpoint_dir = {spelt}")
    (tmp_path / value).write_bytes(bytes(1024))  # check looks for the data file, beside the .scale file
    files = _emit(text, str(tmp_path / "strings.scale"), tmp_path)
    tree = pyast.parse(files["program.py"])
    config = _config(tree)
    assert config["data"]["path"] == value and config["checkpoint"]["dir"] == value
    train = json.loads(files["plan.json"])["train"]
    assert train["data"]["path"] == value and train["checkpoint"]["dir"] == value
    _bash_n(tmp_path / "launch.sh")
    calls = {n.func.attr for n in pyast.walk(tree) if isinstance(n, pyast.Call) and isinstance(n.func, pyast.Attribute)}
    assert "system" not in calls


# ---------------------------------------------------------------------------------------------------------------
# The escaping functions themselves.

def _random_strings(n: int, seed: int = 0, surrogates: bool = True) -> list[str]:
    rng = random.Random(seed)
    pools = ["\"'\\ \n\r\t\x00\x0b\x0c\x1b\x7f\x85\u2028\u2029{}%#$`!Nxu", "ab01", ""]
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randrange(0, 24)):
            r = rng.random()
            if r < 0.5:
                chars.append(rng.choice(pools[0]))
            elif r < 0.7:
                chars.append(rng.choice(pools[1]))
            else:
                cp = rng.randrange(0, 0x110000)
                if not surrogates and 0xD800 <= cp <= 0xDFFF:
                    cp = 0x41
                chars.append(chr(cp))
        out.append("".join(chars))
    return out


SAMPLES = HOSTILE + ["\udcff", "a\ud800b", "\\N{LATIN SMALL LETTER A}", '"', '""', '"""', "\\\"", "x\\"]


def test_py_str_round_trips():
    from compiler.codegen import escape as E
    for s in SAMPLES + _random_strings(3000):
        lit = E.py_str(s)
        lit.encode("utf-8")  # writable as UTF-8, surrogates included
        assert pyast.literal_eval(lit) == s
        assert "\n" not in lit and "\r" not in lit and len(lit.splitlines()) == 1


def test_py_literal_round_trips():
    from compiler.codegen import escape as E
    values = [None, True, False, 0, -3, 2 ** 70, 0.1, -1e-300, 1e300, math.inf, -math.inf, (), ("a",),
              (("x\"'\\", 1, 2.5), ("y", 0, None)), [1, "a"], tuple(SAMPLES)]
    for v in values:
        back = pyast.literal_eval(E.py_literal(v)) if E.py_literal(v) not in ("float('inf')", "float('-inf')") \
            else eval(E.py_literal(v))  # noqa: S307 - our own literal
        assert back == v and type(back) is type(v)
    assert math.isnan(eval(E.py_literal(math.nan)))  # noqa: S307
    assert E.py_literal(("a", 1, 0.5)) == repr(("a", 1, 0.5))  # ordinary values read as Python writes them
    for bad in ({}, object(), b"bytes", {1}):
        with pytest.raises(TypeError):
            E.py_literal(bad)


def test_docstring_cannot_close_its_quotes():
    from compiler.codegen import escape as E
    for s in SAMPLES + _random_strings(3000, seed=1):
        d = E.docstring(s)
        d.encode("utf-8")
        assert d.isprintable(), repr(d)
        src = f'class A:\n    """{d}"""\n\n    x = 1\n'
        tree = pyast.parse(src)
        (cls,) = tree.body
        assert pyast.get_docstring(cls, clean=False) == s and len(cls.body) == 2
        assert len(src.splitlines()) == 4
    assert E.docstring("The whole model `m`: in, out.") == "The whole model `m`: in, out."


def test_comment_stays_one_line(tmp_path):
    from compiler.codegen import escape as E
    strings = SAMPLES + _random_strings(3000, seed=2)
    script = []
    for s in strings:
        c = E.comment(s)
        c.encode("utf-8")
        assert c.isprintable(), repr(c)
        assert E.comment(c) == c  # idempotent: a comment built from comments is the same comment
        src = f"x = 1  # {c}\ny = 2\n"
        assert [t.type for t in tokenize.generate_tokens(io.StringIO(src).readline)].count(tokenize.COMMENT) == 1
        assert len(pyast.parse(src).body) == 2
        script.append(f"# {c}")
    script.append("echo done")
    (tmp_path / "s.sh").write_text("\n".join(script), encoding="utf-8")
    proc = subprocess.run(["bash", str(tmp_path / "s.sh")], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.stdout == "done\n" and proc.returncode == 0, proc.stderr[-2000:]
    assert E.comment("gpt.scale:12  repeat layers {") == "gpt.scale:12  repeat layers {"
    assert E.comment("a\nb\tc") == "a b c"
    assert E.comment("\udcff") == "\\xff"


def test_sh_word_is_one_word(tmp_path):
    from compiler.codegen import escape as E
    words = [s for s in SAMPLES + _random_strings(2000, seed=3, surrogates=False) if "\0" not in s
             and not any(0xD800 <= ord(ch) <= 0xDFFF for ch in s)]
    (tmp_path / "s.sh").write_text("printf '%s\\0' " + " ".join(E.sh_word(w) for w in words) + "\n",
                                   encoding="utf-8")
    proc = subprocess.run(["bash", str(tmp_path / "s.sh")], cwd=tmp_path, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.decode("utf-8").split("\0")[:-1] == words
    assert E.sh_word("scalec-gpt") == '"scalec-gpt"'
    for bad in ("a\0b", "\udcff"):
        with pytest.raises(ValueError):
            E.sh_word(bad)


def test_json_text_round_trips():
    from compiler.codegen import escape as E
    for s in SAMPLES + _random_strings(1000, seed=4):
        text = E.json_text({"k" + s: [s]})
        text.encode("utf-8")
        assert json.loads(text) == {"k" + s: [s]}
    assert E.json_text({"a": "×"}) == json.dumps({"a": "×"}, indent=2, ensure_ascii=False) + "\n"


def test_templates_refuse_unescaped_text():
    """A `{{ value }}` in a template must have gone through an escaping function (or be an int): plain text is an
    error when the template renders, so a new interpolation cannot forget its escaping silently."""
    env = codegen._env()
    assert env.from_string("{{ n }} {{ s | comment }} {{ s | docstring }}").render(n=3, s='a"\n') == '3 a" a\\"\\n'
    for value in ("text", True, 1.5, None, ["a"]):
        with pytest.raises(TypeError, match="not escaped"):
            env.from_string("{{ v }}").render(v=value)
    for name in ("class", "a b", "1x", ""):
        with pytest.raises(ValueError):
            env.from_string("{{ v | ident }}").render(v=name)


def test_display_is_writable():
    from compiler.codegen import escape as E
    assert E.display("gpt.scale") == "gpt.scale"
    assert E.display("\udcff.scale") == "\\xff.scale"
    for s in _random_strings(1000, seed=5):
        E.display(s).encode("utf-8")


# ---------------------------------------------------------------------------------------------------------------
# The command line, with file names that are not UTF-8 or that are hostile.

_CLI_DRIVER = """
import runpy, sys
from compiler.cli import main
good, bad, hostile = sys.argv[1:]
for args in (["check", good], ["plan", good], ["compile", good, "-o", "out"], ["check", bad],
             ["compile", hostile, "-o", "evil"]):
    rc = main(args)
    for stream in (sys.stdout, sys.stderr):
        stream.write(f"\\n=== {args[0]} exit {rc}\\n")
        stream.flush()
sys.argv = ["evil/program.py", "--help"]
try:
    runpy.run_path("evil/program.py", run_name="__main__")
except SystemExit as e:
    print("=== help exit", e.code)
"""


def test_cli_file_names(tmp_path):
    """`scalec` on a file named with byte 0xff: check, plan and compile work, with a strict UTF-8 stdout too, and a
    file with an error gets its located diagnostic; never a traceback, never exit 3. Then the issue's reproduction:
    compile a file named to close the Block docstring and run the program's --help: nothing is created."""
    sample = (ROOT / "samples" / "tiny_gpt.scale").read_text()
    good = os.path.join(os.fsencode(tmp_path), b"\xff.scale")
    bad = os.path.join(os.fsencode(tmp_path), b"bad\xfe.scale")
    hostile = f'x""";{RUN};"""y.scale'
    for path, text in ((good, sample), (bad, sample.replace("heads  = 4", "heads  = 5")), (hostile, sample)):
        with open(os.path.join(os.fsencode(tmp_path), os.fsencode(path)), "w", encoding="utf-8") as f:
            f.write(text)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING="utf-8", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _CLI_DRIVER, good, bad, hostile], cwd=tmp_path, env=env,
                          capture_output=True, timeout=300)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0 and b"Traceback" not in err, err.decode(errors="replace")[-3000:]
    assert re.findall(rb"=== (\w+) exit (\d+)", out) == [
        (b"check", b"0"), (b"plan", b"0"), (b"compile", b"0"), (b"check", b"1"), (b"compile", b"0"), (b"help", b"0")]
    assert b"\xff.scale: ok" in out and b"plan for `tiny_gpt` (" + good + b")" in out
    assert b"bad\xfe.scale:14:" in err and b"error[E0201]" in err
    program = (tmp_path / "out" / "program.py").read_text(encoding="utf-8")
    assert program.startswith("# Generated by scalec") and "from \\xff.scale;" in program
    assert json.loads((tmp_path / "out" / "plan.json").read_text(encoding="utf-8"))["source"] == "\\xff.scale"
    _bash_n(tmp_path / "out" / "launch.sh")
    assert b"usage:" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["\udcff.scale", "bad\udcfe.scale", hostile, "out", "evil"]), "a file was created"
    evil = pyast.parse((tmp_path / "evil" / "program.py").read_text(encoding="utf-8"))
    assert _docstrings(evil)["Block"] == f"One block of the `repeat` at {hostile}:13: the residual stream in and out."


# ---------------------------------------------------------------------------------------------------------------
# String escapes in .scale text.

def _checkpoint_dir(spelt: str) -> str:
    text = TEXT.replace("  log_every    = 5", f"  log_every = 5\n  checkpoint_dir = {spelt}")
    return check_text(text, "s.scale").train.checkpoint_dir


@pytest.mark.parametrize("spelt,value", [
    (r'"C:\\new"', "C:\\new"), (r'"C:\\temp"', "C:\\temp"), (r'"a\"b"', 'a"b'), (r'"\\\\"', "\\\\"),
    (r'"\\n"', "\\n"), (r'"\n\t"', "\n\t"), (r'"\\\""', '\\"'), ('""', ""), (r'"ends\\"', "ends\\"),
])
def test_string_escapes_decode_left_to_right(spelt, value):
    assert _checkpoint_dir(spelt) == value


def test_unknown_escape_is_located():
    text = TEXT.replace("  log_every    = 5", '  log_every = 5\n  checkpoint_dir = "C:\\x\\\\y\\q"')
    with pytest.raises(ScaleError) as info:
        check_text(text, "s.scale")
    diags = info.value.diagnostics
    line = text.split("\n").index('  checkpoint_dir = "C:\\x\\\\y\\q"') + 1
    assert [(d.code, d.span.line, d.span.col, d.span.end_col) for d in diags] == [
        ("E0004", line, 23, 25), ("E0004", line, 28, 30)]
    rendered = info.value.render()
    assert "unknown escape `\\x`" in rendered and "Traceback" not in rendered
