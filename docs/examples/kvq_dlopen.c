/* kvq through dlopen + kvc_get_api, for an engine that loads kvc as an optional plugin:
 * the program is not linked against libkvc and includes kvc.h for the types only (CMake:
 * target_link_libraries(app PRIVATE kvc::headers ${CMAKE_DL_LIBS})). When kvc_get_api
 * returns NULL (a library of another ABI major, or an older minor), the reason is in
 * kvc's last-error message, read with a second dlsym of kvc_last_error_message. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kvc.h"

typedef const kvc_api* (*get_api_fn)(uint32_t);
typedef kvc_status (*last_error_fn)(char*, size_t, size_t*);

int main(void) {
    void* lib = dlopen("libkvc.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    get_api_fn get_api = NULL;
    last_error_fn last_error = NULL;
    void* sym = dlsym(lib, "kvc_get_api");
    void* sym_err = dlsym(lib, "kvc_last_error_message");
    if (!sym || !sym_err) {
        fprintf(stderr, "dlsym: %s\n", dlerror());
        dlclose(lib);
        return 1;
    }
    memcpy(&get_api, &sym, sizeof get_api); /* object pointer -> function pointer */
    memcpy(&last_error, &sym_err, sizeof last_error);

    /* A table for an ABI major this library is not: NULL, and the message says why. */
    char msg[512] = {0};
    size_t needed = 0;
    if (get_api(KVC_ABI_VERSION + (1u << 16)) == NULL) {
        (void) last_error(msg, sizeof msg, &needed);
        printf("kvc_get_api(next major) -> NULL: %s\n", msg);
    }

    const kvc_api* api = get_api(KVC_ABI_VERSION);
    if (!api) {
        (void) last_error(msg, sizeof msg, &needed);
        fprintf(stderr, "kvc_get_api: %s\n", msg);
        dlclose(lib);
        return 1;
    }
    int rc = 1;
    kvc_kvq* kvq = NULL;
    enum { D = 64, NKV = 1, NH = 2, T = 4 };
    uint8_t k[T * NKV * (2 + D)], v[T * NKV * (2 + D / 2)];
    float x[T * NKV * D], q[NH * D], scores[NH * T], out[NH * D];
    size_t kb = 0, vb = 0;
    for (int i = 0; i < T * NKV * D; i++) x[i] = (float) (i % 7) - 3.0f;
    for (int i = 0; i < NH * D; i++) q[i] = (float) (i % 5) * 0.1f;
    if (api->kvq_new("k8v4", D, 1, NKV, &kvq) != KVC_OK ||
        api->kvq_row_bytes(kvq, 0, KVC_TENSOR_K, &kb) != KVC_OK ||
        api->kvq_row_bytes(kvq, 0, KVC_TENSOR_V, &vb) != KVC_OK || kb * T * NKV != sizeof k ||
        vb * T * NKV != sizeof v ||
        api->kvq_quantize_rows(kvq, 0, KVC_TENSOR_K, x, T * NKV, k, sizeof k) != KVC_OK ||
        api->kvq_quantize_rows(kvq, 0, KVC_TENSOR_V, x, T * NKV, v, sizeof v) != KVC_OK ||
        api->kvq_attend(kvq, 0, q, NH, k, sizeof k, v, sizeof v, T, 0.125f, scores, NH * T,
                        out) != KVC_OK) {
        (void) api->last_error_message(msg, sizeof msg, &needed);
        fprintf(stderr, "kvq: %s\n", msg);
        goto done;
    }
    printf("attend through the table: out[0] = %.4f\n", (double) out[0]);
    rc = 0;
done:
    api->kvq_free(kvq);
    dlclose(lib);
    return rc;
}
