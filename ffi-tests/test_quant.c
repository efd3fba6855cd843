/* C11: the C8 quantizer handle: config errors, calibration over f16 rows (K and V of
 * different widths) against msmodelslim's formulas, quantize / dequantize / round trip
 * against the scalar formula, the size queries, every error path (NULL, bad dtype,
 * wrong layer or tensor, uncalibrated, too-small buffer, overflowing n_rows, misaligned,
 * NaN), set/get params, and msmodelslim checkpoints: load the Python-written fixture,
 * save and reload, truncated / corrupt / not-C8 / missing files. KVC_C8_FIXTURES is
 * kvc-cache's fixture directory (set by CMake). */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <unistd.h>

#include "check.h"

/* Field by field: the struct has tail padding, which memcmp would compare too. */
static int same_config(const kvc_quant_config* a, const kvc_quant_config* b) {
    return a->n_layers == b->n_layers && a->k_channels == b->k_channels &&
           a->v_channels == b->v_channels && a->symmetric == b->symmetric;
}

static char msg[1024];

#define LAYERS 2
#define KC 192 /* SmolLM2: 3 KV heads x 64 */
#define VC 96  /* V rows narrower than K rows */
#define ROWS 24

static float randf(uint32_t* s) {
    *s = *s * 1664525u + 1013904223u;
    return ((float)(*s >> 8) / 16777216.0f - 0.45f) * 6.0f;
}

/* f32 -> f16 bits through kvc_convert. */
static void to_f16(const float* x, uint16_t* h, size_t n) {
    size_t len = 0;
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F32, x, n, KVC_DTYPE_F16, h, n, &len), KVC_OK);
    CHECK(len == n);
}

static void to_f32(const uint16_t* h, float* x, size_t n) {
    size_t len = 0;
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, h, n, KVC_DTYPE_F32, x, n, &len), KVC_OK);
}

/* msmodelslim's formula, as written: round half to even (the default rounding mode). */
static int8_t q_ref(float x, float s, float o) {
    float v = nearbyintf(x / s + o);
    if (v < -128.0f) v = -128.0f;
    if (v > 127.0f) v = 127.0f;
    return (int8_t)v;
}

static void test_config(void) {
    kvc_quant_config c;
    memset(&c, 0x5a, sizeof c);
    CHECK_STATUS(kvc_quant_config_default(&c), KVC_OK);
    CHECK(c.n_layers == 0 && c.k_channels == 0 && c.v_channels == 0 && c.symmetric == 0);
    CHECK_STATUS(kvc_quant_config_default(NULL), KVC_NULL_ARGUMENT);

    kvc_quant* sentinel = (kvc_quant*)&c;
    kvc_quant* q = sentinel;
    CHECK_STATUS(kvc_quant_new(&c, &q), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "kvc_quant_new: invalid `config.n_layers`: 0") == msg);
    c.n_layers = LAYERS;
    CHECK_STATUS(kvc_quant_new(&c, &q), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "config.k_channels") != NULL);
    c.k_channels = KC;
    CHECK_STATUS(kvc_quant_new(&c, &q), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "config.v_channels") != NULL);
    c.v_channels = VC;
    kvc_quant_config bad = c;
    bad.symmetric = 2;
    CHECK_STATUS(kvc_quant_new(&bad, &q), KVC_INVALID_ARGUMENT);
    bad = c;
    bad.n_layers = KVC_QUANT_MAX_LAYERS + 1;
    CHECK_STATUS(kvc_quant_new(&bad, &q), KVC_INVALID_ARGUMENT);
    bad = c;
    bad.k_channels = SIZE_MAX;
    CHECK_STATUS(kvc_quant_new(&bad, &q), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_quant_new(NULL, &q), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_new(&c, NULL), KVC_NULL_ARGUMENT);
    CHECK(q == sentinel);

    CHECK_STATUS(kvc_quant_new(&c, &q), KVC_OK);
    kvc_quant_config got;
    CHECK_STATUS(kvc_quant_get_config(q, &got), KVC_OK);
    CHECK(same_config(&got, &c));
    CHECK_STATUS(kvc_quant_get_config(q, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_get_config(NULL, &got), KVC_NULL_ARGUMENT);
    kvc_quant_free(q);
    kvc_quant_free(NULL);
}

static float kx[ROWS * KC], vx[ROWS * VC];
static uint16_t kh[ROWS * KC], vh[ROWS * VC];

static void make_rows(void) {
    uint32_t s = 7;
    for (size_t i = 0; i < ROWS * KC; i++) kx[i] = randf(&s);
    for (size_t i = 0; i < ROWS * VC; i++) vx[i] = randf(&s) * 0.25f + 0.5f;
    to_f16(kx, kh, ROWS * KC);
    to_f16(vx, vh, ROWS * VC);
    to_f32(kh, kx, ROWS * KC); /* the values the f16 rows really hold */
    to_f32(vh, vx, ROWS * VC);
}

/* Asymmetric parameters of channel c of `rows` rows of `ch` channels, msmodelslim's way. */
static void asym_ref(const float* x, size_t rows, size_t ch, size_t c, float* s, float* o) {
    float lo = INFINITY, hi = -INFINITY;
    for (size_t r = 0; r < rows; r++) {
        lo = fminf(lo, x[r * ch + c]);
        hi = fmaxf(hi, x[r * ch + c]);
    }
    lo = fminf(lo, 0.0f);
    hi = fmaxf(hi, 0.0f);
    *s = fmaxf((hi - lo) / 255.0f, FLT_EPSILON);
    *o = nearbyintf(-lo / *s) - 128.0f;
}

static kvc_quant* calibrated(void) {
    kvc_quant_config c;
    CHECK_STATUS(kvc_quant_config_default(&c), KVC_OK);
    c.n_layers = LAYERS;
    c.k_channels = KC;
    c.v_channels = VC;
    kvc_quant* q = NULL;
    CHECK_STATUS(kvc_quant_new(&c, &q), KVC_OK);
    /* Layer 0: K in two batches (and an empty one), V in one; layer 1: K only. */
    CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, kh, 10), KVC_OK);
    CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, NULL, 0), KVC_OK);
    CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, kh + 10 * KC, ROWS - 10),
                 KVC_OK);
    CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_V, KVC_DTYPE_F16, vh, ROWS), KVC_OK);
    CHECK_STATUS(kvc_quant_observe_rows(q, 1, KVC_TENSOR_K, KVC_DTYPE_F32, kx, ROWS), KVC_OK);
    CHECK_STATUS(kvc_quant_finish(q), KVC_OK);
    return q;
}

static void test_calibration(void) {
    kvc_quant_config c = {LAYERS, KC, VC, 0};
    kvc_quant* q = NULL;
    CHECK_STATUS(kvc_quant_new(&c, &q), KVC_OK);
    /* Nothing observed yet: finish and every use fail, clearly. */
    CHECK_STATUS(kvc_quant_finish(q), KVC_INVALID_STATE);
    CHECK(strstr(last_error(msg, sizeof msg), "no rows were observed") != NULL);
    uint16_t row[KC];
    memcpy(row, kh, sizeof row);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, row, 1), KVC_INVALID_STATE);
    CHECK(strstr(last_error(msg, sizeof msg), "layer 0 K has no C8 parameters") != NULL);

    /* Observe errors: nothing is recorded. */
    CHECK_STATUS(kvc_quant_observe_rows(NULL, 0, KVC_TENSOR_K, KVC_DTYPE_F16, kh, 1), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, NULL, 1), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_observe_rows(q, LAYERS, KVC_TENSOR_K, KVC_DTYPE_F16, kh, 1),
                 KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "invalid `layer`: 2 is not below") != NULL);
    CHECK_STATUS(kvc_quant_observe_rows(q, 0, 2, KVC_DTYPE_F16, kh, 1), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_K, 9, kh, 1), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_I8, kh, 1), KVC_UNSUPPORTED);
    CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, kh, SIZE_MAX / 64),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, (char*)kh + 1, 1),
                 KVC_INVALID_ARGUMENT);
    uint16_t nan_rows[2 * KC];
    memcpy(nan_rows, kh, sizeof nan_rows);
    nan_rows[KC + 5] = 0x7e00; /* f16 NaN in row 1 */
    CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, nan_rows, 2), KVC_CORRUPT_DATA);
    CHECK(strstr(last_error(msg, sizeof msg), "non-finite value at element 197") != NULL);
    CHECK_STATUS(kvc_quant_finish(q), KVC_INVALID_STATE); /* still nothing observed */
    kvc_quant_free(q);

    q = calibrated();
    /* Layer 0: the asymmetric parameters over all rows, exactly. */
    size_t n = 0;
    CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_K, NULL, NULL, 0, &n), KVC_OK);
    CHECK(n == KC);
    CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_V, NULL, NULL, 0, &n), KVC_OK);
    CHECK(n == VC);
    static float s[KC], o[KC];
    for (int i = 0; i < KC; i++) s[i] = o[i] = -7.0f;
    CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_K, s, o, KC - 1, &n), KVC_BUFFER_TOO_SMALL);
    CHECK(n == KC && s[0] == -7.0f && o[0] == -7.0f);
    CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_K, s, NULL, KC, &n), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_K, s, s + 1, KC - 1, &n), KVC_BUFFER_TOO_SMALL);
    CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_K, s, o, KC, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_K, s, o, KC, &n), KVC_OK);
    CHECK(n == KC);
    for (size_t ch = 0; ch < KC; ch++) {
        float ws, wo;
        asym_ref(kx, ROWS, KC, ch, &ws, &wo);
        CHECK(s[ch] == ws && o[ch] == wo);
    }
    CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_V, s, o, KC, &n), KVC_OK);
    CHECK(n == VC);
    for (size_t ch = 0; ch < VC; ch++) {
        float ws, wo;
        asym_ref(vx, ROWS, VC, ch, &ws, &wo);
        CHECK(s[ch] == ws && o[ch] == wo);
    }
    /* Layer 1 V was never observed. */
    CHECK_STATUS(kvc_quant_get_params(q, 1, KVC_TENSOR_V, s, o, KC, &n), KVC_INVALID_STATE);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 1, KVC_TENSOR_V, KVC_DTYPE_F16, vh, 1), KVC_INVALID_STATE);
    CHECK(strstr(last_error(msg, sizeof msg), "layer 1 V has no C8 parameters") != NULL);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 1, KVC_TENSOR_K, KVC_DTYPE_F16, row, 1), KVC_OK);

    /* A NaN batch after calibration leaves the statistics alone: finish again, same params. */
    CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, nan_rows, 2), KVC_CORRUPT_DATA);
    CHECK_STATUS(kvc_quant_finish(q), KVC_OK);
    static float s2[KC], o2[KC];
    CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_K, s2, o2, KC, &n), KVC_OK);
    float s0[KC], o0[KC];
    for (size_t ch = 0; ch < KC; ch++) asym_ref(kx, ROWS, KC, ch, &s0[ch], &o0[ch]);
    CHECK(memcmp(s2, s0, sizeof s0) == 0 && memcmp(o2, o0, sizeof o0) == 0);
    kvc_quant_free(q);

    /* Symmetric: offsets 0, scale max|x| / 127. */
    kvc_quant_config sc = {1, KC, VC, 1};
    CHECK_STATUS(kvc_quant_new(&sc, &q), KVC_OK);
    CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, kh, ROWS), KVC_OK);
    CHECK_STATUS(kvc_quant_finish(q), KVC_OK);
    CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_K, s, o, KC, &n), KVC_OK);
    for (size_t ch = 0; ch < KC; ch++) {
        float m = 0.0f;
        for (size_t r = 0; r < ROWS; r++) m = fmaxf(m, fabsf(kx[r * KC + ch]));
        CHECK(o[ch] == 0.0f && s[ch] == fmaxf(m / 127.0f, FLT_EPSILON));
    }
    kvc_quant_free(q);
}

static void test_rows(void) {
    kvc_quant* q = calibrated();
    static float s[KC], o[KC];
    size_t n = 0;
    CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_K, s, o, KC, &n), KVC_OK);

    /* quantize: size query, too small, then the formula element by element. */
    static int8_t qi[ROWS * KC + 4];
    size_t len = 0;
    CHECK_STATUS(kvc_quant_quantize_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, kh, ROWS, NULL, 0, &len), KVC_OK);
    CHECK(len == ROWS * KC);
    memset(qi, 0x11, sizeof qi);
    len = 0;
    CHECK_STATUS(kvc_quant_quantize_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, kh, ROWS, qi, ROWS * KC - 1, &len),
                 KVC_BUFFER_TOO_SMALL);
    CHECK(len == ROWS * KC && qi[0] == 0x11);
    CHECK(strstr(last_error(msg, sizeof msg), "`dst` holds 4607 but 4608") != NULL);
    CHECK_STATUS(kvc_quant_quantize_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, kh, ROWS, NULL, 5, &len),
                 KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_quantize_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, kh, ROWS, qi, sizeof qi, NULL),
                 KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_quantize_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, kh, ROWS, (int8_t*)kh + 2,
                                         sizeof qi, &len),
                 KVC_INVALID_ARGUMENT); /* overlaps src */
    CHECK_STATUS(kvc_quant_quantize_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_I8, kh, ROWS, qi, sizeof qi, &len),
                 KVC_UNSUPPORTED);
    CHECK(qi[0] == 0x11);
    CHECK_STATUS(kvc_quant_quantize_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, kh, ROWS, qi, sizeof qi, &len),
                 KVC_OK);
    CHECK(len == ROWS * KC && qi[ROWS * KC] == 0x11);
    for (size_t r = 0; r < ROWS; r++)
        for (size_t ch = 0; ch < KC; ch++) CHECK(qi[r * KC + ch] == q_ref(kx[r * KC + ch], s[ch], o[ch]));

    /* dequantize to f32 (the formula exactly) and to f16. */
    static float back[ROWS * KC];
    CHECK_STATUS(kvc_quant_dequantize_rows(q, 0, KVC_TENSOR_K, qi, ROWS, KVC_DTYPE_F32, NULL, 0, &len), KVC_OK);
    CHECK(len == ROWS * KC);
    CHECK_STATUS(kvc_quant_dequantize_rows(q, 0, KVC_TENSOR_K, qi, ROWS, KVC_DTYPE_F32, back, ROWS * KC - 1,
                                           &len),
                 KVC_BUFFER_TOO_SMALL);
    CHECK_STATUS(kvc_quant_dequantize_rows(q, 0, KVC_TENSOR_K, qi, ROWS, KVC_DTYPE_F32, (char*)back + 2,
                                           ROWS * KC, &len),
                 KVC_INVALID_ARGUMENT); /* misaligned */
    CHECK_STATUS(kvc_quant_dequantize_rows(q, 0, KVC_TENSOR_K, qi, ROWS, KVC_DTYPE_F32, back, ROWS * KC, &len),
                 KVC_OK);
    for (size_t r = 0; r < ROWS; r++)
        for (size_t ch = 0; ch < KC; ch++) {
            float want = ((float)qi[r * KC + ch] - o[ch]) * s[ch];
            CHECK(back[r * KC + ch] == want);
            CHECK(fabsf(back[r * KC + ch] - kx[r * KC + ch]) <= s[ch] * 0.5f + 1e-6f);
        }
    static uint16_t back16[ROWS * KC], want16[ROWS * KC];
    CHECK_STATUS(kvc_quant_dequantize_rows(q, 0, KVC_TENSOR_K, qi, ROWS, KVC_DTYPE_F16, back16, ROWS * KC, &len),
                 KVC_OK);
    to_f16(back, want16, ROWS * KC);
    CHECK(memcmp(back16, want16, sizeof want16) == 0);

    /* round trip in place == quantize then dequantize, bit for bit. */
    static uint16_t data[ROWS * KC];
    memcpy(data, kh, sizeof data);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, data, ROWS), KVC_OK);
    CHECK(memcmp(data, want16, sizeof data) == 0);
    CHECK(strcmp(last_error(msg, sizeof msg), "") == 0);

    /* round trip errors: nothing written. */
    memcpy(data, kh, sizeof data);
    CHECK_STATUS(kvc_quant_roundtrip_rows(NULL, 0, KVC_TENSOR_K, KVC_DTYPE_F16, data, ROWS), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, NULL, ROWS), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 0, KVC_TENSOR_K, 4, data, ROWS), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "`dtype`: 4 is not a kvc_dtype") != NULL);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_I8, data, ROWS), KVC_UNSUPPORTED);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, LAYERS, KVC_TENSOR_K, KVC_DTYPE_F16, data, ROWS),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 0, 7, KVC_DTYPE_F16, data, ROWS), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "KVC_TENSOR_K (0) or KVC_TENSOR_V (1)") != NULL);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, data, SIZE_MAX / 100),
                 KVC_INVALID_ARGUMENT); /* n_rows * channels overflows */
    CHECK(strstr(last_error(msg, sizeof msg), "overflows size_t") != NULL);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, data, SIZE_MAX / KC / 2),
                 KVC_INVALID_ARGUMENT); /* bytes beyond PTRDIFF_MAX */
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, (char*)data + 1, 1),
                 KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "not aligned to 2 bytes") != NULL);
    CHECK(memcmp(data, kh, sizeof data) == 0);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, NULL, 0), KVC_OK);

    /* V rows are 96 wide: a batch of V rows as f32, through the same handle. */
    static float vdata[ROWS * VC];
    memcpy(vdata, vx, sizeof vdata);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 0, KVC_TENSOR_V, KVC_DTYPE_F32, vdata, ROWS), KVC_OK);
    CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_V, s, o, KC, &n), KVC_OK);
    for (size_t r = 0; r < ROWS; r++)
        for (size_t ch = 0; ch < VC; ch++) {
            float want = ((float)q_ref(vx[r * VC + ch], s[ch], o[ch]) - o[ch]) * s[ch];
            CHECK(vdata[r * VC + ch] == want);
        }
    kvc_quant_free(q);
}

static void test_set_params(void) {
    kvc_quant_config c = {3, 4, 2, 1};
    kvc_quant* q = NULL;
    CHECK_STATUS(kvc_quant_new(&c, &q), KVC_OK);
    const float s[4] = {0.5f, 0.25f, 1.0f, 2.0f}, o[4] = {0.0f, 3.0f, -2.0f, 0.0f};
    CHECK_STATUS(kvc_quant_set_params(q, 2, KVC_TENSOR_K, s, o, 3), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "layer 2 K rows have 4 channels") != NULL);
    const float zero[4] = {0.5f, 0.0f, 1.0f, 1.0f}, nan[4] = {0.0f, NAN, 0.0f, 0.0f};
    CHECK_STATUS(kvc_quant_set_params(q, 2, KVC_TENSOR_K, zero, o, 4), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "invalid `scale`: element 1") != NULL);
    CHECK_STATUS(kvc_quant_set_params(q, 2, KVC_TENSOR_K, s, nan, 4), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "invalid `offset`: element 1") != NULL);
    CHECK_STATUS(kvc_quant_set_params(q, 3, KVC_TENSOR_K, s, o, 4), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_quant_set_params(q, 2, KVC_TENSOR_K, NULL, o, 4), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_set_params(NULL, 2, KVC_TENSOR_K, s, o, 4), KVC_NULL_ARGUMENT);
    float gs[4], go[4];
    size_t n = 0;
    CHECK_STATUS(kvc_quant_get_params(q, 2, KVC_TENSOR_K, gs, go, 4, &n),
                 KVC_INVALID_STATE); /* none of those calls set anything */
    CHECK_STATUS(kvc_quant_set_params(q, 2, KVC_TENSOR_K, s, o, 4), KVC_OK);
    CHECK_STATUS(kvc_quant_get_params(q, 2, KVC_TENSOR_K, gs, go, 4, &n), KVC_OK);
    CHECK(n == 4 && memcmp(gs, s, sizeof s) == 0 && memcmp(go, o, sizeof o) == 0);
    /* x = 1.3 in channel 1: round(1.3 / 0.25 + 3) = 8 -> (8 - 3) * 0.25 = 1.25. */
    float row[4] = {100.0f, 1.3f, -1.0f, -300.0f};
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 2, KVC_TENSOR_K, KVC_DTYPE_F32, row, 1), KVC_OK);
    CHECK(row[0] == 63.5f && row[1] == 1.25f && row[2] == -1.0f && row[3] == -256.0f);
    kvc_quant_free(q);
}

/* ---- msmodelslim checkpoints ---- */

static void copy_file(const char* from, const char* to, long keep) {
    FILE* f = fopen(from, "rb");
    CHECK(f != NULL);
    static unsigned char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    CHECK(n > 0 && n < sizeof buf);
    fclose(f);
    if (keep >= 0 && (size_t)keep < n) n = (size_t)keep;
    f = fopen(to, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(buf, 1, n, f) == n);
    fclose(f);
}

static void write_text(const char* path, const char* text) {
    FILE* f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fputs(text, f) >= 0);
    fclose(f);
}

static void test_msmodelslim(void) {
    char fixture[1024], desc[1200], weights[1200];
    snprintf(fixture, sizeof fixture, "%s/llama_f16_sym", KVC_C8_FIXTURES);
    snprintf(desc, sizeof desc, "%s/quant_model_description.json", fixture);
    snprintf(weights, sizeof weights, "%s/quant_model_weight.safetensors", fixture);

    kvc_quant* q = NULL;
    CHECK_STATUS(kvc_quant_new_from_msmodelslim(fixture, &q), KVC_OK);
    kvc_quant_config c;
    CHECK_STATUS(kvc_quant_get_config(q, &c), KVC_OK);
    CHECK(c.n_layers == 3 && c.k_channels == 192 && c.v_channels == 192 && c.symmetric == 1);
    static float s[192], o[192];
    size_t n = 0;
    CHECK_STATUS(kvc_quant_get_params(q, 2, KVC_TENSOR_V, s, o, 192, &n), KVC_OK);
    CHECK(n == 192 && s[0] > 0.0f && o[0] == 0.0f);
    static uint16_t data[4 * 192];
    memcpy(data, kh, sizeof data);
    CHECK_STATUS(kvc_quant_roundtrip_rows(q, 1, KVC_TENSOR_K, KVC_DTYPE_F16, data, 4), KVC_OK);

    char tmpl[] = "/tmp/kvc_test_quant_XXXXXX";
    char* dir = mkdtemp(tmpl);
    CHECK(dir != NULL);
    char out[256], d2[300], w2[300];
    snprintf(out, sizeof out, "%s/saved", dir);
    snprintf(d2, sizeof d2, "%s/quant_model_description.json", out);
    snprintf(w2, sizeof w2, "%s/quant_model_weight.safetensors", out);

    /* Save as f32 and load back: the same parameters. */
    CHECK_STATUS(kvc_quant_save_msmodelslim(q, out, KVC_DTYPE_I8), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_quant_save_msmodelslim(q, NULL, KVC_DTYPE_F32), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_save_msmodelslim(NULL, out, KVC_DTYPE_F32), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_save_msmodelslim(q, out, KVC_DTYPE_F32), KVC_OK);
    kvc_quant* r = NULL;
    CHECK_STATUS(kvc_quant_new_from_msmodelslim(out, &r), KVC_OK);
    kvc_quant_config rc;
    CHECK_STATUS(kvc_quant_get_config(r, &rc), KVC_OK);
    CHECK(same_config(&rc, &c));
    for (size_t layer = 0; layer < 3; layer++)
        for (kvc_tensor t = KVC_TENSOR_K; t <= KVC_TENSOR_V; t++) {
            static float s1[192], o1[192], s2[192], o2[192];
            CHECK_STATUS(kvc_quant_get_params(q, layer, t, s1, o1, 192, &n), KVC_OK);
            CHECK_STATUS(kvc_quant_get_params(r, layer, t, s2, o2, 192, &n), KVC_OK);
            CHECK(memcmp(s1, s2, sizeof s1) == 0 && memcmp(o1, o2, sizeof o1) == 0);
        }
    kvc_quant_free(r);

    /* Broken checkpoints. Every failure leaves *out alone. */
    kvc_quant* sentinel = (kvc_quant*)&c;
    r = sentinel;
    CHECK_STATUS(kvc_quant_new_from_msmodelslim("/nonexistent/kvc/c8", &r), KVC_IO);
    CHECK(strstr(last_error(msg, sizeof msg), "kvc_quant_new_from_msmodelslim: ") == msg);
    CHECK_STATUS(kvc_quant_new_from_msmodelslim(NULL, &r), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_quant_new_from_msmodelslim(fixture, NULL), KVC_NULL_ARGUMENT);
    /* truncated weights, at many cut points */
    for (long cut = 0; cut < 6016; cut += 377) {
        copy_file(weights, w2, cut);
        CHECK_STATUS(kvc_quant_new_from_msmodelslim(out, &r), KVC_CORRUPT_DATA);
    }
    /* a corrupt header length (first 8 bytes) */
    copy_file(weights, w2, -1);
    FILE* f = fopen(w2, "r+b");
    CHECK(f != NULL);
    const unsigned char huge[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    CHECK(fwrite(huge, 1, 8, f) == 8);
    fclose(f);
    CHECK_STATUS(kvc_quant_new_from_msmodelslim(out, &r), KVC_CORRUPT_DATA);
    copy_file(weights, w2, -1);
    CHECK_STATUS(kvc_quant_new_from_msmodelslim(out, &r), KVC_OK); /* repaired */
    kvc_quant_free(r);
    r = sentinel;
    write_text(d2, "{\"kv_cache_type\": \"C4\"}");
    CHECK_STATUS(kvc_quant_new_from_msmodelslim(out, &r), KVC_UNSUPPORTED);
    CHECK(strstr(last_error(msg, sizeof msg), "not a C8") != NULL);
    write_text(d2, "{\"kv_cache_type\": ");
    CHECK_STATUS(kvc_quant_new_from_msmodelslim(out, &r), KVC_CORRUPT_DATA);
    CHECK(remove(d2) == 0);
    CHECK_STATUS(kvc_quant_new_from_msmodelslim(out, &r), KVC_IO);
    CHECK(r == sentinel);
    copy_file(desc, d2, -1);

    /* Saving what cannot be a checkpoint. */
    kvc_quant_config pc = {2, 4, 4, 0};
    kvc_quant* p = NULL;
    CHECK_STATUS(kvc_quant_new(&pc, &p), KVC_OK);
    CHECK_STATUS(kvc_quant_save_msmodelslim(p, out, KVC_DTYPE_F16), KVC_INVALID_STATE);
    const float ps[4] = {1, 1, 1, 1}, po[4] = {0, 0, 0, 0};
    CHECK_STATUS(kvc_quant_set_params(p, 1, KVC_TENSOR_K, ps, po, 4), KVC_OK);
    CHECK_STATUS(kvc_quant_save_msmodelslim(p, out, KVC_DTYPE_F16), KVC_INVALID_STATE);
    CHECK(strstr(last_error(msg, sizeof msg), "layer 1 has K parameters but no V") != NULL);
    CHECK_STATUS(kvc_quant_set_params(p, 1, KVC_TENSOR_V, ps, po, 4), KVC_OK);
    CHECK_STATUS(kvc_quant_save_msmodelslim(p, out, KVC_DTYPE_BF16), KVC_OK);
    /* Layer 0 had no parameters: the reloaded quantizer has 2 layers, layer 0 empty. */
    CHECK_STATUS(kvc_quant_new_from_msmodelslim(out, &r), KVC_OK);
    CHECK_STATUS(kvc_quant_get_config(r, &rc), KVC_OK);
    CHECK(rc.n_layers == 2 && rc.k_channels == 4 && rc.symmetric == 1);
    CHECK_STATUS(kvc_quant_get_params(r, 0, KVC_TENSOR_K, s, o, 4, &n), KVC_INVALID_STATE);
    kvc_quant_free(r);
    kvc_quant_free(p);

    CHECK(remove(d2) == 0 && remove(w2) == 0 && rmdir(out) == 0 && rmdir(dir) == 0);
    kvc_quant_free(q);
}

/* ABI 0.5: RoPE-aware K calibration (kvc_quant_set_rope). K of each layer gets the
 * symmetric scale max_radius / 127 for both channels of a rotated pair, V keeps the
 * per-channel asymmetric rule; a K row rotated by any angle never clips. */
static void test_rope(void) {
    const size_t hd = 64, half = 32;
    for (kvc_rope_style style = KVC_ROPE_NORM; style <= KVC_ROPE_NEOX; style++) {
        kvc_quant_config c = {LAYERS, KC, VC, 0};
        kvc_quant* q = NULL;
        CHECK_STATUS(kvc_quant_new(&c, &q), KVC_OK);
        /* Errors change nothing. */
        CHECK_STATUS(kvc_quant_set_rope(NULL, hd, style), KVC_NULL_ARGUMENT);
        CHECK_STATUS(kvc_quant_set_rope(q, 0, style), KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_quant_set_rope(q, 63, style), KVC_INVALID_ARGUMENT);
        CHECK(strstr(last_error(msg, sizeof msg), "even") != NULL);
        CHECK_STATUS(kvc_quant_set_rope(q, 128, style), KVC_INVALID_ARGUMENT);
        CHECK(strstr(last_error(msg, sizeof msg), "divide") != NULL);
        CHECK_STATUS(kvc_quant_set_rope(q, hd, 2), KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_quant_set_rope(q, hd, style), KVC_OK);
        CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F16, kh, 10), KVC_OK);
        CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F32, kx + 10 * KC, ROWS - 10),
                     KVC_OK);
        CHECK_STATUS(kvc_quant_observe_rows(q, 0, KVC_TENSOR_V, KVC_DTYPE_F16, vh, ROWS), KVC_OK);
        /* Too late once K rows were observed. */
        CHECK_STATUS(kvc_quant_set_rope(q, hd, style), KVC_INVALID_STATE);
        CHECK(strstr(last_error(msg, sizeof msg), "before the first") != NULL);
        CHECK_STATUS(kvc_quant_finish(q), KVC_OK);

        float s[KC], o[KC];
        size_t n = 0;
        CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_K, s, o, KC, &n), KVC_OK);
        CHECK(n == KC);
        for (size_t h = 0; h < KC / hd; h++) {
            for (size_t i = 0; i < half; i++) {
                size_t a = h * hd + (style == KVC_ROPE_NORM ? 2 * i : i);
                size_t b = style == KVC_ROPE_NORM ? a + 1 : a + half;
                float r2 = 0.0f;
                for (size_t r = 0; r < ROWS; r++) {
                    float x = kx[r * KC + a], y = kx[r * KC + b];
                    r2 = fmaxf(r2, x * x + y * y);
                }
                float want = sqrtf(r2) / 127.0f;
                CHECK(s[a] == s[b] && o[a] == 0.0f && o[b] == 0.0f);
                CHECK(fabsf(s[a] - want) <= want * 1e-5f);
                /* Every observed row rotated by any angle: within half a step. */
                for (size_t r = 0; r < ROWS; r++) {
                    for (int k = 0; k < 16; k++) {
                        float th = 0.4f * (float)k, sn = sinf(th), cs = cosf(th);
                        float x = kx[r * KC + a], y = kx[r * KC + b];
                        float u = x * cs - y * sn, v = x * sn + y * cs;
                        CHECK(fabsf((float)q_ref(u, s[a], 0.0f) * s[a] - u) <= s[a] * 0.5001f);
                        CHECK(fabsf((float)q_ref(v, s[b], 0.0f) * s[b] - v) <= s[b] * 0.5001f);
                    }
                }
            }
        }
        /* V: the per-channel asymmetric rule, unchanged. */
        float vs[VC], vo[VC];
        CHECK_STATUS(kvc_quant_get_params(q, 0, KVC_TENSOR_V, vs, vo, VC, &n), KVC_OK);
        for (size_t ch = 0; ch < VC; ch++) {
            float rs, ro;
            asym_ref(vx, ROWS, VC, ch, &rs, &ro);
            CHECK(vs[ch] == rs && vo[ch] == ro);
        }
        /* Layer 1 was not observed: still uncalibrated. */
        CHECK_STATUS(kvc_quant_get_params(q, 1, KVC_TENSOR_K, s, o, KC, &n), KVC_INVALID_STATE);
        kvc_quant_free(q);
    }
}

int main(void) {
    make_rows();
    test_config();
    test_calibration();
    test_rows();
    test_set_params();
    test_msmodelslim();
    test_rope();
    puts("test_quant: ok");
    return 0;
}
