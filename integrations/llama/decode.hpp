// kvc_llama_eval, contexts and the token-by-token decode loop every PPL/KL mode runs through
// (decode.cpp): the context a mode asks for, batches, the reference logits, a row of results,
// the sequence state's bytes, and the seams a mode plugs into the loop (an EvictionPolicy, a
// CacheEditor, its own memory accounting).
#pragma once

#include "eval_common.hpp"
#include "eviction_policy.hpp"

#include "llama.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvc_llama {

struct EvalTap;  // eval_tap.hpp

// ------------------------------------------------------------------------------------------
// contexts and decoding

struct CtxDeleter {
    void operator()(llama_context * c) const { llama_free(c); }
};
using CtxPtr = std::unique_ptr<llama_context, CtxDeleter>;

struct CtxConfig {
    int n_ctx = 0;
    int n_batch = 512;
    ggml_type type_k = GGML_TYPE_F16;
    ggml_type type_v = GGML_TYPE_F16;
    bool flash_attn = false;
    EvalTap * tap = nullptr;
    std::string kvc_plan;  // a kvq plan file: per-layer kvq cache types (patched llama.cpp)
};

// A llama.cpp context for a mode; a cache type or plan llama.cpp refuses is a UsageError.
CtxPtr make_context(llama_model * model, const Options & o, const CtxConfig & c);

// decodes tokens [first, first+n) at positions pos0.. in one llama_decode (split into ubatches
// by llama.cpp); logits for the positions flagged by want_logits
void decode_batch(llama_context * ctx, const std::vector<llama_token> & toks, int first, int n, llama_pos pos0,
                  const std::vector<bool> & want_logits);

// Reference log-softmax rows of the full-cache run, kept in a temporary file and read back in
// order by the other modes (1535 rows x 49152 floats would be 300 MB in memory).
class RefStore {
public:
    RefStore();
    ~RefStore();
    RefStore(const RefStore &) = delete;
    RefStore & operator=(const RefStore &) = delete;
    void append(const std::vector<float> & row);
    void rewind_for_read();
    void read(std::vector<float> & row, size_t n);
    long rows() const { return rows_; }

private:
    std::FILE * f_;
    long rows_ = 0;
};

struct RunResult {
    std::string mode;
    std::string detail;
    double ppl = NAN;
    double kl = NAN;
    long n_scored = 0;
    double tok_s = NAN;          // token-by-token part only
    double held_bytes_end = 0;   // occupied cells at the end x bytes per cell
    double held_ratio_end = NAN; // full f16 bytes of all tokens / held bytes, at the end
    double held_ratio_mean = NAN;// mean over the scored steps of (full f16 bytes so far / held)
    double alloc_bytes = 0;      // the cache llama.cpp allocated (kv_size cells)
    long cells_end = 0;
    long cells_verified = -1;    // cells in llama_state_seq_get_data at the end
    long cells_peak = 0;         // most cells held at any step
    std::vector<std::pair<std::string, std::string>> extra;  // JSON-ready key -> value
};

// The state blob of sequence 0 (llama_state_seq_get_data): the cell count of its (single)
// stream, or -1.
long state_cell_count(const std::vector<uint8_t> & s);

// llama_state_seq_get_data of sequence 0
std::vector<uint8_t> get_seq_state(llama_context * ctx);

// Changes the cache itself (not only which cells stay) before a decode step: the mlp modes
// rewrite the sequence's state with fewer cells (mlp_mode.hpp). It keeps `held` in step with
// what llama.cpp holds, in position order, and never moves a position: the next token goes in
// at its true position.
class CacheEditor {
public:
    virtual ~CacheEditor() = default;
    // Called before the single-token decode of token n_seen (n_seen tokens decoded so far).
    virtual void edit(llama_context * ctx, std::vector<HeldToken> & held, int n_seen) = 0;
};

struct DecodeSpec {
    std::string mode;
    CtxConfig cfg;
    EvictionPolicy * policy = nullptr;  // null: nothing is evicted
    CacheEditor * editor = nullptr;     // null: the cache is not rewritten
    bool shift_positions = true;
    bool is_reference = false;
    // memory accounting other than the cache type's (C8: int8 bytes per cell + the scales)
    double cell_bytes = 0;   // 0: the cache type's row sizes
    // the cache's bytes per cell are what llama.cpp allocated (llama_kvc_cache_bytes / cells);
    // with cell_bytes > 0 as well, the two must agree exactly
    bool cell_bytes_from_alloc = false;
    double fixed_bytes = 0;  // held whatever the cell count
    // when set, the bytes held with n cells, in place of n * cell_bytes + fixed_bytes (a cache
    // whose bytes per cell change as groups fill)
    std::function<double(size_t)> held_bytes;
    // the cache also holds bytes beside its cells (kvc's kvq cells: sink and window rows, K
    // centers, bookkeeping): at each step, what llama_kvc_cache_bytes reports for K and V
    // beyond the allocated cells (n_ctx x cell_bytes) is added to the bytes held
    bool side_bytes_from_alloc = false;
};

// One PPL/KL row: decodes the first --n-tokens tokens (the --prompt ones as one batch, then one
// at a time) with the mode's context, policy and editor, scores the positions from --ppl-from
// on against the reference (or writes the reference, spec.is_reference), and counts the memory
// held at every step. The cells llama.cpp holds at the end must be the ones the harness counted.
RunResult run_decode(llama_model * model, const ModelInfo & mi, const Options & o,
                     const std::vector<llama_token> & toks, RefStore & ref, const DecodeSpec & spec);

// The text's tokens (with BOS when asked for); fail() when llama.cpp cannot tokenize it.
std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool bos);

}  // namespace kvc_llama
