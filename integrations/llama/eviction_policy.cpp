// kvc_llama_eval, the eviction seam and the local sink + window policy (eviction_policy.hpp).
#include "eviction_policy.hpp"

#include "eval_common.hpp"

#include <algorithm>
#include <cmath>

namespace kvc_llama {

SinkWindowPolicy::SinkWindowPolicy(int sink, int recent, double ratio, int trigger, int interval, bool adaptive,
                                   int n_total)
    : sink_(sink), recent_(recent), ratio_(ratio), trigger_(trigger), interval_(interval),
      adaptive_(adaptive), n_total_(n_total) {}

std::string SinkWindowPolicy::name() const { return "sink+window"; }

int SinkWindowPolicy::target(int n_seen) const {
    const int base = adaptive_ ? n_seen : n_total_;
    const int t = (int) std::ceil((double) base / ratio_);
    return std::max(t, sink_ + recent_);
}

int SinkWindowPolicy::max_cells() const { return std::min(n_total_, target(n_total_) + interval_); }

std::vector<EvictRange> SinkWindowPolicy::plan(const std::vector<HeldToken> & held, int n_seen) {
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

}  // namespace kvc_llama
