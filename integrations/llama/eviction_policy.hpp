// kvc_llama_eval, the eviction seam: EvictionPolicy, the held-token list it plans over, the
// local sink + window policy, and apply_evictions, which carries a plan out on llama.cpp's
// cache (eviction_policy.cpp). kvc's policy plugs in here (kvc_h2o_policy.hpp).
#pragma once

#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvc_llama {

struct EvalTap;  // eval_tap.hpp

struct HeldToken {
    llama_pos pos;      // position the cache holds it at (changes when positions are shifted)
    int token_index;    // index of the token in the text
    int64_t cell = -1;  // llama.cpp cell holding it (from the layer-0 K SET_ROWS index), -1: unknown
};

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
                     int n_total);

    std::string name() const override;
    int target(int n_seen) const;
    int max_cells() const override;
    std::vector<EvictRange> plan(const std::vector<HeldToken> & held, int n_seen) override;

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
                     const std::vector<EvictRange> & plan, bool shift);

}  // namespace kvc_llama
