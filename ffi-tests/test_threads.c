/* C11 + pthreads: kvc_convert from many threads at once, each thread's last error its
 * own. Every thread alternates successes and its own distinct failure and checks after
 * each step that the message it reads is exactly its own, while the others run. Then
 * kvc_quant_roundtrip_rows / _quantize_rows on one shared quantizer handle from every
 * thread at once (const calls), each result checked against a single-threaded one. */
#include <pthread.h>
#include <stdint.h>

#include "check.h"

enum { THREADS = 8, ROUNDS = 2000, N = 256 };

static void* worker(void* arg) {
    const unsigned id = (unsigned)(uintptr_t)arg;
    uint16_t h[N];
    float f[N];
    for (int i = 0; i < N; i++) h[i] = (uint16_t)(0x3c00 + id); /* distinct per thread */
    char msg[512], expected[64];
    snprintf(expected, sizeof expected, "`src_dtype`: %u is not a kvc_dtype", 100 + id);

    for (int r = 0; r < ROUNDS; r++) {
        size_t len = 0;
        CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, N, KVC_DTYPE_F32, f, N, &len), KVC_OK);
        CHECK(len == N);
        uint16_t back[N];
        CHECK_STATUS(kvc_convert(KVC_DTYPE_F32, f, N, KVC_DTYPE_F16, back, N, &len), KVC_OK);
        CHECK(memcmp(back, h, sizeof h) == 0);
        CHECK(strcmp(last_error(msg, sizeof msg), "") == 0);

        CHECK_STATUS(kvc_convert(100 + id, h, N, KVC_DTYPE_F32, f, N, &len), KVC_INVALID_ARGUMENT);
        CHECK(strstr(last_error(msg, sizeof msg), expected) != NULL);
        if (r % 3 == 0) {
            CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, N, KVC_DTYPE_F32, f, N - 1 - id, &len),
                         KVC_BUFFER_TOO_SMALL);
            char exp2[64];
            snprintf(exp2, sizeof exp2, "`dst` holds %u but %d", (unsigned)(N - 1 - id), N);
            CHECK(strstr(last_error(msg, sizeof msg), exp2) != NULL);
        }
    }
    return NULL;
}

/* ---- one quantizer, many threads ---- */
enum { QC = 576, QROWS = 16, QROUNDS = 300 };
static kvc_quant* shared_quant;
static uint16_t q_src[THREADS][QROWS * QC], q_want[THREADS][QROWS * QC];
static int8_t q_want_i8[THREADS][QROWS * QC];

static void* quant_worker(void* arg) {
    const unsigned id = (unsigned)(uintptr_t)arg;
    static _Thread_local uint16_t data[QROWS * QC];
    static _Thread_local int8_t i8[QROWS * QC];
    char msg[256];
    for (int r = 0; r < QROUNDS; r++) {
        memcpy(data, q_src[id], sizeof data);
        CHECK_STATUS(kvc_quant_roundtrip_rows(shared_quant, id % 2, KVC_TENSOR_K, KVC_DTYPE_F16, data, QROWS),
                     KVC_OK);
        CHECK(memcmp(data, q_want[id], sizeof data) == 0);
        size_t len = 0;
        CHECK_STATUS(kvc_quant_quantize_rows(shared_quant, id % 2, KVC_TENSOR_K, KVC_DTYPE_F16, q_src[id], QROWS,
                                             i8, QROWS * QC, &len),
                     KVC_OK);
        CHECK(len == QROWS * QC && memcmp(i8, q_want_i8[id], sizeof i8) == 0);
        /* a failure of this thread's own, while the others succeed */
        CHECK_STATUS(kvc_quant_roundtrip_rows(shared_quant, 2 + id, KVC_TENSOR_K, KVC_DTYPE_F16, data, 1),
                     KVC_INVALID_ARGUMENT);
        char expected[64];
        snprintf(expected, sizeof expected, "invalid `layer`: %u is not below", 2 + id);
        CHECK(strstr(last_error(msg, sizeof msg), expected) != NULL);
    }
    return NULL;
}

static void test_shared_quantizer(void) {
    kvc_quant_config c = {2, QC, QC, 0};
    CHECK_STATUS(kvc_quant_new(&c, &shared_quant), KVC_OK);
    static float x[QROWS * QC];
    uint32_t s = 1;
    for (unsigned id = 0; id < THREADS; id++) {
        for (size_t i = 0; i < QROWS * QC; i++) {
            s = s * 1664525u + 1013904223u;
            x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (float)(id + 1);
        }
        size_t len = 0;
        CHECK_STATUS(kvc_convert(KVC_DTYPE_F32, x, QROWS * QC, KVC_DTYPE_F16, q_src[id], QROWS * QC, &len), KVC_OK);
        CHECK_STATUS(kvc_quant_observe_rows(shared_quant, id % 2, KVC_TENSOR_K, KVC_DTYPE_F16, q_src[id], QROWS),
                     KVC_OK);
    }
    CHECK_STATUS(kvc_quant_finish(shared_quant), KVC_OK);
    for (unsigned id = 0; id < THREADS; id++) {
        memcpy(q_want[id], q_src[id], sizeof q_want[id]);
        CHECK_STATUS(kvc_quant_roundtrip_rows(shared_quant, id % 2, KVC_TENSOR_K, KVC_DTYPE_F16, q_want[id], QROWS),
                     KVC_OK);
        CHECK(memcmp(q_want[id], q_src[id], sizeof q_want[id]) != 0); /* C8 changed something */
        size_t len = 0;
        CHECK_STATUS(kvc_quant_quantize_rows(shared_quant, id % 2, KVC_TENSOR_K, KVC_DTYPE_F16, q_src[id], QROWS,
                                             q_want_i8[id], QROWS * QC, &len),
                     KVC_OK);
    }
    pthread_t threads[THREADS];
    for (unsigned i = 0; i < THREADS; i++)
        CHECK(pthread_create(&threads[i], NULL, quant_worker, (void*)(uintptr_t)i) == 0);
    for (unsigned i = 0; i < THREADS; i++) CHECK(pthread_join(threads[i], NULL) == 0);
    kvc_quant_free(shared_quant);
}

int main(void) {
    pthread_t threads[THREADS];
    for (unsigned i = 0; i < THREADS; i++)
        CHECK(pthread_create(&threads[i], NULL, worker, (void*)(uintptr_t)i) == 0);
    for (unsigned i = 0; i < THREADS; i++) CHECK(pthread_join(threads[i], NULL) == 0);
    test_shared_quantizer();
    /* The main thread never failed: its message is still empty. */
    char msg[64];
    CHECK(strcmp(last_error(msg, sizeof msg), "") == 0);
    puts("test_threads: ok");
    return 0;
}
