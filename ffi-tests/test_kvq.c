/* C11: kvq packed rows through the C API: a config-string handle and a plan handle,
 * row sizes, quantize -> dequantize error for 8 and 4 bits, attention on the packed rows
 * against attention on the dequantized rows computed here in double, and the error paths
 * (bad config, bad plan, NULL, wrong layer or tensor, short buffers, NaN input, every
 * truncation of the packed cache); the handle-free block calls (ABI 0.8, 0.9) and the
 * channel-group calls (ABI 0.10); kvq cells: rows, saved cells, positions (ABI 0.14, 0.15), a dropped
 * ubatch (ABI 0.16). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* An f16 stored little-endian at p, decoded by the IEEE 754 binary16 rules. */
static float f16_le(const unsigned char* p) {
    unsigned h = (unsigned) p[0] | ((unsigned) p[1] << 8);
    int e = (int) ((h >> 10) & 31u);
    unsigned m = h & 1023u;
    float v = e == 0 ? ldexpf((float) m, -24)
              : e == 31 ? (m ? NAN : INFINITY)
                        : ldexpf((float) (m | 1024u), e - 25);
    return (h & 0x8000u) ? -v : v;
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
                 KVC_INVALID_ARGUMENT);

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
    /* Version 4 (layer weights in the calibration record) loads; a version past it does not. */
    const char* v4 = "{\"format\":\"kvc-kvq-plan\",\"version\":4,\"method\":\"lm\",\"seed\":1,"
                     "\"head_dim\":64,\"n_kv_head\":3,\"layers\":[{\"k_bits\":4,\"v_bits\":4}]}";
    CHECK_STATUS(kvc_kvq_new_from_plan(v4, strlen(v4), &kvq), KVC_OK);
    kvc_kvq_free(kvq);
    kvq = NULL;
    const char* v5 = "{\"format\":\"kvc-kvq-plan\",\"version\":5,\"method\":\"lm\",\"seed\":1,"
                     "\"head_dim\":64,\"n_kv_head\":3,\"layers\":[{\"k_bits\":4,\"v_bits\":4}]}";
    CHECK_STATUS(kvc_kvq_new_from_plan(v5, strlen(v5), &kvq), KVC_UNSUPPORTED);
    CHECK(kvq == NULL);
    /* Version 3: the protections an engine applies with kvc_kvq_cells (ABI 0.14). */
    const char* v3 = "{\"format\":\"kvc-kvq-plan\",\"version\":3,\"method\":\"lm\",\"seed\":1,"
                     "\"head_dim\":64,\"n_kv_head\":3,\"sink_tokens\":4,\"recent_tokens\":64,"
                     "\"recent_bits\":8,\"k_center\":true,\"layers\":[{\"k_bits\":4,\"v_bits\":4}]}";
    CHECK_STATUS(kvc_kvq_new_from_plan(v3, strlen(v3), &kvq), KVC_OK);
    kvc_kvq_protections prot;
    CHECK_STATUS(kvc_kvq_get_protections(kvq, &prot), KVC_OK);
    CHECK(prot.sink == 4 && prot.window == 64 && prot.window_bits == 8 && prot.k_center == 1);
    kvc_kvq_free(kvq);
    kvq = NULL;
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
    /* ABI 0.10: K per channel over token groups (kvc_kvq_channel_*, docs/formats/kvq.md,
       "Channel groups"): sizes, the block layout decoded here from the document, a round
       trip within half a step per channel with an outlier channel, scores against the
       decoded rows, and the error paths (every truncation, a corrupt step or minimum,
       NaN input, bad shapes, NULL), each leaving the output untouched. */
    {
        enum { CB = 4, CD = 64, CG = 32, CBYTES = 4 * CD + CG * CD * CB / 8 };
        size_t cbytes = 7;
        CHECK_STATUS(kvc_kvq_channel_block_bytes(CB, CD, CG, &cbytes), KVC_OK);
        CHECK(cbytes == 256 + 1024 && cbytes == CBYTES);
        CHECK_STATUS(kvc_kvq_channel_block_bytes(2, 128, 16, &cbytes), KVC_OK);
        CHECK(cbytes == 512 + 16 * 32);
        CHECK_STATUS(kvc_kvq_channel_block_bytes(8, 256, 256, &cbytes), KVC_OK);
        CHECK(cbytes == 1024 + 256 * 256);
        CHECK_STATUS(kvc_kvq_channel_block_bytes(3, 64, 16, &cbytes), KVC_OK);
        CHECK(cbytes == 256 + 16 * 24);
        cbytes = 7;
        CHECK_STATUS(kvc_kvq_channel_block_bytes(1, CD, CG, &cbytes), KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_channel_block_bytes(9, CD, CG, &cbytes), KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_channel_block_bytes(256 + 4, CD, CG, &cbytes), KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_channel_block_bytes(CB, 96, CG, &cbytes), KVC_UNSUPPORTED);
        CHECK_STATUS(kvc_kvq_channel_block_bytes(CB, 0, CG, &cbytes), KVC_UNSUPPORTED);
        CHECK_STATUS(kvc_kvq_channel_block_bytes(CB, CD, 0, &cbytes), KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_channel_block_bytes(CB, CD, 33, &cbytes), KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_channel_block_bytes(CB, CD, 512, &cbytes), KVC_INVALID_ARGUMENT);
        CHECK(cbytes == 7);
        CHECK_STATUS(kvc_kvq_channel_block_bytes(CB, CD, CG, NULL), KVC_NULL_ARGUMENT);

        /* token-major rows; channel 5 is an outlier (+-400), channel 9 sits far from zero
           (1000 +- 2), channel 11 is constant */
        static float cx[CG * CD], cy[CG * CD], cz[CG * CD], cq[CD], cs[CG], cs2[CG];
        uint32_t seed = 12345;
        for (int t = 0; t < CG; ++t)
            for (int c = 0; c < CD; ++c) {
                float cv = randf(&seed) * (1.0f + (float) (c % 3));
                if (c == 5) cv *= 200.0f;
                if (c == 9) cv += 1000.0f;
                if (c == 11) cv = -0.75f;
                cx[t * CD + c] = cv;
            }
        for (int c = 0; c < CD; ++c) cq[c] = randf(&seed);
        /* exactly block-sized heap buffers, so ASan sees any read or write past them */
        unsigned char* cblk = malloc(CBYTES);
        CHECK(cblk != NULL);
        memset(cblk, 0xa5, CBYTES);
        CHECK_STATUS(kvc_kvq_channel_quantize(CB, CD, CG, cx, cblk, CBYTES), KVC_OK);
        CHECK_STATUS(kvc_kvq_channel_dequantize(CB, CD, CG, cblk, CBYTES, cy), KVC_OK);

        /* the layout: head_dim f16 steps, head_dim f16 minimums, then group rows of
           head_dim 4-bit codes, LSB first; value = min + code * step */
        float smax_plain = 0.0f;
        for (int c = 0; c < CD; ++c) {
            float step = f16_le(cblk + 2 * c), lo = f16_le(cblk + 2 * CD + 2 * c);
            float a = INFINITY, b = -INFINITY;
            for (int t = 0; t < CG; ++t) {
                a = fminf(a, cx[t * CD + c]);
                b = fmaxf(b, cx[t * CD + c]);
            }
            /* minimum: the largest f16 not above the channel's minimum */
            CHECK(lo <= a && a - lo <= fabsf(a) * (1.0f / 1024.0f) + 1e-7f);
            /* step: the smallest f16 not below (max - min) / 15 */
            CHECK(step * 15.0f >= (b - lo) * (1.0f - 1e-6f));
            CHECK(step <= (b - lo) / 15.0f * (1.0f + 1.0f / 1024.0f) + 1e-7f);
            if (c == 11) CHECK(step == 0.0f && lo == -0.75f);
            if (c != 5 && c != 9 && step > smax_plain) smax_plain = step;
            for (int t = 0; t < CG; ++t) {
                const unsigned char* row = cblk + 4 * CD + t * (CD * CB / 8);
                unsigned code = (row[c / 2] >> (4 * (c % 2))) & 15u;
                float want = lo + (float) code * step;
                float got = cy[t * CD + c];
                CHECK(fabsf(got - want) <= 1e-6f * (fabsf(lo) + 15.0f * step));
                /* within half a step of the input (plus the f32 arithmetic) */
                CHECK(fabsf(got - cx[t * CD + c]) <= 0.5f * step + 1e-6f * (fabsf(lo) + 15.0f * step));
            }
        }
        /* the outlier has its own range: the other channels keep a fine step */
        CHECK(f16_le(cblk + 2 * 5) > 40.0f);
        CHECK(smax_plain > 0.0f && smax_plain < 1.0f);

        /* scores from the codes against q . (decoded row), in double */
        for (int t = 0; t < CG; ++t) cs[t] = 99.0f;
        CHECK_STATUS(kvc_kvq_channel_dot(CB, CD, CG, cq, cblk, CBYTES, cs), KVC_OK);
        for (int t = 0; t < CG; ++t) {
            double want = 0.0, mag = 0.0;
            for (int c = 0; c < CD; ++c) {
                want += (double) cq[c] * cy[t * CD + c];
                mag += fabs((double) cq[c] * cy[t * CD + c]);
            }
            CHECK(fabs((double) cs[t] - want) <= 1e-5 * mag + 1e-6);
        }

        /* every truncation refused, nothing written; the copy is exactly n bytes */
        for (size_t n = 0; n < (size_t) CBYTES; ++n) {
            unsigned char* shortb = malloc(n ? n : 1);
            CHECK(shortb != NULL);
            memcpy(shortb, cblk, n);
            for (int i = 0; i < CG * CD; ++i) cz[i] = 7.0f;
            for (int t = 0; t < CG; ++t) cs2[t] = 7.0f;
            CHECK_STATUS(kvc_kvq_channel_dequantize(CB, CD, CG, shortb, n, cz), KVC_BUFFER_TOO_SMALL);
            CHECK_STATUS(kvc_kvq_channel_dot(CB, CD, CG, cq, shortb, n, cs2), KVC_BUFFER_TOO_SMALL);
            memset(shortb, 0x5a, n);
            CHECK_STATUS(kvc_kvq_channel_quantize(CB, CD, CG, cx, shortb, n), KVC_BUFFER_TOO_SMALL);
            for (size_t i = 0; i < n; ++i) CHECK(shortb[i] == 0x5a);
            for (int i = 0; i < CG * CD; ++i) CHECK(cz[i] == 7.0f);
            for (int t = 0; t < CG; ++t) CHECK(cs2[t] == 7.0f);
            free(shortb);
        }

        /* a step that is +inf, NaN or negative, or a minimum that is +-inf or NaN: corrupt */
        {
            static const struct { int at; unsigned char lo, hi; } corrupt[] = {
                {0, 0x00, 0x7c},              /* step 0: +inf */
                {2 * 63, 0x00, 0x7e},         /* step 63: NaN */
                {2 * 7, 0x00, 0xbc},          /* step 7: -1.0 */
                {2 * CD, 0x00, 0xfc},         /* min 0: -inf */
                {2 * CD + 2 * 63, 0x01, 0x7c} /* min 63: NaN */
            };
            unsigned char* cbad = malloc(CBYTES);
            CHECK(cbad != NULL);
            for (size_t j = 0; j < sizeof corrupt / sizeof corrupt[0]; ++j) {
                memcpy(cbad, cblk, CBYTES);
                cbad[corrupt[j].at] = corrupt[j].lo;
                cbad[corrupt[j].at + 1] = corrupt[j].hi;
                for (int i = 0; i < CG * CD; ++i) cz[i] = 7.0f;
                for (int t = 0; t < CG; ++t) cs2[t] = 7.0f;
                CHECK_STATUS(kvc_kvq_channel_dequantize(CB, CD, CG, cbad, CBYTES, cz), KVC_CORRUPT_DATA);
                CHECK_STATUS(kvc_kvq_channel_dot(CB, CD, CG, cq, cbad, CBYTES, cs2), KVC_CORRUPT_DATA);
                for (int i = 0; i < CG * CD; ++i) CHECK(cz[i] == 7.0f);
                for (int t = 0; t < CG; ++t) CHECK(cs2[t] == 7.0f);
            }
            free(cbad);
        }

        /* input that is NaN, infinite or beyond f16's range: a caller's mistake, dst untouched;
           f16's largest finite value is accepted and decodes exactly */
        {
            unsigned char* cout = malloc(CBYTES);
            CHECK(cout != NULL);
            static const float poison[] = {NAN, INFINITY, -INFINITY, 65520.0f, -1e6f};
            for (size_t j = 0; j < sizeof poison / sizeof poison[0]; ++j) {
                memcpy(cz, cx, sizeof cz);
                cz[(int) j * 131 % (CG * CD)] = poison[j];
                memset(cout, 0x5a, CBYTES);
                CHECK_STATUS(kvc_kvq_channel_quantize(CB, CD, CG, cz, cout, CBYTES), KVC_INVALID_ARGUMENT);
                for (int i = 0; i < CBYTES; ++i) CHECK(cout[i] == 0x5a);
            }
            memcpy(cz, cx, sizeof cz);
            cz[3] = 65504.0f;
            cz[CD + 3] = -65504.0f;
            CHECK_STATUS(kvc_kvq_channel_quantize(CB, CD, CG, cz, cout, CBYTES), KVC_OK);
            CHECK_STATUS(kvc_kvq_channel_dequantize(CB, CD, CG, cout, CBYTES, cy), KVC_OK);
            CHECK(cy[CD + 3] == -65504.0f);
            for (int i = 0; i < CG * CD; ++i) CHECK(isfinite(cy[i]));
            free(cout);
        }

        /* bad shapes through every call, outputs untouched */
        {
            static const uint32_t shapes[][3] = {
                {1, CD, CG}, {9, CD, CG}, {CB, 96, CG}, {CB, 32, CG}, {CB, CD, 8}, {CB, CD, 48}};
            static const kvc_status want[] = {KVC_INVALID_ARGUMENT, KVC_INVALID_ARGUMENT,
                                              KVC_UNSUPPORTED,      KVC_UNSUPPORTED,
                                              KVC_INVALID_ARGUMENT, KVC_INVALID_ARGUMENT};
            unsigned char* cout = malloc(CBYTES);
            CHECK(cout != NULL);
            for (size_t j = 0; j < sizeof want / sizeof want[0]; ++j) {
                uint32_t b = shapes[j][0], d = shapes[j][1], g = shapes[j][2];
                memset(cout, 0x5a, CBYTES);
                for (int i = 0; i < CG * CD; ++i) cz[i] = 7.0f;
                for (int t = 0; t < CG; ++t) cs2[t] = 7.0f;
                CHECK_STATUS(kvc_kvq_channel_quantize(b, d, g, cx, cout, CBYTES), want[j]);
                CHECK_STATUS(kvc_kvq_channel_dequantize(b, d, g, cblk, CBYTES, cz), want[j]);
                CHECK_STATUS(kvc_kvq_channel_dot(b, d, g, cq, cblk, CBYTES, cs2), want[j]);
                for (int i = 0; i < CBYTES; ++i) CHECK(cout[i] == 0x5a);
                for (int i = 0; i < CG * CD; ++i) CHECK(cz[i] == 7.0f);
                for (int t = 0; t < CG; ++t) CHECK(cs2[t] == 7.0f);
            }
            free(cout);
        }

        /* NULL pointers, and an output overlapping the input */
        CHECK_STATUS(kvc_kvq_channel_quantize(CB, CD, CG, NULL, cblk, CBYTES), KVC_NULL_ARGUMENT);
        CHECK_STATUS(kvc_kvq_channel_quantize(CB, CD, CG, cx, NULL, CBYTES), KVC_NULL_ARGUMENT);
        CHECK_STATUS(kvc_kvq_channel_dequantize(CB, CD, CG, NULL, CBYTES, cz), KVC_NULL_ARGUMENT);
        CHECK_STATUS(kvc_kvq_channel_dequantize(CB, CD, CG, cblk, CBYTES, NULL), KVC_NULL_ARGUMENT);
        CHECK_STATUS(kvc_kvq_channel_dot(CB, CD, CG, NULL, cblk, CBYTES, cs2), KVC_NULL_ARGUMENT);
        CHECK_STATUS(kvc_kvq_channel_dot(CB, CD, CG, cq, NULL, CBYTES, cs2), KVC_NULL_ARGUMENT);
        CHECK_STATUS(kvc_kvq_channel_dot(CB, CD, CG, cq, cblk, CBYTES, NULL), KVC_NULL_ARGUMENT);
        CHECK_STATUS(kvc_kvq_channel_quantize(CB, CD, CG, cz, (unsigned char*) cz, CBYTES),
                     KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_channel_dot(CB, CD, CG, cz, cblk, CBYTES, cz + 8), KVC_INVALID_ARGUMENT);
        free(cblk);
    }
    /* Centered rows (ABI 0.11): the bytes of quantizing row - center by hand, decoded + center
       back bit for bit, the f16 mean as the center, and every bad center refused. */
    {
        enum { CT = 8, CH = 3, CDIM = 64, CW = CH * CDIM };
        kvc_kvq* kc = NULL;
        CHECK_STATUS(kvc_kvq_new("k4v4", CDIM, 1, CH, &kc), KVC_OK);
        size_t crb = 0;
        CHECK_STATUS(kvc_kvq_row_bytes(kc, 0, KVC_TENSOR_K, &crb), KVC_OK);
        static float cx[CT * CW], cdiff[CT * CW], cy[CT * CW], cz[CT * CW], cc[CW];
        static uint8_t pa[CT * CH * 34], pb[CT * CH * 34];
        CHECK(crb == 34 && sizeof pa == CT * CH * crb);
        uint32_t cs = 11;
        for (size_t i = 0; i < CT * CW; i++) cx[i] = randf(&cs) + ((i % CDIM) % 7 == 0 ? 6.0f : 0.0f);
        CHECK_STATUS(kvc_kvq_mean_center(cx, CT * CW, CH, CDIM, cc, CW), KVC_OK);
        for (size_t e = 0; e < CW; e++) {
            double m = 0;
            for (size_t t = 0; t < CT; t++) m += cx[t * CW + e];
            m /= CT;
            CHECK(fabs(cc[e] - m) <= 1e-3 * (1.0 + fabs(m))); /* f16 rounding */
        }
        for (size_t i = 0; i < CT * CW; i++) cdiff[i] = cx[i] - cc[i % CW];
        CHECK_STATUS(kvc_kvq_quantize_rows(kc, 0, KVC_TENSOR_K, cdiff, CT * CH, pa, sizeof pa), KVC_OK);
        CHECK_STATUS(kvc_kvq_quantize_rows_centered(kc, 0, KVC_TENSOR_K, cx, CT * CH, cc, CW, pb, sizeof pb),
                     KVC_OK);
        CHECK(memcmp(pa, pb, sizeof pa) == 0);
        CHECK_STATUS(kvc_kvq_dequantize_rows(kc, 0, KVC_TENSOR_K, pa, sizeof pa, cz, CT * CH), KVC_OK);
        CHECK_STATUS(kvc_kvq_dequantize_rows_centered(kc, 0, KVC_TENSOR_K, pb, sizeof pb, cc, CW, cy, CT * CH),
                     KVC_OK);
        for (size_t i = 0; i < CT * CW; i++) CHECK(cy[i] == cz[i] + cc[i % CW]);
        /* Bad centers and sizes. */
        CHECK_STATUS(kvc_kvq_quantize_rows_centered(kc, 0, KVC_TENSOR_K, cx, CT * CH, cc, CDIM - 1, pb, sizeof pb),
                     KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_quantize_rows_centered(kc, 0, KVC_TENSOR_K, cx, CT * CH, NULL, CW, pb, sizeof pb),
                     KVC_NULL_ARGUMENT);
        CHECK_STATUS(kvc_kvq_quantize_rows_centered(kc, 0, KVC_TENSOR_K, cx, CT * CH, cc, CW, pb, sizeof pb - 1),
                     KVC_BUFFER_TOO_SMALL);
        CHECK_STATUS(kvc_kvq_quantize_rows_centered(kc, 1, KVC_TENSOR_K, cx, CT * CH, cc, CW, pb, sizeof pb),
                     KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_dequantize_rows_centered(kc, 0, KVC_TENSOR_K, pb, sizeof pb - 1, cc, CW, cy, CT * CH),
                     KVC_BUFFER_TOO_SMALL);
        CHECK_STATUS(kvc_kvq_dequantize_rows_centered(kc, 0, KVC_TENSOR_K, pb, sizeof pb, cc, CW + 1, cy, CT * CH),
                     KVC_INVALID_ARGUMENT);
        /* the output overlapping the center */
        CHECK_STATUS(kvc_kvq_dequantize_rows_centered(kc, 0, KVC_TENSOR_K, pb, sizeof pb, cy, CW, cy, CT * CH),
                     KVC_INVALID_ARGUMENT);
        float cnan[CW];
        memcpy(cnan, cc, sizeof cnan);
        cnan[9] = NAN;
        CHECK_STATUS(kvc_kvq_quantize_rows_centered(kc, 0, KVC_TENSOR_K, cx, CT * CH, cnan, CW, pb, sizeof pb),
                     KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_dequantize_rows_centered(kc, 0, KVC_TENSOR_K, pa, sizeof pa, cnan, CW, cy, CT * CH),
                     KVC_INVALID_ARGUMENT);
        /* mean_center: whole tokens, the out length, non-finite rows; out untouched on error */
        float keep[CW];
        memcpy(keep, cc, sizeof keep);
        CHECK_STATUS(kvc_kvq_mean_center(cx, CT * CW - 1, CH, CDIM, cc, CW), KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_mean_center(cx, CT * CW, CH, CDIM, cc, CW - 1), KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_mean_center(cx, 0, CH, CDIM, cc, CW), KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_mean_center(cx, CT * CW, 0, CDIM, cc, CW), KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_mean_center(cnan, CW, CH, CDIM, cc, CW), KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_kvq_mean_center(NULL, CW, CH, CDIM, cc, CW), KVC_NULL_ARGUMENT);
        CHECK_STATUS(kvc_kvq_mean_center(cx, CT * CW, CH, CDIM, cx, CW), KVC_INVALID_ARGUMENT);
        CHECK(memcmp(keep, cc, sizeof keep) == 0);
        kvc_kvq_free(kc);
    }
    /* kvq cells (ABI 0.14, 0.15): a cache of one K (centered) and one V tensor written in one
     * ubatch; a cell's crow read back (get_rows) and stored again (set_rows); saved, loaded into
     * fresh cells for another sequence (the same crow read back), damaged bytes refused; moved
     * to new positions. */
    {
        enum { NC = 32, CHV = 2, CN = 12 };
        const kvc_kvq_cells_config cfg = {NC, 2, 4, 8};
        const kvc_kvq_cells_tensor ts[2] = {{D, CHV, 4, 1}, {D, CHV, 3, 0}};
        kvc_kvq_cells* cells = NULL;
        CHECK_STATUS(kvc_kvq_cells_new(&cfg, ts, 2, &cells), KVC_OK);
        size_t mb[2];
        for (uint32_t t = 0; t < 2; t++) CHECK_STATUS(kvc_kvq_cells_main_cell_bytes(cells, t, &mb[t]), KVC_OK);
        unsigned char* mains[2] = {calloc(NC, mb[0]), calloc(NC, mb[1])};
        int32_t pos[CN], seq[CN];
        int64_t idx[CN];
        uint32_t ids[CN];
        static float crow[CN * CHV * D];
        uint32_t st = 5;
        for (int i = 0; i < CN; i++) {
            pos[i] = i;
            seq[i] = 0;
            idx[i] = 31 - i;
            ids[i] = (uint32_t) (31 - i);
        }
        for (int i = 0; i < CN * CHV * D; i++) crow[i] = randf(&st) + (float) (i % 7);
        CHECK_STATUS(kvc_kvq_cells_begin_ubatch(cells, pos, seq, idx, CN), KVC_OK);
        for (uint32_t t = 0; t < 2; t++)
            CHECK_STATUS(kvc_kvq_cells_write(cells, t, crow, CN * CHV * D, idx, CN, mains[t], NC * mb[t]), KVC_OK);
        static float got[CN * CHV * D], again[CN * CHV * D];
        CHECK_STATUS(kvc_kvq_cells_get_rows(cells, 0, mains[0], NC * mb[0], ids, CN, got, CN * CHV * D), KVC_OK);
        /* position 0 is a sink row: its f16 values */
        for (int i = 0; i < CHV * D; i++) CHECK(fabsf(got[i] - crow[i]) <= 1e-3f * (1.0f + fabsf(crow[i])));
        /* the last position is a window row (8 bits) */
        CHECK(rel_err(got + (CN - 1) * CHV * D, crow + (CN - 1) * CHV * D, CHV * D) < 0.01);
        CHECK_STATUS(kvc_kvq_cells_set_rows(cells, 0, mains[0], NC * mb[0], ids, CN, got, CN * CHV * D), KVC_OK);
        CHECK_STATUS(kvc_kvq_cells_get_rows(cells, 0, mains[0], NC * mb[0], ids, CN, again, CN * CHV * D), KVC_OK);
        CHECK(rel_err(again, got, CN * CHV * D) < 0.02);
        size_t len = 0;
        CHECK_STATUS(kvc_kvq_cells_save(cells, ids, CN, 0, NULL, 0, &len), KVC_OK);
        unsigned char* saved = malloc(len);
        CHECK_STATUS(kvc_kvq_cells_save(cells, ids, CN, 0, saved, len - 1, &len), KVC_BUFFER_TOO_SMALL);
        CHECK_STATUS(kvc_kvq_cells_save(cells, ids, CN, 0, saved, len, &len), KVC_OK);
        CHECK(memcmp(saved, "KVCQCELS", 8) == 0);
        kvc_kvq_cells* back = NULL;
        CHECK_STATUS(kvc_kvq_cells_new(&cfg, ts, 2, &back), KVC_OK);
        saved[len / 2] ^= 4;
        CHECK_STATUS(kvc_kvq_cells_load(back, saved, len, ids, pos, CN, 7), KVC_CORRUPT_DATA);
        saved[len / 2] ^= 4;
        pos[3]++;
        CHECK_STATUS(kvc_kvq_cells_load(back, saved, len, ids, pos, CN, 7), KVC_INVALID_ARGUMENT);
        pos[3]--;
        CHECK_STATUS(kvc_kvq_cells_load(back, saved, len, ids, pos, CN, 7), KVC_OK);
        CHECK_STATUS(kvc_kvq_cells_get_rows(back, 0, mains[0], NC * mb[0], ids, CN, got, CN * CHV * D), KVC_OK);
        CHECK(memcmp(got, again, sizeof got) == 0);
        /* moved positions; a negative one or a cell never written is refused */
        int32_t moved[CN];
        for (int i = 0; i < CN; i++) moved[i] = i + 100;
        CHECK_STATUS(kvc_kvq_cells_set_positions(back, ids, moved, CN), KVC_OK);
        moved[0] = -1;
        CHECK_STATUS(kvc_kvq_cells_set_positions(back, ids, moved, CN), KVC_INVALID_ARGUMENT);
        const uint32_t unwritten = 0;
        CHECK_STATUS(kvc_kvq_cells_get_rows(back, 0, mains[0], NC * mb[0], &unwritten, 1, got, CHV * D),
                     KVC_INVALID_ARGUMENT);
        /* a ubatch stopped after its K write (an aborted compute) and dropped: the next ubatch
         * begins, and the cells read as those of cells that never began it (ABI 0.16). The
         * stopped ubatch's 8 positions push the first cells out of the window (4); they read
         * their window rows again once it is dropped. */
        {
            kvc_kvq_cells* fresh = NULL;
            CHECK_STATUS(kvc_kvq_cells_new(&cfg, ts, 2, &fresh), KVC_OK);
            /* the bytes at capacity (ABI 0.17): one sequence adds at least its sink (2 f16 rows)
             * and window (4 rows of 8 bits) in both tensors and the K center (f32, twice), and
             * not far above; the cells' bookkeeping comes with no sequence */
            {
                size_t cap0 = 0, cap1 = 0, cap2 = 0;
                CHECK_STATUS(kvc_kvq_cells_capacity_bytes(fresh, 0, 8, &cap0), KVC_OK);
                CHECK_STATUS(kvc_kvq_cells_capacity_bytes(fresh, 1, 8, &cap1), KVC_OK);
                CHECK_STATUS(kvc_kvq_cells_capacity_bytes(fresh, 2, 8, &cap2), KVC_OK);
                const size_t seq_rows = 2 * (2 * CHV * D * 2 + 4 * CHV * (2 + D)) + 2 * 4 * CHV * D;
                CHECK(cap0 > 0 && cap1 - cap0 >= seq_rows && cap1 - cap0 < seq_rows + 1024);
                CHECK(cap2 - cap1 == cap1 - cap0);
                CHECK_STATUS(kvc_kvq_cells_capacity_bytes(fresh, 1, 8, NULL), KVC_NULL_ARGUMENT);
                CHECK_STATUS(kvc_kvq_cells_capacity_bytes(NULL, 1, 8, &cap1), KVC_NULL_ARGUMENT);
            }
            unsigned char* fm[2] = {calloc(NC, mb[0]), calloc(NC, mb[1])};
            CHECK_STATUS(kvc_kvq_cells_clear(cells), KVC_OK);
            enum { A = 6, B = 8 };
            int32_t apos[A], aseq[A] = {0}, bpos[B], bseq[B] = {0};
            int64_t aidx[A], bidx[B];
            for (int i = 0; i < A; i++) {
                apos[i] = i;
                aidx[i] = i;
            }
            for (int i = 0; i < B; i++) {
                bpos[i] = A + i;
                bidx[i] = A + i;
            }
            kvc_kvq_cells* both[2] = {cells, fresh};
            unsigned char** bm[2] = {mains, fm};
            for (int w = 0; w < 2; w++) {
                CHECK_STATUS(kvc_kvq_cells_begin_ubatch(both[w], apos, aseq, aidx, A), KVC_OK);
                for (uint32_t t = 0; t < 2; t++)
                    CHECK_STATUS(kvc_kvq_cells_write(both[w], t, crow, A * CHV * D, aidx, A, bm[w][t], NC * mb[t]),
                                 KVC_OK);
            }
            int dropped = -1;
            CHECK_STATUS(kvc_kvq_cells_begin_ubatch(cells, bpos, bseq, bidx, B), KVC_OK);
            CHECK_STATUS(kvc_kvq_cells_write(cells, 0, crow, B * CHV * D, bidx, B, mains[0], NC * mb[0]), KVC_OK);
            /* without the drop, the next ubatch is refused (tensor 1 missed its write) */
            CHECK_STATUS(kvc_kvq_cells_begin_ubatch(cells, bpos, bseq, bidx, 1), KVC_INVALID_STATE);
            CHECK_STATUS(kvc_kvq_cells_drop_ubatch(cells, &dropped), KVC_OK);
            CHECK(dropped == 1);
            CHECK_STATUS(kvc_kvq_cells_drop_ubatch(cells, &dropped), KVC_OK);
            CHECK(dropped == 0);
            CHECK_STATUS(kvc_kvq_cells_drop_ubatch(NULL, NULL), KVC_NULL_ARGUMENT);
            /* the next ubatch: one token at position A, in both */
            float scs[2][A + 1];
            for (int w = 0; w < 2; w++) {
                CHECK_STATUS(kvc_kvq_cells_begin_ubatch(both[w], bpos, bseq, bidx, 1), KVC_OK);
                for (uint32_t t = 0; t < 2; t++)
                    CHECK_STATUS(kvc_kvq_cells_write(both[w], t, crow, CHV * D, bidx, 1, bm[w][t], NC * mb[t]),
                                 KVC_OK);
                CHECK_STATUS(kvc_kvq_cells_scores(both[w], 0, bm[w][0], NC * mb[0], 1, 0, A + 1, 0, crow, 1, scs[w],
                                                  A + 1),
                             KVC_OK);
            }
            CHECK(memcmp(scs[0], scs[1], sizeof scs[0]) == 0);
            free(fm[0]);
            free(fm[1]);
            kvc_kvq_cells_free(fresh);
        }
        /* a block of query positions at once (ABI 0.19): each token's scores and sums are its
         * own call's, bit for bit, over tiles of main rows only and of window rows */
        {
            kvc_kvq_cells* bc = NULL;
            CHECK_STATUS(kvc_kvq_cells_new(&cfg, ts, 2, &bc), KVC_OK);
            unsigned char* bmain[2] = {calloc(NC, mb[0]), calloc(NC, mb[1])};
            for (int32_t p = 0; p < 24; p++) {
                const int32_t s0 = 0;
                const int64_t ci = p;
                const int n_tok = p < 20 ? 1 : 4;
                int32_t pp[4], ss[4] = {0};
                int64_t ii[4];
                for (int kt = 0; kt < n_tok; kt++) {
                    pp[kt] = p + kt;
                    ii[kt] = p + kt;
                }
                CHECK_STATUS(kvc_kvq_cells_begin_ubatch(bc, n_tok == 1 ? &p : pp, n_tok == 1 ? &s0 : ss,
                                                        n_tok == 1 ? &ci : ii, (size_t) n_tok),
                             KVC_OK);
                for (uint32_t t = 0; t < 2; t++)
                    CHECK_STATUS(kvc_kvq_cells_write(bc, t, crow + (p % 8) * CHV * D, (size_t) n_tok * CHV * D,
                                                     n_tok == 1 ? &ci : ii, (size_t) n_tok, bmain[t], NC * mb[t]),
                                 KVC_OK);
                p += n_tok - 1;
            }
            const uint32_t toks[4] = {0, 1, 2, 3};
            float bq[4 * D], bs[4 * 24], sone[24], bw[4 * 24], bacc[4 * D], acc1[D];
            for (int i = 0; i < 4 * D; i++) bq[i] = (float) ((i * 13) % 11) / 7.0f - 0.6f;
            for (int i = 0; i < 4 * 24; i++) bw[i] = (float) (i % 5 + 1) / 8.0f;
            /* cells 0..11: the sinks and main rows; 4..15: main rows only; 12..23: the window */
            const uint32_t tiles[3] = {0, 4, 12};
            for (int ti = 0; ti < 3; ti++) {
                const uint32_t c0 = tiles[ti];
                CHECK_STATUS(kvc_kvq_cells_scores_tokens(bc, 0, bmain[0], NC * mb[0], 1, c0, 12, toks, 4, bq, 1, bs,
                                                         4 * 12),
                             KVC_OK);
                memset(bacc, 0, sizeof bacc);
                CHECK_STATUS(kvc_kvq_cells_accumulate_tokens(bc, 1, bmain[1], NC * mb[1], 1, c0, 12, toks, 4, bw,
                                                             4 * 12, 1, bacc),
                             KVC_OK);
                for (uint32_t kt = 0; kt < 4; kt++) {
                    CHECK_STATUS(kvc_kvq_cells_scores(bc, 0, bmain[0], NC * mb[0], 1, c0, 12, kt, bq + kt * D, 1, sone, 12),
                                 KVC_OK);
                    CHECK(memcmp(sone, bs + kt * 12, 12 * sizeof(float)) == 0);
                    memset(acc1, 0, sizeof acc1);
                    CHECK_STATUS(kvc_kvq_cells_accumulate(bc, 1, bmain[1], NC * mb[1], 1, c0, 12, kt, bw + kt * 12, 12, 1,
                                                          acc1),
                                 KVC_OK);
                    CHECK(memcmp(acc1, bacc + kt * D, sizeof acc1) == 0);
                }
            }
            /* a token past the ubatch, and more than 64 queries, refused */
            const uint32_t past[2] = {0, 4};
            CHECK_STATUS(kvc_kvq_cells_scores_tokens(bc, 0, bmain[0], NC * mb[0], 1, 0, 12, past, 2, bq, 1, bs, 2 * 12),
                         KVC_INVALID_ARGUMENT);
            free(bmain[0]);
            free(bmain[1]);
            kvc_kvq_cells_free(bc);
        }
        /* a sequence taken back (ABI 0.18): the window (4) reads 3 rows back from the next
         * position; rows kept 2 positions past it, plus the last one-token ubatch undone,
         * cover taking back 4 positions, not 5 */
        {
            kvc_kvq_cells* tc = NULL;
            CHECK_STATUS(kvc_kvq_cells_new(&cfg, ts, 2, &tc), KVC_OK);
            CHECK_STATUS(kvc_kvq_cells_set_rollback(tc, 2), KVC_OK);
            CHECK_STATUS(kvc_kvq_cells_set_rollback(tc, 1u << 31), KVC_INVALID_ARGUMENT);
            unsigned char* tm[2] = {calloc(NC, mb[0]), calloc(NC, mb[1])};
            for (int32_t p = 0; p < 20; p++) {
                const int32_t s0 = 0;
                const int64_t ci = p;
                CHECK_STATUS(kvc_kvq_cells_begin_ubatch(tc, &p, &s0, &ci, 1), KVC_OK);
                for (uint32_t t = 0; t < 2; t++)
                    CHECK_STATUS(kvc_kvq_cells_write(tc, t, crow, CHV * D, &ci, 1, tm[t], NC * mb[t]), KVC_OK);
            }
            int exact = -1;
            CHECK_STATUS(kvc_kvq_cells_can_truncate(tc, 0, 16, &exact), KVC_OK);
            CHECK(exact == 1);
            CHECK_STATUS(kvc_kvq_cells_can_truncate(tc, 0, 15, &exact), KVC_OK);
            CHECK(exact == 0);
            CHECK_STATUS(kvc_kvq_cells_truncate(tc, -1, 15, &exact), KVC_OK);
            CHECK(exact == 0);
            CHECK_STATUS(kvc_kvq_cells_truncate(tc, 0, 16, &exact), KVC_OK);
            CHECK(exact == 1);
            for (uint32_t c = 16; c < 20; c++) CHECK_STATUS(kvc_kvq_cells_release(tc, c), KVC_OK);
            /* a whole sequence always */
            CHECK_STATUS(kvc_kvq_cells_truncate(tc, 0, 0, &exact), KVC_OK);
            CHECK(exact == 1);
            CHECK_STATUS(kvc_kvq_cells_truncate(tc, 0, 0, NULL), KVC_NULL_ARGUMENT);
            CHECK_STATUS(kvc_kvq_cells_can_truncate(NULL, 0, 0, &exact), KVC_NULL_ARGUMENT);
            free(tm[0]);
            free(tm[1]);
            kvc_kvq_cells_free(tc);
        }
        free(saved);
        free(mains[0]);
        free(mains[1]);
        kvc_kvq_cells_free(cells);
        kvc_kvq_cells_free(back);
    }
    puts("test_kvq: ok");
    return 0;
}
