// kvc_llama_eval, kvq as llama.cpp's real cache: the kvq-native modes and the decode-speed
// table (kvq_native_mode.cpp).
//
// These need llama.cpp with kvc's patch series (integrations/llama/patches/): ggml types
// GGML_TYPE_KVQ<bits>_<head_dim> whose kernels are kvc's (ggml-kvc.h), and
// llama_context_params::kvc_kvq_plan for per-layer types. Unlike the kvq: modes, nothing is
// hooked: llama.cpp allocates packed rows, writes them through the type's from_float, and
// its flash attention reads them through vec_dot and to_float. Memory is what llama.cpp
// allocated (llama_kvc_cache_bytes), checked against kvc's row sizes.
#pragma once

#include "decode.hpp"
#include "eval_common.hpp"

#include "llama.h"

#include <string>
#include <vector>

namespace kvc_llama {

// kvq-native:<config> or kvq-native-plan:<file>
bool is_native_mode(const std::string & m);

// One kvq-native row (flash attention unless --kvq-native-no-fa); a config or plan that is not
// a kvq block format, or a head_dim without kvq types, is a UsageError.
RunResult run_kvq_native(llama_model * model, const ModelInfo & mi, const Options & o,
                         const std::vector<llama_token> & toks, RefStore & ref, const std::string & m);

// streaming+kvq-native:<config> or streaming+kvq-native-plan:<file>: the streaming row (sink +
// window eviction through llama_memory_seq_rm, positions shifted with llama_memory_seq_add under
// --positions shift) on llama.cpp's kvq cache; with a plan's protections every shift goes
// through kvc's kvq cells (their K-shift), so its KL against the f16 streaming row tests it.
bool is_streaming_native_mode(const std::string & m);
RunResult run_streaming_native(llama_model * model, const ModelInfo & mi, const Options & o,
                               const std::vector<llama_token> & toks, RefStore & ref, const std::string & m);

// ------------------------------------------------------------------------------------------
// decode speed: tokens per second of single-token decode with the cache filled to each of
// --speed-ctx tokens, per cache type, at one thread and at --threads, all in one run

struct SpeedRow {
    std::string mode;
    int n_ctx = 0;
    int threads = 0;
    double tok_s = 0;                // the median over --speed-repeats interleaved rounds
    std::vector<double> tok_s_runs;  // each round's
    double alloc_bytes = 0;
};

// The decode-speed table: every --speed-modes cache type at every --speed-ctx fill, one line
// on stdout per row as it is measured.
std::vector<SpeedRow> run_speed(llama_model * model, const ModelInfo & mi, const Options & o,
                                const std::vector<llama_token> & text_toks);

}  // namespace kvc_llama
