// kvc_llama_eval, the kvq-kc<G>:CONFIG modes: K per channel over groups of G tokens (KIVI,
// kvc_kvq_channel_*), V as kvq rows (kvq_channel_hooks.cpp).
#pragma once

#include "decode.hpp"
#include "eval_common.hpp"

#include "llama.h"

#include <cstdint>
#include <string>
#include <vector>

namespace kvc_llama {

struct ChannelMode {
    uint32_t group = 0;
    bool window8 = false;  // the unfilled group held as kvq 8-bit rows ("w8"), not f16
    std::string config;    // the kvq config string: K bits for the blocks, V rows
};

// "kvq-kc32:k4v4" -> {32, f16 window, "k4v4"}, "kvq-kc64w8:k4v4" -> {64, 8-bit window,
// "k4v4"}; false when m is not such a mode.
bool parse_channel_mode(const std::string & m, ChannelMode * out);

// One kvq-kc<G>:CONFIG / kvq-kc<G>w8:CONFIG row, m the mode string parse_channel_mode read into cm
// (flash attention as --kvq-fa says).
RunResult run_kvq_channel(llama_model * model, const ModelInfo & mi, const Options & o,
                          const std::vector<llama_token> & toks, RefStore & ref, const ChannelMode & cm,
                          const std::string & m);

}  // namespace kvc_llama
