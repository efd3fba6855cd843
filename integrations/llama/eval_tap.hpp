// kvc_llama_eval, the eval callback (eval_tap.cpp) and what plugs into it: row hooks (K/V rows
// before SET_ROWS writes them, and after), attention scorers (per-cell attention mass, from the
// softmax or, with flash attention on, a recompute checked against fattn_bound.hpp), and the
// tap's own SET_ROWS checks and dump captures.
#pragma once

#include "eval_common.hpp"

#include "ggml.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvc_llama {

// ------------------------------------------------------------------------------------------
// eval-callback plumbing (flash attention off): what the kvc modes will need

// Receives the rows llama.cpp is about to write into the cache: t is Kcur-<il> (post-RoPE) or
// Vcur-<il>, f32 [head_dim, n_head_kv, n_tokens]. A transform may change t->data in place; the
// SET_ROWS node that follows reads a view of this very tensor. kvc's C8 quantize-dequantize
// goes here.
class RowHook {
public:
    virtual ~RowHook() = default;
    virtual void on_rows(int il, bool is_v, ggml_tensor * t) = 0;
    // After SET_ROWS wrote layer il's rows into the cache: dst is the node (a view of
    // cache_k_l<il> / cache_v_l<il>), dst->src[1] the cells written. A hook that rewrites cells
    // already in the cache (a channel group that just filled) does it here, before attention
    // reads them.
    virtual void on_set_rows(int /*il*/, bool /*is_v*/, ggml_tensor * /*dst*/) {}
};

class IdentityRowHook : public RowHook {
public:
    void on_rows(int, bool, ggml_tensor *) override {}
};

// Receives, per layer and llama_decode ubatch, the attention mass on every cell:
// cell_mass[c] = softmax probability on cell c summed over the ubatch's query tokens and
// all query heads. kvc's H2O policy is fed from here.
class AttentionScorer {
public:
    virtual ~AttentionScorer() = default;
    virtual void on_layer_scores(int il, const std::vector<float> & cell_mass, int n_queries) = 0;
};

struct TapStats {
    long kq_calls = 0;
    long rows_calls = 0;
    long set_rows_calls = 0;
    double kq_rowsum_max_err = 0.0;  // |sum of all column sums - n_tokens*n_head| / (n_tokens*n_head)
    bool set_rows_reads_hooked_tensor = true;
    std::vector<std::string> shapes;  // printed once per kind
};

struct EvalTap {
    // the tap reads Q, K and V rows as rows of one head size: a model whose K and V head sizes
    // differ is refused (UsageError) rather than read wrongly
    explicit EvalTap(const ModelInfo & mi)
        : n_layer(mi.n_layer), n_head(mi.n_head), n_head_kv(mi.n_head_kv), head_dim(mi.head_dim) {
        mi.require_equal_kv_heads("the eval callback (attention per cell, row hooks)");
    }
    bool want_kq = false;
    bool want_rows = false;
    bool want_set_rows = false;
    bool capture_f32 = false;  // dump mode: keep every Kcur/Vcur row in token order
    bool capture_q = false;    // dump mode: keep every post-RoPE Qcur row in token order
    int n_layer = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;
    RowHook * hook = nullptr;
    AttentionScorer * scorer = nullptr;
    // flash attention on: recompute each layer's attention from the FLASH_ATTN_EXT inputs
    bool want_fattn = false;
    // cells written by the current llama_decode (all ubatches), from layer 0's K SET_ROWS
    std::vector<int64_t> decode_cells;
    // an error inside the callback (never thrown through ggml); checked after each decode
    std::string error;
    std::vector<float> mass;               // scratch: per-cell attention mass of one call
    std::vector<float> kf, vf;             // scratch for the flash-attention recompute
    long fattn_calls = 0;
    long fattn_checked = 0;
    double fattn_max_out_err = 0.0;        // |recomputed attention output - llama.cpp's| (checked calls)
    double fattn_max_excess = 0.0;         // max of that error / its rounding bound (fattn_bound.hpp)
    // negative controls: checked calls in which each deliberate mistake fell outside the bound
    long fattn_ctrl_head_caught = 0, fattn_ctrl_head_calls = 0, fattn_ctrl_cell_caught = 0, fattn_ctrl_scale_caught = 0;
    // data pointers of the tensors the hook saw last, per layer (checked against SET_ROWS)
    std::vector<const void *> hooked_k, hooked_v;

    // per-cell attention mass, summed over layers, query tokens and heads (layer-uniform)
    std::vector<double> cell_scores;
    // cell index of the last token(s) written, from layer 0's K SET_ROWS indices
    std::vector<int64_t> last_cells;

    // dump capture: [layer] -> f32 rows, token-major [n_tokens][n_embd_kv]
    std::vector<std::vector<float>> k_rows, v_rows;
    // dump capture: [layer] -> f32 query rows, token-major [n_tokens][n_head][head_dim]
    std::vector<std::vector<float>> q_rows;
    // dump capture: layer 0's kq_soft_max of the last ubatch, [n_head][n_tokens][n_kv]
    std::vector<float> kq0;
    int64_t kq0_nkv = 0, kq0_ntok = 0;

    TapStats stats;
    bool logged_kq = false, logged_k = false, logged_v = false, logged_sr_k = false, logged_sr_v = false;
};

// The llama.cpp eval callback (llama_context_params::cb_eval), user data an EvalTap. It never
// throws: an error is kept in EvalTap::error, which the caller checks after llama_decode.
bool eval_callback(ggml_tensor * t, bool ask, void * ud);

// "'name' op OP type T ne=[a,b,c,d]": a tensor in an error message.
std::string shape_str(const ggml_tensor * t);

// 65536-entry f16 -> f32 table (the recompute converts every cached K and V element)
const std::vector<float> & f16_table();

}  // namespace kvc_llama
