#!/usr/bin/env bash
# What the engines' fetch-and-build scripts share (sourced; the caller defines log()):
#   apply_patch_series SRC PATCH_DIR DEST_BASE LABEL
#       copies SRC (without .git) to DEST_BASE-kvc-<hash of the series> and applies
#       PATCH_DIR/*.patch in name order, exactly (no fuzz); a patch that does not apply stops
#       the script with patch's own report. Done once per series: older copies of DEST_BASE
#       are removed. Sets PATCHED_SRC and SERIES_HASH.
#   unpack_pinned TARBALL SHA256 DEST MARKER
#       unpacks TARBALL (its top folder stripped) into DEST once its sha256 is SHA256, unless
#       DEST/MARKER shows it is there already; a wrong hash stops the script.
#   build_kvc_library REPO
#       cargo builds kvc's C ABI crate (release; static and shared library) into
#       KVC_CARGO_TARGET_DIR (default REPO/target), cargo's progress shown on stderr. Sets
#       KVC_TARGET to that directory.

apply_patch_series() {
    local src="$1" patches="$2" base="$3" label="$4" p
    SERIES_HASH="$(cat "$patches"/*.patch | sha256sum | cut -c1-12)"
    PATCHED_SRC="$base-kvc-$SERIES_HASH"
    [ -f "$PATCHED_SRC/.kvc-patched" ] && return 0
    log "applying $(basename "$patches")/ ($SERIES_HASH) to $label"
    rm -rf "$base"-kvc-* "$PATCHED_SRC.tmp"
    mkdir -p "$PATCHED_SRC.tmp"
    (cd "$src" && tar --exclude=./.git -cf - .) | (cd "$PATCHED_SRC.tmp" && tar -xf -)
    for p in "$patches"/*.patch; do
        if ! patch -d "$PATCHED_SRC.tmp" -p1 --forward --batch --fuzz=0 --dry-run --silent <"$p" >/dev/null 2>&1; then
            log "the patch $(basename "$p") does not apply to $label exactly:"
            patch -d "$PATCHED_SRC.tmp" -p1 --forward --batch --fuzz=0 --dry-run <"$p" >&2 || true
            log "update the patch for this version ($patches)"
            rm -rf "$PATCHED_SRC.tmp"
            exit 1
        fi
        patch -d "$PATCHED_SRC.tmp" -p1 --forward --batch --fuzz=0 --silent <"$p" >/dev/null
    done
    touch "$PATCHED_SRC.tmp/.kvc-patched"
    mv "$PATCHED_SRC.tmp" "$PATCHED_SRC"
}

unpack_pinned() {
    local tarball="$1" sha="$2" dest="$3" marker="$4" got
    [ -e "$dest/$marker" ] && return 0
    got="$(sha256sum "$tarball" | cut -d' ' -f1)"
    [ "$got" = "$sha" ] || { log "$tarball: sha256 $got, expected $sha"; exit 1; }
    rm -rf "$dest" "$dest.tmp"
    mkdir -p "$dest.tmp"
    tar -xzf "$tarball" -C "$dest.tmp" --strip-components=1
    mv "$dest.tmp" "$dest"
}

build_kvc_library() {
    local repo="$1" t0=$SECONDS
    KVC_TARGET="${KVC_CARGO_TARGET_DIR:-$repo/target}"
    log "building kvc's library with cargo (release, the kvc-capi crate: about 3 minutes on 2 cores the first time, seconds when nothing changed)"
    # cargo's own lines ("Compiling ...", one per crate), indented under this script's
    (set -o pipefail; cd "$repo" && CARGO_TARGET_DIR="$KVC_TARGET" cargo build --release --locked -p kvc-capi 2>&1 \
        | sed -u 's/^ */  cargo: /' >&2) \
        || { log "building kvc's library failed"; exit 1; }
    log "kvc library: $((SECONDS - t0)) s"
}
