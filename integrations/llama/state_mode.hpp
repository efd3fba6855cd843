// kvc_llama_eval, the state mode: the sequence state saved, restored into a fresh context and
// compressed with kvc's codec, the next-token logits compared bit for bit (state_mode.cpp).
#pragma once

#include "decode.hpp"
#include "eval_common.hpp"

#include "llama.h"

#include <vector>

namespace kvc_llama {

// The state row of one text; fail() when a restore differs or a damaged blob is accepted.
RunResult run_state(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks);

}  // namespace kvc_llama
