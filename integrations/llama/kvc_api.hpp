// kvc_llama_eval, kvc through include/kvc.h: status checks, kvc_h2o's configuration from the
// options, and H2O budgets in cells (kvc_api.cpp).
#pragma once

#include "eval_common.hpp"

#include "kvc.h"

#include <string>

namespace kvc_llama {

// kvc's last error message (kvc_last_error_message)
std::string kvc_message();

// fail() with the call, the status name and kvc's message unless st is KVC_OK
void kvc_ok(kvc_status st, const char * what);

struct KvcBudget {
    int cap = 0;     // cells the cache may hold at the end: ceil(n_tokens / eviction ratio)
    int recent = 0;  // recent window actually protected: min(--recent, cap / 2)
    float kvc_ratio = 0.0f;  // kvc_h2o target_lossy_ratio that ends at cap (see below)
    int sim_end = 0;         // cells the calibration run ended with
};

// kvc_h2o's configuration for the eviction modes: --block, --sink, --trigger, --interval, the
// recent window and lossy ratio given, StreamingLLM or heavy-hitter selection, layer-uniform.
kvc_h2o_config kvc_config(const Options & o, int recent, float ratio, bool streaming);

// kvc_h2o aims at ceil(kv_len / target_lossy_ratio) tokens of the cache as it is when a plan is
// made (MNN's kvSeqLen rule, block-rounded up), so under token-by-token decoding with a plan
// every `interval` steps the cache converges to where one plan removes `interval` tokens. The
// harness wants a memory budget instead: the smallest target_lossy_ratio whose run (this run's
// schedule, simulated) ends with at most `cap` cells.
KvcBudget kvc_budget_cells(int cap, const Options & o);

// kvc_budget_cells for ceil(n_tokens / eviction_ratio) cells
KvcBudget kvc_budget(double eviction_ratio, const Options & o);

}  // namespace kvc_llama
