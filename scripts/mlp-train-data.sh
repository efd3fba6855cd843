#!/usr/bin/env bash
# Regenerates the K/V/Q dumps `kvc mlp train` learns from (not committed: about 165 MB a text).
#   scripts/mlp-train-data.sh [OUT_DIR]     (default /tmp/kvc-mlp-train-data)
# Writes OUT_DIR/train/text{A..F}.* (training) and OUT_DIR/val/text{A,B}.* (validation), each
# the first 1024 tokens of one text through SmolLM2-135M in llama.cpp (the client's dump mode:
# post-RoPE K and Q, V, f32 as the model computed them, and the f16 cache bytes), and
# OUT_DIR/{train,val}/texts.json naming each tag's file and licence.
# The texts are licence documents Debian ships in base-files (/usr/share/common-licenses) and
# package documentation (/usr/share/doc); each entry below names its licence.
# Never add the evaluation texts (GPL-3, the Debian Constitution): the compressors are judged
# on them. Builds only the client, against the llama.cpp build of fetch-and-build.sh.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
out="${1:-/tmp/kvc-mlp-train-data}"
tokens="${KVC_MLP_TRAIN_TOKENS:-1024}"

eval "$("$repo/integrations/llama/fetch-and-build.sh" | grep -E '^(MODEL|EVAL)=')"

lic=/usr/share/common-licenses
doc=/usr/share/doc
# tag file licence-of-the-text. Validation texts are of other kinds than the training ones
# (no MPL-1.1 in training with MPL-2.0 in validation).
train=(
    "textA $lic/Apache-2.0 Apache License 2.0 text (Debian base-files); the ASF permits verbatim copies"
    "textB $lic/LGPL-2.1 GNU LGPL 2.1 text (Debian base-files); verbatim copying permitted, changing it is not allowed"
    "textC $lic/GFDL-1.3 GNU FDL 1.3 text (Debian base-files); verbatim copying permitted, changing it is not allowed"
    "textD $lic/MPL-2.0 Mozilla Public License 2.0 text (Debian base-files); verbatim copies permitted"
    "textE $lic/MPL-1.1 Mozilla Public License 1.1 text (Debian base-files); verbatim copies permitted"
    "textF $doc/git/RelNotes/2.14.0.txt git 2.14.0 release notes (Debian package git); GPL-2 (/usr/share/doc/git/copyright)"
)
val=(
    "textA $doc/dpkg/spec/triggers.txt dpkg triggers specification (Debian package dpkg); GPL-2+ (/usr/share/doc/dpkg/copyright)"
    "textB $lic/Artistic Perl Artistic License text (Debian base-files); verbatim copies permitted"
)

dump() { # dir entries...
    local dir="$1"
    shift
    mkdir -p "$dir"
    local args=() json="{" sep=""
    for e in "$@"; do
        read -r tag file licence <<<"$e"
        case "$(basename "$file")" in GPL-3 | *onstitution*) echo "refusing evaluation text $file" >&2; exit 1 ;; esac
        args+=(--text "$file")
        json+="$sep\"$tag\": {\"file\": \"$file\", \"licence\": \"$licence\"}"
        sep=", "
    done
    echo "$json}" >"$dir/texts.json"
    # --modes dump: only the reference decode of --n-tokens (kept short) and the dump itself.
    nice "$EVAL" --model "$MODEL" "${args[@]}" --modes dump --n-tokens 64 --ppl-from 33 \
        --dump-tokens "$tokens" --dump-dir "$dir" --threads 1 >"$dir/eval.log"
    echo "mlp-train-data: $dir: $(ls "$dir"/*.Q.f32.bin | wc -l) dumps"
}
dump "$out/train" "${train[@]}"
dump "$out/val" "${val[@]}"
