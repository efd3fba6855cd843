// kvc_llama_eval, the c8 and c8-h2o modes: kvc's C8 (int8 per channel, through kvc_quant)
// calibrated on the first tokens, then every K/V row quantized and dequantized before SET_ROWS
// writes it; c8-h2o adds kvc's H2O at each --kv-ratios (c8_hooks.cpp).
#pragma once

#include "decode.hpp"
#include "eval_common.hpp"

#include "llama.h"

#include <vector>

namespace kvc_llama {

// The c8 row (when --modes has c8) and the c8-h2o rows (c8-h2o, one per --kv-ratios), appended
// to rows in that order, after one calibration run.
void run_c8(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks,
            RefStore & ref, std::vector<RunResult> & rows);

}  // namespace kvc_llama
