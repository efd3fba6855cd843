/* kvc_fault_shim: a kvc library that fails on purpose, for the checks that a kvc error in the
 * middle of a run ends the engine's request with a clear error instead of decoding on (MNN's
 * and InfiniLM's CI steps).
 *
 * It is what the engine loads as its kvc library: kvc_get_api loads the real library
 * (environment KVC_FAULT_REAL, its path), copies its function table and replaces three
 * entries. The KVC_FAULT_AFTER-th call (default 100) of h2o_end_call or of kvq_cells_write
 * (H2O or kvq rows) and every later one return KVC_INVALID_STATE; last_error_message then says
 * the fault was injected. Everything else is the real kvc. Test code: never ship it. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvc.h"

static kvc_api table;
static const kvc_api *real;
static long calls, fail_after = 100;
static int failed;

static enum kvc_status failing_end_call(struct kvc_h2o *h2o, size_t layer, struct kvc_h2o_decision *decision) {
    if (++calls >= fail_after) {
        failed = 1;
        return KVC_INVALID_STATE;
    }
    return real->h2o_end_call(h2o, layer, decision);
}

static enum kvc_status failing_cells_write(struct kvc_kvq_cells *cells, uint32_t tensor, const float *rows,
                                          size_t n_values, const int64_t *cell_idx, size_t n_rows, uint8_t *main,
                                          size_t main_len) {
    if (++calls >= fail_after) {
        failed = 1;
        return KVC_INVALID_STATE;
    }
    return real->kvq_cells_write(cells, tensor, rows, n_values, cell_idx, n_rows, main, main_len);
}

static enum kvc_status injected_message(char *buf, size_t capacity, size_t *needed) {
    static const char text[] = "fault injected by kvc_fault_shim";
    if (!failed) {
        return real->last_error_message(buf, capacity, needed);
    }
    if (needed) *needed = sizeof text;
    if (buf == NULL || capacity < sizeof text) return KVC_BUFFER_TOO_SMALL;
    memcpy(buf, text, sizeof text);
    return KVC_OK;
}

const kvc_api *kvc_get_api(uint32_t abi_version) {
    const char *path = getenv("KVC_FAULT_REAL");
    const char *after = getenv("KVC_FAULT_AFTER");
    void *lib = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
    if (lib == NULL) {
        fprintf(stderr, "kvc_fault_shim: set KVC_FAULT_REAL to kvc's library (%s)\n", path ? dlerror() : "unset");
        return NULL;
    }
    const kvc_api *(*get)(uint32_t) = (const kvc_api *(*)(uint32_t))dlsym(lib, "kvc_get_api");
    real = get ? get(abi_version) : NULL;
    if (real == NULL) return NULL;
    if (after) fail_after = atol(after);
    table = *real;
    table.h2o_end_call = failing_end_call;
    if (abi_version >= ((KVC_ABI_VERSION_MAJOR << 16) | 14)) {
        table.kvq_cells_write = failing_cells_write;
    }
    table.last_error_message = injected_message;
    return &table;
}
