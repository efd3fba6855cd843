/* C11 + pthreads: kvc_convert from many threads at once, each thread's last error its
 * own. Every thread alternates successes and its own distinct failure and checks after
 * each step that the message it reads is exactly its own, while the others run. */
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

int main(void) {
    pthread_t threads[THREADS];
    for (unsigned i = 0; i < THREADS; i++)
        CHECK(pthread_create(&threads[i], NULL, worker, (void*)(uintptr_t)i) == 0);
    for (unsigned i = 0; i < THREADS; i++) CHECK(pthread_join(threads[i], NULL) == 0);
    /* The main thread never failed: its message is still empty. */
    char msg[64];
    CHECK(strcmp(last_error(msg, sizeof msg), "") == 0);
    puts("test_threads: ok");
    return 0;
}
