/* C11: the H2O policy handle: defaults, config errors, the call protocol (probabilities,
 * column sums, block sums, softmax tiles), plans read through the size query, plan
 * resolution, metrics, StreamingLLM in the layer-uniform scope. */
#include <stdint.h>

#include "check.h"

static char msg[1024];

static void test_config(void) {
    kvc_h2o_config c;
    memset(&c, 0xff, sizeof c);
    CHECK_STATUS(kvc_h2o_config_default(&c), KVC_OK);
    CHECK(c.block_tokens == 64 && c.sink_tokens == 32 && c.recent_tokens == 256);
    CHECK(c.target_lossy_ratio == 3.5f && c.ema_alpha == 0.9f);
    CHECK(c.trigger_min_tokens == 512 && c.update_interval == 16 && c.layer_start == 0);
    CHECK(c.layer_end == KVC_H2O_LAYER_END_LAST);
    CHECK(c.granularity == KVC_H2O_SCORES_PER_LAYER && c.selection == KVC_H2O_SELECT_HEAVY_HITTERS &&
          c.scope == KVC_H2O_SCOPE_PER_LAYER);
    CHECK_STATUS(kvc_h2o_config_default(NULL), KVC_NULL_ARGUMENT);

    kvc_h2o* sentinel = (kvc_h2o*)&c;
    kvc_h2o* h = sentinel;
    kvc_h2o_config bad = c;
    bad.block_tokens = 0;
    CHECK_STATUS(kvc_h2o_new(&bad, 4, &h), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "h2o_block_tokens") != NULL);
    bad = c;
    bad.ema_alpha = 1.5f;
    CHECK_STATUS(kvc_h2o_new(&bad, 4, &h), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "h2o_ema_alpha") != NULL);
    bad = c;
    bad.target_lossy_ratio = 0.5f;
    CHECK_STATUS(kvc_h2o_new(&bad, 4, &h), KVC_INVALID_ARGUMENT);
    bad = c;
    bad.layer_end = -2;
    CHECK_STATUS(kvc_h2o_new(&bad, 4, &h), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "config.layer_end") != NULL);
    bad = c;
    bad.layer_start = 3;
    bad.layer_end = 1;
    CHECK_STATUS(kvc_h2o_new(&bad, 4, &h), KVC_INVALID_ARGUMENT);
    bad = c;
    bad.selection = 2;
    CHECK_STATUS(kvc_h2o_new(&bad, 4, &h), KVC_INVALID_ARGUMENT);
    bad = c;
    bad.scope = 9;
    CHECK_STATUS(kvc_h2o_new(&bad, 4, &h), KVC_INVALID_ARGUMENT);
    bad = c;
    bad.granularity = 2;
    CHECK_STATUS(kvc_h2o_new(&bad, 4, &h), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_h2o_new(&c, 0, &h), KVC_INVALID_ARGUMENT);
    CHECK(h == sentinel);
    CHECK_STATUS(kvc_h2o_new(NULL, 4, &h), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_h2o_new(&c, 4, NULL), KVC_NULL_ARGUMENT);
    kvc_h2o_free(NULL);
}

#define KV 2048
#define HEADS 4

static void test_h2o_calls(void) {
    kvc_h2o_config c;
    CHECK_STATUS(kvc_h2o_config_default(&c), KVC_OK);
    kvc_h2o* h = NULL;
    CHECK_STATUS(kvc_h2o_new(&c, 2, &h), KVC_OK);

    static float probs[HEADS * KV];
    for (int i = 0; i < HEADS * KV; i++) probs[i] = (i % 97 == 0) ? 0.02f : 1.0f / KV;
    kvc_h2o_call_shape shape = {KV, 1, HEADS, 2};

    /* Protocol errors. */
    CHECK_STATUS(kvc_h2o_ingest_probabilities(h, 0, probs, HEADS * KV), KVC_INVALID_STATE);
    kvc_h2o_decision d;
    memset(&d, 0x5a, sizeof d);
    kvc_h2o_decision d0;
    memcpy(&d0, &d, sizeof d); /* bytes, padding included */
    CHECK_STATUS(kvc_h2o_end_call(h, 0, &d), KVC_INVALID_STATE);
    CHECK(memcmp(&d, &d0, sizeof d) == 0);
    uint32_t res = 77;
    CHECK_STATUS(kvc_h2o_begin_call(h, 2, &shape, &res), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "invalid `layer`: 2") != NULL);
    kvc_h2o_call_shape bad = shape;
    bad.n_kv_heads = 3;
    CHECK_STATUS(kvc_h2o_begin_call(h, 0, &bad, &res), KVC_INVALID_ARGUMENT);
    bad = shape;
    bad.n_queries = 0;
    CHECK_STATUS(kvc_h2o_begin_call(h, 0, &bad, &res), KVC_INVALID_ARGUMENT);
    CHECK(res == 77);
    CHECK_STATUS(kvc_h2o_begin_call(h, 0, NULL, &res), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_h2o_begin_call(NULL, 0, &shape, &res), KVC_NULL_ARGUMENT);

    CHECK_STATUS(kvc_h2o_begin_call(h, 0, &shape, &res), KVC_OK);
    CHECK(res == KVC_H2O_NO_PLAN);
    CHECK_STATUS(kvc_h2o_begin_call(h, 0, &shape, NULL), KVC_INVALID_STATE);
    CHECK_STATUS(kvc_h2o_ingest_probabilities(h, 0, probs, HEADS * KV - 1), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_h2o_ingest_probabilities(h, 0, NULL, HEADS * KV), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_h2o_ingest_probabilities(h, 0, probs, HEADS * KV), KVC_OK);
    /* a softmax tile over keys 64..127 of head 1, and its out-of-range twin */
    CHECK_STATUS(kvc_h2o_ingest_softmax_tile(h, 0, 1, 64, 64, probs, 64, 1, 64), KVC_OK);
    CHECK_STATUS(kvc_h2o_ingest_softmax_tile(h, 0, HEADS, 64, 64, probs, 64, 1, 64),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_h2o_ingest_softmax_tile(h, 0, 1, KV - 10, 64, probs, 64, 1, 64),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_h2o_ingest_softmax_tile(h, 0, 1, 0, 64, probs, 63, 1, 64),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_h2o_end_call(h, 0, &d), KVC_OK);
    CHECK(d.triggered == 1 && d.kv_len == KV && d.kept_tokens < KV);
    /* target: ceil(2048 / 3.5) rounded to blocks, never below the protected floor */
    CHECK(d.kept_tokens >= 32 + 256);

    kvc_h2o_plan_info info;
    CHECK_STATUS(kvc_h2o_get_plan_info(h, 0, &info), KVC_OK);
    CHECK(info.pending == 1 && info.n_groups == 1 && info.kv_len == KV &&
          info.kept_tokens == d.kept_tokens);
    CHECK_STATUS(kvc_h2o_get_plan_info(h, 1, &info), KVC_OK);
    CHECK(info.pending == 0);

    size_t n = 0;
    CHECK_STATUS(kvc_h2o_plan_pairs(h, 0, 0, NULL, 0, &n), KVC_OK);
    CHECK(n >= 2);
    kvc_reserve_pair pairs[64];
    memset(pairs, 0xee, sizeof pairs);
    size_t n2 = 0;
    CHECK_STATUS(kvc_h2o_plan_pairs(h, 0, 0, pairs, n - 1, &n2), KVC_BUFFER_TOO_SMALL);
    CHECK(n2 == n && pairs[0].offset == 0xeeeeeeeeu);
    CHECK(n <= 64);
    CHECK_STATUS(kvc_h2o_plan_pairs(h, 0, 0, pairs, 64, &n2), KVC_OK);
    CHECK(n2 == n);
    size_t kept = 0;
    uint32_t prev_end = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK(i == 0 || pairs[i].offset > prev_end); /* sorted and merged */
        kept += pairs[i].length;
        prev_end = pairs[i].offset + pairs[i].length;
    }
    CHECK(kept == d.kept_tokens && pairs[0].offset == 0 && prev_end == KV);
    CHECK_STATUS(kvc_h2o_plan_pairs(h, 0, 1, pairs, 64, &n2), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_h2o_plan_pairs(h, 1, 0, pairs, 64, &n2), KVC_INVALID_STATE);
    CHECK(strstr(last_error(msg, sizeof msg), "no plan is pending for layer 1") != NULL);
    CHECK_STATUS(kvc_h2o_plan_pairs(h, 0, 0, pairs, 64, NULL), KVC_NULL_ARGUMENT);

    /* The engine compacted: the next call has kept + 1 tokens, and the plan is applied. */
    shape.kv_len = d.kept_tokens + 1;
    CHECK_STATUS(kvc_h2o_begin_call(h, 0, &shape, &res), KVC_OK);
    CHECK(res == KVC_H2O_PLAN_APPLIED);
    static float sums[KV];
    for (size_t i = 0; i < shape.kv_len; i++) sums[i] = (float)HEADS / (float)shape.kv_len;
    CHECK_STATUS(kvc_h2o_ingest_column_sums(h, 0, sums, shape.kv_len), KVC_OK);
    sums[3] = -1.0f;
    CHECK_STATUS(kvc_h2o_ingest_column_sums(h, 0, sums, shape.kv_len), KVC_OK);
    CHECK_STATUS(kvc_h2o_end_call(h, 0, NULL), KVC_INVALID_ARGUMENT); /* negative sums */
    sums[3] = 0.0f;
    /* the failed call was discarded: the same call again, valid this time */
    CHECK_STATUS(kvc_h2o_begin_call(h, 0, &shape, &res), KVC_OK);
    CHECK(res == KVC_H2O_NO_PLAN);
    CHECK_STATUS(kvc_h2o_ingest_column_sums(h, 0, sums, shape.kv_len), KVC_OK);
    CHECK_STATUS(kvc_h2o_end_call(h, 0, &d), KVC_OK);
    CHECK(d.triggered == 0 && d.kv_len == shape.kv_len);

    kvc_h2o_metrics m;
    CHECK_STATUS(kvc_h2o_get_metrics(h, &m), KVC_OK);
    CHECK(m.managed_layers == 2 && m.plans_made == 1 && m.plans_applied == 1);
    CHECK_STATUS(kvc_h2o_get_layer_metrics(h, 0, &m), KVC_OK);
    CHECK(m.managed_layers == 1 && m.plans_applied == 1 && m.lossy_ratio > 1.0);
    CHECK_STATUS(kvc_h2o_get_layer_metrics(h, 2, &m), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_h2o_get_metrics(h, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_h2o_get_metrics(NULL, &m), KVC_NULL_ARGUMENT);
    kvc_h2o_free(h);
}

/* StreamingLLM over two layers sharing cells (llama.cpp): one plan, sink + recent. */
static void test_streaming_uniform(void) {
    kvc_h2o_config c;
    CHECK_STATUS(kvc_h2o_config_default(&c), KVC_OK);
    c.selection = KVC_H2O_SELECT_STREAMING_LLM;
    c.scope = KVC_H2O_SCOPE_LAYER_UNIFORM;
    kvc_h2o* h = NULL;
    CHECK_STATUS(kvc_h2o_new(&c, 2, &h), KVC_OK);
    kvc_h2o_call_shape shape = {KV, 1, HEADS, HEADS};
    const size_t n_blocks = KV / 64;
    static float blocks[KV / 64];
    for (size_t i = 0; i < n_blocks; i++) blocks[i] = (float)HEADS / (float)n_blocks;
    kvc_h2o_decision d;
    for (size_t layer = 0; layer < 2; layer++) {
        CHECK_STATUS(kvc_h2o_begin_call(h, layer, &shape, NULL), KVC_OK);
        CHECK_STATUS(kvc_h2o_ingest_block_sums(h, layer, blocks, n_blocks + 1), KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_h2o_ingest_block_sums(h, layer, blocks, n_blocks), KVC_OK);
        CHECK_STATUS(kvc_h2o_end_call(h, layer, &d), KVC_OK);
        CHECK(d.triggered == (layer == 1));
    }
    kvc_reserve_pair p0[8], p1[8];
    size_t n0 = 0, n1 = 0;
    CHECK_STATUS(kvc_h2o_plan_pairs(h, 0, 0, p0, 8, &n0), KVC_OK);
    CHECK_STATUS(kvc_h2o_plan_pairs(h, 1, 0, p1, 8, &n1), KVC_OK);
    CHECK(n0 == 2 && n1 == 2 && memcmp(p0, p1, sizeof p0[0] * 2) == 0);
    CHECK(p0[0].offset == 0 && p0[1].offset + p0[1].length == KV);
    CHECK(p0[0].length + p0[1].length == d.kept_tokens);
    kvc_h2o_free(h);
}

int main(void) {
    test_config();
    test_h2o_calls();
    test_streaming_uniform();
    puts("test_h2o: ok");
    return 0;
}
