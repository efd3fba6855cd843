#!/usr/bin/env python3
"""The first page of docs/llama-cpp.md, run as written (scripts/ci.d/55-llama-tools.sh; issue 47,
"docs that cannot drift").

"The first page" is everything above the line

    <!-- end of the first page: every command above runs in CI (integrations/llama/ci_docs.py) -->

(Build, Flags and the examples of llama.cpp's tools with kvq). Every command line of its sh code
blocks (`\\` continuations joined, `# comments` dropped) is taken as written and:

- a llama.cpp tool (`llama-perplexity`, `llama-server`, `llama-cli`, `llama-completion`,
  `llama-bench`) is run on the test model from --bin-dir, from the repository root. Only the
  placeholders change: `model.gguf` -> --model, `text.txt` -> --text, `NAME.kld` -> a file in
  --out, a bare `llama-xyz` -> --bin-dir/llama-xyz, and a literal `...` is dropped. What bounds
  the run time is appended, and only where the command does not set it itself: llama-perplexity
  `--chunks 1 -c 256`, llama-bench `-r 1 --no-warmup -p 32 -n 4`, llama-cli `-p PROMPT -n 4
  -st`, llama-completion `-p PROMPT -n 4 -no-cnv`, every tool `-t THREADS`. llama-server starts
  on a free loopback port, answers /health and one short chat completion, and is stopped. The
  doc's own flags and values are passed unchanged: a flag that does not exist makes the tool
  fail, and this script with it, naming the doc's line;
- a build command (fetch-and-build.sh, cargo, pip download, tar, cp, rm, the patch loop, cmake)
  is not run (CI's 50-llama step runs fetch-and-build.sh) but checked against what it names:
  every repository path exists, every `cmake -D` option is set by fetch-and-build.sh or named by
  the patched tree's CMake files (--llama-src), every `--target` is a target there, the pip
  package and version, the sdist's name, the cargo package, its flags and its library's path
  are fetch-and-build.sh's (and integrations/common/engine-build.sh's, which it sources), and
  the patch loop's flags are the ones the series is applied with;
- every flag named in inline code (`-ctk kvq4`, `--kvc-sink N`, `llama-server ... --flag`) is
  one the tools' --help lists.

A command of any other kind fails the run: teach this script to check it. One line per command:
the doc's line, the result, the seconds, what was run or checked; status 1 if anything failed.
--self-test runs the same checks on a small synthetic page that names a flag that does not
exist (and other faults), and fails unless each fault is reported on its line.

    ci_docs.py --bin-dir DIR --model GGUF --text TEXT --llama-src DIR --out DIR [--doc MD]
    ci_docs.py --self-test --bin-dir DIR --model GGUF --text TEXT --llama-src DIR --out DIR
"""
import argparse
import contextlib
import glob
import io
import os
import re
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ci_tools import Server  # noqa: E402  (importing it also sets OMP_WAIT_POLICY=passive)

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MARKER = "<!-- end of the first page: every command above runs in CI (integrations/llama/ci_docs.py) -->"
SH_LANGS = {"sh", "bash", "shell", "console"}
PROMPT = "Name three colours."
SEPARATORS = {";", "&&", "||", "|", "&"}
PUNCT = {"<", ">", "(", ")", "{", "}"}


# ---- reading the page ------------------------------------------------------------------------

def strip_comment(line):
    """The line without a shell comment: a `#` that starts a word, outside quotes."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"':
                continue
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def tokens(text):
    """Shell words of one logical line, with ; && || | < > ( ) as words of their own."""
    lex = shlex.shlex(text, posix=True, punctuation_chars=";&|<>()")
    lex.whitespace_split = True
    lex.commenters = ""
    return list(lex)


def first_page(md_path):
    """(line number, text) of each line above the marker; the marker must be there."""
    lines = open(md_path, encoding="utf-8").read().split("\n")
    for i, line in enumerate(lines):
        if line.strip() == MARKER:
            return list(enumerate(lines[:i], start=1))
    raise ValueError(f"{md_path} has no line '{MARKER}': the first page has no end")


def commands(page):
    """(line, words, source) of each command line of the page's sh code blocks."""
    out, fence, pending = [], None, None
    for n, line in page:
        s = line.strip()
        if s.startswith("```"):
            if fence is None:
                fence = s[3:].strip().lower() or "-"
            else:
                if pending:
                    raise ValueError(f"line {pending[0]}: a `\\` continuation runs to the end of its code block")
                fence = None
            continue
        if fence not in SH_LANGS:
            continue
        text = strip_comment(line)
        if pending:
            pending[1] += " " + text
        elif text.strip():
            pending = [n, text]
        else:
            continue
        if pending[1].rstrip().endswith("\\"):
            pending[1] = pending[1].rstrip()[:-1]
            continue
        src = " ".join(pending[1].split())
        out.append((pending[0], tokens(pending[1]), src))
        pending = None
    return out


def inline_flags(page):
    """(line, flag, span) for each flag in the page's inline code outside code blocks (a span
    may run over a line break): spans whose first word is a flag or a llama.cpp tool."""
    kept, fence = [], False
    for n, line in page:  # code blocks blanked, so that offsets keep their line numbers
        if line.strip().startswith("```"):
            fence = not fence
            line = ""
        kept.append("" if fence else line)
    text, out = "\n".join(kept), []
    for m in re.finditer(r"`([^`]+)`", text):
        if "\n\n" in m.group(1):
            continue
        n = page[0][0] + text.count("\n", 0, m.start()) if page else 0
        span = " ".join(m.group(1).split())
        words = span.replace("\\|", "|").split()
        if not words or not (words[0].startswith("-") or re.fullmatch(r"llama-[a-z-]+", words[0])):
            continue
        out += [(n, w, span) for w in words if re.fullmatch(r"--?[A-Za-z][\w-]*", w)]
    return out


# ---- what the build scripts say ----------------------------------------------------------------

def script_command(path, program, expand):
    """The words of the first line of a script that runs `program` (continuations joined),
    with $NAME / ${NAME} replaced from `expand`."""
    text = open(path).read().replace("\\\n", " ")
    for line in text.split("\n"):
        line = strip_comment(line)
        if re.search(rf"(^|[\s(]){re.escape(program)}\s", line):
            for k, v in expand.items():
                line = line.replace("${" + k + "}", v).replace("$" + k, v)
            words = tokens(line)
            words = words[words.index(program.split()[-1]):]
            cut = [i for i, w in enumerate(words) if w in SEPARATORS or w in PUNCT]
            return words[:cut[0]] if cut else words
    raise ValueError(f"{path} runs no '{program}'")


class Facts:
    """What fetch-and-build.sh, engine-build.sh, the crates and the patched tree define."""

    def __init__(self, llama_src):
        fab = os.path.join(REPO, "integrations/llama/fetch-and-build.sh")
        eng = os.path.join(REPO, "integrations/common/engine-build.sh")
        self.fab_text = open(fab).read()
        v = re.search(r"^LLAMA_CPP_PYTHON_VERSION=(\S+)", self.fab_text, re.M)
        if not v:
            raise ValueError(f"{fab} sets no LLAMA_CPP_PYTHON_VERSION")
        self.pip_version = v.group(1)
        self.pip = script_command(fab, "pip download", {"LLAMA_CPP_PYTHON_VERSION": self.pip_version})
        self.sdist_top = f"llama_cpp_python-{self.pip_version}"
        if f'sdist="$dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"' not in self.fab_text:
            raise ValueError(f"{fab} no longer names the sdist llama_cpp_python-VERSION.tar.gz")
        self.sdist = self.sdist_top + ".tar.gz"
        self.vendored = f"{self.sdist_top}/vendor/llama.cpp"
        if '"$top/vendor/llama.cpp"' not in self.fab_text:
            raise ValueError(f"{fab} no longer takes llama.cpp from the sdist's vendor/llama.cpp")
        self.cargo = script_command(eng, "cargo build", {})
        self.patch = script_command(eng, "patch", {})
        self.crates = {}
        for toml in glob.glob(os.path.join(REPO, "crates/*/Cargo.toml")):
            t = open(toml).read()
            pkg = re.search(r'^\[package\][^\[]*?^name\s*=\s*"([^"]+)"', t, re.M | re.S)
            lib = re.search(r'^\[lib\][^\[]*?^name\s*=\s*"([^"]+)"', t, re.M | re.S)
            if pkg:
                static = re.search(r'^\[lib\][^\[]*?crate-type\s*=\s*\[[^\]]*"staticlib"', t, re.M | re.S)
                name = (lib.group(1) if lib else pkg.group(1)).replace("-", "_")
                self.crates[pkg.group(1)] = f"lib{name}.a" if static else None
        self.cmake_text, self.cmake_targets = "", set()
        if not os.path.isfile(os.path.join(llama_src, "CMakeLists.txt")):
            raise ValueError(f"--llama-src {llama_src} holds no CMakeLists.txt")
        for root, dirs, files in os.walk(llama_src):
            dirs[:] = [d for d in dirs if not d.startswith((".", "build"))]
            for f in files:
                if f == "CMakeLists.txt" or f.endswith(".cmake"):
                    t = open(os.path.join(root, f), errors="replace").read()
                    self.cmake_text += t + "\n"
                    self.cmake_targets.update(re.findall(r"set\(\s*TARGET\s+([\w.+-]+)\s*\)", t))
                    self.cmake_targets.update(
                        re.findall(r"add_(?:executable|library|custom_target)\(\s*([\w.+-]+)", t))
        try:
            ls = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
            self.top = {p.split("/")[0] for p in ls.split("\n") if p}
        except (OSError, subprocess.CalledProcessError):
            self.top = {e for e in os.listdir(REPO) if not e.startswith(".") and e not in ("target", "build")}


# ---- build commands: checked, not run --------------------------------------------------------

class Static:
    """The checks of one logical build line; each problem is kept in `errors`. `page` is what
    the page's earlier lines made (the library of its cargo line)."""

    def __init__(self, facts, page):
        self.f, self.page, self.errors, self.done = facts, page, [], []

    def path(self, p, what="names"):
        """A path the command names: a repository path must exist (a glob must match); one in
        cargo's target directory must be the library the doc's cargo line builds."""
        p = p.replace("${PWD}", REPO).replace("$PWD", REPO)
        if p.startswith(REPO + "/") or p == REPO:
            p = os.path.relpath(p, REPO)
        elif os.path.isabs(p) or "/" not in p and p not in self.f.top:
            return
        head = p.split("/")[0]
        if head == "target":
            lib = self.page.get("cargo_lib")
            if p != lib:
                self.errors.append(f"{p}: not what an earlier cargo line of the page builds ({lib or 'none'})")
            else:
                self.done.append(f"{p} is cargo's")
        elif head in self.f.top:
            if not glob.glob(os.path.join(REPO, p)):
                self.errors.append(f"{what} {p}, which is not in the repository")
            else:
                self.done.append(f"{p} exists")

    def subset(self, words, script_words, what):
        extra = [w for w in words if w not in script_words]
        if extra:
            self.errors.append(f"{what}: {' '.join(extra)} not in the script's '{' '.join(script_words)}'")
        else:
            self.done.append(f"{what} as the script's")

    def segment(self, w):
        cmd = w[0]
        if "/" in cmd:
            self.path(cmd, "runs")
            if not self.errors and not os.access(os.path.join(REPO, cmd), os.X_OK):
                self.errors.append(f"{cmd} is not executable")
            return
        if cmd == "cargo":
            self.subset(w[1:], self.f.cargo, "cargo's arguments (engine-build.sh)")
            pkg = w[w.index("-p") + 1] if "-p" in w[:-1] else None
            if pkg not in self.f.crates:
                self.errors.append(f"cargo -p {pkg}: no such package in crates/")
            elif not self.f.crates[pkg]:
                self.errors.append(f"cargo -p {pkg}: the package builds no static library")
            else:
                profile = "release" if "--release" in w or "-r" in w else "debug"
                self.page["cargo_lib"] = f"target/{profile}/{self.f.crates[pkg]}"
        elif cmd == "pip":
            self.subset(w[1:], self.f.pip, "pip's arguments (fetch-and-build.sh)")
        elif cmd == "tar":
            arch = [x for x in w[1:] if x.endswith((".tar.gz", ".tgz"))]
            if arch != [self.f.sdist]:
                self.errors.append(f"tar takes {arch}, fetch-and-build.sh's sdist is {self.f.sdist}")
            else:
                self.done.append(f"{self.f.sdist} is the sdist")
        elif cmd == "cp":
            srcs = [x for x in w[1:-1] if not x.startswith("-")]
            for s in srcs:
                if s.split("/")[0] == self.f.sdist_top:
                    if s.rstrip("/") != self.f.vendored:
                        self.errors.append(f"cp {s}: fetch-and-build.sh takes {self.f.vendored}")
                    else:
                        self.done.append(f"{s} is the vendored tree")
                else:
                    self.path(s, "copies")
        elif cmd == "rm":
            pass
        elif cmd == "patch":
            words, skip = [], False
            for x in w[1:]:  # all but the tree it patches and the file it reads
                if skip:
                    skip = False
                elif x in ("-d", "<"):
                    skip = True
                else:
                    words.append(x)
            self.subset(words, self.f.patch, "patch's flags (engine-build.sh)")
        elif cmd == "cmake":
            self.cmake(w)
        else:
            self.errors.append(f"no check for '{cmd}' in ci_docs.py")

    def cmake(self, w):
        if "--build" in w:
            if "--target" in w:
                for t in w[w.index("--target") + 1:]:
                    if t.startswith("-"):
                        break
                    if t not in self.f.cmake_targets:
                        self.errors.append(f"cmake --target {t}: no such target in the patched tree")
                    else:
                        self.done.append(f"target {t}")
            return
        i = 1
        while i < len(w):
            x = w[i]
            if x == "-D" and i + 1 < len(w):
                i += 1
                x = "-D" + w[i]
            if x.startswith("-D"):
                name, _, value = x[2:].partition("=")
                name = name.split(":")[0]
                if f"-D{name}=" in self.f.fab_text:
                    self.done.append(f"-D{name} (fetch-and-build.sh)")
                elif re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", self.f.cmake_text):
                    self.done.append(f"-D{name} (patched tree)")
                else:
                    self.errors.append(f"cmake -D{name}: neither fetch-and-build.sh nor the patched tree's "
                                       "CMake files know it")
                self.path(value)
            i += 1

    def line(self, words):
        segs, cur = [], []
        for x in words:
            if x in SEPARATORS:
                segs.append(cur)
                cur = []
            else:
                cur.append(x)
        segs.append(cur)
        for s in segs:
            if s and s[0] == "do":
                s = s[1:]
            if not s or s == ["done"]:
                continue
            if s[0] == "for":
                if len(s) < 3 or s[2] != "in":
                    self.errors.append("a for loop ci_docs.py cannot read")
                for x in s[3:]:
                    self.path(x, "loops over")
                continue
            if s[0] in ("then", "else", "fi", "if", "while", "until"):
                self.errors.append(f"no check for '{s[0]}' in ci_docs.py")
                continue
            self.segment(s)
            if s[0] != "cp":
                for x in s[1:]:
                    if not x.startswith("-") and x not in PUNCT:
                        self.path(x)
        self.errors = list(dict.fromkeys(self.errors))


# ---- tool commands: run ------------------------------------------------------------------------

def has(argv, *names):
    return any(a in names or any(a.startswith(n + "=") for n in names if n.startswith("--")) for a in argv)


def limits(tool, argv, threads):
    """What bounds the run, for what the command does not set itself."""
    add = []
    if tool == "llama-perplexity":
        add += [] if has(argv, "--chunks") else ["--chunks", "1"]
        add += [] if has(argv, "-c", "--ctx-size") else ["-c", "256"]
    elif tool == "llama-bench":
        add += [] if has(argv, "-r", "--repetitions") else ["-r", "1"]
        add += [] if has(argv, "--no-warmup") else ["--no-warmup"]
        add += [] if has(argv, "-p", "--n-prompt", "-pg") else ["-p", "32"]
        add += [] if has(argv, "-n", "--n-gen", "-pg") else ["-n", "4"]
    elif tool in ("llama-cli", "llama-completion"):
        add += [] if has(argv, "-p", "--prompt", "-f", "--file") else ["-p", PROMPT]
        add += [] if has(argv, "-n", "--predict", "--n-predict") else ["-n", "4"]
        if tool == "llama-cli":
            add += [] if has(argv, "-st", "--single-turn") else ["-st"]
        else:
            add += [] if has(argv, "-cnv", "-no-cnv", "--conversation", "--no-conversation") else ["-no-cnv"]
    add += [] if has(argv, "-t", "--threads") else ["-t", threads]
    return add


def error_lines(text, n=6):
    lines = [x for x in text.splitlines() if x.strip()]
    bad = [x for x in lines if re.search(r"error|invalid|unknown|unsupported|failed|refus", x, re.I)]
    return " | ".join((bad or lines)[-n:])


def run_tool(words, a, log):
    """Runs one tool command; returns (ok, what was run, what it said)."""
    tool = words[0]
    binary = os.path.join(a.bin_dir, tool)
    if not os.path.isfile(binary):
        return False, tool, f"no {tool} in {a.bin_dir}"
    argv = []
    for w in words[1:]:
        if w == "...":
            continue
        w = {"model.gguf": a.model, "text.txt": a.text}.get(w, w)
        if re.fullmatch(r"[\w.-]+\.kld", w):
            w = os.path.join(os.path.abspath(a.out), w)
        argv.append(w)
    if tool not in ("llama-perplexity", "llama-bench", "llama-cli", "llama-completion", "llama-server"):
        return False, tool, f"ci_docs.py does not know how to bound a {tool} run: teach it"
    argv += limits(tool, argv, a.threads)
    shown = " ".join(shlex.quote(x) for x in [binary] + argv)
    if tool == "llama-server":
        if has(argv, "--port", "--host"):
            return False, shown, "ci_docs.py starts llama-server on its own port: teach it the doc's --port/--host"
        s = Server(binary, argv, log)
        shown = " ".join(shlex.quote(x) for x in s.p.args)
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                s.__enter__()
                r = s.chat(PROMPT, max_tokens=8)
            return True, shown, "answered " + repr(r["choices"][0]["message"]["content"][:40])
        except SystemExit:
            return False, shown, error_lines(open(log, errors="replace").read()) or said.getvalue().strip()
        except Exception as e:  # noqa: BLE001 (an HTTP error, a malformed answer)
            return False, shown, f"{type(e).__name__}: {e}"
        finally:
            s.__exit__()
    try:
        with open(log, "w") as f:
            p = subprocess.run([binary] + argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               cwd=REPO, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return False, shown, f"still running after {a.timeout} s"
    text = open(log, errors="replace").read()
    if p.returncode != 0:
        return False, shown, f"exited {p.returncode}: {error_lines(text)}"
    want = {"llama-perplexity": r"Final estimate: PPL|KLD", "llama-bench": r"\| +(pp|tg)\d+ +\|"}.get(tool)
    if want and not re.search(want, text):
        return False, shown, f"exited 0 without its result (/{want}/): {error_lines(text)}"
    return True, shown, ""


# ---- the page --------------------------------------------------------------------------------

def help_flags(a):
    flags = set()
    for tool in ("llama-server", "llama-perplexity", "llama-cli", "llama-completion", "llama-bench"):
        binary = os.path.join(a.bin_dir, tool)
        if os.path.isfile(binary):
            p = subprocess.run([binary, "--help"], capture_output=True, text=True, errors="replace",
                               stdin=subprocess.DEVNULL, timeout=60)
            flags |= set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", p.stdout + p.stderr))
    return flags


def check_page(md, a, facts, out=print):
    """Runs the page's first page; returns [(line, ok, message)] (a line 0 for the page)."""
    name = os.path.relpath(md, REPO) if md.startswith(REPO + "/") else md
    results = []

    def report(n, ok, secs, what, said=""):
        out(f"{name}:{n} {'ok  ' if ok else 'FAIL'} {secs:5.1f} s  {what}" + (f"\n    -> {said}" if said else ""))
        results.append((n, ok, f"{what} {said}"))

    try:
        page = first_page(md)
        cmds = commands(page)
    except ValueError as e:
        report(0, False, 0.0, str(e))
        return results
    if not cmds:
        report(0, False, 0.0, "no command above the marker")
    os.makedirs(a.out, exist_ok=True)
    for f in glob.glob(os.path.join(a.out, "*.kld")):
        os.remove(f)
    made = {}
    for n, words, src in cmds:
        t0 = time.time()
        if re.fullmatch(r"llama-[a-z-]+", words[0]):
            if any(x in SEPARATORS or x in PUNCT for x in words):
                report(n, False, 0.0, src, "a tool line must be one command (no ; && | < >): ci_docs.py runs it alone")
                continue
            ok, shown, said = run_tool(words, a, os.path.join(a.out, f"line-{n}.log"))
            report(n, ok, time.time() - t0, "ran: " + shown, said)
        else:
            st = Static(facts, made)
            st.line(words)
            report(n, not st.errors, time.time() - t0, "checked (not run): " + src,
                   "; ".join(st.errors) if st.errors else "")
    flags = help_flags(a)
    for n, flag, span in inline_flags(page):
        if flag not in flags:
            report(n, False, 0.0, f"inline `{span}`", f"{flag}: no llama.cpp tool's --help lists it")
    inl = inline_flags(page)
    if inl and all(f in flags for _, f, _ in inl):
        out(f"{name}: every flag of the {len(inl)} in inline code is in the tools' --help")
    return results


SELF_TEST_PAGE = """# a synthetic page

```sh
llama-completion -m model.gguf -ctk kvq4 -ctv kvq4     # runs: passes
llama-server -m model.gguf --kvc-no-such-flag 1         # a flag that does not exist
cmake -S /tmp/x -B /tmp/x/build -DGGML_KVC=ON \\
      -DGGML_KVC_NO_SUCH_OPTION=ON                      # a -D option nobody defines
integrations/llama/no-such-script.sh                    # a path not in the repository
cargo build --release --locked -p kvc-no-such-crate
```

Inline code over a line break: `-ctk kvq4
--kvc-no-such-inline 3`.

""" + MARKER + """

```sh
llama-server -m model.gguf --kvc-below-the-marker 1    # below the marker: never run
```
"""


def self_test(a, facts):
    """The checks on SELF_TEST_PAGE must fail each fault on its line, pass the good line and
    run nothing below the marker; the parser must join continuations and drop comments."""
    problems = []
    # (as in sh: a `\\` inside a comment continues nothing, a `#` inside a word is no comment)
    got = commands([(1, "```sh"), (2, "llama-bench -m model.gguf \\"), (3, "   -ctk 'a # b' \\"),
                    (4, "  -p 8   # the end \\"), (5, "llama-cli -x#y"), (6, "```")])
    if got != [(2, ["llama-bench", "-m", "model.gguf", "-ctk", "a # b", "-p", "8"],
                "llama-bench -m model.gguf -ctk 'a # b' -p 8"), (5, ["llama-cli", "-x#y"], "llama-cli -x#y")]:
        problems.append(f"parser: {got}")
    os.makedirs(a.out, exist_ok=True)
    md = os.path.join(os.path.abspath(a.out), "self-test.md")
    open(md, "w").write(SELF_TEST_PAGE)
    shown = io.StringIO()
    res = check_page(md, a, facts, out=lambda s: print("  (self-test) " + s, file=shown))
    want = {4: (True, ""), 5: (False, "--kvc-no-such-flag"), 6: (False, "GGML_KVC_NO_SUCH_OPTION"),
            8: (False, "no-such-script.sh"), 9: (False, "kvc-no-such-crate"), 12: (False, "--kvc-no-such-inline")}
    for n, (ok, needle) in want.items():
        mine = [r for r in res if r[0] == n]
        if len(mine) != 1 or mine[0][1] != ok or needle not in mine[0][2]:
            problems.append(f"line {n}: want {'ok' if ok else 'a failure naming ' + needle}, got {mine}")
    extra = [r for r in res if r[0] not in want]
    if extra:
        problems.append(f"unexpected results (below the marker?): {extra}")
    open(md, "w").write(SELF_TEST_PAGE.replace(MARKER, ""))
    res = check_page(md, a, facts, out=lambda s: print("  (self-test) " + s, file=shown))
    if [r[:2] for r in res] != [(0, False)]:
        problems.append(f"a page without the marker: {res}")
    print(shown.getvalue(), end="")
    if problems:
        for p in problems:
            print(f"ci_docs --self-test: {p}", file=sys.stderr)
        return 1
    print(f"ci_docs --self-test: passed (a nonexistent flag, -D option, path and crate each failed on its "
          f"line; the good line ran; nothing below the marker ran; no marker, no page)")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", required=True, help="the patched llama.cpp build's bin/")
    ap.add_argument("--model", required=True, help="the GGUF that model.gguf stands for")
    ap.add_argument("--text", required=True, help="the text that text.txt stands for")
    ap.add_argument("--llama-src", required=True, help="the patched llama.cpp tree (its CMake files)")
    ap.add_argument("--out", required=True, help="logs and written files")
    ap.add_argument("--doc", default=os.path.join(REPO, "docs/llama-cpp.md"))
    ap.add_argument("--threads", default="2")
    ap.add_argument("--timeout", type=int, default=180, help="seconds per command")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    for k in ("model", "text", "bin_dir", "llama_src", "out", "doc"):
        setattr(a, k, os.path.abspath(getattr(a, k)))
    os.chdir(REPO)  # the page's commands run from the repository root, as it says
    try:
        facts = Facts(a.llama_src)
    except (OSError, ValueError) as e:
        print(f"ci_docs: {e}", file=sys.stderr)
        return 1
    if a.self_test:
        return self_test(a, facts)
    t0 = time.time()
    res = check_page(os.path.abspath(a.doc), a, facts)
    bad = [r for r in res if not r[1]]
    print(f"ci_docs: {len(res) - len(bad)} of {len(res)} checks passed in {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
