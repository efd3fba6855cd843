// kvc_llama_eval, what every mode shares: errors, the options and their parser, small
// helpers (files, JSON text, time, log-softmax and KL), llama.cpp's log, the model's facts and
// the JSON-ready extra fields of a result row (eval_common.cpp).
#pragma once

#include "llama.h"

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kvc_llama {

// ------------------------------------------------------------------------------------------
// errors

// Bad input: the program ends with status 2 and the message.
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Anything else that went wrong: status 1 and the message.
[[noreturn]] void fail(const std::string & msg);

// ------------------------------------------------------------------------------------------
// options

struct Options {
    std::string model;
    std::vector<std::string> texts;
    std::vector<std::string> modes = {"full",  "streaming", "kvc-streaming", "h2o",      "h2o-fa",   "c8",
                                      "c8-h2o", "q8_0",      "q4_0",          "q8_0-q4_0", "kvq:k4v4", "kvq:k4v2",
                                      "kvq-kc32:k4v4", "probe", "state", "dump"};
    int kvq_sink = 0;  // kvq modes: tokens at positions below this stay as the f16 cache holds them
    int kvq_recent = 0;  // kvq: / kvq-plan: modes: the newest tokens stay as the f16 cache holds them
    int kvq_recent_bits = 16;  // 16: the window in f16; 2..8: as kvq k<B>v<B> rows
    bool kvq_center = false;  // kvq: / kvq-plan: with --kvq-recent: code K rows minus a per-head center
    bool kvq_fa = false;  // kvq: modes with flash attention on (as the kvq-native modes run)
    bool kvq_native_fa = true;  // kvq-native modes with flash attention (off: llama.cpp must refuse)
    // decode-speed table (kvq_native_mode.hpp): cache types, filled contexts, decoded tokens
    std::vector<std::string> speed_modes;
    std::vector<int> speed_ctx = {2048, 8192};
    int speed_decode = 32;
    int speed_repeats = 1;
    std::vector<double> kv_ratios = {3.5};  // whole-model KV ratios the kvc eviction modes aim at
    int block = 16;                          // kvc_h2o block_tokens in the llama.cpp modes
    int c8_calib = 0;                        // tokens calibrating the C8 scales; 0: ppl_from - 1
    std::string c8_rule = "rope";            // C8 K scales: per channel, or per RoPE pair radius
    int n_tokens = 2048;
    int ppl_from = 513;   // first target position scored
    int prompt = 0;       // tokens decoded as one batch before the token-by-token part
    int threads = 1;      // 1: stable on shared machines (OpenMP barriers spin when oversubscribed)
    double ratio = 3.5;
    int sink = 32;
    int recent = 256;
    int trigger = 512;
    int interval = 16;
    std::string budget = "adaptive";  // adaptive: n_seen/ratio cells (MNN rule); fixed: n_tokens/ratio
    std::string positions = "shift";  // shift: close gaps with seq_add; keep: original positions
    bool bos = false;
    std::string json;
    std::string dump_dir;
    std::string realkv_dir;
    int dump_tokens = 0;  // 0: n_tokens
    std::vector<std::string> mlp_weights;  // mlp modes: .bin v1 compressor files (mlp_mode.hpp)
    bool verbose = false;
    bool progress = false;  // one line on stderr per finished decode (long runs: numbers before the end)
    // share mode (share_mode.hpp)
    std::string redis;               // redis:// or redis+cluster:// URL; empty: the disk tier
    std::string share_dir;           // disk tier directory; empty: a temporary one, removed after
    int share_prefix = 2048;         // tokens prefilled by process 1 and restored by process 2
    int share_rest = 64;             // tokens after the prefix, decoded one at a time and compared
    int share_clients = 1;           // process-2 instances started at once
    int share_rounds = 1;            // times the share_clients processes are started, one after the other
    int share_chunk = 256;           // tokens per chunk (kvc_tiers_config.chunk_tokens)
    std::string share_codec = "gear-v2";
    std::string share_calibration;   // tc-<bound>: the transform coder's calibration file
    std::string share_between;       // shell command run after the store, before the process 2s
    // internal: set by process 1 on the command line of the processes it starts
    std::string share_child;         // output path prefix of a process 2
    int share_text = 0;              // which --text a process 2 works on
    int share_sync_r = -1, share_sync_w = -1;  // start barrier pipe ends
    bool share_control = false;      // a process 2 that damages one restored value on purpose
};

// The command line, checked (UsageError on anything it refuses); --help prints the usage and
// exits 0.
Options parse_options(int argc, char ** argv);

int parse_int(const std::string & flag, const std::string & v, int lo, int hi);
double parse_double(const std::string & flag, const std::string & v, double lo, double hi);
std::vector<std::string> split_commas(const std::string & s);

bool has_mode(const Options & o, const char * m);

// ------------------------------------------------------------------------------------------
// small helpers

// The file's bytes; UsageError when it cannot be read.
std::string read_file(const std::string & path);
// Writes the bytes to a file; fail() when it cannot.
void write_bytes(const std::string & path, const void * data, size_t n);
std::string base_name(const std::string & path);
std::string json_escape(const std::string & s);
// %.10g, or null for a value that is not finite
std::string json_num(double x);
double now_s();

// llama.cpp's last error line (why a context was refused, for instance)
extern std::string g_llama_last_error;
// llama.cpp's log callback: errors on stderr (and kept in g_llama_last_error), everything with
// a non-null user data pointer (--verbose)
void quiet_log(ggml_log_level level, const char * text, void * ud);

// log-softmax of one row of logits, in double for the sums
void log_softmax(const float * logits, int n, std::vector<float> & out);
// KL(P_ref || P) from two log-softmax rows
double kl_div(const std::vector<float> & ref, const std::vector<float> & cur);
// how many of the n floats at a and b differ in any bit (logits compared bit for bit)
long bits_differing(const float * a, const float * b, int n);

// Extra fields of a result row: key -> JSON-ready value.
using RunResultExtra = std::vector<std::pair<std::string, std::string>>;

// ------------------------------------------------------------------------------------------
// model facts

struct ModelInfo {
    int n_layer = 0;
    int n_head = 0;
    int n_head_kv = 0;
    // The per-head K and V sizes as llama.cpp reads them: GGUF <arch>.attention.key_length /
    // value_length, else n_embd / n_head (they differ from n_embd / n_head on e.g. Gemma 3,
    // Qwen3, and can differ from each other, as on MLA models).
    int head_dim_k = 0;
    int head_dim_v = 0;
    // Both, where they are equal: every kvc mode treats K and V rows alike (one kvq / C8 / MLP
    // row size, one state row width); kvc_llama_eval refuses those modes on a model whose K and
    // V head sizes differ (require_equal_kv_heads), so they only meet head_dim_k == head_dim_v.
    int head_dim = 0;
    int n_vocab = 0;
    std::string desc;
    std::string file;
    // RoPE, from the model's metadata (what the transform coder's calibration undoes):
    // "norm", "neox", "none" or another llama.cpp rope type by number
    std::string rope_type = "none";
    double rope_freq_base = 0.0;   // <arch>.rope.freq_base (0: not in the metadata)
    double rope_freq_scale = 1.0;  // llama_model_rope_freq_scale_train
    int rope_n_rot = 0;            // <arch>.rope.dimension_count (0: not in the metadata)

    int n_embd_kv() const { return n_head_kv * head_dim; }  // a K or V row, where they are alike
    int n_embd_k() const { return n_head_kv * head_dim_k; }
    int n_embd_v() const { return n_head_kv * head_dim_v; }
    // bytes one cell holds over all layers (K row + V row per layer) for a cache type
    size_t cell_bytes(ggml_type tk, ggml_type tv) const {
        return (size_t) n_layer * (ggml_row_size(tk, n_embd_k()) + ggml_row_size(tv, n_embd_v()));
    }
    // UsageError unless the K and V head sizes are equal: `what` treats K and V rows alike.
    void require_equal_kv_heads(const std::string & what) const {
        if (head_dim_k != head_dim_v) {
            throw UsageError(what + " treats K and V rows alike (one head size); this model's K heads hold " +
                             std::to_string(head_dim_k) + " values and its V heads " + std::to_string(head_dim_v));
        }
    }
};

}  // namespace kvc_llama
