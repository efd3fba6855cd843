// kvc_llama_eval, kvc through include/kvc.h: status checks and H2O budgets (kvc_api.hpp).
#include "kvc_api.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

namespace kvc_llama {

std::string kvc_message() {
    char buf[1024];
    size_t need = 0;
    if (kvc_last_error_message(buf, sizeof buf, &need) != KVC_OK) return "(message longer than 1 KiB)";
    return buf;
}

void kvc_ok(kvc_status st, const char * what) {
    if (st != KVC_OK) fail(std::string(what) + " failed: " + kvc_status_name((int) st) + ": " + kvc_message());
}

kvc_h2o_config kvc_config(const Options & o, int recent, float ratio, bool streaming) {
    kvc_h2o_config c;
    kvc_ok(kvc_h2o_config_default(&c), "kvc_h2o_config_default");
    c.block_tokens = (uint32_t) o.block;
    c.sink_tokens = (uint32_t) o.sink;
    c.recent_tokens = (uint32_t) recent;
    c.target_lossy_ratio = ratio;
    c.trigger_min_tokens = (uint32_t) o.trigger;
    c.update_interval = (uint32_t) o.interval;
    c.selection = streaming ? KVC_H2O_SELECT_STREAMING_LLM : KVC_H2O_SELECT_HEAVY_HITTERS;
    c.scope = KVC_H2O_SCOPE_LAYER_UNIFORM;
    c.granularity = KVC_H2O_SCORES_PER_LAYER;
    return c;
}

namespace {

// The cells a kvc_h2o policy with `ratio` holds after this run's schedule (the prompt, then
// one token at a time), found by driving a one-layer kvc_h2o with uniform scores: the kept
// count does not depend on the scores.
int kvc_simulate_end(const Options & o, int recent, float ratio) {
    kvc_h2o_config c = kvc_config(o, recent, ratio, true);
    kvc_h2o * h = nullptr;
    kvc_ok(kvc_h2o_new(&c, 1, &h), "kvc_h2o_new (calibration)");
    std::unique_ptr<kvc_h2o, void (*)(kvc_h2o *)> guard(h, kvc_h2o_free);
    size_t held = 0;
    std::vector<float> sums;
    int i = 0;
    while (i < o.n_tokens) {
        const size_t nq = (i == 0 && o.prompt > 0) ? (size_t) o.prompt : 1;
        const size_t kv_len = held + nq;
        kvc_h2o_call_shape shape{kv_len, nq, 1, 1};
        kvc_ok(kvc_h2o_begin_call(h, 0, &shape, nullptr), "kvc_h2o_begin_call (calibration)");
        sums.assign(kv_len, (float) nq / (float) kv_len);
        kvc_ok(kvc_h2o_ingest_column_sums(h, 0, sums.data(), sums.size()), "kvc_h2o_ingest_column_sums (calibration)");
        kvc_h2o_decision d;
        kvc_ok(kvc_h2o_end_call(h, 0, &d), "kvc_h2o_end_call (calibration)");
        held = kv_len;
        i += (int) nq;
        if (d.triggered && i < o.n_tokens) held = d.kept_tokens;  // applied before the next decode
    }
    return (int) held;
}

}  // namespace

// kvc_h2o aims at ceil(kv_len / target_lossy_ratio) tokens of the cache as it is when a plan is
// made (MNN's kvSeqLen rule, block-rounded up), so under token-by-token decoding with a plan
// every `interval` steps the cache converges to where one plan removes `interval` tokens. The
// harness wants a memory budget instead: the smallest target_lossy_ratio (bisection over
// kvc_simulate_end) whose run ends with at most `cap` cells.
KvcBudget kvc_budget_cells(int cap, const Options & o) {
    KvcBudget b;
    b.cap = cap;
    b.recent = std::min(o.recent, b.cap / 2);
    if (b.cap <= o.sink + b.recent) fail("budget of " + std::to_string(b.cap) + " cells leaves nothing beyond sink + recent");
    // Not monotone: past some ratio the protected tokens reach the target and kvc makes no
    // plan at all. So scan a geometric grid upwards and take the first ratio that fits.
    int best = INT32_MAX;
    for (double r = 1.001; r < 64.0; r *= 1.01) {
        const int end = kvc_simulate_end(o, b.recent, (float) r);
        best = std::min(best, end);
        if (end <= b.cap) {
            b.kvc_ratio = (float) r;
            b.sim_end = end;
            return b;
        }
    }
    fail("no kvc_h2o target_lossy_ratio ends this run within " + std::to_string(b.cap) + " cells (best " +
         std::to_string(best) + "); lower --recent or --sink");
}

KvcBudget kvc_budget(double eviction_ratio, const Options & o) {
    return kvc_budget_cells((int) std::ceil((double) o.n_tokens / eviction_ratio), o);
}

}  // namespace kvc_llama
