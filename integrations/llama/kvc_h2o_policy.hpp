// kvc_llama_eval, kvc's H2O / StreamingLLM policy through the C API as an EvictionPolicy, and
// the kvc-streaming, h2o and h2o-fa rows it runs (kvc_h2o_policy.cpp).
#pragma once

#include "decode.hpp"
#include "eval_common.hpp"
#include "eval_tap.hpp"
#include "eviction_policy.hpp"
#include "kvc_api.hpp"

#include "kvc.h"
#include "llama.h"

#include <cstddef>
#include <string>
#include <vector>

namespace kvc_llama {

// kvc's H2O (or StreamingLLM) policy through the C API, layer-uniform (llama.cpp's cells are
// shared by all layers). Every layer's attention mass per cell (kq_soft_max-<il>, or the
// flash-attention recompute) is mapped to the token order kvc works in (the held tokens in
// position order, then the ubatch's new tokens) and ingested as column sums; the last layer's
// end_call may make a plan, which plan() turns into the ranges of held tokens to evict.
class KvcH2oPolicy : public EvictionPolicy, public AttentionScorer {
public:
    KvcH2oPolicy(const ModelInfo & mi, const Options & o, bool streaming, const KvcBudget & b);
    ~KvcH2oPolicy() override;
    KvcH2oPolicy(const KvcH2oPolicy &) = delete;
    KvcH2oPolicy & operator=(const KvcH2oPolicy &) = delete;

    std::string name() const override;
    int max_cells() const override;
    void bind(const std::vector<HeldToken> * held, EvalTap * tap) override;

    void on_layer_scores(int il, const std::vector<float> & mass, int n_queries) override;

    std::vector<EvictRange> plan(const std::vector<HeldToken> & held, int) override;

    // kvc's metrics and the budget, as extra fields of the row
    void report(RunResultExtra & extra) const;
    long dropped() const { return dropped_; }
    double unmapped_max() const { return unmapped_max_; }

private:
    const ModelInfo & mi_;
    bool streaming_;
    KvcBudget budget_;
    int block_, interval_;
    kvc_h2o * h2o_ = nullptr;
    const std::vector<HeldToken> * held_ = nullptr;
    EvalTap * tap_ = nullptr;
    std::vector<float> sums_;
    bool plan_ready_ = false;
    long calls_ = 0, plans_ = 0, dropped_ = 0;
    size_t evicted_ = 0;
    double unmapped_max_ = 0.0;
};

// One kvc_h2o row: mode kvc-streaming, h2o or h2o-fa at eviction ratio R (cells), its held
// cells kvq cells when kvq_mode ("kvq:CONFIG" / "kvq-plan:FILE") is given (the "+kvq:"
// combined modes). h2o-fa runs with flash attention on, its scores recomputed and checked.
RunResult run_kvc_evict(llama_model * model, const ModelInfo & mi, const Options & o,
                        const std::vector<llama_token> & toks, RefStore & ref, const std::string & mode, double R,
                        const std::string & kvq_mode);

}  // namespace kvc_llama
