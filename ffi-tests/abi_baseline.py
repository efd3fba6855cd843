#!/usr/bin/env python3
"""The C ABI baseline: what libkvc exports and how include/kvc.h lays out its structs.

    abi_baseline.py snapshot LIB HEADER          print the current ABI
    abi_baseline.py check    LIB HEADER BASELINE fail on any difference from BASELINE
    abi_baseline.py update   LIB HEADER BASELINE [--force]  rewrite BASELINE

The ABI is the library's exported `kvc_*` symbols (`nm -D --defined-only`) and the layout of
every struct defined in the header: its size and alignment and each field's name and offset.
Offsets come from the C compiler, not from reading sizes: the struct bodies are parsed out of
the header into a small C program that prints `offsetof`, `sizeof` and `__alignof__` for each
field, compiled against the header with `$CC` (default `cc`). The program also proves that the
parse missed no field: each field must start where the one before ends (rounded up to its
alignment) and the struct must end after its last field, so an unparsed field would leave a gap.

The rule (docs/c-api.md, "Versioning"), within one ABI major version:
- an exported symbol is never removed or renamed;
- `kvc_api` is append-only: each baseline field keeps its name and offset, new fields come
  after them (the table grows);
- every other struct is frozen: same fields, offsets, size and alignment (engines embed them
  by value and none carries a size);
- anything new (symbols, `kvc_api` fields, structs) also bumps KVC_ABI_VERSION_MINOR and must
  be recorded: `check` fails on additions too, until `update` writes them into the baseline.
`update` refuses to write a baseline that breaks the old one (unless `--force`, for a new ABI
major version) or that adds something without a new ABI minor.
"""

import os
import re
import subprocess
import sys
import tempfile

GROWABLE = {"kvc_api"}  # structs that start with struct_size and may grow at their end


def die(msg):
    print(f"abi_baseline: {msg}", file=sys.stderr)
    sys.exit(2)


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def abi_version(header_text):
    found = {}
    for part in ("MAJOR", "MINOR"):
        m = re.search(rf"^#define KVC_ABI_VERSION_{part} (\d+)\s*$", header_text, re.M)
        if not m:
            die(f"no '#define KVC_ABI_VERSION_{part} <n>' in the header")
        found[part] = int(m.group(1))
    return found["MAJOR"], found["MINOR"]


def field_name(decl, struct):
    """The one name a member declaration declares (function pointers and arrays included)."""
    m = re.fullmatch(r"[^()]*\(\s*\*\s*([A-Za-z_]\w*)\s*\)\s*\(.*\)", decl, re.S)
    if m:
        return m.group(1)
    depth = 0
    for ch in decl:
        depth += ch in "([" and 1 or (ch in ")]" and -1 or 0)
        if ch == "," and depth == 0:
            die(f"{struct}: '{decl}' declares several members; one per declaration, please")
        if ch == ":" and depth == 0:
            die(f"{struct}: '{decl}' is a bit-field, which has no offset")
    if "(" in decl or "{" in decl:
        die(f"{struct}: cannot read the member name of '{decl}'")
    m = re.fullmatch(r".*?\b([A-Za-z_]\w*)\s*((\[[^\]]*\]\s*)*)", decl, re.S)
    if not m or not re.search(r"\w", decl[: m.start(1)]):
        die(f"{struct}: cannot read the member name of '{decl}'")
    return m.group(1)


def parse_structs(header_text):
    """[(struct name, [field names])] for every struct body in the header, in header order."""
    text = strip_comments(header_text)
    structs = []
    for m in re.finditer(r"\bstruct\s+([A-Za-z_]\w*)\s*\{", text):
        name, i, depth = m.group(1), m.end(), 1
        start = i
        while depth:
            if i >= len(text):
                die(f"struct {name}: no closing brace")
            if text[i] == "{":
                die(f"struct {name}: nested braces are not supported")
            depth -= text[i] == "}"
            i += 1
        body = text[start : i - 1]
        if "#" in body:
            die(f"struct {name}: preprocessor lines inside a struct body are not supported")
        decls, depth, cur = [], 0, ""
        for ch in body:
            depth += ch == "(" and 1 or (ch == ")" and -1 or 0)
            if ch == ";" and depth == 0:
                decls.append(" ".join(cur.split()))
                cur = ""
            else:
                cur += ch
        if cur.strip():
            die(f"struct {name}: text after the last ';': '{cur.strip()}'")
        fields = [field_name(d, name) for d in decls if d]
        if not fields:
            die(f"struct {name}: no fields found")
        if len(set(fields)) != len(fields):
            die(f"struct {name}: a field name appears twice")
        structs.append((name, fields))
    if not any(n == "kvc_api" for n, _ in structs):
        die("no 'struct kvc_api { ... }' in the header")
    if len({n for n, _ in structs}) != len(structs):
        die("a struct is defined twice")
    return structs


def layouts(header, structs):
    """{struct: (size, align, [(field, offset)])}, measured by the C compiler."""
    lines = [
        "#include <stddef.h>",
        "#include <stdio.h>",
        f'#include "{os.path.abspath(header)}"',
        "#define F(S, f) printf(\"F %s %s %zu %zu %zu\\n\", #S, #f, offsetof(struct S, f), "
        "sizeof(((struct S *)0)->f), (size_t)__alignof__(((struct S *)0)->f))",
        "int main(void) {",
    ]
    for name, fields in structs:
        lines.append(
            f'    printf("S {name} %zu %zu\\n", sizeof(struct {name}), '
            f"(size_t)__alignof__(struct {name}));"
        )
        lines += [f"    F({name}, {f});" for f in fields]
    lines += ["    return 0;", "}", ""]
    cc = os.environ.get("CC") or "cc"
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "abi_layout.c"), os.path.join(tmp, "abi_layout")
        with open(src, "w") as f:
            f.write("\n".join(lines))
        build = subprocess.run(
            [cc, "-std=gnu11", "-Wall", "-Werror", "-o", exe, src], capture_output=True, text=True
        )
        if build.returncode:
            die(f"{cc} could not build the layout probe:\n{build.stderr}")
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout
    result = {}
    for line in out.splitlines():
        parts = line.split()
        if parts[0] == "S":
            result[parts[1]] = (int(parts[2]), int(parts[3]), [])
        else:
            _, s, f, off, size, align = parts
            result[s][2].append((f, int(off), int(size), int(align)))
    for name, (size, align, fields) in result.items():
        end = 0
        for f, off, fsize, falign in fields:
            expect = -(-end // falign) * falign
            if off != expect:
                die(f"struct {name}: field {f} at offset {off}, expected {expect}: "
                    "did the parse miss a field?")
            end = off + fsize
        if size != -(-end // align) * align:
            die(f"struct {name}: size {size} but its fields end at {end}: "
                "did the parse miss a field?")
    return {n: (s, a, [(f, o) for f, o, _, _ in fs]) for n, (s, a, fs) in result.items()}


def symbols(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
    if out.returncode:
        die(f"nm failed on {lib}: {out.stderr.strip()}")
    names = sorted({line.split()[-1] for line in out.stdout.splitlines() if line.strip()})
    # kvc_test_* exist only in the `test-hooks` build that ffi-tests links (kvc-capi's
    # test_hooks.rs): never in a shipped library, so never part of the ABI.
    names = [n for n in names if n.startswith("kvc_") and not n.startswith("kvc_test_")]
    if not names:
        die(f"{lib} exports no kvc_* symbols")
    return names


def snapshot(lib, header):
    with open(header) as f:
        text = f.read()
    major, minor = abi_version(text)
    lines = [
        "# The kvc C ABI baseline: exported symbols and struct layouts (x86_64 Linux).",
        "# Checked by ffi-tests/check_exports.sh; after appending to the ABI, regenerate with",
        "# `ffi-tests/check_exports.sh --update` and commit. Do not edit by hand.",
        f"abi {major}.{minor}",
    ]
    lines += [f"symbol {s}" for s in symbols(lib)]
    for name, (size, align, fields) in layouts(header, parse_structs(text)).items():
        lines.append(f"struct {name} size {size} align {align}")
        lines += [f"field {name} {off} {f}" for f, off in fields]
    return lines


def parse_baseline(lines):
    abi, syms, structs = None, set(), {}
    for line in lines:
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        if parts[0] == "abi":
            abi = tuple(int(x) for x in parts[1].split("."))
        elif parts[0] == "symbol":
            syms.add(parts[1])
        elif parts[0] == "struct":
            structs[parts[1]] = [int(parts[3]), int(parts[5]), []]
        elif parts[0] == "field":
            structs[parts[1]][2].append((parts[3], int(parts[2])))
        else:
            die(f"unreadable baseline line: {line}")
    if abi is None:
        die("the baseline has no 'abi M.m' line")
    return abi, syms, structs


def compare(old, new):
    """(breaks, additions) going from the old ABI to the new one."""
    (old_abi, old_syms, old_structs), (new_abi, new_syms, new_structs) = old, new
    breaks, adds = [], []
    if new_abi[0] != old_abi[0]:
        breaks.append(f"ABI major {old_abi[0]} -> {new_abi[0]}")
    breaks += [f"symbol {s} removed or renamed" for s in sorted(old_syms - new_syms)]
    adds += [f"symbol {s} is new" for s in sorted(new_syms - old_syms)]
    for name, (size, align, fields) in old_structs.items():
        if name not in new_structs:
            breaks.append(f"struct {name} removed or renamed")
            continue
        nsize, nalign, nfields = new_structs[name]
        for i, (f, off) in enumerate(fields):
            if i >= len(nfields):
                breaks.append(f"{name}.{f} (offset {off}) removed")
            elif nfields[i] != (f, off):
                breaks.append(f"{name}.{f} at offset {off} is now {nfields[i][0]} at "
                              f"offset {nfields[i][1]}")
        extra = nfields[len(fields):]
        if name in GROWABLE:
            adds += [f"{name}.{f} appended at offset {off}" for f, off in extra]
            if nsize < size:
                breaks.append(f"sizeof({name}) shrank from {size} to {nsize}")
            elif nsize != size and not extra:
                breaks.append(f"sizeof({name}) changed from {size} to {nsize} without new fields")
            if nalign != align:
                breaks.append(f"alignof({name}) changed from {align} to {nalign}")
        else:
            breaks += [f"{name}.{f} added at offset {off}: struct {name} is frozen (no "
                       "struct_size); add a new struct instead" for f, off in extra]
            if (nsize, nalign) != (size, align):
                breaks.append(f"struct {name} size/align {size}/{align} -> {nsize}/{nalign}")
    adds += [f"struct {n} is new" for n in new_structs if n not in old_structs]
    return breaks, adds


def main(argv):
    if len(argv) < 3 or argv[0] not in ("snapshot", "check", "update"):
        die(__doc__.split("\n\n")[1])
    cmd, lib, header = argv[:3]
    current = snapshot(lib, header)
    if cmd == "snapshot":
        print("\n".join(current))
        return 0
    if len(argv) < 4:
        die(f"{cmd} needs the baseline file")
    path, force = argv[3], "--force" in argv[4:]
    new = parse_baseline(current)
    if not os.path.exists(path):
        if cmd == "check":
            die(f"no baseline at {path}; create it with `ffi-tests/check_exports.sh --update`")
        old = None
    else:
        with open(path) as f:
            old = parse_baseline(f.read().splitlines())
    breaks, adds = compare(old, new) if old else ([], [])
    for b in breaks:
        print(f"abi_baseline: BREAK: {b}", file=sys.stderr)
    for a in adds:
        print(f"abi_baseline: new: {a}", file=sys.stderr)
    if cmd == "check":
        if breaks:
            print(f"abi_baseline: the ABI breaks {path} (append-only within a major version; "
                  "see docs/c-api.md, Versioning)", file=sys.stderr)
            return 1
        if adds:
            print(f"abi_baseline: additions not in {path}: if they are meant, bump "
                  "KVC_ABI_VERSION_MINOR and run `ffi-tests/check_exports.sh --update`",
                  file=sys.stderr)
            return 1
        n_fields = len(new[2]["kvc_api"][2])
        print(f"abi_baseline: matches {path}: ABI {new[0][0]}.{new[0][1]}, {len(new[1])} "
              f"symbols, {len(new[2])} structs, kvc_api {n_fields} fields / "
              f"{new[2]['kvc_api'][0]} bytes")
        return 0
    if breaks and not force:
        print("abi_baseline: refusing to write a baseline that breaks the old one "
              "(--force only for a new ABI major version)", file=sys.stderr)
        return 1
    if old and adds and new[0] <= old[0] and not force:
        print(f"abi_baseline: additions need a new KVC_ABI_VERSION_MINOR (still "
              f"{new[0][0]}.{new[0][1]})", file=sys.stderr)
        return 1
    with open(path, "w") as f:
        f.write("\n".join(current) + "\n")
    print(f"abi_baseline: wrote {path} ({len(adds)} additions)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
