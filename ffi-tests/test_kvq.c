/* C11: kvq packed rows through the C API: a config-string handle and a plan handle,
 * row sizes, quantize -> dequantize error for 8 and 4 bits, attention on the packed rows
 * against attention on the dequantized rows computed here in double, and the error paths
 * (bad config, bad plan, NULL, wrong layer or tensor, short buffers, NaN input, every
 * truncation of the packed cache). */
#include <math.h>
#include <stdint.h>

#include "check.h"

#define D 64
#define NKV 3
#define NH 9
#define T 40

static float randf(uint32_t* s) {
    *s = *s * 1664525u + 1013904223u;
    return ((float)(*s >> 8) / 16777216.0f - 0.5f) * 4.0f;
}

static double rel_err(const float* a, const float* b, size_t n) {
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(e / s);
}

int main(void) {
    kvc_kvq* kvq = NULL;
    CHECK_STATUS(kvc_kvq_new("k9v4", D, 2, NKV, &kvq), KVC_INVALID_ARGUMENT);
    CHECK(kvq == NULL);
    CHECK_STATUS(kvc_kvq_new("k4v4", 96, 2, NKV, &kvq), KVC_UNSUPPORTED);
    CHECK_STATUS(kvc_kvq_new("k4v4", D, 0, NKV, &kvq), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_kvq_new(NULL, D, 2, NKV, &kvq), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_kvq_new("k8v4", D, 2, NKV, &kvq), KVC_OK);
    CHECK(kvq != NULL);

    size_t kb = 0, vb = 0;
    CHECK_STATUS(kvc_kvq_row_bytes(kvq, 1, KVC_TENSOR_K, &kb), KVC_OK);
    CHECK_STATUS(kvc_kvq_row_bytes(kvq, 1, KVC_TENSOR_V, &vb), KVC_OK);
    CHECK(kb == 2 + 64 && vb == 2 + 32); /* docs/formats/kvq.md: lm, 8 and 4 bits at d 64 */
    CHECK_STATUS(kvc_kvq_row_bytes(kvq, 2, KVC_TENSOR_K, &kb), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_kvq_row_bytes(kvq, 0, 7, &kb), KVC_INVALID_ARGUMENT);

    static float k[T * NKV * D], v[T * NKV * D], q[NH * D], y[T * NKV * D];
    static uint8_t pk[T * NKV * (2 + 64)], pv[T * NKV * (2 + 32)];
    uint32_t s = 7;
    for (size_t i = 0; i < T * NKV * D; i++) k[i] = randf(&s), v[i] = randf(&s);
    for (size_t i = 0; i < NH * D; i++) q[i] = randf(&s);
    const size_t rows = T * NKV;
    CHECK_STATUS(kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_K, k, rows, pk, sizeof pk), KVC_OK);
    CHECK_STATUS(kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_V, v, rows, pv, sizeof pv), KVC_OK);
    CHECK_STATUS(kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_V, v, rows, pv, sizeof pv - 1),
                 KVC_BUFFER_TOO_SMALL);
    CHECK_STATUS(kvc_kvq_dequantize_rows(kvq, 0, KVC_TENSOR_K, pk, sizeof pk, y, rows), KVC_OK);
    CHECK(rel_err(y, k, rows * D) < 0.01); /* 8-bit Lloyd-Max: about -44 dB */
    static float dk[T * NKV * D], dv[T * NKV * D];
    for (size_t i = 0; i < rows * D; i++) dk[i] = y[i];
    CHECK_STATUS(kvc_kvq_dequantize_rows(kvq, 0, KVC_TENSOR_V, pv, sizeof pv, dv, rows), KVC_OK);
    const double ev = rel_err(dv, v, rows * D);
    CHECK(ev > 0.03 && ev < 0.15); /* 4-bit: about -21 dB */
    CHECK_STATUS(kvc_kvq_dequantize_rows(kvq, 0, KVC_TENSOR_V, pv, sizeof pv - 1, dv, rows),
                 KVC_BUFFER_TOO_SMALL);

    /* NaN input. */
    float bad[D];
    for (size_t i = 0; i < D; i++) bad[i] = 1.0f;
    bad[5] = NAN;
    uint8_t one[66];
    CHECK_STATUS(kvc_kvq_quantize_rows(kvq, 0, KVC_TENSOR_K, bad, 1, one, sizeof one),
                 KVC_CORRUPT_DATA);

    /* Attention: packed vs double attention on the dequantized rows. */
    static float scores[NH * T], out[NH * D];
    const float scale = 0.125f;
    CHECK_STATUS(kvc_kvq_attend(kvq, 0, q, NH, pk, sizeof pk, pv, sizeof pv, T, scale, scores,
                                NH * T, out),
                 KVC_OK);
    for (int h = 0; h < NH; h++) {
        const int kvh = h / (NH / NKV);
        double sc[T], m = -1e300, z = 0, o[D] = {0};
        for (int t = 0; t < T; t++) {
            double a = 0;
            for (int i = 0; i < D; i++) a += (double)q[h * D + i] * dk[(t * NKV + kvh) * D + i];
            sc[t] = a * scale;
            if (sc[t] > m) m = sc[t];
        }
        for (int t = 0; t < T; t++) z += (sc[t] = exp(sc[t] - m));
        for (int t = 0; t < T; t++)
            for (int i = 0; i < D; i++) o[i] += sc[t] / z * dv[(t * NKV + kvh) * D + i];
        for (int i = 0; i < D; i++) CHECK(fabs(out[h * D + i] - o[i]) < 1e-4);
    }
    /* Every truncation of the packed K and V is an error, never a read past the end. */
    for (size_t cut = 0; cut < sizeof pk; cut += 7)
        CHECK_STATUS(kvc_kvq_attend(kvq, 0, q, NH, pk, cut, pv, sizeof pv, T, scale, scores,
                                    NH * T, out),
                     KVC_BUFFER_TOO_SMALL);
    for (size_t cut = 0; cut < sizeof pv; cut += 5)
        CHECK_STATUS(kvc_kvq_attend(kvq, 0, q, NH, pk, sizeof pk, pv, cut, T, scale, scores,
                                    NH * T, out),
                     KVC_BUFFER_TOO_SMALL);
    CHECK_STATUS(kvc_kvq_attend(kvq, 0, q, NH, pk, sizeof pk, pv, sizeof pv, T, scale, scores,
                                NH * T - 1, out),
                 KVC_BUFFER_TOO_SMALL);
    CHECK_STATUS(kvc_kvq_attend(kvq, 0, q, 8, pk, sizeof pk, pv, sizeof pv, T, scale, scores,
                                NH * T, out),
                 KVC_INVALID_ARGUMENT); /* 8 query heads over 3 KV heads */
    CHECK_STATUS(kvc_kvq_attend(kvq, 5, q, NH, pk, sizeof pk, pv, sizeof pv, T, scale, scores,
                                NH * T, out),
                 KVC_INVALID_ARGUMENT);
    kvc_kvq_free(kvq);
    kvc_kvq_free(NULL);

    /* A plan: per-layer bits. */
    const char* plan =
        "{\"format\":\"kvc-kvq-plan\",\"version\":1,\"method\":\"u32\",\"seed\":5,"
        "\"head_dim\":64,\"n_kv_head\":3,\"layers\":[{\"k_bits\":5,\"v_bits\":3},"
        "{\"k_bits\":4,\"v_bits\":2}]}";
    CHECK_STATUS(kvc_kvq_new_from_plan(plan, strlen(plan), &kvq), KVC_OK);
    CHECK_STATUS(kvc_kvq_row_bytes(kvq, 0, KVC_TENSOR_K, &kb), KVC_OK);
    CHECK(kb == 4 + 40);
    CHECK_STATUS(kvc_kvq_row_bytes(kvq, 1, KVC_TENSOR_V, &vb), KVC_OK);
    CHECK(vb == 4 + 16);
    kvc_kvq_free(kvq);
    kvq = NULL;
    for (size_t cut = 0; cut < strlen(plan); cut += 3)
        CHECK(kvc_kvq_new_from_plan(plan, cut, &kvq) != KVC_OK && kvq == NULL);
    const char* v3 = "{\"format\":\"kvc-kvq-plan\",\"version\":3,\"method\":\"lm\",\"seed\":1,"
                     "\"head_dim\":64,\"n_kv_head\":3,\"layers\":[{\"k_bits\":4,\"v_bits\":4}]}";
    CHECK_STATUS(kvc_kvq_new_from_plan(v3, strlen(v3), &kvq), KVC_UNSUPPORTED);
    /* Version 2: a calibrated plan as `kvc quant plan` writes it. */
    const char* v2 =
        "{\"format\":\"kvc-kvq-plan\",\"version\":2,\"method\":\"lm\",\"seed\":1,"
        "\"head_dim\":64,\"n_kv_head\":3,\"layers\":[{\"k_bits\":5,\"v_bits\":3},"
        "{\"k_bits\":4,\"v_bits\":4}],\"calibration\":{\"source\":\"/tmp/calib\","
        "\"tag\":\"textA\",\"n_tokens\":1024,\"n_head\":9,\"query_from\":64,"
        "\"query_stride\":8,\"budget_ratio\":3.5,\"k_weight\":1.0,\"achieved_ratio\":3.765,"
        "\"total_error\":0.03,\"layer_errors\":[{\"k_err\":0.01,\"v_err\":0.005},"
        "{\"k_err\":0.01,\"v_err\":0.005}]}}";
    CHECK_STATUS(kvc_kvq_new_from_plan(v2, strlen(v2), &kvq), KVC_OK);
    CHECK_STATUS(kvc_kvq_row_bytes(kvq, 0, KVC_TENSOR_K, &kb), KVC_OK);
    CHECK(kb == 2 + 40);
    kvc_kvq_free(kvq);
    kvq = NULL;
    for (size_t cut = 0; cut < strlen(v2); cut += 7)
        CHECK(kvc_kvq_new_from_plan(v2, cut, &kvq) != KVC_OK && kvq == NULL);
    /* ABI 0.8: the handle-free block formats ggml's type traits call, and a plan's block
       bits. The v2 plan above is lm with seed 1: not a block format. */
    CHECK_STATUS(kvc_kvq_new_from_plan(v2, strlen(v2), &kvq), KVC_OK);
    {
        uint32_t nl = 0, nh = 0, hd = 0, bits = 0;
        CHECK_STATUS(kvc_kvq_shape(kvq, &nl, &nh, &hd), KVC_OK);
        CHECK(nl == 2 && nh == 3 && hd == 64);
        CHECK_STATUS(kvc_kvq_block_bits(kvq, 0, KVC_TENSOR_K, &bits), KVC_UNSUPPORTED);
        CHECK_STATUS(kvc_kvq_shape(kvq, NULL, &nh, &hd), KVC_NULL_ARGUMENT);
    }
    kvc_kvq_free(kvq);
    kvq = NULL;
    {
        enum { BROWS = 3 }; /* rows of D (64) values */
        size_t bbytes = 0;
        CHECK_STATUS(kvc_kvq_block_bytes(D, 4, &bbytes), KVC_OK);
        CHECK(bbytes == 2 + 32);
        CHECK_STATUS(kvc_kvq_block_bytes(96, 4, &bbytes), KVC_INVALID_ARGUMENT);
        float bx[BROWS * D], by[BROWS * D], byr[BROWS * D], bq[D];
        for (int i = 0; i < BROWS * D; ++i) bx[i] = (float) ((i * 37) % 23) / 7.0f - 1.5f;
        for (int i = 0; i < D; ++i) bq[i] = (float) ((i * 11) % 13) / 5.0f - 1.0f;
        bx[2 * D + 3] = INFINITY; /* row 2 holds an infinity: stored poisoned */
        unsigned char bpacked[BROWS * (2 + 32)];
        CHECK_STATUS(kvc_kvq_block_quantize(D, 4, bx, BROWS * D, bpacked, sizeof bpacked), KVC_OK);
        CHECK_STATUS(kvc_kvq_block_quantize(D, 4, bx, BROWS * D, bpacked, sizeof bpacked - 1),
                     KVC_BUFFER_TOO_SMALL);
        CHECK_STATUS(kvc_kvq_block_dequantize(D, 4, bpacked, sizeof bpacked, by, BROWS * D), KVC_OK);
        CHECK_STATUS(kvc_kvq_block_dequantize_rotated(D, 4, bpacked, sizeof bpacked, byr, BROWS * D), KVC_OK);
        CHECK_STATUS(kvc_kvq_block_unrotate(D, byr, BROWS * D), KVC_OK);
        for (int i = 0; i < 2 * D; ++i) {
            CHECK(fabsf(byr[i] - by[i]) <= 1e-5f * (1.0f + fabsf(by[i])));
            CHECK(fabsf(by[i] - bx[i]) < 0.5f);
        }
        for (int i = 2 * D; i < 3 * D; ++i) CHECK(by[i] != by[i]); /* NaN */
        float bqr[D], bs = 0.0f;
        memcpy(bqr, bq, sizeof bqr);
        CHECK_STATUS(kvc_kvq_block_rotate(D, bqr, D), KVC_OK);
        CHECK_STATUS(kvc_kvq_block_dot(D, 4, bpacked + (2 + 32), 2 + 32, bqr, D, &bs), KVC_OK);
        double bwant = 0.0;
        for (int i = 0; i < D; ++i) bwant += (double) bq[i] * by[D + i];
        CHECK(fabs((double) bs - bwant) < 1e-3 * (1.0 + fabs(bwant)));
        CHECK_STATUS(kvc_kvq_block_dot(D, 4, bpacked + 2 * (2 + 32), 2 + 32, bqr, D, &bs), KVC_OK);
        CHECK(bs != bs);
        CHECK_STATUS(kvc_kvq_block_dot(D, 4, bpacked, 2 + 32, bqr, D - 1, &bs), KVC_INVALID_ARGUMENT);

        /* ABI 0.9: two queries per tile (grouped-query attention) equal one call each, bit
           for bit; the poisoned row 2 scores NaN for both and is weighted by query 1 only. */
        enum { G = 2 };
        float gq[G * D], gs[G * BROWS], gw[G * BROWS] = {0.5f, 0.25f, 0.0f, 0.0f, 1.0f, 2.0f};
        float gacc[G * D], s1[BROWS], a1[D];
        for (int i = 0; i < G * D; ++i) gq[i] = (float) ((i * 7) % 19) / 9.0f - 1.0f;
        CHECK_STATUS(kvc_kvq_block_rotate(D, gq, G * D), KVC_OK);
        for (int i = 0; i < G * D; ++i) gacc[i] = 0.125f * (float) (i % 5);
        CHECK_STATUS(kvc_kvq_block_dot_rows_multi(D, 4, bpacked, 2 + 32, BROWS, gq, G, gs), KVC_OK);
        CHECK_STATUS(kvc_kvq_block_accumulate_rows_multi(D, 4, bpacked, 2 + 32, BROWS, gw, G, gacc),
                     KVC_OK);
        for (int g = 0; g < G; ++g) {
            CHECK_STATUS(kvc_kvq_block_dot_rows(D, 4, bpacked, 2 + 32, BROWS, gq + g * D, s1), KVC_OK);
            for (int i = 0; i < D; ++i) a1[i] = 0.125f * (float) ((g * D + i) % 5);
            CHECK_STATUS(kvc_kvq_block_accumulate_rows(D, 4, bpacked, 2 + 32, BROWS, gw + g * BROWS, a1),
                         KVC_OK);
            CHECK(memcmp(s1, gs + g * BROWS, sizeof s1) == 0);
            CHECK(memcmp(a1, gacc + g * D, sizeof a1) == 0);
            CHECK(gs[g * BROWS + 2] != gs[g * BROWS + 2]);
            CHECK((gacc[g * D] != gacc[g * D]) == (g == 1));
        }
        /* bad arguments: a stride shorter than a row, a query run that overflows, NULL */
        CHECK_STATUS(kvc_kvq_block_dot_rows_multi(D, 4, bpacked, 2 + 31, BROWS, gq, G, gs),
                     KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_block_dot_rows_multi(D, 4, bpacked, 2 + 32, BROWS, gq, SIZE_MAX / 8, gs),
                     KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_block_accumulate_rows_multi(D, 4, bpacked, 2 + 32, BROWS, gw, G, NULL),
                     KVC_NULL_ARGUMENT);
        CHECK_STATUS(kvc_kvq_block_accumulate_rows_multi(D, 4, bpacked, 2 + 32, BROWS, NULL, 0, NULL),
                     KVC_OK);
    }
    puts("test_kvq: ok");
    return 0;
}
