// kvc_llama_eval, mlp modes: kvc-mlp's learned compressor on the cache llama.cpp holds.
//
//   mlp@F          the --mlp-weights file of factor F (plain mlp: the one file, its factor)
//   mlp-meanpool@F weights generated here whose MLPs compute each group's exact mean: a
//                  baseline for what the MLP adds, not a trained compressor
//
// What is compressed: the seed's prefix compression (kvc-mlp's plan: groups of F consecutive
// tokens through the K and V MLPs of each layer, [F * head_dim] -> [head_dim]) applied to the
// older cells, those outside the first --sink and the last --recent. From --trigger on, every
// --interval decode steps, the oldest cells not yet compressed go through kvc_mlp_compress_inplace
// (include/kvc.h), whole groups only, as many as it takes to bring the cell count down to the
// budget (--budget adaptive: ceil(seen / --ratio), fixed: ceil(n_tokens / --ratio)) or as many
// as there are; never fewer than the file's min_seq_len groups. Compressed cells are never
// compressed again.
//
// How: the sequence's state (llama_state_seq_get_data) is parsed (llama_state_parse.hpp), the
// span's K and V rows of every layer gathered into kvc's [heads, tokens, head_dim] layout,
// compressed in place, and the state written back with g cells where the span had g * F
// (llama_state_seq_set_data). Positions follow kvc-mlp's RoPE-decoupled rule: K is cached
// after RoPE, so a compressed cell needs no position of its own; it takes its group's last
// position (only the causal mask reads it), and new tokens keep their true positions.
// Memory: every cell counts as an f16 cell, compressed or not.
//
// With a "+kvq:CONFIG" / "+kvq-plan:FILE" suffix (mlp@4+kvq:k8v4) every cell is a kvq cell:
// new rows go through kvq's quantizer as they are written (KvqSetup), so the MLP reads the
// values a kvq cache holds (dequantized, as an engine compressing its kvq cache would have to),
// and each compressed group's K and V rows go through the quantizer again before the state is
// written back: the cache never holds a value a kvq cache could not. Memory: kvq's packed bytes
// per held cell (compressed or not), the --kvq-sink cells at f16 (--kvq-sink may not exceed
// --sink, so no compressed cell is ever a protected one).
//
// mlp_mode.cpp has the weights, the compression (a CacheEditor of the decode loop) and the row.
#pragma once

#include "decode.hpp"
#include "eval_common.hpp"

#include "kvc.h"
#include "llama.h"

#include <memory>
#include <string>
#include <vector>

namespace kvc_llama {

struct MlpWeights {
    std::string source;     // the file, or what generated the weights
    bool meanpool = false;  // generated mean-pool weights (checked against the exact mean)
    std::shared_ptr<kvc_mlp> h;
    kvc_mlp_info info{};
};

// Whether a mode (with or without a "+kvq:" / "+kvq-plan:" suffix) is an mlp mode.
bool is_mlp_mode(const std::string & mode);

// The --mlp-weights files, loaded and checked, and which one each mlp mode runs with: all
// settled before anything is decoded.
struct MlpSet {
    std::vector<MlpWeights> files;

    // The file an mlp mode runs with; UsageError when none or two fit it.
    const MlpWeights & pick(const std::string & mode) const;
};

// Loads every --mlp-weights file, checks it fits the model (UsageError otherwise) and that
// every mlp mode has its file.
MlpSet load_mlp_set(const Options & o, const ModelInfo & mi);

// One mlp row (mlp, mlp@F, mlp-meanpool@F, each with an optional +kvq suffix).
RunResult run_mlp(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks,
                  RefStore & ref, const std::string & mode, const MlpSet & set);

}  // namespace kvc_llama
