/* C11: versions, status names, kvc_convert happy and error paths, the last-error
 * contract, outputs untouched on failure. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "check.h"

static char msg[1024];

static void test_versions(void) {
    const char* v = kvc_version();
    CHECK(v != NULL && strlen(v) >= 5);
    CHECK(kvc_abi_version() == KVC_ABI_VERSION);
    CHECK(KVC_ABI_VERSION == ((KVC_ABI_VERSION_MAJOR << 16) | KVC_ABI_VERSION_MINOR));
}

static void test_status_names(void) {
    CHECK(strcmp(kvc_status_name(KVC_OK), "KVC_OK") == 0);
    CHECK(strcmp(kvc_status_name(KVC_NULL_ARGUMENT), "KVC_NULL_ARGUMENT") == 0);
    CHECK(strcmp(kvc_status_name(KVC_INVALID_ARGUMENT), "KVC_INVALID_ARGUMENT") == 0);
    CHECK(strcmp(kvc_status_name(KVC_CORRUPT_DATA), "KVC_CORRUPT_DATA") == 0);
    CHECK(strcmp(kvc_status_name(KVC_BUFFER_TOO_SMALL), "KVC_BUFFER_TOO_SMALL") == 0);
    CHECK(strcmp(kvc_status_name(KVC_IO), "KVC_IO") == 0);
    CHECK(strcmp(kvc_status_name(KVC_UNSUPPORTED), "KVC_UNSUPPORTED") == 0);
    CHECK(strcmp(kvc_status_name(KVC_OUT_OF_MEMORY), "KVC_OUT_OF_MEMORY") == 0);
    CHECK(strcmp(kvc_status_name(KVC_INVALID_STATE), "KVC_INVALID_STATE") == 0);
    CHECK(strcmp(kvc_status_name(KVC_PANIC), "KVC_PANIC") == 0);
    CHECK(strcmp(kvc_status_name(-1), "KVC_UNKNOWN_STATUS") == 0);
    CHECK(strcmp(kvc_status_name(KVC_INTERNAL), "KVC_INTERNAL") == 0);
    CHECK(strcmp(kvc_status_name(KVC_INTERNAL + 1), "KVC_UNKNOWN_STATUS") == 0);
    CHECK(strcmp(kvc_status_name(INT_MAX), "KVC_UNKNOWN_STATUS") == 0);
    CHECK(strcmp(kvc_status_name(INT_MIN), "KVC_UNKNOWN_STATUS") == 0);
}

static void test_dtype_size(void) {
    CHECK(kvc_dtype_size(KVC_DTYPE_F16) == 2);
    CHECK(kvc_dtype_size(KVC_DTYPE_BF16) == 2);
    CHECK(kvc_dtype_size(KVC_DTYPE_F32) == 4);
    CHECK(kvc_dtype_size(KVC_DTYPE_I8) == 1);
    CHECK(kvc_dtype_size(4) == 0);
    CHECK(kvc_dtype_size(UINT32_MAX) == 0);
}

static void test_convert_happy(void) {
    const uint16_t h[5] = {0x3c00, 0xc000, 0x0001, 0x7c00, 0x7e00};
    float f[5] = {0};
    size_t len = 0;
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, 5, KVC_DTYPE_F32, f, 5, &len), KVC_OK);
    CHECK(len == 5);
    CHECK(f[0] == 1.0f && f[1] == -2.0f);
    CHECK(f[2] == ldexpf(1.0f, -24));
    CHECK(isinf(f[3]) && f[3] > 0);
    CHECK(isnan(f[4]));
    CHECK(strcmp(last_error(msg, sizeof msg), "") == 0);

    /* bf16 -> f32 is exact: bits << 16. */
    const uint16_t b[3] = {0x3f80, 0xc2f7, 0x0001};
    CHECK_STATUS(kvc_convert(KVC_DTYPE_BF16, b, 3, KVC_DTYPE_F32, f, 5, &len), KVC_OK);
    CHECK(len == 3);
    for (int i = 0; i < 3; i++) {
        uint32_t bits;
        memcpy(&bits, &f[i], 4);
        CHECK(bits == (uint32_t)b[i] << 16);
    }

    /* f32 -> f16 and bf16: round to nearest, ties to even. */
    const float x[4] = {1.0f + ldexpf(1.0f, -11), 1.0f + 3 * ldexpf(1.0f, -11), 70000.0f, -0.0f};
    uint16_t out[4] = {0};
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F32, x, 4, KVC_DTYPE_F16, out, 4, &len), KVC_OK);
    CHECK(out[0] == 0x3c00 && out[1] == 0x3c02 && out[2] == 0x7c00 && out[3] == 0x8000);
    const float y[2] = {1.0f + ldexpf(1.0f, -8), 1.0f + 3 * ldexpf(1.0f, -8)};
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F32, y, 2, KVC_DTYPE_BF16, out, 4, &len), KVC_OK);
    CHECK(len == 2 && out[0] == 0x3f80 && out[1] == 0x3f82);

    /* f16 <-> bf16 through f32: 1.0 and -2.0 are exact in both. */
    const uint16_t h2[2] = {0x3c00, 0xc000};
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h2, 2, KVC_DTYPE_BF16, out, 4, &len), KVC_OK);
    CHECK(out[0] == 0x3f80 && out[1] == 0xc000);
    uint16_t back[2] = {0};
    CHECK_STATUS(kvc_convert(KVC_DTYPE_BF16, out, 2, KVC_DTYPE_F16, back, 2, &len), KVC_OK);
    CHECK(back[0] == 0x3c00 && back[1] == 0xc000);

    /* Same type copies. */
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, 5, KVC_DTYPE_F16, out, 4, &len), KVC_BUFFER_TOO_SMALL);
    uint16_t copy[5] = {0};
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, 5, KVC_DTYPE_F16, copy, 5, &len), KVC_OK);
    CHECK(memcmp(copy, h, sizeof h) == 0);

    /* Zero elements: NULL buffers are fine. */
    len = 99;
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, NULL, 0, KVC_DTYPE_F32, NULL, 0, &len), KVC_OK);
    CHECK(len == 0);
}

static void test_size_query_and_too_small(void) {
    const uint16_t h[6] = {0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00};
    size_t len = 0;
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, 6, KVC_DTYPE_F32, NULL, 0, &len), KVC_OK);
    CHECK(len == 6);

    float small[4] = {7, 7, 7, 7};
    len = 0;
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, 6, KVC_DTYPE_F32, small, 4, &len),
                 KVC_BUFFER_TOO_SMALL);
    CHECK(len == 6); /* the size needed */
    for (int i = 0; i < 4; i++) CHECK(small[i] == 7.0f); /* untouched */
    last_error(msg, sizeof msg);
    CHECK(strstr(msg, "kvc_convert: ") == msg);
    CHECK(strstr(msg, "`dst` holds 4 but 6") != NULL);
}

static void test_convert_errors(void) {
    _Alignas(4) uint16_t h[8] = {0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x3c00};
    float f[4] = {7, 7, 7, 7};
    size_t len = 12345;

    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, 4, KVC_DTYPE_F32, f, 4, NULL), KVC_NULL_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "`dst_len` is NULL") != NULL);
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, NULL, 4, KVC_DTYPE_F32, f, 4, &len), KVC_NULL_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "`src` is NULL") != NULL);
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, 4, KVC_DTYPE_F32, NULL, 4, &len), KVC_NULL_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "`dst` is NULL") != NULL);

    CHECK_STATUS(kvc_convert(3, h, 4, KVC_DTYPE_F32, f, 4, &len), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "`src_dtype`: 3 is not a kvc_dtype") != NULL);
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, 4, 0xdeadbeefu, f, 4, &len), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "`dst_dtype`") != NULL);

    /* Misaligned pointers (built through uintptr_t: the pointer is never dereferenced). */
    float* odd_f = (float*)(void*)((uintptr_t)(void*)f + 2);
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, 1, KVC_DTYPE_F32, odd_f, 1, &len), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "not aligned to 4 bytes") != NULL);
    const uint16_t* odd_h = (const uint16_t*)(const void*)((uintptr_t)(const void*)h + 1);
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, odd_h, 1, KVC_DTYPE_F32, f, 1, &len), KVC_INVALID_ARGUMENT);

    /* Sizes that cannot exist. */
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, SIZE_MAX, KVC_DTYPE_F32, f, SIZE_MAX, &len),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, SIZE_MAX / 2, KVC_DTYPE_F32, f, SIZE_MAX, &len),
                 KVC_INVALID_ARGUMENT);

    /* Overlapping input and output. */
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, 4, KVC_DTYPE_F16, h + 2, 4, &len), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "overlaps") != NULL);
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, 4, KVC_DTYPE_F32, (float*)(void*)h, 4, &len),
                 KVC_INVALID_ARGUMENT);
    for (int i = 0; i < 8; i++) CHECK(h[i] == 0x3c00);

    CHECK(len == 12345); /* no failure but BUFFER_TOO_SMALL writes dst_len */
    for (int i = 0; i < 4; i++) CHECK(f[i] == 7.0f);
}

static void test_last_error_contract(void) {
    size_t len = 0;
    CHECK_STATUS(kvc_convert(9, NULL, 0, KVC_DTYPE_F32, NULL, 0, &len), KVC_INVALID_ARGUMENT);

    size_t needed = 0;
    CHECK_STATUS(kvc_last_error_message(NULL, 0, &needed), KVC_OK);
    CHECK(needed > 1);
    char tiny[4] = {'x', 'x', 'x', 'x'};
    size_t needed2 = 0;
    CHECK_STATUS(kvc_last_error_message(tiny, sizeof tiny, &needed2), KVC_BUFFER_TOO_SMALL);
    CHECK(needed2 == needed);
    CHECK(tiny[0] == 'x' && tiny[3] == 'x'); /* nothing copied, no truncation */
    CHECK_STATUS(kvc_last_error_message(NULL, 8, &needed2), KVC_NULL_ARGUMENT);
    char* exact = (char*)malloc(needed);
    CHECK(exact != NULL);
    CHECK_STATUS(kvc_last_error_message(exact, needed, NULL), KVC_OK);
    CHECK(strlen(exact) + 1 == needed);
    CHECK(strstr(exact, "kvc_convert: invalid `src_dtype`: 9") == exact);
    /* Reading it does not clear it; no-status functions leave it alone. */
    (void)kvc_status_name(KVC_IO);
    (void)kvc_version();
    (void)kvc_dtype_size(KVC_DTYPE_F16);
    CHECK(strcmp(last_error(msg, sizeof msg), exact) == 0);
    free(exact);

    /* A successful call clears it. */
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F32, NULL, 0, KVC_DTYPE_F32, NULL, 0, &len), KVC_OK);
    CHECK(strcmp(last_error(msg, sizeof msg), "") == 0);
    CHECK_STATUS(kvc_last_error_message(NULL, 0, &needed), KVC_OK);
    CHECK(needed == 1);
}

int main(void) {
    test_versions();
    test_status_names();
    test_dtype_size();
    test_convert_happy();
    test_size_query_and_too_small();
    test_convert_errors();
    test_last_error_contract();
    puts("test_core: ok");
    return 0;
}
