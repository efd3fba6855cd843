// kvc_llama_eval, the eviction seam: EvictionPolicy and the local sink + window policy.
// Part of the one kvc_llama_eval program (one translation unit: kvc_llama_eval.cpp includes
// every part in this order; each part includes the one before it).
#pragma once

#include "eval_common.hpp"

namespace {

// ------------------------------------------------------------------------------------------
// eviction policy: the seam where kvc's policy (through the C API) replaces the local one

using RunResultExtra = std::vector<std::pair<std::string, std::string>>;

struct HeldToken {
    llama_pos pos;      // position the cache holds it at (changes when positions are shifted)
    int token_index;    // index of the token in the text
    int64_t cell = -1;  // llama.cpp cell holding it (from the layer-0 K SET_ROWS index), -1: unknown
};

struct EvalTap;

struct EvictRange {
    size_t begin;  // indices into the held list, [begin, end)
    size_t end;
};

class EvictionPolicy {
public:
    virtual ~EvictionPolicy() = default;
    virtual std::string name() const = 0;
    // Called before each single-token decode. held: the tokens the cache holds, in position
    // order; n_seen: tokens decoded so far. Returns disjoint ranges of held to evict, sorted.
    virtual std::vector<EvictRange> plan(const std::vector<HeldToken> & held, int n_seen) = 0;
    // The most cells the policy will ever hold (to size the llama.cpp context).
    virtual int max_cells() const = 0;
    // Policies that score tokens from attention see the held list and the eval tap.
    virtual void bind(const std::vector<HeldToken> *, EvalTap *) {}
};

// StreamingLLM-style: keep `sink` first tokens and the most recent ones so that at most
// `target` cells are held; evicts only once n_seen reaches `trigger`, then every `interval`
// decode steps (the MNN H2O schedule), so the cache oscillates between target and
// target + interval - 1 cells.
class SinkWindowPolicy : public EvictionPolicy {
public:
    SinkWindowPolicy(int sink, int recent, double ratio, int trigger, int interval, bool adaptive,
                     int n_total)
        : sink_(sink), recent_(recent), ratio_(ratio), trigger_(trigger), interval_(interval),
          adaptive_(adaptive), n_total_(n_total) {}

    std::string name() const override { return "sink+window"; }

    int target(int n_seen) const {
        const int base = adaptive_ ? n_seen : n_total_;
        const int t = (int) std::ceil((double) base / ratio_);
        return std::max(t, sink_ + recent_);
    }

    int max_cells() const override { return std::min(n_total_, target(n_total_) + interval_); }

    std::vector<EvictRange> plan(const std::vector<HeldToken> & held, int n_seen) override {
        if (n_seen < trigger_) return {};
        if (last_ >= 0 && n_seen - last_ < interval_) return {};
        const int tgt = target(n_seen);
        if ((int) held.size() <= tgt) return {};
        last_ = n_seen;
        const size_t n_evict = held.size() - (size_t) tgt;
        const size_t b = std::min((size_t) sink_, held.size());
        const size_t e = std::min(held.size(), b + n_evict);
        if (e <= b) return {};
        return {EvictRange{b, e}};
    }

private:
    int sink_, recent_;
    double ratio_;
    int trigger_, interval_;
    bool adaptive_;
    int n_total_;
    int last_ = -1;
};

// Applies a plan to llama.cpp's cache: llama_memory_seq_rm per range (highest first), then,
// when shifting, llama_memory_seq_add moves every later position down over the gap (llama.cpp
// re-rotates the cached K for the new positions on the next decode).
void apply_evictions(llama_memory_t mem, std::vector<HeldToken> & held,
                     const std::vector<EvictRange> & plan, bool shift) {
    for (auto it = plan.rbegin(); it != plan.rend(); ++it) {
        if (it->begin >= it->end || it->end > held.size()) fail("eviction plan out of range");
        const llama_pos p0 = held[it->begin].pos;
        const llama_pos p1 = held[it->end - 1].pos + 1;
        if (!llama_memory_seq_rm(mem, 0, p0, p1)) fail("llama_memory_seq_rm refused a range");
        held.erase(held.begin() + (long) it->begin, held.begin() + (long) it->end);
        if (shift) {
            const llama_pos delta = p1 - p0;
            llama_memory_seq_add(mem, 0, p1, -1, -delta);
            for (size_t i = it->begin; i < held.size(); ++i) held[i].pos -= delta;
        }
    }
}

}  // namespace
