// kvc_llama_eval, share mode: a prefix's KV shared between processes through kvc's tiers
// (kvc_tiers_*: content-addressed, checksummed chunks on disk or in Redis; issue 23).
//
// Process 1 (the process the user started) prefills the first --share-prefix tokens of the text
// in batches of one chunk, reads K and V of every layer out of llama_state_seq_get_data
// (parse_f16_state) and stores them with kvc_tiers_store: every full chunk is one key (chained
// BLAKE3 of the tokens and a fingerprint of the model file's hash, layers, KV heads, head_dim,
// f16 and the codec) and one blob (docs/formats/kv-chunk.md). Then it decodes the next
// --share-rest tokens one at a time and keeps their logits: the reference, a run that prefilled.
//
// Process 2 (--share-clients of them, started at once with posix_spawn of this binary with the
// internal --share-child flag) loads the model into a fresh context and, after a start barrier
// (every process 2 ready before any restores), looks the prefix up (kvc_tiers_lookup), restores
// it (kvc_tiers_restore), builds a state blob of the restored cells (build_f16_state, the
// layout llama_state_parse.hpp documents) and loads it (llama_state_seq_set_data). What it did
// not get (a tier down, a chunk missing, corrupt or of another model, the tokens after the last
// full chunk) it prefills, in the same chunk-aligned batches as process 1. Then it decodes the
// same --share-rest tokens one at a time and writes their logits to a file; process 1 compares
// them bit for bit with its own. With a lossy codec (kvq) the logits cannot be identical: the
// row reports their KL against process 1's (`kl`), `logits_identical` false is expected, and
// the control is compared with the first process 2 (the same restored KV but one damaged value).
//
// Tiers: --redis URL (Redis only), or else a disk tier (one file per chunk) in --share-dir or a
// temporary directory. The in-process memory tier is off in both processes: it cannot carry
// anything from one process to another.
//
// share_mode.cpp has both processes; this header offers the two entry points.
#pragma once

#include "decode.hpp"
#include "eval_common.hpp"

#include "llama.h"

#include <string>
#include <vector>

namespace kvc_llama {

// Process 1: the share row of text number text_no; args is this process's command line, which
// the process 2s it starts get with the internal flags added.
RunResult run_share(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks,
                    int text_no, const std::vector<std::string> & args);

// A process 2 (--share-child): restore (or recompute) the prefix, decode the rest, write
// <prefix>.logits and <prefix>.txt ("key value" lines). Returns 0 whenever the tiers failed:
// that is a fallback.
int run_share_child(llama_model * model, const ModelInfo & mi, const Options & o);

}  // namespace kvc_llama
