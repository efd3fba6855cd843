// kvc_llama_eval, the dump mode: every layer's post-RoPE K and V as the cache holds them (and
// Q, and the f32 rows before the cache), in the realkv format (raw + JSON sidecar), compared
// bit for bit with a reference directory (dump_mode.cpp).
#pragma once

#include "decode.hpp"
#include "eval_common.hpp"

#include "llama.h"

#include <string>
#include <vector>

namespace kvc_llama {

// The dump row of one text: --dump-tokens (or --n-tokens) tokens in batches of 512, files in
// --dump-dir named after tag ("textA"), compared with --realkv-dir's textA files when given.
RunResult run_dump(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks,
                   const std::string & text_path, const std::string & text, const std::string & tag);

}  // namespace kvc_llama
