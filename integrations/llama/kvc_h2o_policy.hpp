// kvc_llama_eval, kvc's H2O / StreamingLLM policy through the C API, as an EvictionPolicy.
// Part of the one kvc_llama_eval program (one translation unit: kvc_llama_eval.cpp includes
// every part in this order; each part includes the one before it).
#pragma once

#include "kvq_channel_hooks.hpp"

namespace {

// kvc's H2O (or StreamingLLM) policy through the C API, layer-uniform (llama.cpp's cells are
// shared by all layers). Every layer's attention mass per cell (kq_soft_max-<il>, or the
// flash-attention recompute) is mapped to the token order kvc works in (the held tokens in
// position order, then the ubatch's new tokens) and ingested as column sums; the last layer's
// end_call may make a plan, which plan() turns into the ranges of held tokens to evict.
class KvcH2oPolicy : public EvictionPolicy, public AttentionScorer {
public:
    KvcH2oPolicy(const ModelInfo & mi, const Options & o, bool streaming, const KvcBudget & b)
        : mi_(mi), streaming_(streaming), budget_(b), block_(o.block), interval_(o.interval) {
        kvc_h2o_config c = kvc_config(o, b.recent, b.kvc_ratio, streaming);
        kvc_ok(kvc_h2o_new(&c, (size_t) mi.n_layer, &h2o_), "kvc_h2o_new");
    }
    ~KvcH2oPolicy() override { kvc_h2o_free(h2o_); }
    KvcH2oPolicy(const KvcH2oPolicy &) = delete;
    KvcH2oPolicy & operator=(const KvcH2oPolicy &) = delete;

    std::string name() const override { return streaming_ ? "kvc_h2o StreamingLLM" : "kvc_h2o heavy hitters"; }
    int max_cells() const override { return budget_.cap + interval_ + 2 * block_; }
    void bind(const std::vector<HeldToken> * held, EvalTap * tap) override {
        held_ = held;
        tap_ = tap;
    }

    void on_layer_scores(int il, const std::vector<float> & mass, int n_queries) override {
        const size_t n_new = tap_->decode_cells.size();
        const size_t kv_len = held_->size() + n_new;
        sums_.assign(kv_len, 0.0f);
        double mapped = 0.0, total = 0.0;
        for (float x : mass) total += x;
        auto at = [&](int64_t cell) -> float {
            if (cell < 0 || cell >= (int64_t) mass.size()) fail("a held token's cell is outside the attention columns");
            return mass[(size_t) cell];
        };
        for (size_t i = 0; i < held_->size(); ++i) sums_[i] = at((*held_)[i].cell);
        for (size_t j = 0; j < n_new; ++j) sums_[held_->size() + j] = at(tap_->decode_cells[j]);
        for (float x : sums_) mapped += x;
        // every bit of attention must land on a cell the harness knows: the cell map is right
        unmapped_max_ = std::max(unmapped_max_, std::fabs(total - mapped) / std::max(1e-30, total));
        kvc_h2o_call_shape shape{kv_len, (size_t) n_queries, (size_t) mi_.n_head, (size_t) mi_.n_head_kv};
        uint32_t res = 0;
        kvc_ok(kvc_h2o_begin_call(h2o_, (size_t) il, &shape, &res), "kvc_h2o_begin_call");
        if (res == KVC_H2O_PLAN_DROPPED) dropped_++;
        kvc_ok(kvc_h2o_ingest_column_sums(h2o_, (size_t) il, sums_.data(), sums_.size()), "kvc_h2o_ingest_column_sums");
        kvc_h2o_decision d;
        kvc_ok(kvc_h2o_end_call(h2o_, (size_t) il, &d), "kvc_h2o_end_call");
        if (d.triggered) plan_ready_ = true;
        calls_++;
    }

    std::vector<EvictRange> plan(const std::vector<HeldToken> & held, int) override {
        if (!plan_ready_) return {};
        plan_ready_ = false;
        kvc_h2o_plan_info info;
        kvc_ok(kvc_h2o_get_plan_info(h2o_, 0, &info), "kvc_h2o_get_plan_info");
        if (!info.pending) return {};
        if (info.kv_len != held.size()) {
            fail("kvc plan made for " + std::to_string(info.kv_len) + " tokens, the cache holds " + std::to_string(held.size()));
        }
        size_t n = 0;
        kvc_ok(kvc_h2o_plan_pairs(h2o_, 0, 0, nullptr, 0, &n), "kvc_h2o_plan_pairs (size)");
        std::vector<kvc_reserve_pair> pairs(n);
        kvc_ok(kvc_h2o_plan_pairs(h2o_, 0, 0, pairs.data(), pairs.size(), &n), "kvc_h2o_plan_pairs");
        // evict the complement of the kept pairs
        std::vector<EvictRange> out;
        size_t next = 0, kept = 0;
        for (const auto & p : pairs) {
            if (p.offset < next || (size_t) p.offset + p.length > held.size()) fail("kvc plan pairs out of order or range");
            if (p.offset > next) out.push_back({next, p.offset});
            next = (size_t) p.offset + p.length;
            kept += p.length;
        }
        if (next < held.size()) out.push_back({next, held.size()});
        if (kept != info.kept_tokens) fail("kvc plan pairs do not add up to its kept tokens");
        plans_++;
        evicted_ += held.size() - kept;
        return out;
    }

    void report(RunResultExtra & extra) const {
        kvc_h2o_metrics m;
        kvc_ok(kvc_h2o_get_metrics(h2o_, &m), "kvc_h2o_get_metrics");
        extra.push_back({"kvc_plans_made", std::to_string(m.plans_made)});
        extra.push_back({"kvc_plans_applied", std::to_string(m.plans_applied)});
        extra.push_back({"kvc_plans_dropped", std::to_string(m.plans_dropped)});
        extra.push_back({"kvc_calls", std::to_string(calls_)});
        extra.push_back({"evictions", std::to_string(plans_)});
        extra.push_back({"tokens_evicted", std::to_string(evicted_)});
        extra.push_back({"attention_unmapped_max", json_num(unmapped_max_)});
        extra.push_back({"budget_cells", std::to_string(budget_.cap)});
        extra.push_back({"recent", std::to_string(budget_.recent)});
        extra.push_back({"block", std::to_string(block_)});
        extra.push_back({"kvc_target_lossy_ratio", json_num(budget_.kvc_ratio)});
        extra.push_back({"calibrated_end_cells", std::to_string(budget_.sim_end)});
    }
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

}  // namespace
