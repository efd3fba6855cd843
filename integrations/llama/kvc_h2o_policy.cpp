// kvc_llama_eval, kvc's H2O / StreamingLLM policy and its rows (kvc_h2o_policy.hpp).
#include "kvc_h2o_policy.hpp"

#include "kvq_hooks.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

namespace kvc_llama {

KvcH2oPolicy::KvcH2oPolicy(const ModelInfo & mi, const Options & o, bool streaming, const KvcBudget & b)
    : mi_(mi), streaming_(streaming), budget_(b), block_(o.block), interval_(o.interval) {
    kvc_h2o_config c = kvc_config(o, b.recent, b.kvc_ratio, streaming);
    kvc_ok(kvc_h2o_new(&c, (size_t) mi.n_layer, &h2o_), "kvc_h2o_new");
}

KvcH2oPolicy::~KvcH2oPolicy() { kvc_h2o_free(h2o_); }

std::string KvcH2oPolicy::name() const { return streaming_ ? "kvc_h2o StreamingLLM" : "kvc_h2o heavy hitters"; }

int KvcH2oPolicy::max_cells() const { return budget_.cap + interval_ + 2 * block_; }

void KvcH2oPolicy::bind(const std::vector<HeldToken> * held, EvalTap * tap) {
    held_ = held;
    tap_ = tap;
}

void KvcH2oPolicy::on_layer_scores(int il, const std::vector<float> & mass, int n_queries) {
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

std::vector<EvictRange> KvcH2oPolicy::plan(const std::vector<HeldToken> & held, int) {
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

void KvcH2oPolicy::report(RunResultExtra & extra) const {
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

RunResult run_kvc_evict(llama_model * model, const ModelInfo & mi, const Options & o,
                        const std::vector<llama_token> & toks, RefStore & ref, const std::string & mode, double R,
                        const std::string & kvq_mode) {
    const bool fa = mode == "h2o-fa";
    const KvcBudget bud = kvc_budget(R, o);
    KvcH2oPolicy pol(mi, o, mode == "kvc-streaming", bud);
    EvalTap tap(mi);
    std::unique_ptr<KvqSetup> kq;
    DecodeSpec s;
    if (!kvq_mode.empty()) {
        kq.reset(new KvqSetup(kvq_mode, mi, o));
        kq->attach(tap, s);
    }
    tap.want_set_rows = true;
    tap.want_kq = !fa;
    tap.want_fattn = fa;
    tap.scorer = &pol;
    s.mode = mode + "@" + json_num(R) + (kvq_mode.empty() ? "" : "+" + kvq_mode);
    s.cfg.n_ctx = o.n_tokens;
    s.cfg.flash_attn = fa;
    s.cfg.tap = &tap;
    s.policy = &pol;
    s.shift_positions = o.positions == "shift";
    RunResult r = run_decode(model, mi, o, toks, ref, s);
    pol.report(r.extra);
    if (fa) {
        r.extra.push_back({"fattn_recompute_max_out_err", json_num(tap.fattn_max_out_err)});
        r.extra.push_back({"fattn_checked_calls", std::to_string(tap.fattn_checked)});
        r.extra.push_back({"fattn_err_over_bound", json_num(tap.fattn_max_excess)});
        r.extra.push_back({"fattn_control_head_caught", std::to_string(tap.fattn_ctrl_head_caught)});
        r.extra.push_back({"fattn_control_head_calls", std::to_string(tap.fattn_ctrl_head_calls)});
        r.extra.push_back({"fattn_control_cell_caught", std::to_string(tap.fattn_ctrl_cell_caught)});
        r.extra.push_back({"fattn_control_scale_caught", std::to_string(tap.fattn_ctrl_scale_caught)});
        // within the rounding bound of fattn_bound.hpp (derived from the kernel's f16
        // arithmetic, not tuned to one machine), and every checked call able to fail:
        // each deliberate mistake lands outside the same bound
        if (!(tap.fattn_checked > 0 && tap.fattn_max_excess <= 1.0)) {
            fail(s.mode + ": recomputed attention output differs from llama.cpp's by " +
                 json_num(tap.fattn_max_out_err) + ", " + json_num(tap.fattn_max_excess) +
                 " times the rounding bound");
        }
        if (tap.fattn_ctrl_head_caught != tap.fattn_ctrl_head_calls ||
            tap.fattn_ctrl_cell_caught != tap.fattn_checked || tap.fattn_ctrl_scale_caught != tap.fattn_checked) {
            fail(s.mode + ": the attention check missed a deliberate mistake (caught: wrong head " +
                 std::to_string(tap.fattn_ctrl_head_caught) + ", missing cell " +
                 std::to_string(tap.fattn_ctrl_cell_caught) + ", scale " +
                 std::to_string(tap.fattn_ctrl_scale_caught) + " of " + std::to_string(tap.fattn_checked) +
                 " calls)");
        }
    }
    if (!(pol.unmapped_max() < 1e-3)) {
        fail(s.mode + ": " + json_num(pol.unmapped_max()) + " of the attention fell on cells the harness does not hold");
    }
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s, cap %d cells (sink %d, recent %d, block %d), positions %s%s",
                  pol.name().c_str(), bud.cap, o.sink, bud.recent, o.block, o.positions.c_str(),
                  fa ? ", flash attention on (scores recomputed)" : "");
    r.detail = buf;
    if (kq) r.detail += "; " + kq->finish(tap, r);
    return r;
}

}  // namespace kvc_llama
