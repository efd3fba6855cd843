/* kvq in an engine, linked against libkvc: size the packed cache, quantize each token's
 * K and V rows at the cache write, run one decode step of attention on the packed rows
 * with caller scratch, and handle errors. Build and run:
 *
 *   cc kvq_example.c $(pkg-config --cflags --libs kvc) -lm -o kvq_example && ./kvq_example
 *
 * (CMake: find_package(kvc) and target_link_libraries(app PRIVATE kvc::kvc m).) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvc.h"

enum { HEAD_DIM = 128, N_LAYER = 2, N_KV_HEAD = 2, N_HEAD = 8, N_CTX = 64 };

/* Prints the failing call, its status and kvc's message (call, row and element). */
static void report(FILE* to, const char* call, kvc_status st) {
    char msg[512] = {0};
    size_t needed = 0;
    (void) kvc_last_error_message(msg, sizeof msg, &needed); /* never truncated if it fits */
    fprintf(to, "%s -> %s: %s\n", call, kvc_status_name(st), msg);
}

#define TRY(call)                                                                          \
    do {                                                                                   \
        kvc_status st_ = (call);                                                           \
        if (st_ != KVC_OK) {                                                               \
            report(stderr, #call, st_);                                                    \
            goto done;                                                                     \
        }                                                                                  \
    } while (0)

int main(void) {
    int rc = 1;
    kvc_kvq* kvq = NULL;
    uint8_t *k_cache = NULL, *v_cache = NULL;
    float *rows = NULL, *q = NULL, *scores = NULL, *out = NULL;

    /* 8-bit K, 4-bit V (K is the sensitive one), the same for every layer. */
    TRY(kvc_kvq_new("k8v4", HEAD_DIM, N_LAYER, N_KV_HEAD, &kvq));

    /* 1. Sizing: one packed row is one token of one KV head; a layer's cache holds
     *    N_CTX * N_KV_HEAD rows, token-major, row (t, h) at (t * N_KV_HEAD + h) * row. */
    size_t k_row = 0, v_row = 0;
    TRY(kvc_kvq_row_bytes(kvq, 0, KVC_TENSOR_K, &k_row));
    TRY(kvc_kvq_row_bytes(kvq, 0, KVC_TENSOR_V, &v_row));
    const size_t k_len = (size_t) N_CTX * N_KV_HEAD * k_row;
    const size_t v_len = (size_t) N_CTX * N_KV_HEAD * v_row;
    k_cache = malloc(k_len);
    v_cache = malloc(v_len);
    rows = malloc((size_t) N_KV_HEAD * HEAD_DIM * sizeof *rows);
    q = malloc((size_t) N_HEAD * HEAD_DIM * sizeof *q);
    scores = malloc((size_t) N_HEAD * N_CTX * sizeof *scores); /* attend's scratch */
    out = malloc((size_t) N_HEAD * HEAD_DIM * sizeof *out);
    if (!k_cache || !v_cache || !rows || !q || !scores || !out) goto done;
    printf("layer 0: K row %zu bytes, V row %zu bytes, %zu cache bytes for %d tokens "
           "(f16: %zu)\n",
           k_row, v_row, k_len + v_len, N_CTX, (size_t) 2 * 2 * N_CTX * N_KV_HEAD * HEAD_DIM);

    /* 2. Cache write: each new token's N_KV_HEAD rows of K (then V), quantized into its
     *    slot. All or nothing: on an error the slot is left as it was. */
    for (size_t t = 0; t < N_CTX; t++) {
        for (size_t i = 0; i < (size_t) N_KV_HEAD * HEAD_DIM; i++)
            rows[i] = sinf(0.37f * (float) i + 0.11f * (float) t);
        TRY(kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_K, rows, N_KV_HEAD,
                                  k_cache + t * N_KV_HEAD * k_row, N_KV_HEAD * k_row));
        for (size_t i = 0; i < (size_t) N_KV_HEAD * HEAD_DIM; i++)
            rows[i] = cosf(0.23f * (float) i - 0.05f * (float) t);
        TRY(kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_V, rows, N_KV_HEAD,
                                  v_cache + t * N_KV_HEAD * v_row, N_KV_HEAD * v_row));
    }

    /* 3. One decode step of every query head on the packed rows (grouped-query: head i
     *    reads KV head i / (N_HEAD / N_KV_HEAD)). `scores` is scratch; after the call it
     *    holds each head's unnormalized softmax weights (the largest is 1). */
    for (size_t i = 0; i < (size_t) N_HEAD * HEAD_DIM; i++) q[i] = sinf(0.01f * (float) i);
    TRY(kvc_kvq_attend(kvq, 0, q, N_HEAD, k_cache, k_len, v_cache, v_len, N_CTX,
                       1.0f / sqrtf((float) HEAD_DIM), scores, (size_t) N_HEAD * N_CTX, out));
    double z = 0;
    for (size_t t = 0; t < N_CTX; t++) z += scores[t];
    printf("head 0: out[0] = %.4f, weight of the last token %.4f\n", (double) out[0],
           (double) scores[N_CTX - 1] / z);

    /* 4. Errors: an engine bug (a NaN in a row) is refused with a status and a message
     *    naming the call, the row and the element; the cache slot is not written. */
    rows[HEAD_DIM + 5] = NAN;
    const kvc_status st = kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_K, rows, N_KV_HEAD,
                                                k_cache, N_KV_HEAD * k_row);
    if (st != KVC_INVALID_ARGUMENT) goto done;
    report(stdout, "a NaN in row 1", st);
    rc = 0;
done:
    free(out);
    free(scores);
    free(q);
    free(rows);
    free(v_cache);
    free(k_cache);
    kvc_kvq_free(kvq);
    return rc;
}
