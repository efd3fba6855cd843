/* C11: the kvq contract of docs/c-api.md ("kvq errors: one status per kind of mistake",
 * issue 38), one check per row of its table, each asserting the status, the message
 * (the call, and the row and element where the mistake has them) and that the output is
 * byte-identical after the failed call; and the two goal tests: a row holding 1e30 is
 * refused (never coded as a row of scale 0), and a NaN in row 5 of 16 leaves the output
 * untouched. */
#include <math.h>
#include <stdint.h>

#include "check.h"

#define D 64
#define NKV 2
#define NH 4
#define ROWS 16

/* Checks the status and that this thread's last error contains every needle. */
static void expect(kvc_status got, kvc_status want, const char* n1, const char* n2,
                   const char* n3, int line) {
    char msg[512];
    if (got != want) {
        fprintf(stderr, "line %d: %s, expected %s (%s)\n", line, kvc_status_name(got),
                kvc_status_name(want), last_error(msg, sizeof msg));
        exit(1);
    }
    last_error(msg, sizeof msg);
    const char* needles[3] = {n1, n2, n3};
    for (int i = 0; i < 3; i++) {
        if (needles[i] && !strstr(msg, needles[i])) {
            fprintf(stderr, "line %d: message \"%s\" lacks \"%s\"\n", line, msg, needles[i]);
            exit(1);
        }
    }
}
#define EXPECT(call, want, n1, n2, n3) expect((call), (want), (n1), (n2), (n3), __LINE__)

static float randf(uint32_t* s) {
    *s = *s * 1664525u + 1013904223u;
    return ((float) (*s >> 8) / 16777216.0f - 0.5f) * 4.0f;
}

int main(void) {
    kvc_kvq* kvq = NULL;
    CHECK_STATUS(kvc_kvq_new("k4v4", D, 1, NKV, &kvq), KVC_OK);
    size_t rb = 0;
    CHECK_STATUS(kvc_kvq_row_bytes(kvq, 0, KVC_TENSOR_K, &rb), KVC_OK);
    CHECK(rb == 2 + 32);

    static float x[ROWS * D], y[ROWS * D], keep_y[ROWS * D];
    static uint8_t p[ROWS * (2 + 32)], keep_p[ROWS * (2 + 32)], good[ROWS * (2 + 32)];
    uint32_t s = 11;
    for (size_t i = 0; i < ROWS * D; i++) x[i] = randf(&s);
    CHECK_STATUS(kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_K, x, ROWS, good, sizeof good), KVC_OK);
    for (size_t i = 0; i < sizeof p; i++) keep_p[i] = (uint8_t) (i * 37u + 5u);
    for (size_t i = 0; i < ROWS * D; i++) keep_y[i] = (float) i;

    /* Goal 1: a row holding 1e30 (and 2e19, whose square overflows f32) is refused with a
     * status naming the call, the row and the element; nothing is written. Before the
     * fix it returned KVC_OK with a row of scale 0 (zeros when decoded). */
    static const float huge[] = {1e30f, 2e19f, -3.0e38f};
    for (size_t j = 0; j < sizeof huge / sizeof huge[0]; j++) {
        float row[D];
        for (int i = 0; i < D; i++) row[i] = 0.5f;
        row[9] = huge[j];
        memcpy(p, keep_p, sizeof p);
        EXPECT(kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_K, row, 1, p, rb), KVC_INVALID_ARGUMENT,
               "kvc_kvq_quantize_rows", "row 0, element 9", NULL);
        CHECK(memcmp(p, keep_p, sizeof p) == 0);
        /* The one-row block call writes the documented poison (an f16 NaN scale), which
         * decodes to NaNs, never a zero row. */
        uint8_t blk[2 + 32];
        float back[D];
        CHECK_STATUS(kvc_kvq_block_quantize(D, 4, row, D, blk, sizeof blk), KVC_OK);
        CHECK_STATUS(kvc_kvq_block_dequantize(D, 4, blk, sizeof blk, back, D), KVC_OK);
        for (int i = 0; i < D; i++) CHECK(isnan(back[i]));
    }

    /* Goal 2: a NaN in row 5 of 16 leaves the output byte-identical. */
    x[5 * D + 17] = NAN;
    memcpy(p, keep_p, sizeof p);
    EXPECT(kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_K, x, ROWS, p, sizeof p), KVC_INVALID_ARGUMENT,
           "kvc_kvq_quantize_rows", "row 5, element 17", "not finite");
    CHECK(memcmp(p, keep_p, sizeof p) == 0);
    /* ... and a value whose row cannot get an f16 scale, in the last row. */
    x[5 * D + 17] = 0.0f;
    x[15 * D + 63] = 5e8f;
    EXPECT(kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_K, x, ROWS, p, sizeof p), KVC_INVALID_ARGUMENT,
           "kvc_kvq_quantize_rows", "row 15, element 63", "f16");
    CHECK(memcmp(p, keep_p, sizeof p) == 0);
    x[15 * D + 63] = 1.0f;

    /* Centered rows: the same contract. */
    {
        float center[NKV * D];
        for (int i = 0; i < NKV * D; i++) center[i] = 0.25f;
        x[7 * D + 3] = INFINITY;
        EXPECT(kvc_kvq_quantize_rows_centered(kvq, 0, KVC_TENSOR_K, x, ROWS, center, NKV * D, p,
                                              sizeof p),
               KVC_INVALID_ARGUMENT, "kvc_kvq_quantize_rows_centered", "row 7, element 3", NULL);
        CHECK(memcmp(p, keep_p, sizeof p) == 0);
        x[7 * D + 3] = 0.0f;
        center[D + 4] = NAN;
        EXPECT(kvc_kvq_quantize_rows_centered(kvq, 0, KVC_TENSOR_K, x, ROWS, center, NKV * D, p,
                                              sizeof p),
               KVC_INVALID_ARGUMENT, "kvc_kvq_quantize_rows_centered", "row 1, element 4", NULL);
        CHECK(memcmp(p, keep_p, sizeof p) == 0);
    }

    /* Bad bytes: a non-finite scale in row 10 of 16 is corrupt data naming the row; the
     * output is byte-identical (rows 0-9 used to be written). */
    {
        static uint8_t bad[ROWS * (2 + 32)];
        memcpy(bad, good, sizeof bad);
        bad[10 * rb] = 0x00;
        bad[10 * rb + 1] = 0x7e; /* f16 NaN */
        memcpy(y, keep_y, sizeof y);
        EXPECT(kvc_kvq_dequantize_rows(kvq, 0, KVC_TENSOR_K, bad, sizeof bad, y, ROWS),
               KVC_CORRUPT_DATA, "kvc_kvq_dequantize_rows", "packed row 10", NULL);
        CHECK(memcmp(y, keep_y, sizeof y) == 0);
        float center[NKV * D] = {0};
        EXPECT(kvc_kvq_dequantize_rows_centered(kvq, 0, KVC_TENSOR_K, bad, sizeof bad, center,
                                                NKV * D, y, ROWS),
               KVC_CORRUPT_DATA, "kvc_kvq_dequantize_rows_centered", "packed row 10", NULL);
        CHECK(memcmp(y, keep_y, sizeof y) == 0);

        /* attend: the bad row is found before any head writes `out`. */
        static float q[NH * D], sc[NH * (ROWS / NKV)], out[NH * D], keep_out[NH * D];
        for (int i = 0; i < NH * D; i++) q[i] = randf(&s), keep_out[i] = -1.0f;
        memcpy(out, keep_out, sizeof out);
        EXPECT(kvc_kvq_attend(kvq, 0, q, NH, bad, sizeof bad, good, sizeof good, ROWS / NKV,
                              0.125f, sc, NH * (ROWS / NKV), out),
               KVC_CORRUPT_DATA, "kvc_kvq_attend", "K row", "row 10");
        CHECK(memcmp(out, keep_out, sizeof out) == 0);
        /* A NaN attention scale, or a NaN query value, is the caller's mistake. */
        EXPECT(kvc_kvq_attend(kvq, 0, q, NH, good, sizeof good, good, sizeof good, ROWS / NKV,
                              NAN, sc, NH * (ROWS / NKV), out),
               KVC_INVALID_ARGUMENT, "kvc_kvq_attend", "attention scale", "element 0");
        q[2 * D + 6] = NAN;
        EXPECT(kvc_kvq_attend(kvq, 0, q, NH, good, sizeof good, good, sizeof good, ROWS / NKV,
                              0.125f, sc, NH * (ROWS / NKV), out),
               KVC_INVALID_ARGUMENT, "kvc_kvq_attend", "query: row 2, element 6", NULL);
        CHECK(memcmp(out, keep_out, sizeof out) == 0);
    }

    /* Shapes and arguments of the handle: n_kv_head 0 is the caller's mistake; a uniform
     * group wider than head_dim, or a head_dim kvq does not code, is unsupported. No plan
     * was passed, so neither is "bad kvq plan" / corrupt data. */
    kvc_kvq* other = NULL;
    EXPECT(kvc_kvq_new("k4v4", D, 1, 0, &other), KVC_INVALID_ARGUMENT, "kvc_kvq_new",
           "n_kv_head", NULL);
    EXPECT(kvc_kvq_new("k4v4:u128", 64, 1, 1, &other), KVC_UNSUPPORTED, "kvc_kvq_new",
           "group 128", NULL);
    EXPECT(kvc_kvq_new("k4v4", 96, 1, 1, &other), KVC_UNSUPPORTED, "kvc_kvq_new", "head_dim",
           NULL);
    EXPECT(kvc_kvq_new("k9v4", D, 1, 1, &other), KVC_INVALID_ARGUMENT, "kvc_kvq_new", "k9v4",
           NULL);
    CHECK(other == NULL);
    /* A plan is bytes: malformed is corrupt data. */
    static const char plan[] = "{\"format\": \"kvc-kvq-plan\", \"version\": 1";
    EXPECT(kvc_kvq_new_from_plan(plan, sizeof plan - 1, &other), KVC_CORRUPT_DATA,
           "kvc_kvq_new_from_plan", NULL, NULL);
    CHECK(other == NULL);

    /* K channel groups: a value past f16 is the caller's mistake (token row, channel);
     * a corrupt step is bad bytes. */
    {
        enum { CG = 16, CBYTES = 4 * D + CG * D * 4 / 8 };
        static float cx[CG * D], cy[CG * D], keep_cy[CG * D];
        static uint8_t cb[CBYTES], keep_cb[CBYTES];
        size_t need = 0;
        CHECK_STATUS(kvc_kvq_channel_block_bytes(4, D, CG, &need), KVC_OK);
        CHECK(need == CBYTES);
        for (int i = 0; i < CG * D; i++) cx[i] = randf(&s), keep_cy[i] = 3.0f;
        for (int i = 0; i < CBYTES; i++) keep_cb[i] = (uint8_t) i;
        cx[3 * D + 40] = 1e30f;
        memcpy(cb, keep_cb, sizeof cb);
        EXPECT(kvc_kvq_channel_quantize(4, D, CG, cx, cb, CBYTES), KVC_INVALID_ARGUMENT,
               "kvc_kvq_channel_quantize", "row 3, element 40", NULL);
        CHECK(memcmp(cb, keep_cb, sizeof cb) == 0);
        cx[3 * D + 40] = 0.5f;
        CHECK_STATUS(kvc_kvq_channel_quantize(4, D, CG, cx, cb, CBYTES), KVC_OK);
        cb[2 * 7] = 0x00;
        cb[2 * 7 + 1] = 0xfc; /* channel 7's step: -inf */
        memcpy(cy, keep_cy, sizeof cy);
        EXPECT(kvc_kvq_channel_dequantize(4, D, CG, cb, CBYTES, cy), KVC_CORRUPT_DATA,
               "kvc_kvq_channel_dequantize", NULL, NULL);
        CHECK(memcmp(cy, keep_cy, sizeof cy) == 0);
    }

    /* Sizes: a short output is its own status, nothing written. */
    memcpy(p, keep_p, sizeof p);
    EXPECT(kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_K, x, ROWS, p, sizeof p - 1),
           KVC_BUFFER_TOO_SMALL, "kvc_kvq_quantize_rows", NULL, NULL);
    CHECK(memcmp(p, keep_p, sizeof p) == 0);

    /* ABI 0.12: the symmetric calls. */
    for (size_t i = 0; i < ROWS * D; i++) x[i] = randf(&s);
    CHECK_STATUS(kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_K, x, ROWS, good, sizeof good), KVC_OK);
    {
        /* dequantize ordered like quantize, with dst_len: the same floats; short dst and a
         * corrupt row leave dst untouched. */
        static float y1[ROWS * D], y2[ROWS * D];
        CHECK_STATUS(kvc_kvq_dequantize_rows(kvq, 0, KVC_TENSOR_K, good, sizeof good, y1, ROWS), KVC_OK);
        CHECK_STATUS(kvc_kvq_dequantize_rows_checked(kvq, 0, KVC_TENSOR_K, good, sizeof good, ROWS, y2,
                                                     ROWS * D),
                     KVC_OK);
        CHECK(memcmp(y1, y2, sizeof y1) == 0);
        memcpy(y2, keep_y, sizeof y2);
        EXPECT(kvc_kvq_dequantize_rows_checked(kvq, 0, KVC_TENSOR_K, good, sizeof good, ROWS, y2,
                                               ROWS * D - 1),
               KVC_BUFFER_TOO_SMALL, "kvc_kvq_dequantize_rows_checked", "dst", NULL);
        CHECK(memcmp(y2, keep_y, sizeof y2) == 0);
        static uint8_t bad[ROWS * (2 + 32)];
        memcpy(bad, good, sizeof bad);
        bad[3 * rb + 1] = 0x7c; /* f16 infinity (low byte 0 below) */
        bad[3 * rb] = 0x00;
        EXPECT(kvc_kvq_dequantize_rows_checked(kvq, 0, KVC_TENSOR_K, bad, sizeof bad, ROWS, y2,
                                               ROWS * D),
               KVC_CORRUPT_DATA, "kvc_kvq_dequantize_rows_checked", "packed row 3", NULL);
        CHECK(memcmp(y2, keep_y, sizeof y2) == 0);

        /* f16 and bf16 rows in: the bytes of the f32 call on the same values. */
        static uint16_t h[ROWS * D];
        static float back[ROWS * D];
        static uint8_t p32[ROWS * (2 + 32)], p16[ROWS * (2 + 32)];
        const kvc_dtype types[2] = {KVC_DTYPE_F16, KVC_DTYPE_BF16};
        for (int j = 0; j < 2; j++) {
            size_t n = 0;
            CHECK_STATUS(kvc_convert(KVC_DTYPE_F32, x, ROWS * D, types[j], h, ROWS * D, &n), KVC_OK);
            CHECK_STATUS(kvc_convert(types[j], h, ROWS * D, KVC_DTYPE_F32, back, ROWS * D, &n), KVC_OK);
            CHECK_STATUS(kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_K, back, ROWS, p32, sizeof p32), KVC_OK);
            CHECK_STATUS(kvc_kvq_quantize_rows_typed(kvq, 0, KVC_TENSOR_K, types[j], h, ROWS, p16,
                                                     sizeof p16),
                         KVC_OK);
            CHECK(memcmp(p32, p16, sizeof p32) == 0);
            /* and out: the f32 values rounded to the type */
            static uint16_t o16[ROWS * D], want[ROWS * D];
            CHECK_STATUS(kvc_kvq_dequantize_rows_typed(kvq, 0, KVC_TENSOR_K, good, sizeof good, ROWS,
                                                       types[j], o16, ROWS * D),
                         KVC_OK);
            CHECK_STATUS(kvc_convert(KVC_DTYPE_F32, y1, ROWS * D, types[j], want, ROWS * D, &n), KVC_OK);
            CHECK(memcmp(o16, want, sizeof o16) == 0);
        }
        /* A NaN among f16 rows (row 5): refused, dst untouched. */
        h[5 * D + 2] = 0x7e00;
        memcpy(p16, keep_p, sizeof p16);
        EXPECT(kvc_kvq_quantize_rows_typed(kvq, 0, KVC_TENSOR_K, KVC_DTYPE_F16, h, ROWS, p16, sizeof p16),
               KVC_INVALID_ARGUMENT, "kvc_kvq_quantize_rows_typed", "row 5, element 2", NULL);
        CHECK(memcmp(p16, keep_p, sizeof p16) == 0);
        EXPECT(kvc_kvq_quantize_rows_typed(kvq, 0, KVC_TENSOR_K, KVC_DTYPE_I8, h, ROWS, p16, sizeof p16),
               KVC_UNSUPPORTED, "kvc_kvq_quantize_rows_typed", "KVC_DTYPE_I8", NULL);
        EXPECT(kvc_kvq_quantize_rows_typed(kvq, 0, KVC_TENSOR_K, 9, h, ROWS, p16, sizeof p16),
               KVC_INVALID_ARGUMENT, "kvc_kvq_quantize_rows_typed", "dtype", NULL);
        CHECK(memcmp(p16, keep_p, sizeof p16) == 0);
    }
    {
        /* Strided attend: the token-major cache copied head-major ([H, S, D], S = 12 slots
         * of which T = 8 are used) gives the bits of kvc_kvq_attend. */
        enum { T = ROWS / NKV, S = 12 };
        static uint8_t hk[NKV * S * (2 + 32)], hv[NKV * S * (2 + 32)];
        static float q[NH * D], sc[NH * T], o1[NH * D], o2[NH * D];
        for (int i = 0; i < NH * D; i++) q[i] = randf(&s);
        for (int t = 0; t < T; t++)
            for (int hh = 0; hh < NKV; hh++) {
                memcpy(hk + ((size_t) hh * S + (size_t) t) * rb, good + ((size_t) t * NKV + (size_t) hh) * rb, rb);
                memcpy(hv + ((size_t) hh * S + (size_t) t) * rb, good + ((size_t) t * NKV + (size_t) hh) * rb, rb);
            }
        CHECK_STATUS(kvc_kvq_attend(kvq, 0, q, NH, good, sizeof good, good, sizeof good, T, 0.125f, sc,
                                    NH * T, o1),
                     KVC_OK);
        CHECK_STATUS(kvc_kvq_attend_strided(kvq, 0, q, NH, hk, sizeof hk, rb, S * rb, hv, sizeof hv, rb,
                                            S * rb, T, 0.125f, sc, NH * T, o2),
                     KVC_OK);
        CHECK(memcmp(o1, o2, sizeof o1) == 0);
        CHECK_STATUS(kvc_kvq_attend_strided(kvq, 0, q, NH, good, sizeof good, NKV * rb, rb, good,
                                            sizeof good, NKV * rb, rb, T, 0.125f, sc, NH * T, o2),
                     KVC_OK);
        CHECK(memcmp(o1, o2, sizeof o1) == 0);
        memcpy(o2, keep_y, sizeof o2);
        EXPECT(kvc_kvq_attend_strided(kvq, 0, q, NH, hk, sizeof hk, rb - 1, S * rb, hv, sizeof hv, rb,
                                      S * rb, T, 0.125f, sc, NH * T, o2),
               KVC_INVALID_ARGUMENT, "kvc_kvq_attend_strided", "token stride", NULL);
        EXPECT(kvc_kvq_attend_strided(kvq, 0, q, NH, hk, sizeof hk - 1, rb, S * rb, hv, sizeof hv, rb,
                                      S * rb, S + 1, 0.125f, sc, NH * (S + 1), o2),
               KVC_BUFFER_TOO_SMALL, "kvc_kvq_attend_strided", NULL, NULL);
        CHECK(memcmp(o2, keep_y, sizeof o2) == 0);
    }

    kvc_kvq_free(kvq);
    puts("test_kvq_contract: ok");
    return 0;
}
