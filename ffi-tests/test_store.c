/* kvc_store from C: append, schedule, wait, restore bit-exact, metrics that show bytes
 * released; every error path (NULL, bad config, wrong layer, too-small buffer,
 * overflowing sizes); and readers on several threads at once. */
#include <pthread.h>
#include <stdint.h>

#include "check.h"

enum { HEADS = 3, DIM = 64, ROW = HEADS * DIM * 2, LAYERS = 2, TOKENS = 1500, CAP = 2048 };

static uint16_t* K[LAYERS];
static uint16_t* V[LAYERS];

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint16_t next_value(void) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    uint64_t x = rng * 0x2545f4914f6cdd1dull;
    /* Plausible f16 KV values: small magnitudes, either sign. */
    return (uint16_t)(0x2c00 + (x % 0x1000) + ((x >> 40) & 1 ? 0x8000 : 0));
}

static kvc_store_layer layer_desc(void) {
    kvc_store_layer l;
    memset(&l, 0, sizeof l);
    l.dtype = KVC_DTYPE_F16;
    l.v_trans = 0;
    l.n_kv_heads = HEADS;
    l.head_dim_k = DIM;
    l.head_dim_v = DIM;
    l.capacity = CAP;
    return l;
}

static void check_layer(const kvc_store* s, int layer) {
    size_t kl = 0, vl = 0;
    uint8_t* k = malloc((size_t)TOKENS * ROW);
    uint8_t* v = malloc((size_t)TOKENS * ROW);
    CHECK(k && v);
    CHECK_STATUS(kvc_store_read_tokens(s, layer, 0, TOKENS, k, (size_t)TOKENS * ROW, v,
                                       (size_t)TOKENS * ROW, &kl, &vl),
                 KVC_OK);
    CHECK(kl == (size_t)TOKENS * ROW && vl == kl);
    CHECK(memcmp(k, K[layer], kl) == 0);
    CHECK(memcmp(v, V[layer], vl) == 0);
    free(k);
    free(v);
}

static void* reader(void* arg) {
    const kvc_store* s = (const kvc_store*)arg;
    for (int r = 0; r < 6; r++) {
        check_layer(s, r % LAYERS);
        /* A small range from the middle of the cold zone. */
        uint8_t k[10 * ROW], v[10 * ROW];
        size_t kl = 0, vl = 0;
        CHECK_STATUS(kvc_store_read_tokens(s, 1, 500, 510, k, sizeof k, v, sizeof v, &kl, &vl),
                     KVC_OK);
        CHECK(memcmp(k, (uint8_t*)K[1] + 500 * ROW, sizeof k) == 0);
        CHECK(memcmp(v, (uint8_t*)V[1] + 500 * ROW, sizeof v) == 0);
        kvc_store_metrics m;
        CHECK_STATUS(kvc_store_get_metrics(s, &m), KVC_OK);
        CHECK(m.restore_failures == 0);
    }
    return NULL;
}

static void happy_path(void) {
    kvc_store_config cfg;
    CHECK_STATUS(kvc_store_config_default(&cfg), KVC_OK);
    CHECK(cfg.mode == KVC_STORE_MODE_STORE && cfg.scope == KVC_STORE_SCOPE_BOTH);
    CHECK(cfg.hot_sink_tokens == 16 && cfg.hot_recent_tokens == 256);
    CHECK(cfg.bootstrap_tokens == 16 && cfg.group_tokens == 384);
    CHECK(cfg.evict_after_attention == 1 && cfg.verify_restore == 1);
    CHECK(cfg.h2o_layer_end == KVC_STORE_LAYER_END_LAST);
    for (uint32_t codec = KVC_STORE_CODEC_GEAR_V1; codec <= KVC_STORE_CODEC_GEAR_V2; codec++) {
        cfg.codec = codec;
        kvc_store_layer layers[LAYERS] = {layer_desc(), layer_desc()};
        kvc_store* s = NULL;
        CHECK_STATUS(kvc_store_new(&cfg, layers, LAYERS, &s), KVC_OK);
        CHECK(s != NULL);
        for (int t = 0; t < TOKENS; t++) {
            for (int l = 0; l < LAYERS; l++) {
                size_t len = 0, handled = 0, finished = 0;
                CHECK_STATUS(kvc_store_append_tokens(s, l, (uint8_t*)K[l] + (size_t)t * ROW, ROW,
                                                     (uint8_t*)V[l] + (size_t)t * ROW, ROW, &len),
                             KVC_OK);
                CHECK(len == (size_t)t + 1);
                CHECK_STATUS(kvc_store_schedule(s, l, &handled), KVC_OK);
                CHECK_STATUS(kvc_store_poll(s, &finished), KVC_OK);
            }
        }
        CHECK_STATUS(kvc_store_wait_idle(s), KVC_OK);
        kvc_store_metrics m;
        CHECK_STATUS(kvc_store_get_metrics(s, &m), KVC_OK);
        /* 1500 tokens: cold 16..1244: the bootstrap chunk and 3 groups per layer. */
        CHECK(m.chunks_held == 8 && m.fallbacks == 0 && m.in_flight == 0);
        CHECK(m.stored_raw_bytes == 2ull * (16 + 3 * 384) * 2 * ROW);
        CHECK(m.blob_bytes > 0 && m.blob_bytes < m.stored_raw_bytes && m.lossless_ratio > 1.0);
        CHECK(m.released_bytes_total > m.blob_bytes);
        CHECK(m.cache_resident_bytes < m.cache_mapped_bytes);
        const uint64_t resident = m.cache_resident_bytes;

        /* Size query, then bit-exact reads; memory goes back after each read. */
        size_t kl = 0, vl = 0;
        CHECK_STATUS(kvc_store_read_tokens(s, 0, 0, TOKENS, NULL, 0, NULL, 0, &kl, &vl),
                     KVC_BUFFER_TOO_SMALL);
        CHECK(kl == (size_t)TOKENS * ROW && vl == kl);
        for (int l = 0; l < LAYERS; l++) check_layer(s, l);
        CHECK_STATUS(kvc_store_get_metrics(s, &m), KVC_OK);
        CHECK(m.restores == 8 && m.decode_cache_misses == 8 && m.decode_cache_resident == 0);
        CHECK(m.cache_resident_bytes == resident);
        CHECK(m.restore_us_p50 > 0.0);

        /* A prefetch keeps the chunks until the next read, which hits. */
        size_t decoded = 0, hits = 0, released = 0;
        CHECK_STATUS(kvc_store_restore_layer(s, 1, &decoded, &hits), KVC_OK);
        CHECK(decoded == 4 && hits == 0);
        CHECK_STATUS(kvc_store_get_metrics(s, &m), KVC_OK);
        CHECK(m.decode_cache_resident == 4 && m.cache_resident_bytes > resident);
        check_layer(s, 1);
        CHECK_STATUS(kvc_store_get_metrics(s, &m), KVC_OK);
        CHECK(m.decode_cache_hits == 4 && m.cache_resident_bytes == resident);
        CHECK_STATUS(kvc_store_restore_layer(s, 0, &decoded, &hits), KVC_OK);
        CHECK_STATUS(kvc_store_evict_decoded(s, KVC_STORE_ALL_LAYERS, &released), KVC_OK);
        CHECK(released == 4);

        /* Readers on several threads at once. */
        pthread_t th[4];
        for (int i = 0; i < 4; i++) CHECK(pthread_create(&th[i], NULL, reader, s) == 0);
        for (int i = 0; i < 4; i++) CHECK(pthread_join(th[i], NULL) == 0);
        CHECK_STATUS(kvc_store_get_metrics(s, &m), KVC_OK);
        CHECK(m.restore_failures == 0 && m.cache_resident_bytes == resident);
        kvc_store_free(s);
    }
}

static void error_paths(void) {
    char msg[512];
    kvc_store_config cfg;
    CHECK_STATUS(kvc_store_config_default(NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_config_default(&cfg), KVC_OK);
    kvc_store_layer layers[1] = {layer_desc()};
    kvc_store* s = (kvc_store*)0x1;

    /* NULL arguments; nothing is written on failure. */
    CHECK_STATUS(kvc_store_new(NULL, layers, 1, &s), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_new(&cfg, NULL, 1, &s), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_new(&cfg, layers, 1, NULL), KVC_NULL_ARGUMENT);
    CHECK(s == (kvc_store*)0x1);

    /* Bad configs. */
    kvc_store_config bad = cfg;
    bad.mode = 7;
    CHECK_STATUS(kvc_store_new(&bad, layers, 1, &s), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "config.mode") != NULL);
    bad = cfg;
    bad.scope = 0;
    CHECK_STATUS(kvc_store_new(&bad, layers, 1, &s), KVC_INVALID_ARGUMENT);
    bad = cfg;
    bad.codec = 9;
    CHECK_STATUS(kvc_store_new(&bad, layers, 1, &s), KVC_INVALID_ARGUMENT);
    bad = cfg;
    bad.group_tokens = 0;
    CHECK_STATUS(kvc_store_new(&bad, layers, 1, &s), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "group_tokens") != NULL);
    bad = cfg;
    bad.async_threads = 0;
    CHECK_STATUS(kvc_store_new(&bad, layers, 1, &s), KVC_INVALID_ARGUMENT);
    bad = cfg;
    bad.verify_restore = 2;
    CHECK_STATUS(kvc_store_new(&bad, layers, 1, &s), KVC_INVALID_ARGUMENT);
    bad = cfg;
    bad.h2o_layer_end = -5;
    CHECK_STATUS(kvc_store_new(&bad, layers, 1, &s), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_store_new(&cfg, layers, 0, &s), KVC_INVALID_ARGUMENT);

    /* Bad layers: dtype, v_trans, zero and overflowing sizes. */
    kvc_store_layer bl = layer_desc();
    bl.dtype = 42;
    CHECK_STATUS(kvc_store_new(&cfg, &bl, 1, &s), KVC_INVALID_ARGUMENT);
    bl = layer_desc();
    bl.v_trans = 3;
    CHECK_STATUS(kvc_store_new(&cfg, &bl, 1, &s), KVC_INVALID_ARGUMENT);
    bl = layer_desc();
    bl.capacity = SIZE_MAX;
    CHECK_STATUS(kvc_store_new(&cfg, &bl, 1, &s), KVC_INVALID_ARGUMENT);
    bl = layer_desc();
    bl.n_kv_heads = SIZE_MAX / 2;
    bl.head_dim_k = 64;
    CHECK_STATUS(kvc_store_new(&cfg, &bl, 1, &s), KVC_INVALID_ARGUMENT);
    bl = layer_desc();
    bl.head_dim_v = 0;
    CHECK_STATUS(kvc_store_new(&cfg, &bl, 1, &s), KVC_INVALID_ARGUMENT);
    CHECK(s == (kvc_store*)0x1);

    cfg.hot_recent_tokens = 16;
    cfg.group_tokens = 32;
    CHECK_STATUS(kvc_store_new(&cfg, layers, 1, &s), KVC_OK);
    uint8_t row[ROW * 2];
    memset(row, 0x3c, sizeof row);
    size_t n = 77, kl = 77, vl = 77;

    /* Handles and outputs. */
    CHECK_STATUS(kvc_store_append_tokens(NULL, 0, row, ROW, row, ROW, &n), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_append_tokens(s, 0, NULL, ROW, row, ROW, &n), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_append_tokens(s, 0, row, ROW, row, ROW, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_schedule(NULL, 0, &n), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_schedule(s, 0, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_poll(s, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_wait_idle(NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_get_metrics(s, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_get_metrics(NULL, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_restore_layer(s, 0, NULL, &n), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_evict_decoded(s, 0, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_store_read_tokens(s, 0, 0, 0, row, ROW, row + ROW, ROW, NULL, &vl),
                 KVC_NULL_ARGUMENT);
    CHECK(n == 77);

    /* Wrong layer. */
    CHECK_STATUS(kvc_store_append_tokens(s, 1, row, ROW, row, ROW, &n), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "layer 1 out of range") != NULL);
    CHECK_STATUS(kvc_store_schedule(s, 5, &n), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_store_restore_layer(s, 1, &n, &n), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_store_evict_decoded(s, 1, &n), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_store_evict_decoded(s, -2, &n), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_store_read_tokens(s, 3, 0, 0, row, ROW, row + ROW, ROW, &kl, &vl),
                 KVC_INVALID_ARGUMENT);
    CHECK(n == 77 && kl == 77);

    /* Lengths that are not whole rows, or K and V that disagree. */
    CHECK_STATUS(kvc_store_append_tokens(s, 0, row, ROW - 1, row, ROW - 1, &n),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_store_append_tokens(s, 0, row, ROW, row, 2 * ROW, &n), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_store_append_tokens(s, 0, row, SIZE_MAX, row, ROW, &n), KVC_INVALID_ARGUMENT);

    /* Fill past the capacity: refused, nothing written. */
    for (int t = 0; t < CAP; t++) {
        CHECK_STATUS(kvc_store_append_tokens(s, 0, row, ROW, row, ROW, &n), KVC_OK);
    }
    CHECK_STATUS(kvc_store_append_tokens(s, 0, row, ROW, row, ROW, &n), KVC_INVALID_ARGUMENT);
    CHECK(n == CAP);
    CHECK_STATUS(kvc_store_schedule(s, 0, &n), KVC_OK);
    CHECK_STATUS(kvc_store_wait_idle(s), KVC_OK);

    /* Ranges out of bounds, overlapping buffers, too-small buffers. */
    kl = vl = 77;
    CHECK_STATUS(kvc_store_read_tokens(s, 0, 10, 5, row, ROW, row + ROW, ROW, &kl, &vl),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_store_read_tokens(s, 0, 0, CAP + 1, row, ROW, row + ROW, ROW, &kl, &vl),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_store_read_tokens(s, 0, 0, SIZE_MAX, row, ROW, row + ROW, ROW, &kl, &vl),
                 KVC_INVALID_ARGUMENT);
    CHECK(kl == 77 && vl == 77);
    CHECK_STATUS(kvc_store_read_tokens(s, 0, 0, 1, row, ROW + 1, row + ROW, ROW, &kl, &vl),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_store_read_tokens(s, 0, 100, 102, row, 2 * ROW, row, 2 * ROW, &kl, &vl),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_store_read_tokens(s, 0, 100, 102, row, ROW, row + ROW, ROW, &kl, &vl),
                 KVC_BUFFER_TOO_SMALL);
    CHECK(kl == 2 * ROW && vl == 2 * ROW);
    CHECK(strstr(last_error(msg, sizeof msg), "`k_dst` holds") != NULL);
    CHECK_STATUS(kvc_store_read_tokens(s, 0, 100, 101, row, ROW, row + ROW, ROW - 1, &kl, &vl),
                 KVC_BUFFER_TOO_SMALL);
    CHECK(strstr(last_error(msg, sizeof msg), "`v_dst` holds") != NULL);
    CHECK_STATUS(kvc_store_read_tokens(s, 0, 100, 101, row, ROW, row + ROW, ROW, &kl, &vl),
                 KVC_OK);
    CHECK(kl == ROW && row[0] == 0x3c && row[ROW - 1] == 0x3c);

    kvc_store_metrics m;
    CHECK_STATUS(kvc_store_get_metrics(s, &m), KVC_OK);
    CHECK(m.chunks_held > 0 && m.fallbacks == 0);
    kvc_store_free(s);
    kvc_store_free(NULL);
}

int main(void) {
    for (int l = 0; l < LAYERS; l++) {
        K[l] = malloc((size_t)TOKENS * ROW);
        V[l] = malloc((size_t)TOKENS * ROW);
        CHECK(K[l] && V[l]);
        for (size_t i = 0; i < (size_t)TOKENS * ROW / 2; i++) {
            K[l][i] = next_value();
            V[l][i] = next_value();
        }
    }
    happy_path();
    error_paths();
    for (int l = 0; l < LAYERS; l++) {
        free(K[l]);
        free(V[l]);
    }
    puts("test_store: ok");
    return 0;
}
