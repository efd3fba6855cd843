/* C11: the cache view handle: config errors, sizes, compaction of a llama.cpp layer (V
 * transposed) by hand-written pairs and by an H2O plan fed straight from
 * kvc_h2o_plan_pairs, per-KV-head compaction of an InfiniLM [H, S_max, D] layer by a
 * per-head H2O plan, an MNN packed layer, zeroing, and every error path (nothing changes
 * on failure). */
#include <stdint.h>

#include "check.h"

static char msg[1024];

#define H 2
#define D 4
#define C (H * D)
#define CAP 2048

static kvc_cache* make_cache(uint32_t layout, size_t capacity, uint32_t v_trans) {
    kvc_cache_config c;
    CHECK_STATUS(kvc_cache_config_default(&c), KVC_OK);
    c.layout = layout;
    c.n_kv_heads = H;
    c.head_dim_k = D;
    c.capacity = capacity;
    c.v_trans = v_trans;
    kvc_cache* cache = NULL;
    CHECK_STATUS(kvc_cache_new(&c, &cache), KVC_OK);
    return cache;
}

static void test_config(void) {
    kvc_cache_config c;
    memset(&c, 0x5a, sizeof c);
    CHECK_STATUS(kvc_cache_config_default(&c), KVC_OK);
    CHECK(c.layout == KVC_CACHE_LAYOUT_LLAMA && c.dtype == KVC_DTYPE_F16 && c.n_kv_heads == 0 &&
          c.head_dim_k == 0 && c.head_dim_v == 0 && c.capacity == 0 && c.v_trans == 0 && c.mnn_hp == 0 &&
          c.mnn_lp == 0 && c.mnn_flash_block == 0);
    CHECK_STATUS(kvc_cache_config_default(NULL), KVC_NULL_ARGUMENT);

    kvc_cache* sentinel = (kvc_cache*)&c;
    kvc_cache* cache = sentinel;
    CHECK_STATUS(kvc_cache_new(&c, &cache), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "kvc_cache_new: invalid `config.n_kv_heads`") == msg);
    c.n_kv_heads = H;
    c.head_dim_k = D;
    c.capacity = 16;
    kvc_cache_config bad = c;
    bad.layout = 3;
    CHECK_STATUS(kvc_cache_new(&bad, &cache), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "config.layout") != NULL);
    bad = c;
    bad.dtype = 9;
    CHECK_STATUS(kvc_cache_new(&bad, &cache), KVC_INVALID_ARGUMENT);
    bad = c;
    bad.v_trans = 2;
    CHECK_STATUS(kvc_cache_new(&bad, &cache), KVC_INVALID_ARGUMENT);
    bad = c;
    bad.mnn_hp = 4;
    CHECK_STATUS(kvc_cache_new(&bad, &cache), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "only used by KVC_CACHE_LAYOUT_MNN") != NULL);
    bad = c;
    bad.layout = KVC_CACHE_LAYOUT_INFINILM;
    bad.head_dim_v = D + 1;
    CHECK_STATUS(kvc_cache_new(&bad, &cache), KVC_INVALID_ARGUMENT);
    bad.head_dim_v = 0;
    bad.v_trans = 1;
    CHECK_STATUS(kvc_cache_new(&bad, &cache), KVC_INVALID_ARGUMENT);
    bad = c;
    bad.layout = KVC_CACHE_LAYOUT_MNN;
    CHECK_STATUS(kvc_cache_new(&bad, &cache), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "config.mnn_hp") != NULL);
    bad = c;
    bad.n_kv_heads = SIZE_MAX / 2;
    CHECK_STATUS(kvc_cache_new(&bad, &cache), KVC_INVALID_ARGUMENT);
    bad = c;
    bad.capacity = SIZE_MAX / 4; /* elements fit, bytes do not */
    CHECK_STATUS(kvc_cache_new(&bad, &cache), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "overflow") != NULL);
    CHECK_STATUS(kvc_cache_new(NULL, &cache), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_cache_new(&c, NULL), KVC_NULL_ARGUMENT);
    CHECK(cache == sentinel);

    /* llama.cpp with different K and V head sizes (n_embd_head_k != n_embd_head_v). */
    c.head_dim_v = 6;
    c.dtype = KVC_DTYPE_F32;
    CHECK_STATUS(kvc_cache_new(&c, &cache), KVC_OK);
    kvc_cache_info info;
    CHECK_STATUS(kvc_cache_get_info(cache, &info), KVC_OK);
    CHECK(info.dtype == KVC_DTYPE_F32 && info.capacity == 16 && info.n_kv_heads == H);
    CHECK(info.k_channels == H * D && info.v_channels == H * 6);
    CHECK(info.k_bytes == 16 * H * D * 4 && info.v_bytes == 16 * H * 6 * 4);
    CHECK(info.layer_bytes == info.k_bytes + info.v_bytes && info.token_bytes == (H * D + H * 6) * 4);
    CHECK_STATUS(kvc_cache_get_info(cache, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_cache_get_info(NULL, &info), KVC_NULL_ARGUMENT);
    kvc_cache_free(cache);
    kvc_cache_free(NULL);
}

/* llama.cpp layer: K rows [cap][C], V transposed [C][cap]; element values name (t, c). */
static uint16_t kbuf[CAP * C], vbuf[C * CAP], k0[CAP * C], v0[C * CAP];

static uint16_t kval(size_t t, size_t c) { return (uint16_t)(t * C + c); }
static uint16_t vval(size_t t, size_t c) { return (uint16_t)(0x4000 + t * C + c); }

static void fill_llama(void) {
    for (size_t t = 0; t < CAP; t++)
        for (size_t c = 0; c < C; c++) {
            kbuf[t * C + c] = kval(t, c);
            vbuf[c * CAP + t] = vval(t, c);
        }
    memcpy(k0, kbuf, sizeof kbuf);
    memcpy(v0, vbuf, sizeof vbuf);
}

/* Token i of the compacted layer is old token `from[i]`. */
static void check_llama(const size_t* from, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < C; c++) {
            CHECK(kbuf[i * C + c] == kval(from[i], c));
            CHECK(vbuf[c * CAP + i] == vval(from[i], c));
        }
}

static size_t expand(const kvc_reserve_pair* pairs, size_t n_pairs, size_t* from) {
    size_t n = 0;
    for (size_t p = 0; p < n_pairs; p++)
        for (uint32_t j = 0; j < pairs[p].length; j++) from[n++] = pairs[p].offset + j;
    return n;
}

static void test_compact_llama(void) {
    kvc_cache* cache = make_cache(KVC_CACHE_LAYOUT_LLAMA, CAP, 1);
    fill_llama();
    size_t new_len = 777;

    /* Errors first: nothing changes. */
    const kvc_reserve_pair unsorted[2] = {{5, 3}, {0, 2}};
    const kvc_reserve_pair past[1] = {{8, 3}};
    const kvc_reserve_pair empty[1] = {{2, 0}};
    const kvc_reserve_pair good[2] = {{0, 2}, {5, 3}};
    CHECK_STATUS(kvc_cache_compact_layer(cache, kbuf, vbuf, unsorted, 2, 10, &new_len), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "sorted and disjoint") != NULL);
    CHECK_STATUS(kvc_cache_compact_layer(cache, kbuf, vbuf, past, 1, 10, &new_len), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_cache_compact_layer(cache, kbuf, vbuf, empty, 1, 10, &new_len), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_cache_compact_layer(cache, kbuf, vbuf, good, 2, CAP + 1, &new_len), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "exceed the cache's capacity 2048") != NULL);
    CHECK_STATUS(kvc_cache_compact_layer(cache, kbuf, kbuf + 8, good, 2, 10, &new_len),
                 KVC_INVALID_ARGUMENT); /* K and V overlap */
    CHECK_STATUS(kvc_cache_compact_layer(cache, (char*)kbuf + 1, vbuf, good, 2, 10, &new_len),
                 KVC_INVALID_ARGUMENT); /* misaligned */
    CHECK_STATUS(kvc_cache_compact_layer(cache, NULL, vbuf, good, 2, 10, &new_len), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_cache_compact_layer(cache, kbuf, NULL, good, 2, 10, &new_len), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_cache_compact_layer(cache, kbuf, vbuf, NULL, 2, 10, &new_len), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_cache_compact_layer(cache, kbuf, vbuf, good, SIZE_MAX, 10, &new_len),
                 KVC_INVALID_ARGUMENT); /* a pair count no buffer can hold */
    CHECK_STATUS(kvc_cache_compact_layer(cache, kbuf, vbuf, good, 2, 10, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_cache_compact_layer(NULL, kbuf, vbuf, good, 2, 10, &new_len), KVC_NULL_ARGUMENT);
    CHECK(new_len == 777 && memcmp(kbuf, k0, sizeof kbuf) == 0 && memcmp(vbuf, v0, sizeof vbuf) == 0);

    CHECK_STATUS(kvc_cache_compact_layer(cache, kbuf, vbuf, good, 2, 10, &new_len), KVC_OK);
    CHECK(new_len == 5);
    const size_t from[5] = {0, 1, 5, 6, 7};
    check_llama(from, 5);
    /* Tokens past the old length are untouched. */
    CHECK(memcmp(kbuf + 10 * C, k0 + 10 * C, sizeof(uint16_t) * (CAP - 10) * C) == 0);
    /* No pairs: everything dropped. */
    CHECK_STATUS(kvc_cache_compact_layer(cache, kbuf, vbuf, NULL, 0, 5, &new_len), KVC_OK);
    CHECK(new_len == 0);
    kvc_cache_free(cache);
}

/* An H2O plan goes straight from kvc_h2o_plan_pairs into kvc_cache_compact_layer. */
static void test_h2o_plan_feeds_compaction(void) {
    kvc_cache* cache = make_cache(KVC_CACHE_LAYOUT_LLAMA, CAP, 1);
    fill_llama();
    kvc_h2o_config hc;
    CHECK_STATUS(kvc_h2o_config_default(&hc), KVC_OK);
    kvc_h2o* h2o = NULL;
    CHECK_STATUS(kvc_h2o_new(&hc, 1, &h2o), KVC_OK);
    kvc_h2o_call_shape shape = {CAP, 1, H, H};
    static float probs[H * CAP];
    for (size_t i = 0; i < H * CAP; i++) probs[i] = (i % 97 == 0) ? 0.05f : 0.5f / CAP;
    CHECK_STATUS(kvc_h2o_begin_call(h2o, 0, &shape, NULL), KVC_OK);
    CHECK_STATUS(kvc_h2o_ingest_probabilities(h2o, 0, probs, H * CAP), KVC_OK);
    kvc_h2o_decision d;
    CHECK_STATUS(kvc_h2o_end_call(h2o, 0, &d), KVC_OK);
    CHECK(d.triggered == 1 && d.kept_tokens < CAP);

    size_t n_pairs = 0;
    CHECK_STATUS(kvc_h2o_plan_pairs(h2o, 0, 0, NULL, 0, &n_pairs), KVC_OK);
    kvc_reserve_pair* pairs = malloc(sizeof *pairs * n_pairs);
    CHECK(pairs != NULL);
    CHECK_STATUS(kvc_h2o_plan_pairs(h2o, 0, 0, pairs, n_pairs, &n_pairs), KVC_OK);

    size_t new_len = 0;
    CHECK_STATUS(kvc_cache_compact_layer(cache, kbuf, vbuf, pairs, n_pairs, d.kv_len, &new_len), KVC_OK);
    CHECK(new_len == d.kept_tokens);
    static size_t from[CAP];
    CHECK(expand(pairs, n_pairs, from) == new_len);
    check_llama(from, new_len);

    /* The engine now holds kept + 1 tokens: the policy sees the plan applied. */
    shape.kv_len = new_len + 1;
    uint32_t res = 0;
    CHECK_STATUS(kvc_h2o_begin_call(h2o, 0, &shape, &res), KVC_OK);
    CHECK(res == KVC_H2O_PLAN_APPLIED);
    free(pairs);
    kvc_h2o_free(h2o);
    kvc_cache_free(cache);
}

/* InfiniLM [H, ICAP, D]; a per-KV-head H2O plan compacts each head by its own pairs. Long
 * enough that the plan keeps heavy blocks beyond the protected sink and recent tokens. */
#define ICAP 4096
static uint16_t ik[H * ICAP * D], iv[H * ICAP * D], k0c[H * ICAP * D], v0c[H * ICAP * D];

static uint16_t ival(size_t h, size_t t, size_t d) { return (uint16_t)((t * H + h) * D + d); }

static void test_compact_heads(void) {
    kvc_cache* cache = make_cache(KVC_CACHE_LAYOUT_INFINILM, ICAP, 0);
    for (size_t h = 0; h < H; h++)
        for (size_t t = 0; t < ICAP; t++)
            for (size_t d = 0; d < D; d++) {
                ik[(h * ICAP + t) * D + d] = ival(h, t, d);
                iv[(h * ICAP + t) * D + d] = (uint16_t)(ival(h, t, d) ^ 0x8000u);
            }

    kvc_h2o_config hc;
    CHECK_STATUS(kvc_h2o_config_default(&hc), KVC_OK);
    hc.granularity = KVC_H2O_SCORES_PER_KV_HEAD;
    kvc_h2o* h2o = NULL;
    CHECK_STATUS(kvc_h2o_new(&hc, 1, &h2o), KVC_OK);
    kvc_h2o_call_shape shape = {ICAP, 1, H, H};
    static float probs[H * ICAP];
    for (size_t t = 0; t < ICAP; t++) {
        /* head 0 attends to tokens 128..1023, head 1 to 1920..2815 */
        probs[t] = (t >= 128 && t < 1024) ? 4.0f / ICAP : 0.5f / ICAP;
        probs[ICAP + t] = (t >= 1920 && t < 2816) ? 4.0f / ICAP : 0.5f / ICAP;
    }
    CHECK_STATUS(kvc_h2o_begin_call(h2o, 0, &shape, NULL), KVC_OK);
    CHECK_STATUS(kvc_h2o_ingest_probabilities(h2o, 0, probs, H * ICAP), KVC_OK);
    kvc_h2o_decision d;
    CHECK_STATUS(kvc_h2o_end_call(h2o, 0, &d), KVC_OK);
    CHECK(d.triggered == 1);
    kvc_h2o_plan_info info;
    CHECK_STATUS(kvc_h2o_get_plan_info(h2o, 0, &info), KVC_OK);
    CHECK(info.n_groups == H);

    /* Every head's pairs back to back, with the per-head counts. */
    static kvc_reserve_pair pairs[2 * ICAP];
    size_t counts[H], n_pairs = 0;
    for (size_t h = 0; h < H; h++) {
        CHECK_STATUS(kvc_h2o_plan_pairs(h2o, 0, h, pairs + n_pairs, 2 * ICAP - n_pairs, &counts[h]), KVC_OK);
        n_pairs += counts[h];
    }
    static size_t from[H][ICAP];
    size_t kept0 = expand(pairs, counts[0], from[0]);
    size_t kept1 = expand(pairs + counts[0], counts[1], from[1]);
    CHECK(kept0 == info.kept_tokens && kept1 == kept0);
    CHECK(memcmp(from[0], from[1], sizeof(size_t) * kept0) != 0); /* the heads differ */

    memcpy(k0c, ik, sizeof ik);
    memcpy(v0c, iv, sizeof iv);
    size_t new_len = 999;
    size_t wrong[H] = {counts[0], counts[1] + 1};
    CHECK_STATUS(kvc_cache_compact_heads(cache, ik, iv, pairs, n_pairs, wrong, H, ICAP, &new_len),
                 KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "do not add up to n_pairs") != NULL);
    size_t huge[H] = {SIZE_MAX, 2};
    CHECK_STATUS(kvc_cache_compact_heads(cache, ik, iv, pairs, n_pairs, huge, H, ICAP, &new_len),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_cache_compact_heads(cache, ik, iv, pairs, n_pairs, counts, H - 1, ICAP, &new_len),
                 KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "the cache has 2 KV heads") != NULL);
    CHECK_STATUS(kvc_cache_compact_heads(cache, ik, iv, pairs, n_pairs, NULL, H, ICAP, &new_len),
                 KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_cache_compact_heads(cache, ik, iv, pairs, n_pairs, counts, H, ICAP + 1, &new_len),
                 KVC_INVALID_ARGUMENT);
    const kvc_reserve_pair uneven[2] = {{0, 4}, {0, 3}};
    const size_t one_each[H] = {1, 1};
    CHECK_STATUS(kvc_cache_compact_heads(cache, ik, iv, uneven, 2, one_each, H, ICAP, &new_len),
                 KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "tokens kept per head") != NULL);
    CHECK(new_len == 999 && memcmp(ik, k0c, sizeof ik) == 0 && memcmp(iv, v0c, sizeof iv) == 0);

    CHECK_STATUS(kvc_cache_compact_heads(cache, ik, iv, pairs, n_pairs, counts, H, ICAP, &new_len), KVC_OK);
    CHECK(new_len == kept0);
    for (size_t h = 0; h < H; h++)
        for (size_t i = 0; i < new_len; i++)
            for (size_t dd = 0; dd < D; dd++) {
                CHECK(ik[(h * ICAP + i) * D + dd] == ival(h, from[h][i], dd));
                CHECK(iv[(h * ICAP + i) * D + dd] == (uint16_t)(ival(h, from[h][i], dd) ^ 0x8000u));
            }
    kvc_h2o_free(h2o);
    kvc_cache_free(cache);
}

/* MNN packed key (hP 4, lP 2), flash attention off: MNN's keyIndex, element by element. */
#define MCAP 10
static size_t mnn_key(size_t h, size_t t, size_t d) {
    const size_t hp = 4, lp = 2;
    const size_t head = ((MCAP + hp - 1) / hp) * hp * ((D + lp - 1) / lp) * lp;
    return h * head + (t / hp) * ((D + lp - 1) / lp) * lp * hp + (d / lp) * hp * lp + (t % hp) * lp + d % lp;
}

static void test_mnn(void) {
    kvc_cache_config c;
    CHECK_STATUS(kvc_cache_config_default(&c), KVC_OK);
    c.layout = KVC_CACHE_LAYOUT_MNN;
    c.dtype = KVC_DTYPE_F32;
    c.n_kv_heads = H;
    c.head_dim_k = D;
    c.capacity = MCAP;
    c.mnn_hp = 4;
    c.mnn_lp = 2;
    kvc_cache* cache = NULL;
    CHECK_STATUS(kvc_cache_new(&c, &cache), KVC_OK);
    kvc_cache_info info;
    CHECK_STATUS(kvc_cache_get_info(cache, &info), KVC_OK);
    /* K: ceil(10/4)*4 rows x ceil(4/2)*2 dims per head; V: ceil(4/4)*4 x ceil(10/2)*2. */
    CHECK(info.k_bytes == H * 12 * 4 * 4 && info.v_bytes == H * 4 * 10 * 4);
    float k[H * 12 * 4], v[H * 4 * 10];
    memset(k, 0, sizeof k);
    memset(v, 0, sizeof v);
    for (size_t h = 0; h < H; h++)
        for (size_t t = 0; t < MCAP; t++)
            for (size_t d = 0; d < D; d++) k[mnn_key(h, t, d)] = (float)(t * 100 + h * 10 + d + 1);
    const kvc_reserve_pair pairs[2] = {{1, 2}, {6, 3}};
    size_t new_len = 0;
    CHECK_STATUS(kvc_cache_compact_layer(cache, k, v, pairs, 2, 9, &new_len), KVC_OK);
    CHECK(new_len == 5);
    const size_t from[5] = {1, 2, 6, 7, 8};
    for (size_t h = 0; h < H; h++)
        for (size_t i = 0; i < 5; i++)
            for (size_t d = 0; d < D; d++) CHECK(k[mnn_key(h, i, d)] == (float)(from[i] * 100 + h * 10 + d + 1));
    kvc_cache_free(cache);
}

static void test_zero(void) {
    kvc_cache* cache = make_cache(KVC_CACHE_LAYOUT_LLAMA, CAP, 1);
    fill_llama();
    CHECK_STATUS(kvc_cache_zero_tokens(cache, kbuf, vbuf, 5, 3), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_cache_zero_tokens(cache, kbuf, vbuf, 3, CAP + 1), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "not a range inside the capacity 2048") != NULL);
    CHECK_STATUS(kvc_cache_zero_tokens(cache, kbuf, NULL, 3, 5), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_cache_zero_tokens(NULL, kbuf, vbuf, 3, 5), KVC_NULL_ARGUMENT);
    CHECK(memcmp(kbuf, k0, sizeof kbuf) == 0 && memcmp(vbuf, v0, sizeof vbuf) == 0);
    CHECK_STATUS(kvc_cache_zero_tokens(cache, kbuf, vbuf, 3, 5), KVC_OK);
    for (size_t t = 0; t < CAP; t++)
        for (size_t c = 0; c < C; c++) {
            int zeroed = t >= 3 && t < 5;
            CHECK(kbuf[t * C + c] == (zeroed ? 0 : kval(t, c)));
            CHECK(vbuf[c * CAP + t] == (zeroed ? 0 : vval(t, c)));
        }
    CHECK_STATUS(kvc_cache_zero_tokens(cache, kbuf, vbuf, CAP, CAP), KVC_OK); /* empty range */
    kvc_cache_free(cache);
}

int main(void) {
    test_config();
    test_compact_llama();
    test_h2o_plan_feeds_compaction();
    test_compact_heads();
    test_mnn();
    test_zero();
    puts("test_cache: ok");
    return 0;
}
