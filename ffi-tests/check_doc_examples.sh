#!/bin/sh
# Checks that each example file is included verbatim in the markdown document: the
# fenced ```c block that follows the line `<!-- example: <file name> -->` must equal the
# file byte for byte. Usage: check_doc_examples.sh DOC.md FILE...
set -eu
doc=$1
shift
status=0
for f in "$@"; do
    name=$(basename "$f")
    block=$(awk -v marker="<!-- example: $name -->" '
        $0 == marker { found = 1; next }
        found == 1 && $0 == "```c" { inside = 1; found = 2; next }
        inside && $0 == "```" { exit }
        inside { print }
    ' "$doc")
    if [ -z "$block" ]; then
        echo "$doc: no block for $name (a line <!-- example: $name --> then a \`\`\`c block)" >&2
        status=1
    elif [ "$block" != "$(cat "$f")" ]; then
        echo "$doc: the block for $name differs from $f:" >&2
        printf '%s\n' "$block" | diff - "$f" >&2 || true
        status=1
    fi
done
exit $status
