// kvc_llama_eval: kvc's quality and memory harness inside llama.cpp, built against llama.h only.
//
// It decodes a text token by token (batch of 1 after an optional prompt) and reports, per mode:
// perplexity over the positions after a warm-up, mean KL divergence of the next-token
// distribution against the full-cache reference run, tokens/s, and the KV memory actually held
// (bytes, and the ratio to the full f16 cache). Modes:
//   full       f16 cache, flash attention off: the reference every other mode is compared with
//   streaming  sink + recent window eviction through llama_memory_seq_rm, positions shifted
//              (llama_memory_seq_add) or kept; the policy is an EvictionPolicy object so that
//              kvc's policy plugs in through the C API later
//   q8_0 q4_0  llama.cpp's own quantized cache types (flash attention on), comparison rows
//   probe      the eval-callback plumbing the kvc modes need: kq_soft_max-<il> column sums per
//              cell, the SET_ROWS index (cell) of every new token, and a hook on Kcur-<il> /
//              Vcur-<il> before SET_ROWS writes them (identity for now); checks what it sees and
//              measures its overhead
//   dump       every layer's post-RoPE K and V as the cache holds them, in the realkv format
//              (raw + JSON sidecar), compared bit for bit with a reference directory
//   state      llama_state_seq_get_data / set_data round trip into a fresh context, next-token
//              logits compared bit for bit, truncated state rejected
// Output: a table on stdout and, with --json FILE, the same numbers as JSON.
// Bad input (missing files, bad options, a text too short) exits with status 2 and one line.

#include "fattn_bound.hpp"
#include "kvc.h"
#include "llama.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

// ------------------------------------------------------------------------------------------
// errors

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string & msg) { throw std::runtime_error(msg); }

// ------------------------------------------------------------------------------------------
// options

struct Options {
    std::string model;
    std::vector<std::string> texts;
    std::vector<std::string> modes = {"full", "streaming", "kvc-streaming", "h2o",   "h2o-fa", "c8",
                                      "c8-h2o", "q8_0",    "q4_0",          "probe", "state",  "dump"};
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
    bool verbose = false;
};

const char * kUsage =
    "usage: kvc_llama_eval --model GGUF --text FILE [--text FILE ...] [options]\n"
    "  --modes LIST        comma list of full,streaming,kvc-streaming,h2o,h2o-fa,c8,c8-h2o,\n"
    "                      q8_0,q4_0,probe,state,dump\n"
    "                      (default: all; full always runs first as the reference)\n"
    "  --n-tokens N        tokens of each text to decode [2048]\n"
    "  --ppl-from P        first target position scored [513]\n"
    "  --prompt N          tokens decoded as one batch first [0]\n"
    "  --threads N         decode threads [1]\n"
    "  --ratio R --sink S --recent W --trigger T --interval I   budget [3.5 32 256 512 16]\n"
    "  --kv-ratios LIST    KV ratios (whole model, vs the full f16 cache of n-tokens) the kvc\n"
    "                      modes kvc-streaming, h2o, h2o-fa, c8-h2o run at [3.5]\n"
    "  --c8-calib N        tokens whose K/V rows calibrate kvc's C8 scales [ppl-from - 1:\n"
    "                      the unscored warm-up]\n"
    "  --c8-rule channel|rope  C8 K scales: channel = per-channel min/max (asymmetric);\n"
    "                      rope = per rotated channel pair, max radius / 127, for the model's\n"
    "                      rope type (NORM or NEOX), never clipping later positions [rope]\n"
    "  --block B           kvc_h2o block_tokens for the kvc modes [16]\n"
    "  --budget adaptive|fixed   adaptive: keep ceil(seen/R) (MNN); fixed: ceil(n_tokens/R) [adaptive]\n"
    "  --positions shift|keep    after eviction shift positions down or keep them [shift]\n"
    "  --bos               prepend BOS (default: no BOS, as the realkv data)\n"
    "  --dump-dir DIR      where the dump mode writes (default: no files, compare only)\n"
    "  --dump-tokens N     tokens the dump mode runs [n-tokens]\n"
    "  --realkv-dir DIR    reference dumps to compare with (textA.{K,V}.{f16,bf16}.bin)\n"
    "  --json FILE         write the results as JSON\n"
    "  --verbose           llama.cpp's log on stderr\n";

int parse_int(const std::string & flag, const std::string & v, int lo, int hi) {
    char * end = nullptr;
    errno = 0;
    long x = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi) {
        throw UsageError(flag + ": expected an integer in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "], got '" + v + "'");
    }
    return (int) x;
}

double parse_double(const std::string & flag, const std::string & v, double lo, double hi) {
    char * end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(x) || x < lo || x > hi) {
        throw UsageError(flag + ": expected a number in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "], got '" + v + "'");
    }
    return x;
}

std::vector<std::string> split_commas(const std::string & s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (!item.empty()) out.push_back(item);
    }
    return out;
}

Options parse_options(int argc, char ** argv) {
    Options o;
    bool modes_given = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) throw UsageError(a + ": missing value");
            return argv[++i];
        };
        if (a == "--model") o.model = val();
        else if (a == "--text") o.texts.push_back(val());
        else if (a == "--modes") { o.modes = split_commas(val()); modes_given = true; }
        else if (a == "--n-tokens") o.n_tokens = parse_int(a, val(), 2, 1 << 20);
        else if (a == "--ppl-from") o.ppl_from = parse_int(a, val(), 1, 1 << 20);
        else if (a == "--prompt") o.prompt = parse_int(a, val(), 0, 1 << 20);
        else if (a == "--threads") o.threads = parse_int(a, val(), 1, 1024);
        else if (a == "--ratio") o.ratio = parse_double(a, val(), 1.0, 1e6);
        else if (a == "--sink") o.sink = parse_int(a, val(), 0, 1 << 20);
        else if (a == "--recent") o.recent = parse_int(a, val(), 1, 1 << 20);
        else if (a == "--trigger") o.trigger = parse_int(a, val(), 0, 1 << 20);
        else if (a == "--interval") o.interval = parse_int(a, val(), 1, 1 << 20);
        else if (a == "--budget") o.budget = val();
        else if (a == "--block") o.block = parse_int(a, val(), 1, 1 << 16);
        else if (a == "--c8-calib") o.c8_calib = parse_int(a, val(), 1, 1 << 20);
        else if (a == "--c8-rule") o.c8_rule = val();
        else if (a == "--kv-ratios") {
            o.kv_ratios.clear();
            for (const auto & r : split_commas(val())) o.kv_ratios.push_back(parse_double(a, r, 1.0, 1e6));
            if (o.kv_ratios.empty()) throw UsageError("--kv-ratios: at least one ratio");
        }
        else if (a == "--positions") o.positions = val();
        else if (a == "--bos") o.bos = true;
        else if (a == "--json") o.json = val();
        else if (a == "--dump-dir") o.dump_dir = val();
        else if (a == "--dump-tokens") o.dump_tokens = parse_int(a, val(), 1, 1 << 20);
        else if (a == "--realkv-dir") o.realkv_dir = val();
        else if (a == "--verbose") o.verbose = true;
        else if (a == "-h" || a == "--help") { std::fputs(kUsage, stdout); std::exit(0); }
        else throw UsageError("unknown option '" + a + "' (see --help)");
    }
    if (o.model.empty()) throw UsageError("--model is required");
    if (o.texts.empty()) throw UsageError("at least one --text is required");
    if (o.budget != "fixed" && o.budget != "adaptive") throw UsageError("--budget: fixed or adaptive");
    if (o.c8_rule != "channel" && o.c8_rule != "rope") throw UsageError("--c8-rule: channel or rope");
    if (o.positions != "shift" && o.positions != "keep") throw UsageError("--positions: shift or keep");
    if (o.ppl_from >= o.n_tokens) throw UsageError("--ppl-from must be below --n-tokens");
    if (o.prompt >= o.n_tokens) throw UsageError("--prompt must be below --n-tokens");
    static const char * known[] = {"full", "streaming", "kvc-streaming", "h2o",   "h2o-fa", "c8",
                                   "c8-h2o", "q8_0",    "q4_0",          "probe", "state",  "dump"};
    for (const auto & m : o.modes) {
        if (std::find_if(std::begin(known), std::end(known), [&](const char * k) { return m == k; }) ==
            std::end(known)) {
            throw UsageError("--modes: unknown mode '" + m + "'");
        }
    }
    (void) modes_given;
    return o;
}

bool has_mode(const Options & o, const char * m) {
    return std::find(o.modes.begin(), o.modes.end(), m) != o.modes.end();
}

// ------------------------------------------------------------------------------------------
// small helpers

std::string read_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw UsageError("cannot read '" + path + "'");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string base_name(const std::string & path) {
    auto p = path.find_last_of('/');
    return p == std::string::npos ? path : path.substr(p + 1);
}

std::string json_escape(const std::string & s) {
    std::string out;
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            case '\r': out += "\\r"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += (char) c;
                }
        }
    }
    return out;
}

std::string json_num(double x) {
    if (!std::isfinite(x)) return "null";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.10g", x);
    return buf;
}

double now_s() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

void quiet_log(ggml_log_level level, const char * text, void * ud) {
    const bool verbose = ud != nullptr;
    if (verbose || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

// log-softmax of one row of logits, in double for the sums
void log_softmax(const float * logits, int n, std::vector<float> & out) {
    out.resize(n);
    float mx = logits[0];
    for (int i = 1; i < n; ++i) mx = std::max(mx, logits[i]);
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += std::exp((double) logits[i] - mx);
    const double lse = mx + std::log(sum);
    for (int i = 0; i < n; ++i) out[i] = (float) ((double) logits[i] - lse);
}

// KL(P_ref || P) from two log-softmax rows
double kl_div(const std::vector<float> & ref, const std::vector<float> & cur) {
    double kl = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double p = std::exp((double) ref[i]);
        if (p > 0.0) kl += p * ((double) ref[i] - (double) cur[i]);
    }
    return kl;
}

// ------------------------------------------------------------------------------------------
// model facts

struct ModelInfo {
    int n_layer = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;
    int n_vocab = 0;
    std::string desc;
    std::string file;

    int n_embd_kv() const { return n_head_kv * head_dim; }
    // bytes one cell holds over all layers (K row + V row per layer) for a cache type
    size_t cell_bytes(ggml_type tk, ggml_type tv) const {
        return (size_t) n_layer * (ggml_row_size(tk, n_embd_kv()) + ggml_row_size(tv, n_embd_kv()));
    }
};

// ------------------------------------------------------------------------------------------
// eviction policy: the seam where kvc's policy (through the C API) replaces the local one

using RunResultExtra = std::vector<std::pair<std::string, std::string>>;

struct HeldToken {
    llama_pos pos;      // position the cache holds it at (changes when positions are shifted)
    int token_index;    // index of the token in the text
    int64_t cell = -1;  // llama.cpp cell holding it (from the layer-0 K SET_ROWS index), -1: unknown
};

struct EvalTap;

struct EvictRange {
    size_t begin;  // indices into the held list, [begin, end)
    size_t end;
};

class EvictionPolicy {
public:
    virtual ~EvictionPolicy() = default;
    virtual std::string name() const = 0;
    // Called before each single-token decode. held: the tokens the cache holds, in position
    // order; n_seen: tokens decoded so far. Returns disjoint ranges of held to evict, sorted.
    virtual std::vector<EvictRange> plan(const std::vector<HeldToken> & held, int n_seen) = 0;
    // The most cells the policy will ever hold (to size the llama.cpp context).
    virtual int max_cells() const = 0;
    // Policies that score tokens from attention see the held list and the eval tap.
    virtual void bind(const std::vector<HeldToken> *, EvalTap *) {}
};

// StreamingLLM-style: keep `sink` first tokens and the most recent ones so that at most
// `target` cells are held; evicts only once n_seen reaches `trigger`, then every `interval`
// decode steps (the MNN H2O schedule), so the cache oscillates between target and
// target + interval - 1 cells.
class SinkWindowPolicy : public EvictionPolicy {
public:
    SinkWindowPolicy(int sink, int recent, double ratio, int trigger, int interval, bool adaptive,
                     int n_total)
        : sink_(sink), recent_(recent), ratio_(ratio), trigger_(trigger), interval_(interval),
          adaptive_(adaptive), n_total_(n_total) {}

    std::string name() const override { return "sink+window"; }

    int target(int n_seen) const {
        const int base = adaptive_ ? n_seen : n_total_;
        const int t = (int) std::ceil((double) base / ratio_);
        return std::max(t, sink_ + recent_);
    }

    int max_cells() const override { return std::min(n_total_, target(n_total_) + interval_); }

    std::vector<EvictRange> plan(const std::vector<HeldToken> & held, int n_seen) override {
        if (n_seen < trigger_) return {};
        if (last_ >= 0 && n_seen - last_ < interval_) return {};
        const int tgt = target(n_seen);
        if ((int) held.size() <= tgt) return {};
        last_ = n_seen;
        const size_t n_evict = held.size() - (size_t) tgt;
        const size_t b = std::min((size_t) sink_, held.size());
        const size_t e = std::min(held.size(), b + n_evict);
        if (e <= b) return {};
        return {EvictRange{b, e}};
    }

private:
    int sink_, recent_;
    double ratio_;
    int trigger_, interval_;
    bool adaptive_;
    int n_total_;
    int last_ = -1;
};

// Applies a plan to llama.cpp's cache: llama_memory_seq_rm per range (highest first), then,
// when shifting, llama_memory_seq_add moves every later position down over the gap (llama.cpp
// re-rotates the cached K for the new positions on the next decode).
void apply_evictions(llama_memory_t mem, std::vector<HeldToken> & held,
                     const std::vector<EvictRange> & plan, bool shift) {
    for (auto it = plan.rbegin(); it != plan.rend(); ++it) {
        if (it->begin >= it->end || it->end > held.size()) fail("eviction plan out of range");
        const llama_pos p0 = held[it->begin].pos;
        const llama_pos p1 = held[it->end - 1].pos + 1;
        if (!llama_memory_seq_rm(mem, 0, p0, p1)) fail("llama_memory_seq_rm refused a range");
        held.erase(held.begin() + (long) it->begin, held.begin() + (long) it->end);
        if (shift) {
            const llama_pos delta = p1 - p0;
            llama_memory_seq_add(mem, 0, p1, -1, -delta);
            for (size_t i = it->begin; i < held.size(); ++i) held[i].pos -= delta;
        }
    }
}

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
    bool want_kq = false;
    bool want_rows = false;
    bool want_set_rows = false;
    bool capture_f32 = false;  // dump mode: keep every Kcur/Vcur row in token order
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

    TapStats stats;
    bool logged_kq = false, logged_k = false, logged_v = false, logged_sr_k = false, logged_sr_v = false;
};

int layer_of(const char * name, const char * prefix) {
    const size_t n = std::strlen(prefix);
    if (std::strncmp(name, prefix, n) != 0) return -1;
    const char * p = name + n;
    if (*p < '0' || *p > '9') return -1;
    char * end = nullptr;
    long il = std::strtol(p, &end, 10);
    if (*end != '\0') return -1;
    return (int) il;
}

std::string shape_str(const ggml_tensor * t) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "'%s' op %s type %s ne=[%lld,%lld,%lld,%lld]", ggml_get_name(t),
                  ggml_op_name(t->op), ggml_type_name(t->type), (long long) t->ne[0], (long long) t->ne[1],
                  (long long) t->ne[2], (long long) t->ne[3]);
    return buf;
}

float f32_at(const ggml_tensor * t, int64_t i0, int64_t i1, int64_t i2) {
    const char * p = (const char *) t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2];
    return *(const float *) p;
}

// llama.cpp names several tensors "Kcur-<il>" / "Vcur-<il>" (the projection's MUL_MAT, its
// 3-D reshape, the RoPE). The rows SET_ROWS writes are the RoPE output for K and the 3-D
// [head_dim, n_head_kv, n_tokens] view of the projection for V; only those are hooked.
bool is_row_target(const EvalTap * tap, const ggml_tensor * t, int * il, bool * is_v) {
    const char * name = ggml_get_name(t);
    const int ik = layer_of(name, "Kcur-");
    const int iv = layer_of(name, "Vcur-");
    if (ik < 0 && iv < 0) return false;
    if (t->ne[0] != tap->head_dim || t->ne[1] != tap->n_head_kv || t->ne[3] != 1) return false;
    if (ik >= 0 && t->op != GGML_OP_ROPE) return false;
    *il = ik >= 0 ? ik : iv;
    *is_v = iv >= 0;
    return *il < tap->n_layer;
}

// 65536-entry f16 -> f32 table (the recompute converts every cached K and V element)
const std::vector<float> & f16_table() {
    static const std::vector<float> table = [] {
        std::vector<float> x(65536);
        for (uint32_t i = 0; i < 65536; ++i) x[i] = ggml_fp16_to_fp32((ggml_fp16_t) i);
        return x;
    }();
    return table;
}

const ggml_tensor * view_root(const ggml_tensor * t) {
    while (t->view_src) t = t->view_src;
    return t;
}

// Flash attention on: llama.cpp never forms the softmax, so the attention of this ubatch's
// queries is recomputed from the FLASH_ATTN_EXT node's own inputs, read when the node has
// run: Q (post-RoPE, f32 [head_dim, n_tokens, n_head]), the cache's K (f16 [head_dim, n_kv,
// n_head_kv], K-shifted positions included) and the mask (f16 [n_kv, n_tokens_pad]), with the
// node's scale. softmax(scale * q.k + mask) in double per (query, head) row, summed per cell.
// The first calls are checked against the node's output (sum of p * V): every element must lie
// within the rounding bound of fattn_bound.hpp, derived from the kernel's f16 arithmetic, and
// three deliberate mistakes (a wrong KV-head mapping, the heaviest cell missing, the scale 25 %
// off) must each fall outside it, so the check is shown to be able to fail.
void on_flash_attn(ggml_tensor * t, EvalTap * tap) {
    const ggml_tensor * q = t->src[0];
    const ggml_tensor * k = t->src[1];
    const ggml_tensor * v = t->src[2];
    const ggml_tensor * m = t->src[3];
    const int il = layer_of(ggml_get_name(view_root(k)), "cache_k_l");
    if (il < 0 || il >= tap->n_layer) fail("flash attention: K is not a view of cache_k_l<il>: " + shape_str(view_root(k)));
    float scale, max_bias, softcap;
    std::memcpy(&scale, &t->op_params[0], 4);
    std::memcpy(&max_bias, &t->op_params[1], 4);
    std::memcpy(&softcap, &t->op_params[2], 4);
    if (max_bias != 0.0f || softcap != 0.0f || t->src[4] != nullptr) fail("flash attention: ALiBi, softcap or sinks are not supported");
    if (q->type != GGML_TYPE_F32 || k->type != GGML_TYPE_F16 || v->type != GGML_TYPE_F16 || !m ||
        m->type != GGML_TYPE_F16) {
        fail("flash attention: expected f32 Q, f16 K/V/mask: " + shape_str(q) + " " + shape_str(k));
    }
    const int64_t D = q->ne[0], n_tok = q->ne[1], n_head = q->ne[2], n_kv = k->ne[1], n_kvh = k->ne[2];
    if (D != tap->head_dim || n_head != tap->n_head || n_kvh != tap->n_head_kv || k->ne[0] != D || v->ne[1] != n_kv ||
        v->ne[0] != D || m->ne[0] < n_kv || m->ne[1] < n_tok || q->ne[3] != 1 || k->ne[3] != 1) {
        fail("flash attention: unexpected shapes " + shape_str(q) + " " + shape_str(k) + " " + shape_str(m));
    }
    const auto & f16 = f16_table();
    auto h16 = [&](const ggml_tensor * x, int64_t i0, int64_t i1, int64_t i2) {
        uint16_t b;
        std::memcpy(&b, (const char *) x->data + i0 * x->nb[0] + i1 * x->nb[1] + i2 * x->nb[2], 2);
        return f16[b];
    };
    const bool check = tap->fattn_checked < 64;
    // K (and, when checking, V) of this layer as f32, [kv head][cell][d]
    tap->kf.resize((size_t) n_kvh * n_kv * D);
    for (int64_t h = 0; h < n_kvh; ++h)
        for (int64_t c = 0; c < n_kv; ++c)
            for (int64_t d = 0; d < D; ++d) tap->kf[((size_t) h * n_kv + c) * D + d] = h16(k, d, c, h);
    if (check) {
        tap->vf.resize((size_t) n_kvh * n_kv * D);
        for (int64_t h = 0; h < n_kvh; ++h)
            for (int64_t c = 0; c < n_kv; ++c)
                for (int64_t d = 0; d < D; ++d) tap->vf[((size_t) h * n_kv + c) * D + d] = h16(v, d, c, h);
    }
    tap->mass.assign((size_t) n_kv, 0.0f);
    std::vector<double> logits((size_t) n_kv), p, qk_abs((size_t) n_kv), qk_sq((size_t) n_kv), out, node((size_t) D),
        bound, ctrl, pc, lc;
    std::vector<uint8_t> live((size_t) n_kv);
    const int64_t group = n_head / n_kvh;
    double call_excess = 0.0, ctrl_head = INFINITY, ctrl_cell = 0.0, ctrl_scale = INFINITY;
    for (int64_t qi = 0; qi < n_tok; ++qi) {
        for (int64_t h = 0; h < n_head; ++h) {
            const int64_t kvh = h / group;
            // scaled logits of query qi, head h, against KV head kh (the mask added)
            auto row_logits = [&](int64_t kh, double sc, std::vector<double> & out_logits, bool fill_abs) {
                out_logits.resize((size_t) n_kv);
                for (int64_t c = 0; c < n_kv; ++c) {
                    const float mk = h16(m, c, qi, 0);
                    if (mk == -INFINITY) {
                        out_logits[c] = -INFINITY;
                        continue;
                    }
                    const float * kr = &tap->kf[((size_t) kh * n_kv + c) * D];
                    double dot = 0.0, mag = 0.0, sq = 0.0;
                    for (int64_t d = 0; d < D; ++d) {
                        const double x = (double) f32_at(q, d, qi, h) * kr[d];
                        dot += x;
                        mag += std::fabs(x);
                        sq += x * x;
                    }
                    out_logits[c] = sc * dot + mk;
                    if (fill_abs) {
                        qk_abs[c] = mag;
                        qk_sq[c] = sq;
                    }
                }
            };
            row_logits(kvh, scale, logits, check);
            if (!fattn::softmax(logits, p)) fail("flash attention: a query row with every key masked");
            for (int64_t c = 0; c < n_kv; ++c) tap->mass[c] += (float) p[c];
            if (!check) continue;
            const float * vh = &tap->vf[(size_t) kvh * n_kv * D];
            for (int64_t c = 0; c < n_kv; ++c) live[c] = logits[c] != -INFINITY;
            fattn::attend(p, vh, D, out);
            // the node's output is [head_dim, n_head, n_tokens]
            for (int64_t d = 0; d < D; ++d) {
                node[d] = f32_at(t, d, h, qi);
                tap->fattn_max_out_err = std::max(tap->fattn_max_out_err, std::fabs(out[d] - node[d]));
            }
            fattn::output_bound(p, live, qk_abs, qk_sq, scale, vh, D, out, false, bound);
            call_excess = std::max(call_excess, fattn::excess(out, node, bound));
            // negative controls: how far outside the bound each mistake lands (max over the call)
            if (n_kvh > 1) {
                const int64_t wrong = (kvh + 1) % n_kvh;
                row_logits(wrong, scale, lc, false);
                fattn::softmax(lc, pc);
                fattn::attend(pc, &tap->vf[(size_t) wrong * n_kv * D], D, ctrl);
                ctrl_head = std::isinf(ctrl_head) ? fattn::excess(ctrl, node, bound)
                                                  : std::max(ctrl_head, fattn::excess(ctrl, node, bound));
            }
            if (fattn::without_top_cell(p, vh, D, out, ctrl)) ctrl_cell = std::max(ctrl_cell, fattn::excess(ctrl, node, bound));
            lc.resize((size_t) n_kv);
            for (int64_t c = 0; c < n_kv; ++c) lc[c] = live[c] ? (logits[c] - h16(m, c, qi, 0)) * 0.75 + h16(m, c, qi, 0) : -INFINITY;
            fattn::softmax(lc, pc);
            fattn::attend(pc, vh, D, ctrl);
            ctrl_scale = std::isinf(ctrl_scale) ? fattn::excess(ctrl, node, bound)
                                                : std::max(ctrl_scale, fattn::excess(ctrl, node, bound));
        }
    }
    if (check) {
        tap->fattn_checked++;
        tap->fattn_max_excess = std::max(tap->fattn_max_excess, call_excess);
        // a control counts as caught in this call when some element lies outside the bound
        if (!std::isinf(ctrl_head)) tap->fattn_ctrl_head_caught += ctrl_head > 1.0;
        tap->fattn_ctrl_cell_caught += ctrl_cell > 1.0;
        tap->fattn_ctrl_scale_caught += ctrl_scale > 1.0;
        tap->fattn_ctrl_head_calls += !std::isinf(ctrl_head);
    }
    tap->fattn_calls++;
    if (tap->scorer) tap->scorer->on_layer_scores(il, tap->mass, (int) n_tok);
}

bool eval_callback_inner(ggml_tensor * t, EvalTap * tap);

bool eval_callback(ggml_tensor * t, bool ask, void * ud) {
    auto * tap = (EvalTap *) ud;
    const char * name = ggml_get_name(t);
    int il;
    if (ask) {
        if (tap->want_kq && layer_of(name, "kq_soft_max-") >= 0) return true;
        bool v_;
        if ((tap->want_rows || tap->capture_f32) && is_row_target(tap, t, &il, &v_)) return true;
        if (tap->want_set_rows && t->op == GGML_OP_SET_ROWS) return true;
        if (tap->want_fattn && t->op == GGML_OP_FLASH_ATTN_EXT) return true;
        return false;
    }
    if (!tap->error.empty()) return true;
    try {
        return eval_callback_inner(t, tap);
    } catch (const std::exception & e) {
        // never unwind through ggml: keep the message, the caller fails after llama_decode
        tap->error = e.what();
        return true;
    }
}

bool eval_callback_inner(ggml_tensor * t, EvalTap * tap) {
    const char * name = ggml_get_name(t);
    int il;
    if (t->op == GGML_OP_FLASH_ATTN_EXT) {
        on_flash_attn(t, tap);
        return true;
    }

    if ((il = layer_of(name, "kq_soft_max-")) >= 0) {
        // [n_kv, n_tokens, n_head]: column c is cell c; every (token, head) row sums to 1
        if (t->type != GGML_TYPE_F32 || t->ne[3] != 1) fail("kq_soft_max: unexpected " + shape_str(t));
        if (!tap->logged_kq) {
            tap->stats.shapes.push_back("kq_soft_max: " + shape_str(t) + " = [n_kv, n_tokens, n_head]");
            tap->logged_kq = true;
        }
        if (t->ne[2] != tap->n_head) fail("kq_soft_max: ne[2] is not n_head: " + shape_str(t));
        const int64_t n_kv = t->ne[0];
        if ((int64_t) tap->cell_scores.size() < n_kv) tap->cell_scores.resize(n_kv, 0.0);
        double total = 0.0;
        for (int64_t h = 0; h < t->ne[2]; ++h) {
            for (int64_t q = 0; q < t->ne[1]; ++q) {
                for (int64_t c = 0; c < n_kv; ++c) {
                    const float p = f32_at(t, c, q, h);
                    tap->cell_scores[c] += p;
                    total += p;
                }
            }
        }
        const double expect = (double) t->ne[1] * (double) t->ne[2];
        tap->stats.kq_rowsum_max_err = std::max(tap->stats.kq_rowsum_max_err, std::fabs(total - expect) / expect);
        tap->stats.kq_calls++;
        if (tap->scorer) {
            tap->mass.assign((size_t) n_kv, 0.0f);
            for (int64_t h = 0; h < t->ne[2]; ++h) {
                for (int64_t q = 0; q < t->ne[1]; ++q) {
                    for (int64_t c = 0; c < n_kv; ++c) tap->mass[c] += f32_at(t, c, q, h);
                }
            }
            tap->scorer->on_layer_scores(il, tap->mass, (int) t->ne[1]);
        }
        return true;
    }

    bool is_v = false;
    if (is_row_target(tap, t, &il, &is_v)) {
        if (t->type != GGML_TYPE_F32 || t->ne[3] != 1) fail("Kcur/Vcur: unexpected " + shape_str(t));
        bool & logged = is_v ? tap->logged_v : tap->logged_k;
        if (!logged) {
            tap->stats.shapes.push_back(std::string(is_v ? "Vcur" : "Kcur") + ": " + shape_str(t) +
                                        " = [head_dim, n_head_kv, n_tokens]");
            logged = true;
        }
        if (tap->hook) tap->hook->on_rows(il, is_v, t);
        auto & seen = is_v ? tap->hooked_v : tap->hooked_k;
        if ((int) seen.size() < tap->n_layer) seen.assign(tap->n_layer, nullptr);
        seen[il] = t->data;
        if (tap->capture_f32 && il < tap->n_layer) {
            auto & dst = (is_v ? tap->v_rows : tap->k_rows)[il];
            for (int64_t tok = 0; tok < t->ne[2]; ++tok) {
                for (int64_t h = 0; h < t->ne[1]; ++h) {
                    for (int64_t d = 0; d < t->ne[0]; ++d) dst.push_back(f32_at(t, d, h, tok));
                }
            }
        }
        tap->stats.rows_calls++;
        return true;
    }

    if (t->op == GGML_OP_SET_ROWS) {
        // dst 'cache_k_l<il>' / 'cache_v_l<il>' (views); src[0] the rows, src[1] the cell indices
        const ggml_tensor * src = t->src[0];
        const ggml_tensor * idx = t->src[1];
        const bool is_k = std::strstr(name, "cache_k_l") != nullptr;
        const bool is_v = std::strstr(name, "cache_v_l") != nullptr;
        bool & logged = is_k ? tap->logged_sr_k : tap->logged_sr_v;
        if ((is_k || is_v) && !logged) {
            tap->stats.shapes.push_back(std::string("SET_ROWS ") + shape_str(t) + " <- src0 " + shape_str(src) +
                                        " (view of '" + (src->view_src ? ggml_get_name(src->view_src) : "-") +
                                        "'), src1 " + shape_str(idx));
            logged = true;
        }
        if (is_k && std::strncmp(name, "cache_k_l0", 10) == 0 && (name[10] == ' ' || name[10] == '\0')) {
            if (idx->type != GGML_TYPE_I64) fail("SET_ROWS indices are not I64: " + shape_str(idx));
            tap->last_cells.clear();
            for (int64_t i = 0; i < idx->ne[0]; ++i) {
                tap->last_cells.push_back(*(const int64_t *) ((const char *) idx->data + i * idx->nb[0]));
            }
            tap->decode_cells.insert(tap->decode_cells.end(), tap->last_cells.begin(), tap->last_cells.end());
        }
        // the rows SET_ROWS reads must be the storage of the tensor the hook saw for this layer
        if ((is_k || is_v) && tap->want_rows) {
            const char * digits = name + 9;  // after "cache_k_l" / "cache_v_l"
            char * end = nullptr;
            const long l = std::strtol(digits, &end, 10);
            const auto & seen = is_k ? tap->hooked_k : tap->hooked_v;
            const bool ok = end != digits && l >= 0 && l < (long) seen.size() && seen[l] != nullptr &&
                            (src->data == seen[l] || (src->view_src && src->view_src->data == seen[l]));
            if (!ok) tap->stats.set_rows_reads_hooked_tensor = false;
        }
        tap->stats.set_rows_calls++;
        return true;
    }
    return true;
}

// ------------------------------------------------------------------------------------------
// kvc through include/kvc.h

std::string kvc_message() {
    char buf[1024];
    size_t need = 0;
    if (kvc_last_error_message(buf, sizeof buf, &need) != KVC_OK) return "(message longer than 1 KiB)";
    return buf;
}

void kvc_ok(kvc_status st, const char * what) {
    if (st != KVC_OK) fail(std::string(what) + " failed: " + kvc_status_name((int) st) + ": " + kvc_message());
}

struct KvcBudget {
    int cap = 0;     // cells the cache may hold at the end: ceil(n_tokens / eviction ratio)
    int recent = 0;  // recent window actually protected: min(--recent, cap / 2)
    float kvc_ratio = 0.0f;  // kvc_h2o target_lossy_ratio that ends at cap (see below)
    int sim_end = 0;         // cells the calibration run ended with
};

kvc_h2o_config kvc_config(const Options & o, int recent, float ratio, bool streaming) {
    kvc_h2o_config c;
    kvc_ok(kvc_h2o_config_default(&c), "kvc_h2o_config_default");
    c.block_tokens = (uint32_t) o.block;
    c.sink_tokens = (uint32_t) o.sink;
    c.recent_tokens = (uint32_t) recent;
    c.target_lossy_ratio = ratio;
    c.trigger_min_tokens = (uint32_t) o.trigger;
    c.update_interval = (uint32_t) o.interval;
    c.selection = streaming ? KVC_H2O_SELECT_STREAMING_LLM : KVC_H2O_SELECT_HEAVY_HITTERS;
    c.scope = KVC_H2O_SCOPE_LAYER_UNIFORM;
    c.granularity = KVC_H2O_SCORES_PER_LAYER;
    return c;
}

// The cells a kvc_h2o policy with `ratio` holds after this run's schedule (the prompt, then
// one token at a time), found by driving a one-layer kvc_h2o with uniform scores: the kept
// count does not depend on the scores.
int kvc_simulate_end(const Options & o, int recent, float ratio) {
    kvc_h2o_config c = kvc_config(o, recent, ratio, true);
    kvc_h2o * h = nullptr;
    kvc_ok(kvc_h2o_new(&c, 1, &h), "kvc_h2o_new (calibration)");
    std::unique_ptr<kvc_h2o, void (*)(kvc_h2o *)> guard(h, kvc_h2o_free);
    size_t held = 0;
    std::vector<float> sums;
    int i = 0;
    while (i < o.n_tokens) {
        const size_t nq = (i == 0 && o.prompt > 0) ? (size_t) o.prompt : 1;
        const size_t kv_len = held + nq;
        kvc_h2o_call_shape shape{kv_len, nq, 1, 1};
        kvc_ok(kvc_h2o_begin_call(h, 0, &shape, nullptr), "kvc_h2o_begin_call (calibration)");
        sums.assign(kv_len, (float) nq / (float) kv_len);
        kvc_ok(kvc_h2o_ingest_column_sums(h, 0, sums.data(), sums.size()), "kvc_h2o_ingest_column_sums (calibration)");
        kvc_h2o_decision d;
        kvc_ok(kvc_h2o_end_call(h, 0, &d), "kvc_h2o_end_call (calibration)");
        held = kv_len;
        i += (int) nq;
        if (d.triggered && i < o.n_tokens) held = d.kept_tokens;  // applied before the next decode
    }
    return (int) held;
}

// kvc_h2o aims at ceil(kv_len / target_lossy_ratio) tokens of the cache as it is when a plan is
// made (MNN's kvSeqLen rule, block-rounded up), so under token-by-token decoding with a plan
// every `interval` steps the cache converges to where one plan removes `interval` tokens. The
// harness wants a memory budget instead: the smallest target_lossy_ratio (bisection over
// kvc_simulate_end) whose run ends with at most `cap` cells.
KvcBudget kvc_budget_cells(int cap, const Options & o) {
    KvcBudget b;
    b.cap = cap;
    b.recent = std::min(o.recent, b.cap / 2);
    if (b.cap <= o.sink + b.recent) fail("budget of " + std::to_string(b.cap) + " cells leaves nothing beyond sink + recent");
    // Not monotone: past some ratio the protected tokens reach the target and kvc makes no
    // plan at all. So scan a geometric grid upwards and take the first ratio that fits.
    int best = INT32_MAX;
    for (double r = 1.001; r < 64.0; r *= 1.01) {
        const int end = kvc_simulate_end(o, b.recent, (float) r);
        best = std::min(best, end);
        if (end <= b.cap) {
            b.kvc_ratio = (float) r;
            b.sim_end = end;
            return b;
        }
    }
    fail("no kvc_h2o target_lossy_ratio ends this run within " + std::to_string(b.cap) + " cells (best " +
         std::to_string(best) + "); lower --recent or --sink");
}

KvcBudget kvc_budget(double eviction_ratio, const Options & o) {
    return kvc_budget_cells((int) std::ceil((double) o.n_tokens / eviction_ratio), o);
}

// ------------------------------------------------------------------------------------------
// C8 through kvc_quant: calibrate per-channel int8 parameters on the first tokens, then
// quantize and dequantize every K/V row in the RowHook before SET_ROWS writes it

struct QuantPtr {
    kvc_quant * q = nullptr;
    QuantPtr(const ModelInfo & mi) {
        kvc_quant_config c;
        kvc_ok(kvc_quant_config_default(&c), "kvc_quant_config_default");
        c.n_layers = (size_t) mi.n_layer;
        c.k_channels = c.v_channels = (size_t) mi.n_embd_kv();
        kvc_ok(kvc_quant_new(&c, &q), "kvc_quant_new");
    }
    ~QuantPtr() { kvc_quant_free(q); }
    QuantPtr(const QuantPtr &) = delete;
    QuantPtr & operator=(const QuantPtr &) = delete;
};

// The rows as the f16 cache would hold them: f32 [head_dim, n_head_kv, n_tokens], contiguous.
void rows_to_f16(const ggml_tensor * t, int n_embd, std::vector<ggml_fp16_t> & out) {
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || t->ne[0] * t->ne[1] != n_embd) {
        fail("C8: unexpected K/V rows " + shape_str(t));
    }
    out.resize((size_t) ggml_nelements(t));
    ggml_fp32_to_fp16_row((const float *) t->data, out.data(), ggml_nelements(t));
}

class C8ObserveHook : public RowHook {
public:
    C8ObserveHook(kvc_quant * q, int n_embd) : q_(q), n_embd_(n_embd) {}
    void on_rows(int il, bool is_v, ggml_tensor * t) override {
        rows_to_f16(t, n_embd_, buf_);
        kvc_ok(kvc_quant_observe_rows(q_, (size_t) il, is_v ? KVC_TENSOR_V : KVC_TENSOR_K, KVC_DTYPE_F16, buf_.data(),
                                      (size_t) t->ne[2]),
               "kvc_quant_observe_rows");
        rows_ += t->ne[2];
    }
    long rows() const { return rows_; }

private:
    kvc_quant * q_;
    int n_embd_;
    std::vector<ggml_fp16_t> buf_;
    long rows_ = 0;
};

// Rounds every row to f16 (what the cache holds), quantize-dequantizes it with kvc, writes
// it back as f32 (exact: f16 values are f32 values, so the cache stores kvc's dequantized
// f16), and measures the error against the f16 row.
class C8RoundTripHook : public RowHook {
public:
    C8RoundTripHook(const kvc_quant * q, int n_embd) : q_(q), n_embd_(n_embd) {}
    void on_rows(int il, bool is_v, ggml_tensor * t) override {
        rows_to_f16(t, n_embd_, orig_);
        rt_ = orig_;
        kvc_ok(kvc_quant_roundtrip_rows(q_, (size_t) il, is_v ? KVC_TENSOR_V : KVC_TENSOR_K, KVC_DTYPE_F16, rt_.data(),
                                        (size_t) t->ne[2]),
               "kvc_quant_roundtrip_rows");
        Err & e = err_[is_v ? 1 : 0];
        const auto & f16 = f16_table();
        for (size_t i = 0; i < rt_.size(); ++i) {
            const double a = f16[orig_[i]], b = f16[rt_[i]];
            e.sq += (a - b) * (a - b);
            e.ref += a * a;
            e.max = std::max(e.max, std::fabs(a - b));
            e.n++;
        }
        ggml_fp16_to_fp32_row(rt_.data(), (float *) t->data, ggml_nelements(t));
    }
    struct Err {
        double sq = 0, ref = 0, max = 0;
        long n = 0;
    };
    const Err & err(bool v) const { return err_[v ? 1 : 0]; }

private:
    const kvc_quant * q_;
    int n_embd_;
    std::vector<ggml_fp16_t> orig_, rt_;
    Err err_[2];
};

// kvc's H2O (or StreamingLLM) policy through the C API, layer-uniform (llama.cpp's cells are
// shared by all layers). Every layer's attention mass per cell (kq_soft_max-<il>, or the
// flash-attention recompute) is mapped to the token order kvc works in (the held tokens in
// position order, then the ubatch's new tokens) and ingested as column sums; the last layer's
// end_call may make a plan, which plan() turns into the ranges of held tokens to evict.
class KvcH2oPolicy : public EvictionPolicy, public AttentionScorer {
public:
    KvcH2oPolicy(const ModelInfo & mi, const Options & o, bool streaming, const KvcBudget & b)
        : mi_(mi), streaming_(streaming), budget_(b), block_(o.block), interval_(o.interval) {
        kvc_h2o_config c = kvc_config(o, b.recent, b.kvc_ratio, streaming);
        kvc_ok(kvc_h2o_new(&c, (size_t) mi.n_layer, &h2o_), "kvc_h2o_new");
    }
    ~KvcH2oPolicy() override { kvc_h2o_free(h2o_); }
    KvcH2oPolicy(const KvcH2oPolicy &) = delete;
    KvcH2oPolicy & operator=(const KvcH2oPolicy &) = delete;

    std::string name() const override { return streaming_ ? "kvc_h2o StreamingLLM" : "kvc_h2o heavy hitters"; }
    int max_cells() const override { return budget_.cap + interval_ + 2 * block_; }
    void bind(const std::vector<HeldToken> * held, EvalTap * tap) override {
        held_ = held;
        tap_ = tap;
    }

    void on_layer_scores(int il, const std::vector<float> & mass, int n_queries) override {
        const size_t n_new = tap_->decode_cells.size();
        const size_t kv_len = held_->size() + n_new;
        sums_.assign(kv_len, 0.0f);
        double mapped = 0.0, total = 0.0;
        for (float x : mass) total += x;
        auto at = [&](int64_t cell) -> float {
            if (cell < 0 || cell >= (int64_t) mass.size()) fail("a held token's cell is outside the attention columns");
            return mass[(size_t) cell];
        };
        for (size_t i = 0; i < held_->size(); ++i) sums_[i] = at((*held_)[i].cell);
        for (size_t j = 0; j < n_new; ++j) sums_[held_->size() + j] = at(tap_->decode_cells[j]);
        for (float x : sums_) mapped += x;
        // every bit of attention must land on a cell the harness knows: the cell map is right
        unmapped_max_ = std::max(unmapped_max_, std::fabs(total - mapped) / std::max(1e-30, total));
        kvc_h2o_call_shape shape{kv_len, (size_t) n_queries, (size_t) mi_.n_head, (size_t) mi_.n_head_kv};
        uint32_t res = 0;
        kvc_ok(kvc_h2o_begin_call(h2o_, (size_t) il, &shape, &res), "kvc_h2o_begin_call");
        if (res == KVC_H2O_PLAN_DROPPED) dropped_++;
        kvc_ok(kvc_h2o_ingest_column_sums(h2o_, (size_t) il, sums_.data(), sums_.size()), "kvc_h2o_ingest_column_sums");
        kvc_h2o_decision d;
        kvc_ok(kvc_h2o_end_call(h2o_, (size_t) il, &d), "kvc_h2o_end_call");
        if (d.triggered) plan_ready_ = true;
        calls_++;
    }

    std::vector<EvictRange> plan(const std::vector<HeldToken> & held, int) override {
        if (!plan_ready_) return {};
        plan_ready_ = false;
        kvc_h2o_plan_info info;
        kvc_ok(kvc_h2o_get_plan_info(h2o_, 0, &info), "kvc_h2o_get_plan_info");
        if (!info.pending) return {};
        if (info.kv_len != held.size()) {
            fail("kvc plan made for " + std::to_string(info.kv_len) + " tokens, the cache holds " + std::to_string(held.size()));
        }
        size_t n = 0;
        kvc_ok(kvc_h2o_plan_pairs(h2o_, 0, 0, nullptr, 0, &n), "kvc_h2o_plan_pairs (size)");
        std::vector<kvc_reserve_pair> pairs(n);
        kvc_ok(kvc_h2o_plan_pairs(h2o_, 0, 0, pairs.data(), pairs.size(), &n), "kvc_h2o_plan_pairs");
        // evict the complement of the kept pairs
        std::vector<EvictRange> out;
        size_t next = 0, kept = 0;
        for (const auto & p : pairs) {
            if (p.offset < next || (size_t) p.offset + p.length > held.size()) fail("kvc plan pairs out of order or range");
            if (p.offset > next) out.push_back({next, p.offset});
            next = (size_t) p.offset + p.length;
            kept += p.length;
        }
        if (next < held.size()) out.push_back({next, held.size()});
        if (kept != info.kept_tokens) fail("kvc plan pairs do not add up to its kept tokens");
        plans_++;
        evicted_ += held.size() - kept;
        return out;
    }

    void report(RunResultExtra & extra) const {
        kvc_h2o_metrics m;
        kvc_ok(kvc_h2o_get_metrics(h2o_, &m), "kvc_h2o_get_metrics");
        extra.push_back({"kvc_plans_made", std::to_string(m.plans_made)});
        extra.push_back({"kvc_plans_applied", std::to_string(m.plans_applied)});
        extra.push_back({"kvc_plans_dropped", std::to_string(m.plans_dropped)});
        extra.push_back({"kvc_calls", std::to_string(calls_)});
        extra.push_back({"evictions", std::to_string(plans_)});
        extra.push_back({"tokens_evicted", std::to_string(evicted_)});
        extra.push_back({"attention_unmapped_max", json_num(unmapped_max_)});
        extra.push_back({"budget_cells", std::to_string(budget_.cap)});
        extra.push_back({"recent", std::to_string(budget_.recent)});
        extra.push_back({"block", std::to_string(block_)});
        extra.push_back({"kvc_target_lossy_ratio", json_num(budget_.kvc_ratio)});
        extra.push_back({"calibrated_end_cells", std::to_string(budget_.sim_end)});
    }
    long dropped() const { return dropped_; }
    double unmapped_max() const { return unmapped_max_; }

private:
    const ModelInfo & mi_;
    bool streaming_;
    KvcBudget budget_;
    int block_, interval_;
    kvc_h2o * h2o_ = nullptr;
    const std::vector<HeldToken> * held_ = nullptr;
    EvalTap * tap_ = nullptr;
    std::vector<float> sums_;
    bool plan_ready_ = false;
    long calls_ = 0, plans_ = 0, dropped_ = 0;
    size_t evicted_ = 0;
    double unmapped_max_ = 0.0;
};

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
};

CtxPtr make_context(llama_model * model, const Options & o, const CtxConfig & c) {
    llama_context_params p = llama_context_default_params();
    p.n_ctx = (uint32_t) c.n_ctx;
    p.n_batch = (uint32_t) std::max(c.n_batch, o.prompt);
    p.n_ubatch = 512;
    p.n_seq_max = 1;
    p.n_threads = o.threads;
    p.n_threads_batch = o.threads;
    p.flash_attn_type = c.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    p.type_k = c.type_k;
    p.type_v = c.type_v;
    p.no_perf = true;
    if (c.tap) {
        p.cb_eval = eval_callback;
        p.cb_eval_user_data = c.tap;
    }
    llama_context * ctx = llama_init_from_model(model, p);
    if (!ctx) fail("llama_init_from_model failed (n_ctx " + std::to_string(c.n_ctx) + ")");
    return CtxPtr(ctx);
}

// decodes tokens [first, first+n) at positions pos0.. in one llama_decode (split into ubatches
// by llama.cpp); logits for the positions flagged by want_logits
void decode_batch(llama_context * ctx, const std::vector<llama_token> & toks, int first, int n, llama_pos pos0,
                  const std::vector<bool> & want_logits) {
    llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        b.token[i] = toks[first + i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = want_logits[i] ? 1 : 0;
    }
    b.n_tokens = n;
    const int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    if (rc != 0) fail("llama_decode failed with status " + std::to_string(rc));
}

// Reference log-softmax rows of the full-cache run, kept in a temporary file and read back in
// order by the other modes (1535 rows x 49152 floats would be 300 MB in memory).
class RefStore {
public:
    RefStore() : f_(std::tmpfile()) {
        if (!f_) fail("cannot create a temporary file for the reference logits");
    }
    ~RefStore() { std::fclose(f_); }
    RefStore(const RefStore &) = delete;
    RefStore & operator=(const RefStore &) = delete;
    void append(const std::vector<float> & row) {
        if (std::fwrite(row.data(), sizeof(float), row.size(), f_) != row.size()) fail("reference write failed");
        rows_++;
    }
    void rewind_for_read() { std::fflush(f_); std::rewind(f_); }
    void read(std::vector<float> & row, size_t n) {
        row.resize(n);
        if (std::fread(row.data(), sizeof(float), n, f_) != n) fail("reference read failed");
    }
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

// A llama_state_seq_get_data blob opens with llama.cpp's state magic and the sequence id,
// then the cache's own state (see parse_f16_state).
constexpr uint32_t kStateMagic = 0xaf143cd8u;
constexpr size_t kStateHeader = 8;

// The state blob of sequence 0: the cell count of its (single) stream, or -1.
long state_cell_count(const std::vector<uint8_t> & s) {
    if (s.size() < kStateHeader + 8) return -1;
    uint32_t magic, n_stream, cells;
    int32_t seq;
    std::memcpy(&magic, s.data(), 4);
    std::memcpy(&seq, s.data() + 4, 4);
    std::memcpy(&n_stream, s.data() + 8, 4);
    std::memcpy(&cells, s.data() + 12, 4);
    if (magic != kStateMagic || seq != 0 || n_stream != 1) return -1;
    return (long) cells;
}

std::vector<uint8_t> get_seq_state(llama_context * ctx) {
    const size_t n = llama_state_seq_get_size(ctx, 0);
    std::vector<uint8_t> buf(n);
    const size_t got = llama_state_seq_get_data(ctx, buf.data(), buf.size(), 0);
    if (got == 0 || got > n) fail("llama_state_seq_get_data failed");
    buf.resize(got);
    return buf;
}

struct DecodeSpec {
    std::string mode;
    CtxConfig cfg;
    EvictionPolicy * policy = nullptr;  // null: nothing is evicted
    bool shift_positions = true;
    bool is_reference = false;
    // memory accounting other than the cache type's (C8: int8 bytes per cell + the scales)
    double cell_bytes = 0;   // 0: the cache type's row sizes
    double fixed_bytes = 0;  // held whatever the cell count
};

RunResult run_decode(llama_model * model, const ModelInfo & mi, const Options & o,
                     const std::vector<llama_token> & toks, RefStore & ref, const DecodeSpec & spec) {
    const int n = o.n_tokens;
    CtxPtr ctx = make_context(model, o, spec.cfg);
    llama_memory_t mem = llama_get_memory(ctx.get());
    const double cell_bytes =
        spec.cell_bytes > 0 ? spec.cell_bytes : (double) mi.cell_bytes(spec.cfg.type_k, spec.cfg.type_v);
    const size_t full_cell_bytes = mi.cell_bytes(GGML_TYPE_F16, GGML_TYPE_F16);

    RunResult r;
    r.mode = spec.mode;
    r.alloc_bytes = (double) llama_n_ctx(ctx.get()) * (double) mi.cell_bytes(spec.cfg.type_k, spec.cfg.type_v);

    std::vector<HeldToken> held;
    EvalTap * tap = spec.cfg.tap;
    if (spec.policy) spec.policy->bind(&held, tap);
    // after a llama_decode: the callback's error if any, and the cells of the new tokens
    auto after_decode = [&](size_t first_new) {
        if (!tap) return;
        if (!tap->error.empty()) fail(spec.mode + ": " + tap->error);
        if (!tap->want_set_rows) return;
        if (tap->decode_cells.size() != held.size() - first_new) {
            fail(spec.mode + ": SET_ROWS wrote " + std::to_string(tap->decode_cells.size()) + " cells for " +
                 std::to_string(held.size() - first_new) + " tokens");
        }
        for (size_t j = first_new; j < held.size(); ++j) held[j].cell = tap->decode_cells[j - first_new];
        tap->decode_cells.clear();
    };
    size_t peak = 0;
    std::vector<float> lp, lp_ref;
    double nll = 0.0, kl = 0.0, ratio_sum = 0.0;
    long scored = 0, ratio_steps = 0;
    if (!spec.is_reference) ref.rewind_for_read();

    auto score = [&](const float * logits, int target_pos) {
        if (target_pos < o.ppl_from || target_pos >= n) return;
        log_softmax(logits, mi.n_vocab, lp);
        nll -= (double) lp[toks[target_pos]];
        if (spec.is_reference) {
            ref.append(lp);
        } else {
            ref.read(lp_ref, (size_t) mi.n_vocab);
            kl += kl_div(lp_ref, lp);
        }
        scored++;
        // memory at the moment this prediction was made: target_pos tokens seen
        ratio_sum += (double) target_pos * (double) full_cell_bytes / ((double) held.size() * cell_bytes + spec.fixed_bytes);
        ratio_steps++;
    };

    // optional prompt as one batch
    llama_pos next_pos = 0;
    int i = 0;
    if (o.prompt > 0) {
        std::vector<bool> want(o.prompt);
        for (int j = 0; j < o.prompt; ++j) want[j] = j + 1 >= o.ppl_from;
        if (tap) tap->decode_cells.clear();
        decode_batch(ctx.get(), toks, 0, o.prompt, 0, want);
        for (int j = 0; j < o.prompt; ++j) held.push_back({j, j});
        after_decode(0);
        peak = held.size();
        for (int j = 0; j < o.prompt; ++j) {
            if (want[j]) score(llama_get_logits_ith(ctx.get(), j), j + 1);
        }
        next_pos = o.prompt;
        i = o.prompt;
    }

    llama_batch b = llama_batch_init(1, 0, 1);
    const double t0 = now_s();
    const int n_steps = n - i;
    try {
        for (; i < n; ++i) {
            if (spec.policy) {
                const auto plan = spec.policy->plan(held, i);
                if (!plan.empty()) {
                    apply_evictions(mem, held, plan, spec.shift_positions);
                    next_pos = spec.shift_positions ? (held.empty() ? 0 : held.back().pos + 1) : i;
                }
            }
            b.n_tokens = 1;
            b.token[0] = toks[i];
            b.pos[0] = next_pos;
            b.n_seq_id[0] = 1;
            b.seq_id[0][0] = 0;
            b.logits[0] = 1;
            if (tap) tap->decode_cells.clear();
            const int rc = llama_decode(ctx.get(), b);
            if (rc != 0) fail("llama_decode failed with status " + std::to_string(rc) + " at token " + std::to_string(i));
            held.push_back({next_pos, i});
            after_decode(held.size() - 1);
            peak = std::max(peak, held.size());
            next_pos++;
            if (i + 1 < n) score(llama_get_logits_ith(ctx.get(), -1), i + 1);
        }
    } catch (...) {
        llama_batch_free(b);
        throw;
    }
    llama_batch_free(b);
    const double dt = now_s() - t0;

    r.tok_s = n_steps / dt;
    r.n_scored = scored;
    r.ppl = std::exp(nll / (double) std::max<long>(1, scored));
    r.kl = spec.is_reference ? 0.0 : kl / (double) std::max<long>(1, scored);
    r.cells_end = (long) held.size();
    r.cells_peak = (long) peak;
    r.held_bytes_end = (double) held.size() * cell_bytes + spec.fixed_bytes;
    r.held_ratio_end = (double) n * (double) full_cell_bytes / r.held_bytes_end;
    r.held_ratio_mean = ratio_steps ? ratio_sum / (double) ratio_steps : NAN;
    r.cells_verified = state_cell_count(get_seq_state(ctx.get()));
    if (r.cells_verified != r.cells_end) {
        fail(spec.mode + ": llama.cpp holds " + std::to_string(r.cells_verified) + " cells, the harness counted " +
             std::to_string(r.cells_end));
    }
    if (spec.policy) r.detail = spec.policy->name();
    return r;
}

// ------------------------------------------------------------------------------------------
// dump mode: post-RoPE K and V as the cache holds them, in the realkv format

// Reads the K and V rows of an f16 cache out of a llama_state_seq_get_data blob (single
// stream, single sequence). Layout: magic, seq_id, then llama_kv_cache::state_write: n_stream, then per
// stream cell_count, per cell (pos, n_seq_id, seq ids), then v_trans, n_layer, n_rot_k, n_rot_v,
// per layer K (type, row size, rows), per layer V (rows, or when transposed type, element
// size, n_embd_v_gqa and the cells of each channel). Every field is checked.
struct StateReader {
    const std::vector<uint8_t> & s;
    size_t off = 0;
    template <class T> T get(const char * what) {
        if (s.size() - off < sizeof(T)) fail(std::string("state blob truncated at ") + what);
        T v;
        std::memcpy(&v, s.data() + off, sizeof(T));
        off += sizeof(T);
        return v;
    }
    const uint8_t * take(size_t n, const char * what) {
        if (s.size() - off < n) fail(std::string("state blob truncated at ") + what);
        const uint8_t * p = s.data() + off;
        off += n;
        return p;
    }
};

struct CacheDump {
    int n_cells = 0;
    std::vector<llama_pos> pos;
    // [layer][cell][n_embd_kv] f16 bits
    std::vector<uint16_t> k, v;
};

CacheDump parse_f16_state(const std::vector<uint8_t> & blob, const ModelInfo & mi) {
    StateReader r{blob};
    CacheDump d;
    if (r.get<uint32_t>("magic") != kStateMagic) fail("state: bad magic");
    if (r.get<int32_t>("seq_id") != 0) fail("state: not sequence 0");
    if (r.get<uint32_t>("n_stream") != 1) fail("state: expected one stream");
    const uint32_t cells = r.get<uint32_t>("cell_count");
    if (cells == 0 || cells > (1u << 24)) fail("state: implausible cell count");
    d.n_cells = (int) cells;
    for (uint32_t c = 0; c < cells; ++c) {
        d.pos.push_back(r.get<int32_t>("pos"));
        const uint32_t n_seq = r.get<uint32_t>("n_seq_id");
        if (n_seq != 1) fail("state: a cell with " + std::to_string(n_seq) + " sequences");
        if (r.get<int32_t>("seq_id") != 0) fail("state: unexpected sequence id");
    }
    const uint32_t v_trans = r.get<uint32_t>("v_trans");
    const uint32_t n_layer = r.get<uint32_t>("n_layer");
    r.get<uint32_t>("n_rot_k");
    r.get<uint32_t>("n_rot_v");
    if ((int) n_layer != mi.n_layer) fail("state: layer count differs from the model");
    const size_t ne = (size_t) mi.n_embd_kv();
    d.k.resize((size_t) n_layer * cells * ne);
    d.v.resize((size_t) n_layer * cells * ne);
    for (uint32_t l = 0; l < n_layer; ++l) {
        if (r.get<int32_t>("k type") != GGML_TYPE_F16) fail("state: K cache is not f16");
        if (r.get<uint64_t>("k row size") != ne * 2) fail("state: K row size");
        std::memcpy(&d.k[(size_t) l * cells * ne], r.take((size_t) cells * ne * 2, "K rows"), (size_t) cells * ne * 2);
    }
    for (uint32_t l = 0; l < n_layer; ++l) {
        if (r.get<int32_t>("v type") != GGML_TYPE_F16) fail("state: V cache is not f16");
        if (!v_trans) {
            if (r.get<uint64_t>("v row size") != ne * 2) fail("state: V row size");
            std::memcpy(&d.v[(size_t) l * cells * ne], r.take((size_t) cells * ne * 2, "V rows"), (size_t) cells * ne * 2);
        } else {
            if (r.get<uint32_t>("v element size") != 2) fail("state: V element size");
            if (r.get<uint32_t>("n_embd_v_gqa") != ne) fail("state: n_embd_v_gqa");
            for (size_t j = 0; j < ne; ++j) {
                const uint8_t * p = r.take((size_t) cells * 2, "V channel");
                for (uint32_t c = 0; c < cells; ++c) {
                    uint16_t x;
                    std::memcpy(&x, p + (size_t) c * 2, 2);
                    d.v[((size_t) l * cells + c) * ne + j] = x;
                }
            }
        }
    }
    if (r.off != blob.size()) fail("state: trailing bytes after the V data");
    return d;
}

void write_bytes(const std::string & path, const void * data, size_t n) {
    std::FILE * f = std::fopen(path.c_str(), "wb");
    if (!f) fail("cannot write '" + path + "'");
    const size_t w = std::fwrite(data, 1, n, f);
    const int c = std::fclose(f);
    if (w != n || c != 0) fail("short write to '" + path + "'");
}

std::vector<uint8_t> read_bytes_or_empty(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return {};
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// compares our [L][T][H][D] dump with a reference [RL][RT][H][D] over the common layers/tokens
struct Compare {
    bool done = false;
    long values = 0;
    long mismatches = 0;
    long layer0_mismatches = 0;
    int layers_differing = 0;        // layers with at least one differing value
    int first_differing_layer = -1;  // -1: every compared layer bit-identical
    int layers = 0, tokens = 0;
};

Compare compare_dump(const std::vector<uint16_t> & ours, int L, int T, const std::vector<uint8_t> & ref, int RL,
                     int RT, size_t ne) {
    Compare c;
    if (ref.size() != (size_t) RL * RT * ne * 2) return c;
    c.done = true;
    c.layers = std::min(L, RL);
    c.tokens = std::min(T, RT);
    for (int l = 0; l < c.layers; ++l) {
        const long before = c.mismatches;
        for (int t = 0; t < c.tokens; ++t) {
            const uint16_t * a = &ours[((size_t) l * T + t) * ne];
            const uint8_t * b = &ref[((size_t) l * RT + t) * ne * 2];
            for (size_t j = 0; j < ne; ++j) {
                uint16_t y;
                std::memcpy(&y, b + j * 2, 2);
                c.values++;
                if (a[j] != y) {
                    c.mismatches++;
                    if (l == 0) c.layer0_mismatches++;
                }
            }
        }
        if (c.mismatches != before) {
            c.layers_differing++;
            if (c.first_differing_layer < 0) c.first_differing_layer = l;
        }
    }
    return c;
}

// reads shape [L, T, ...] from a realkv JSON sidecar (the first two numbers of "shape")
bool sidecar_shape(const std::string & path, int & L, int & T) {
    std::ifstream f(path);
    if (!f) return false;
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string s = ss.str();
    const auto p = s.find("\"shape\"");
    if (p == std::string::npos) return false;
    const auto b = s.find('[', p);
    if (b == std::string::npos) return false;
    return std::sscanf(s.c_str() + b, "[ %d , %d", &L, &T) == 2;
}

// dtype: "f16" (the cache bytes), "bf16" (RNE of the callback's f32) or "f32" (the callback's f32)
void write_sidecar(const std::string & path, const std::string & file, const char * tensor, const std::string & dtype,
                   const ModelInfo & mi, int n_tok, const Options & o, const std::string & text_path,
                   const std::string & text, long text_tokens_total) {
    const bool bf16 = dtype == "bf16", f32 = dtype == "f32", from_f32 = bf16 || f32;
    std::ostringstream j;
    j << "{\n";
    j << "  \"file\": \"" << json_escape(file) << "\",\n";
    j << "  \"tensor\": \"" << tensor << "\",\n";
    j << "  \"dtype\": \""
      << (bf16  ? "bfloat16 (RNE from float32)"
          : f32 ? "float32 (the rows the model computed, before the f16 cache)"
                : "float16 IEEE binary16 (bytes read back from the llama.cpp f16 KV cache)")
      << "\",\n";
    j << "  \"byte_order\": \"little-endian\",\n";
    j << "  \"layout\": \"[n_layer][n_tokens][n_kv_head][head_dim]\",\n";
    j << "  \"shape\": [" << mi.n_layer << ", " << n_tok << ", " << mi.n_head_kv << ", " << mi.head_dim << "],\n";
    j << "  \"n_layer\": " << mi.n_layer << ",\n";
    j << "  \"n_tokens\": " << n_tok << ",\n";
    j << "  \"n_kv_head\": " << mi.n_head_kv << ",\n";
    j << "  \"n_head\": " << mi.n_head << ",\n";
    j << "  \"head_dim\": " << mi.head_dim << ",\n";
    j << "  \"model\": \"" << json_escape(mi.file) << "\",\n";
    j << "  \"model_desc\": \"" << json_escape(mi.desc) << "\",\n";
    j << "  \"runtime\": \"llama.cpp (llama-cpp-sys-2 0.1.161 vendored source), CPU, kv cache type f16, flash_attn off, "
         "n_ctx 4096, n_ubatch 512\",\n";
    j << "  \"text_source\": \"" << json_escape(base_name(text_path)) << ", first " << n_tok << " tokens\",\n";
    j << "  \"text_file_tokens_total\": " << text_tokens_total << ",\n";
    j << "  \"token_count\": " << n_tok << ",\n";
    j << "  \"bos_prepended\": " << (o.bos ? "true" : "false") << ",\n";
    j << "  \"text_first_200_chars\": \"" << json_escape(text.substr(0, 200)) << "\",\n";
    if (tensor[0] == 'K') {
        j << "  \"capture\": \""
          << (bf16  ? "eval callback on 'Kcur-<il>' (op ROPE, f32), rounded to bf16"
              : f32 ? "eval callback on 'Kcur-<il>' (op ROPE, f32)"
                    : "K rows of llama_state_seq_get_data (the cache bytes)")
          << "\",\n";
        j << "  \"post_rope\": true,\n";
    } else {
        j << "  \"capture\": \""
          << (bf16  ? "eval callback on 'Vcur-<il>' (f32), rounded to bf16"
              : f32 ? "eval callback on 'Vcur-<il>' (f32)"
                    : "V of llama_state_seq_get_data (the cache bytes, transposed back)")
          << "\",\n";
    }
    j << "  \"fp16_equals_cache_bytes\": " << (from_f32 ? "false" : "true") << ",\n";
    j << "  \"producer\": \"kvc integrations/llama/kvc_llama_eval --modes dump\"\n";
    j << "}\n";
    const std::string s = j.str();
    write_bytes(path, s.data(), s.size());
}

// how many of the n floats at a and b differ in any bit (logits compared bit for bit)
long bits_differing(const float * a, const float * b, int n) {
    long d = 0;
    for (int i = 0; i < n; ++i) {
        uint32_t x, y;
        std::memcpy(&x, &a[i], 4);
        std::memcpy(&y, &b[i], 4);
        if (x != y) d++;
    }
    return d;
}

uint16_t f32_to_bf16_rne(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t) ((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t) (u >> 16);
}

RunResult run_dump(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks,
                   const std::string & text_path, const std::string & text, const std::string & tag) {
    const int n = std::min<int>(o.dump_tokens > 0 ? o.dump_tokens : o.n_tokens, (int) toks.size());
    if (n > 4096) fail("dump: at most 4096 tokens (the realkv setup uses n_ctx 4096)");
    EvalTap tap;
    tap.capture_f32 = true;
    tap.n_layer = mi.n_layer;
    tap.n_head = mi.n_head;
    tap.n_head_kv = mi.n_head_kv;
    tap.head_dim = mi.head_dim;
    tap.k_rows.resize(mi.n_layer);
    tap.v_rows.resize(mi.n_layer);
    CtxConfig cfg;
    cfg.n_ctx = 4096;  // the realkv runtime: n_ctx 4096, n_ubatch 512, flash attention off, f16
    cfg.n_batch = 512;
    cfg.tap = &tap;
    CtxPtr ctx = make_context(model, o, cfg);
    const double t0 = now_s();
    for (int s = 0; s < n; s += 512) {
        const int m = std::min(512, n - s);
        std::vector<bool> want(m, false);
        want[m - 1] = true;
        decode_batch(ctx.get(), toks, s, m, s, want);
    }
    const double dt = now_s() - t0;
    const auto blob = get_seq_state(ctx.get());
    const CacheDump d = parse_f16_state(blob, mi);
    if (d.n_cells != n) fail("dump: cache holds " + std::to_string(d.n_cells) + " cells, expected " + std::to_string(n));
    for (int c = 0; c < n; ++c) {
        if (d.pos[c] != c) fail("dump: cell " + std::to_string(c) + " holds position " + std::to_string(d.pos[c]));
    }
    const size_t ne = (size_t) mi.n_embd_kv();
    for (int l = 0; l < mi.n_layer; ++l) {
        if (tap.k_rows[l].size() != (size_t) n * ne || tap.v_rows[l].size() != (size_t) n * ne) {
            fail("dump: eval callback captured the wrong number of rows for layer " + std::to_string(l));
        }
    }
    // f16 of the callback's f32 must be the cache bytes; bf16 files come from the same f32
    long f16_mismatch = 0;
    std::vector<uint16_t> kb((size_t) mi.n_layer * n * ne), vb(kb.size());
    for (int l = 0; l < mi.n_layer; ++l) {
        for (size_t x = 0; x < (size_t) n * ne; ++x) {
            const size_t at = (size_t) l * n * ne + x;
            const float kf = tap.k_rows[l][x], vf = tap.v_rows[l][x];
            if (ggml_fp32_to_fp16(kf) != d.k[at]) f16_mismatch++;
            if (ggml_fp32_to_fp16(vf) != d.v[at]) f16_mismatch++;
            kb[at] = f32_to_bf16_rne(kf);
            vb[at] = f32_to_bf16_rne(vf);
        }
    }

    RunResult r;
    r.mode = "dump";
    r.detail = std::to_string(n) + " tok x " + std::to_string(mi.n_layer) + " layers";
    r.tok_s = n / dt;
    r.cells_end = n;
    r.cells_verified = d.n_cells;
    r.extra.push_back({"f16_of_callback_f32_mismatches", std::to_string(f16_mismatch)});
    r.extra.push_back({"state_bytes", std::to_string(blob.size())});

    if (!o.dump_dir.empty()) {
        const std::string pre = o.dump_dir + "/" + tag;
        const size_t nb = kb.size() * 2;
        const std::pair<const char *, const std::vector<uint16_t> *> files[] = {
            {"K.f16", &d.k}, {"V.f16", &d.v}, {"K.bf16", &kb}, {"V.bf16", &vb}};
        for (const auto & f : files) {
            const std::string bin = tag + "." + f.first + ".bin";
            write_bytes(o.dump_dir + "/" + bin, f.second->data(), nb);
            const bool bf16 = std::strstr(f.first, "bf16") != nullptr;
            write_sidecar(pre + "." + f.first + ".json", bin, f.first[0] == 'K' ? "K" : "V", bf16 ? "bf16" : "f16", mi, n,
                          o, text_path, text, (long) toks.size());
        }
        // f32: the rows the model computed (the f16 cache rounds them), layer after layer
        for (const bool is_v : { false, true }) {
            const std::string name = is_v ? "V.f32" : "K.f32";
            const std::string bin  = tag + "." + name + ".bin";
            std::vector<float> all;
            all.reserve((size_t) mi.n_layer * n * ne);
            for (int l = 0; l < mi.n_layer; ++l) {
                const auto & rows = is_v ? tap.v_rows[l] : tap.k_rows[l];
                all.insert(all.end(), rows.begin(), rows.end());
            }
            write_bytes(o.dump_dir + "/" + bin, all.data(), all.size() * sizeof(float));
            write_sidecar(pre + "." + name + ".json", bin, is_v ? "V" : "K", "f32", mi, n, o, text_path, text,
                          (long) toks.size());
        }
        r.extra.push_back({"dump_dir", "\"" + json_escape(o.dump_dir) + "\""});
    }

    if (!o.realkv_dir.empty()) {
        const std::pair<const char *, const std::vector<uint16_t> *> refs[] = {
            {"K.f16", &d.k}, {"V.f16", &d.v}, {"K.bf16", &kb}, {"V.bf16", &vb}};
        std::string summary;
        for (const auto & f : refs) {
            const std::string stem = o.realkv_dir + "/textA." + f.first;
            int RL = 0, RT = 0;
            Compare c;
            if (sidecar_shape(stem + ".json", RL, RT)) {
                c = compare_dump(*f.second, mi.n_layer, n, read_bytes_or_empty(stem + ".bin"), RL, RT, ne);
            }
            std::string key = std::string("realkv_") + f.first;
            std::replace(key.begin(), key.end(), '.', '_');
            if (!c.done) {
                r.extra.push_back({key, "null"});
                continue;
            }
            r.extra.push_back({key, "{\"layers\": " + std::to_string(c.layers) + ", \"tokens\": " + std::to_string(c.tokens) +
                                        ", \"values\": " + std::to_string(c.values) +
                                        ", \"mismatches\": " + std::to_string(c.mismatches) +
                                        ", \"layer0_mismatches\": " + std::to_string(c.layer0_mismatches) +
                                        ", \"layers_differing\": " + std::to_string(c.layers_differing) +
                                        ", \"first_differing_layer\": " + std::to_string(c.first_differing_layer) + "}"});
            char buf[160];
            std::snprintf(buf, sizeof buf, " %s %s, %d of %d layers differ, %.2f%% of values;", f.first,
                          c.layer0_mismatches == 0 ? "layer 0 identical" : "layer 0 DIFFERS", c.layers_differing,
                          c.layers, 100.0 * (double) c.mismatches / (double) std::max<long>(1, c.values));
            summary += buf;
        }
        if (!summary.empty()) r.detail += "; vs realkv:" + summary;
    }
    return r;
}

// ------------------------------------------------------------------------------------------
// the sequence state compressed with kvc's codec

// A state blob cut into what kvc's codec should see: the K rows and the V data of every layer
// as f16 streams, everything else (header, per-cell positions and sequence ids, per-layer
// type and size fields) as bytes.
struct StateSegment {
    size_t off, len;
    bool f16;
    kvc_tensor tensor;
};

std::vector<StateSegment> state_segments(const std::vector<uint8_t> & blob, const ModelInfo & mi) {
    StateReader r{blob};
    std::vector<StateSegment> segs;
    size_t mark = 0;
    auto data = [&](size_t n, kvc_tensor tensor, const char * what) {
        const size_t at = r.off;
        r.take(n, what);
        if (at > mark) segs.push_back({mark, at - mark, false, KVC_TENSOR_K});
        segs.push_back({at, n, true, tensor});
        mark = r.off;
    };
    if (r.get<uint32_t>("magic") != kStateMagic) fail("state: bad magic");
    r.get<int32_t>("seq_id");
    if (r.get<uint32_t>("n_stream") != 1) fail("state: expected one stream");
    const uint32_t cells = r.get<uint32_t>("cell_count");
    for (uint32_t c = 0; c < cells; ++c) {
        r.get<int32_t>("pos");
        const uint32_t n_seq = r.get<uint32_t>("n_seq_id");
        for (uint32_t k = 0; k < n_seq; ++k) r.get<int32_t>("seq_id");
    }
    const uint32_t v_trans = r.get<uint32_t>("v_trans");
    const uint32_t n_layer = r.get<uint32_t>("n_layer");
    r.get<uint32_t>("n_rot_k");
    r.get<uint32_t>("n_rot_v");
    if ((int) n_layer != mi.n_layer) fail("state: layer count differs from the model");
    const size_t ne = (size_t) mi.n_embd_kv();
    for (uint32_t l = 0; l < n_layer; ++l) {
        if (r.get<int32_t>("k type") != GGML_TYPE_F16) fail("state: K cache is not f16");
        if (r.get<uint64_t>("k row size") != ne * 2) fail("state: K row size");
        data((size_t) cells * ne * 2, KVC_TENSOR_K, "K rows");
    }
    for (uint32_t l = 0; l < n_layer; ++l) {
        if (r.get<int32_t>("v type") != GGML_TYPE_F16) fail("state: V cache is not f16");
        if (!v_trans) {
            if (r.get<uint64_t>("v row size") != ne * 2) fail("state: V row size");
        } else {
            if (r.get<uint32_t>("v element size") != 2) fail("state: V element size");
            if (r.get<uint32_t>("n_embd_v_gqa") != ne) fail("state: n_embd_v_gqa");
        }
        data((size_t) cells * ne * 2, KVC_TENSOR_V, "V data");
    }
    if (r.off != blob.size()) fail("state: trailing bytes after the V data");
    if (mark < blob.size()) segs.push_back({mark, blob.size() - mark, false, KVC_TENSOR_K});
    return segs;
}

struct CodecPtr {
    kvc_codec * c = nullptr;
    explicit CodecPtr(kvc_dtype dtype) {
        kvc_codec_config cfg;
        kvc_ok(kvc_codec_config_default(&cfg), "kvc_codec_config_default");
        cfg.dtype = dtype;
        kvc_ok(kvc_codec_new(&cfg, &c), "kvc_codec_new");
    }
    ~CodecPtr() { kvc_codec_free(c); }
    CodecPtr(const CodecPtr &) = delete;
    CodecPtr & operator=(const CodecPtr &) = delete;
};

constexpr uint32_t kPackMagic = 0x5356434bu;  // "KCVS"

void put_u64(std::vector<uint8_t> & out, uint64_t x) {
    for (int i = 0; i < 8; ++i) out.push_back((uint8_t) (x >> (8 * i)));
}

// Container: u32 magic, u32 segment count, then per segment u8 kind (0 bytes, 1 K f16, 2 V
// f16), u64 raw length, u64 blob length, the kvc_codec blob (gear-v1).
std::vector<uint8_t> pack_state(const std::vector<uint8_t> & blob, const std::vector<StateSegment> & segs) {
    CodecPtr c16(KVC_DTYPE_F16), c8(KVC_DTYPE_I8);
    std::vector<uint8_t> out;
    put_u64(out, (uint64_t) kPackMagic | ((uint64_t) segs.size() << 32));
    std::vector<uint8_t> buf;
    for (const auto & sg : segs) {
        kvc_codec * c = sg.f16 ? c16.c : c8.c;
        size_t cap = 0;
        kvc_ok(kvc_codec_max_encoded_size(c, sg.len, &cap), "kvc_codec_max_encoded_size");
        buf.resize(cap);
        size_t n = 0;
        kvc_ok(kvc_codec_encode(c, sg.tensor, blob.data() + sg.off, sg.len, buf.data(), buf.size(), &n), "kvc_codec_encode");
        out.push_back(sg.f16 ? (sg.tensor == KVC_TENSOR_K ? 1 : 2) : 0);
        put_u64(out, sg.len);
        put_u64(out, n);
        out.insert(out.end(), buf.begin(), buf.begin() + (long) n);
    }
    return out;
}

// Decodes a container; every length is checked against what is left before it is used.
std::vector<uint8_t> unpack_state(const std::vector<uint8_t> & pack, size_t max_raw) {
    CodecPtr c16(KVC_DTYPE_F16), c8(KVC_DTYPE_I8);
    StateReader r{pack};
    const uint64_t head = r.get<uint64_t>("container header");
    if ((uint32_t) head != kPackMagic) fail("container: bad magic");
    const uint64_t n_seg = head >> 32;
    std::vector<uint8_t> out;
    for (uint64_t i = 0; i < n_seg; ++i) {
        const uint8_t kind = r.get<uint8_t>("segment kind");
        const uint64_t raw = r.get<uint64_t>("segment raw length");
        const uint64_t len = r.get<uint64_t>("segment blob length");
        if (kind > 2) fail("container: unknown segment kind");
        if (raw > max_raw - out.size()) fail("container: segments larger than the state can be");
        if (len > pack.size() - r.off) fail("container: segment blob truncated");
        const uint8_t * p = r.take((size_t) len, "segment blob");
        const size_t at = out.size();
        out.resize(at + (size_t) raw);
        size_t got = 0;
        kvc_ok(kvc_codec_decode(kind ? c16.c : c8.c, p, (size_t) len, out.data() + at, (size_t) raw, &got), "kvc_codec_decode");
        if (got != raw) fail("container: a segment decoded to the wrong length");
    }
    if (r.off != pack.size()) fail("container: trailing bytes");
    return out;
}

// ------------------------------------------------------------------------------------------
// state mode: save the sequence, restore it into a fresh context, compare the next logits

RunResult run_state(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks) {
    const int n = o.n_tokens;
    CtxConfig cfg;
    cfg.n_ctx = n;
    cfg.n_batch = 512;
    CtxPtr a = make_context(model, o, cfg);
    for (int s = 0; s < n - 1; s += 512) {
        const int m = std::min(512, n - 1 - s);
        std::vector<bool> want(m, false);
        decode_batch(a.get(), toks, s, m, s, want);
    }
    const double t0 = now_s();
    const auto blob = get_seq_state(a.get());
    const double t_save = now_s() - t0;
    std::vector<bool> one(1, true);
    decode_batch(a.get(), toks, n - 1, 1, n - 1, one);
    std::vector<float> la(llama_get_logits_ith(a.get(), -1), llama_get_logits_ith(a.get(), -1) + mi.n_vocab);

    CtxPtr b = make_context(model, o, cfg);
    // a truncated blob must be refused without touching the process
    const size_t trunc = llama_state_seq_set_data(b.get(), blob.data(), blob.size() / 2, 0);
    const bool trunc_rejected = trunc == 0;
    llama_memory_clear(llama_get_memory(b.get()), true);
    const double t1 = now_s();
    const size_t used = llama_state_seq_set_data(b.get(), blob.data(), blob.size(), 0);
    const double t_restore = now_s() - t1;
    if (used != blob.size()) fail("llama_state_seq_set_data consumed " + std::to_string(used) + " of " +
                                  std::to_string(blob.size()) + " bytes");
    const auto blob2 = get_seq_state(b.get());
    decode_batch(b.get(), toks, n - 1, 1, n - 1, one);
    const long diff = bits_differing(la.data(), llama_get_logits_ith(b.get(), -1), mi.n_vocab);
    // the same state through kvc's codec: pack, unpack, restore into a third context
    const auto segs = state_segments(blob, mi);
    const double t2 = now_s();
    const auto pack = pack_state(blob, segs);
    const double t_enc = now_s() - t2;
    const double t3 = now_s();
    const auto unpacked = unpack_state(pack, blob.size());
    const double t_dec = now_s() - t3;
    const bool codec_exact = unpacked == blob;
    CtxPtr c = make_context(model, o, cfg);
    const size_t used_c = llama_state_seq_set_data(c.get(), unpacked.data(), unpacked.size(), 0);
    if (used_c != unpacked.size()) fail("state: the codec round trip was not accepted by llama_state_seq_set_data");
    decode_batch(c.get(), toks, n - 1, 1, n - 1, one);
    const long diff_codec = bits_differing(la.data(), llama_get_logits_ith(c.get(), -1), mi.n_vocab);
    // a damaged container must be refused: truncated, and one byte of a K blob flipped
    bool trunc_pack_refused = false, flip_refused_or_detected = false;
    try {
        std::vector<uint8_t> t(pack.begin(), pack.begin() + (long) (pack.size() / 2));
        unpack_state(t, blob.size());
    } catch (const std::runtime_error &) {
        trunc_pack_refused = true;
    }
    try {
        std::vector<uint8_t> f = pack;
        f[8 + 17] ^= 0x5a;  // the first byte of the first segment's gear-v1 blob
        unpack_state(f, blob.size());
    } catch (const std::runtime_error &) {
        flip_refused_or_detected = true;
    }
    size_t f16_raw = 0, f16_packed = 0;
    {
        StateReader pr{pack};
        pr.get<uint64_t>("h");
        for (size_t i = 0; i < segs.size(); ++i) {
            const uint8_t kind = pr.get<uint8_t>("k");
            const uint64_t raw = pr.get<uint64_t>("r");
            const uint64_t len = pr.get<uint64_t>("l");
            pr.take((size_t) len, "b");
            if (kind) {
                f16_raw += raw;
                f16_packed += len;
            }
        }
    }

    RunResult r;
    r.mode = "state";
    const bool ok = diff == 0 && blob2 == blob && trunc_rejected && codec_exact && diff_codec == 0 && trunc_pack_refused &&
                    flip_refused_or_detected;
    char cbuf[160];
    std::snprintf(cbuf, sizeof cbuf, "; kvc codec %.3f:1 (%zu B), encode %.0f MB/s, decode %.0f MB/s, restored logits %s",
                  (double) blob.size() / (double) pack.size(), pack.size(), (double) blob.size() / 1e6 / t_enc,
                  (double) blob.size() / 1e6 / t_dec, diff_codec == 0 ? "identical" : "DIFFER");
    r.detail = std::string(ok ? "restore identical" : "MISMATCH") + ", " + std::to_string(blob.size()) + " B state" + cbuf;
    r.cells_end = n - 1;
    r.cells_verified = state_cell_count(blob);
    r.held_bytes_end = (double) blob.size();
    r.extra.push_back({"state_bytes", std::to_string(blob.size())});
    r.extra.push_back({"kv_f16_bytes", std::to_string((size_t) (n - 1) * mi.cell_bytes(GGML_TYPE_F16, GGML_TYPE_F16))});
    r.extra.push_back({"logits_differing", std::to_string(diff)});
    r.extra.push_back({"state_round_trip_identical", blob2 == blob ? "true" : "false"});
    r.extra.push_back({"truncated_state_rejected", trunc_rejected ? "true" : "false"});
    r.extra.push_back({"codec_state_ratio", json_num((double) blob.size() / (double) pack.size())});
    r.extra.push_back({"codec_packed_bytes", std::to_string(pack.size())});
    r.extra.push_back({"codec_kv_ratio", json_num((double) f16_raw / (double) std::max<size_t>(1, f16_packed))});
    r.extra.push_back({"codec_segments", std::to_string(segs.size())});
    r.extra.push_back({"codec_encode_mb_s", json_num((double) blob.size() / 1e6 / t_enc)});
    r.extra.push_back({"codec_decode_mb_s", json_num((double) blob.size() / 1e6 / t_dec)});
    r.extra.push_back({"codec_round_trip_identical", codec_exact ? "true" : "false"});
    r.extra.push_back({"codec_logits_differing", std::to_string(diff_codec)});
    r.extra.push_back({"codec_truncated_refused", trunc_pack_refused ? "true" : "false"});
    r.extra.push_back({"codec_damaged_header_refused", flip_refused_or_detected ? "true" : "false"});
    r.extra.push_back({"save_s", json_num(t_save)});
    r.extra.push_back({"restore_s", json_num(t_restore)});
    if (!ok) fail("state: " + r.detail + " (logits differing " + std::to_string(diff) + ", truncated rejected " +
                  (trunc_rejected ? "yes" : "no") + ")");
    return r;
}

// ------------------------------------------------------------------------------------------
// reporting

struct TextReport {
    std::string path;
    long tokens_total = 0;
    std::vector<RunResult> rows;
};

void print_table(const TextReport & t, const Options & o) {
    std::printf("\n%s: %ld tokens in the file, first %d decoded one at a time, PPL over positions %d..%d\n",
                t.path.c_str(), t.tokens_total, o.n_tokens, o.ppl_from, o.n_tokens - 1);
    std::printf("%-10s %9s %9s %8s %9s %9s %8s %10s  %s\n", "mode", "PPL", "KL", "tok/s", "KV ratio", "mean ratio",
                "cells", "KV bytes", "notes");
    for (const auto & r : t.rows) {
        auto f = [](double x, const char * fmt) {
            char buf[32];
            if (std::isfinite(x)) std::snprintf(buf, sizeof buf, fmt, x);
            else std::snprintf(buf, sizeof buf, "-");
            return std::string(buf);
        };
        std::printf("%-10s %9s %9s %8s %9s %9s %8ld %10.0f  %s\n", r.mode.c_str(), f(r.ppl, "%.4f").c_str(),
                    f(r.kl, "%.5f").c_str(), f(r.tok_s, "%.1f").c_str(), f(r.held_ratio_end, "%.3f").c_str(),
                    f(r.held_ratio_mean, "%.3f").c_str(), r.cells_end, r.held_bytes_end, r.detail.c_str());
    }
}

std::string result_json(const RunResult & r) {
    std::ostringstream j;
    j << "{\"mode\": \"" << json_escape(r.mode) << "\", \"detail\": \"" << json_escape(r.detail) << "\""
      << ", \"ppl\": " << json_num(r.ppl) << ", \"kl\": " << json_num(r.kl) << ", \"n_scored\": " << r.n_scored
      << ", \"tokens_per_s\": " << json_num(r.tok_s) << ", \"kv_held_bytes_end\": " << json_num(r.held_bytes_end)
      << ", \"kv_ratio_end\": " << json_num(r.held_ratio_end) << ", \"kv_ratio_mean\": " << json_num(r.held_ratio_mean)
      << ", \"kv_alloc_bytes\": " << json_num(r.alloc_bytes) << ", \"cells_end\": " << r.cells_end
      << ", \"cells_verified\": " << r.cells_verified << ", \"cells_peak\": " << r.cells_peak;
    for (const auto & kv : r.extra) j << ", \"" << json_escape(kv.first) << "\": " << kv.second;
    j << "}";
    return j.str();
}

void write_json(const std::string & path, const Options & o, const ModelInfo & mi, const std::vector<TextReport> & reps,
                const TapStats * probe_stats) {
    std::ostringstream j;
    j << "{\n  \"model\": \"" << json_escape(mi.file) << "\", \"model_desc\": \"" << json_escape(mi.desc) << "\",\n";
    j << "  \"n_layer\": " << mi.n_layer << ", \"n_head\": " << mi.n_head << ", \"n_head_kv\": " << mi.n_head_kv
      << ", \"head_dim\": " << mi.head_dim << ",\n";
    j << "  \"n_tokens\": " << o.n_tokens << ", \"ppl_from\": " << o.ppl_from << ", \"prompt\": " << o.prompt
      << ", \"threads\": " << o.threads << ",\n";
    j << "  \"budget\": {\"ratio\": " << json_num(o.ratio) << ", \"sink\": " << o.sink << ", \"recent\": " << o.recent
      << ", \"trigger\": " << o.trigger << ", \"interval\": " << o.interval << ", \"mode\": \"" << o.budget
      << "\", \"positions\": \"" << o.positions << "\"},\n";
    if (probe_stats) {
        j << "  \"probe\": {\"kq_calls\": " << probe_stats->kq_calls << ", \"rows_calls\": " << probe_stats->rows_calls
          << ", \"set_rows_calls\": " << probe_stats->set_rows_calls
          << ", \"kq_rowsum_max_rel_err\": " << json_num(probe_stats->kq_rowsum_max_err)
          << ", \"set_rows_reads_hooked_tensor\": " << (probe_stats->set_rows_reads_hooked_tensor ? "true" : "false")
          << ", \"shapes\": [";
        for (size_t i = 0; i < probe_stats->shapes.size(); ++i) {
            j << (i ? ", " : "") << "\"" << json_escape(probe_stats->shapes[i]) << "\"";
        }
        j << "]},\n";
    }
    j << "  \"texts\": [\n";
    for (size_t t = 0; t < reps.size(); ++t) {
        j << "    {\"text\": \"" << json_escape(reps[t].path) << "\", \"tokens_total\": " << reps[t].tokens_total
          << ", \"results\": [\n";
        for (size_t i = 0; i < reps[t].rows.size(); ++i) {
            j << "      " << result_json(reps[t].rows[i]) << (i + 1 < reps[t].rows.size() ? ",\n" : "\n");
        }
        j << "    ]}" << (t + 1 < reps.size() ? ",\n" : "\n");
    }
    j << "  ]\n}\n";
    const std::string s = j.str();
    write_bytes(path, s.data(), s.size());
}

std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool bos) {
    int n = -llama_tokenize(vocab, text.data(), (int32_t) text.size(), nullptr, 0, bos, false);
    if (n <= 0) fail("tokenization failed");
    std::vector<llama_token> toks(n);
    const int got = llama_tokenize(vocab, text.data(), (int32_t) text.size(), toks.data(), n, bos, false);
    if (got != n) fail("tokenization failed");
    return toks;
}

int run(int argc, char ** argv) {
    const Options o = parse_options(argc, argv);
    llama_log_set(quiet_log, o.verbose ? (void *) 1 : nullptr);
    llama_backend_init();

    {
        std::ifstream probe(o.model, std::ios::binary);
        if (!probe) throw UsageError("cannot read model '" + o.model + "'");
    }
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(o.model.c_str(), mp);
    if (!model) throw UsageError("cannot load model '" + o.model + "' (not a GGUF llama.cpp can read?)");
    std::unique_ptr<llama_model, void (*)(llama_model *)> model_guard(model, llama_model_free);

    ModelInfo mi;
    mi.n_layer = llama_model_n_layer(model);
    mi.n_head = llama_model_n_head(model);
    mi.n_head_kv = llama_model_n_head_kv(model);
    mi.head_dim = llama_model_n_embd(model) / std::max(1, mi.n_head);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    mi.n_vocab = llama_vocab_n_tokens(vocab);
    char desc[256];
    llama_model_desc(model, desc, sizeof desc);
    mi.desc = desc;
    mi.file = base_name(o.model);

    std::vector<TextReport> reports;
    TapStats probe_stats;
    bool have_probe = false;
    int text_no = 0;
    for (const auto & path : o.texts) {
        const std::string text = read_file(path);
        const auto toks = tokenize(vocab, text, o.bos);
        if ((int) toks.size() < o.n_tokens) {
            throw UsageError("'" + path + "' has " + std::to_string(toks.size()) + " tokens, fewer than --n-tokens " +
                             std::to_string(o.n_tokens));
        }
        TextReport rep;
        rep.path = path;
        rep.tokens_total = (long) toks.size();
        RefStore ref;

        DecodeSpec full;
        full.mode = "full";
        full.cfg.n_ctx = o.n_tokens;
        full.is_reference = true;
        rep.rows.push_back(run_decode(model, mi, o, toks, ref, full));
        const double full_tok_s = rep.rows.back().tok_s;

        if (has_mode(o, "streaming")) {
            SinkWindowPolicy pol(o.sink, o.recent, o.ratio, o.trigger, o.interval, o.budget == "adaptive", o.n_tokens);
            DecodeSpec s;
            s.mode = "streaming";
            s.cfg.n_ctx = std::max(pol.max_cells() + 1, o.prompt + 1);
            s.policy = &pol;
            s.shift_positions = o.positions == "shift";
            RunResult r = run_decode(model, mi, o, toks, ref, s);
            r.detail = "sink " + std::to_string(o.sink) + " + window, " + o.budget + " 1/" + json_num(o.ratio) +
                       ", positions " + o.positions;
            rep.rows.push_back(r);
        }
        for (double R : o.kv_ratios) {
            for (const char * m : {"kvc-streaming", "h2o", "h2o-fa"}) {
                if (!has_mode(o, m)) continue;
                const std::string mode = m;
                const bool fa = mode == "h2o-fa";
                const KvcBudget bud = kvc_budget(R, o);
                KvcH2oPolicy pol(mi, o, mode == "kvc-streaming", bud);
                EvalTap tap;
                tap.n_layer = mi.n_layer;
                tap.n_head = mi.n_head;
                tap.n_head_kv = mi.n_head_kv;
                tap.head_dim = mi.head_dim;
                tap.want_set_rows = true;
                tap.want_kq = !fa;
                tap.want_fattn = fa;
                tap.scorer = &pol;
                DecodeSpec s;
                s.mode = mode + "@" + json_num(R);
                s.cfg.n_ctx = o.n_tokens;
                s.cfg.flash_attn = fa;
                s.cfg.tap = &tap;
                s.policy = &pol;
                s.shift_positions = o.positions == "shift";
                RunResult r = run_decode(model, mi, o, toks, ref, s);
                pol.report(r.extra);
                if (fa) {
                    r.extra.push_back({"fattn_recompute_max_out_err", json_num(tap.fattn_max_out_err)});
                    r.extra.push_back({"fattn_checked_calls", std::to_string(tap.fattn_checked)});
                    r.extra.push_back({"fattn_err_over_bound", json_num(tap.fattn_max_excess)});
                    r.extra.push_back({"fattn_control_head_caught", std::to_string(tap.fattn_ctrl_head_caught)});
                    r.extra.push_back({"fattn_control_head_calls", std::to_string(tap.fattn_ctrl_head_calls)});
                    r.extra.push_back({"fattn_control_cell_caught", std::to_string(tap.fattn_ctrl_cell_caught)});
                    r.extra.push_back({"fattn_control_scale_caught", std::to_string(tap.fattn_ctrl_scale_caught)});
                    // within the rounding bound of fattn_bound.hpp (derived from the kernel's f16
                    // arithmetic, not tuned to one machine), and every checked call able to fail:
                    // each deliberate mistake lands outside the same bound
                    if (!(tap.fattn_checked > 0 && tap.fattn_max_excess <= 1.0)) {
                        fail(s.mode + ": recomputed attention output differs from llama.cpp's by " +
                             json_num(tap.fattn_max_out_err) + ", " + json_num(tap.fattn_max_excess) +
                             " times the rounding bound");
                    }
                    if (tap.fattn_ctrl_head_caught != tap.fattn_ctrl_head_calls ||
                        tap.fattn_ctrl_cell_caught != tap.fattn_checked || tap.fattn_ctrl_scale_caught != tap.fattn_checked) {
                        fail(s.mode + ": the attention check missed a deliberate mistake (caught: wrong head " +
                             std::to_string(tap.fattn_ctrl_head_caught) + ", missing cell " +
                             std::to_string(tap.fattn_ctrl_cell_caught) + ", scale " +
                             std::to_string(tap.fattn_ctrl_scale_caught) + " of " + std::to_string(tap.fattn_checked) +
                             " calls)");
                    }
                }
                if (!(pol.unmapped_max() < 1e-3)) {
                    fail(s.mode + ": " + json_num(pol.unmapped_max()) + " of the attention fell on cells the harness does not hold");
                }
                char buf[200];
                std::snprintf(buf, sizeof buf, "%s, cap %d cells (sink %d, recent %d, block %d), positions %s%s",
                              pol.name().c_str(), bud.cap, o.sink, bud.recent, o.block, o.positions.c_str(),
                              fa ? ", flash attention on (scores recomputed)" : "");
                r.detail = buf;
                rep.rows.push_back(r);
            }
        }
        if (has_mode(o, "c8") || has_mode(o, "c8-h2o")) {
            // calibration: the first --c8-calib tokens in one batch, rows observed as f16
            const int nc = std::min(o.c8_calib > 0 ? o.c8_calib : o.ppl_from - 1, o.n_tokens);
            QuantPtr quant(mi);
            if (o.c8_rule == "rope") {
                // K rows are post-RoPE: pair the channels as the model's rope rotates them
                const int rt = llama_model_rope_type(model);
                kvc_rope_style style;
                if (rt == LLAMA_ROPE_TYPE_NORM) style = KVC_ROPE_NORM;
                else if (rt == LLAMA_ROPE_TYPE_NEOX) style = KVC_ROPE_NEOX;
                else fail("--c8-rule rope: the model's rope type " + std::to_string(rt) +
                          " is neither NORM nor NEOX; use --c8-rule channel");
                kvc_ok(kvc_quant_set_rope(quant.q, (size_t) mi.head_dim, style), "kvc_quant_set_rope");
            }
            {
                C8ObserveHook obs(quant.q, mi.n_embd_kv());
                EvalTap tap;
                tap.n_layer = mi.n_layer;
                tap.n_head = mi.n_head;
                tap.n_head_kv = mi.n_head_kv;
                tap.head_dim = mi.head_dim;
                tap.want_rows = true;
                tap.hook = &obs;
                CtxConfig cc;
                cc.n_ctx = nc;
                cc.n_batch = nc;
                cc.tap = &tap;
                Options oc = o;
                oc.prompt = nc;
                CtxPtr cctx = make_context(model, oc, cc);
                std::vector<bool> none(nc, false);
                none[nc - 1] = true;
                decode_batch(cctx.get(), toks, 0, nc, 0, none);
                if (!tap.error.empty()) fail("C8 calibration: " + tap.error);
                if (obs.rows() != (long) nc * 2 * mi.n_layer) fail("C8 calibration: the hook saw the wrong number of rows");
                kvc_ok(kvc_quant_finish(quant.q), "kvc_quant_finish");
            }
            // memory as a C8 cache would hold it: int8 K and V rows per cell, f32 scale and
            // offset per channel, per layer, for K and V (llama.cpp itself keeps f16 here)
            const double c8_cell = (double) mi.n_layer * 2.0 * mi.n_embd_kv();
            const double c8_params = (double) mi.n_layer * 2.0 * mi.n_embd_kv() * 2.0 * 4.0;
            const double full_bytes = (double) o.n_tokens * (double) mi.cell_bytes(GGML_TYPE_F16, GGML_TYPE_F16);
            std::vector<double> rs;
            if (has_mode(o, "c8")) rs.push_back(0.0);
            if (has_mode(o, "c8-h2o")) rs.insert(rs.end(), o.kv_ratios.begin(), o.kv_ratios.end());
            for (double R : rs) {
                C8RoundTripHook hook(quant.q, mi.n_embd_kv());
                EvalTap tap;
                tap.n_layer = mi.n_layer;
                tap.n_head = mi.n_head;
                tap.n_head_kv = mi.n_head_kv;
                tap.head_dim = mi.head_dim;
                tap.want_rows = true;
                tap.want_set_rows = true;
                tap.hook = &hook;
                DecodeSpec s;
                s.cfg.n_ctx = o.n_tokens;
                s.cfg.tap = &tap;
                s.cell_bytes = c8_cell;
                s.fixed_bytes = c8_params;
                s.shift_positions = o.positions == "shift";
                std::unique_ptr<KvcH2oPolicy> pol;
                KvcBudget bud;
                if (R > 0.0) {
                    // total ratio R: cells x int8 bytes + params <= full f16 bytes / R
                    const int cap = (int) std::floor((full_bytes / R - c8_params) / c8_cell);
                    bud = kvc_budget_cells(cap, o);
                    pol.reset(new KvcH2oPolicy(mi, o, false, bud));
                    tap.want_kq = true;
                    tap.scorer = pol.get();
                    s.policy = pol.get();
                    s.mode = "c8-h2o@" + json_num(R);
                } else {
                    s.mode = "c8";
                }
                RunResult r = run_decode(model, mi, o, toks, ref, s);
                if (!tap.stats.set_rows_reads_hooked_tensor) fail(s.mode + ": a SET_ROWS node reads rows the hook did not see");
                for (int v = 0; v < 2; ++v) {
                    const auto & e = hook.err(v == 1);
                    const std::string k = v ? "c8_v_" : "c8_k_";
                    if (e.n == 0) fail(s.mode + ": the C8 hook saw no rows");
                    r.extra.push_back({k + "rel_rms_err", json_num(std::sqrt(e.sq / std::max(1e-30, e.ref)))});
                    r.extra.push_back({k + "max_abs_err", json_num(e.max)});
                    r.extra.push_back({k + "values", std::to_string(e.n)});
                }
                r.extra.push_back({"c8_calib_tokens", std::to_string(nc)});
                r.extra.push_back({"c8_rule", "\"" + o.c8_rule + "\""});
                r.extra.push_back({"kv_accounting", "\"C8: int8 K/V per cell + f32 scale and offset per channel (llama.cpp holds f16: kvc dequantizes)\""});
                char buf[200];
                const auto & ek = hook.err(false);
                const auto & ev = hook.err(true);
                std::snprintf(buf, sizeof buf, "kvc C8 (%s rule, calibrated on %d tokens), rel RMS err K %.4f V %.4f; memory = int8 + scales",
                              o.c8_rule.c_str(), nc, std::sqrt(ek.sq / std::max(1e-30, ek.ref)), std::sqrt(ev.sq / std::max(1e-30, ev.ref)));
                r.detail = buf;
                if (pol) {
                    pol->report(r.extra);
                    r.detail += ", + kvc_h2o heavy hitters cap " + std::to_string(bud.cap) + " cells (recent " +
                                std::to_string(bud.recent) + ")";
                }
                rep.rows.push_back(r);
            }
        }
        for (const char * q : {"q8_0", "q4_0"}) {
            if (!has_mode(o, q)) continue;
            DecodeSpec s;
            s.mode = q;
            s.cfg.n_ctx = o.n_tokens;
            s.cfg.type_k = s.cfg.type_v = std::string(q) == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_Q4_0;
            s.cfg.flash_attn = true;
            RunResult r = run_decode(model, mi, o, toks, ref, s);
            r.detail = "llama.cpp cache type, flash attention on";
            rep.rows.push_back(r);
        }
        if (has_mode(o, "probe")) {
            EvalTap tap;
            IdentityRowHook hook;
            tap.want_kq = tap.want_rows = tap.want_set_rows = true;
            tap.n_layer = mi.n_layer;
            tap.n_head = mi.n_head;
            tap.n_head_kv = mi.n_head_kv;
            tap.head_dim = mi.head_dim;
            tap.hook = &hook;
            DecodeSpec s;
            s.mode = "probe";
            s.cfg.n_ctx = o.n_tokens;
            s.cfg.tap = &tap;
            RunResult r = run_decode(model, mi, o, toks, ref, s);
            const RunResult & f = rep.rows.front();
            const bool same = r.ppl == f.ppl;
            r.detail = std::string("eval callback, identity hook; overhead ") + json_num(100.0 * (full_tok_s / r.tok_s - 1.0)) +
                       " %; PPL " + (same ? "identical to full" : "DIFFERS from full");
            r.extra.push_back({"overhead_pct", json_num(100.0 * (full_tok_s / r.tok_s - 1.0))});
            r.extra.push_back({"ppl_identical_to_full", same ? "true" : "false"});
            if (!same) fail("probe: an identity hook changed the perplexity");
            if (!tap.stats.set_rows_reads_hooked_tensor) fail("probe: a SET_ROWS node reads a tensor the hook did not see");
            if (tap.stats.kq_rowsum_max_err > 1e-3) fail("probe: kq_soft_max rows do not sum to 1");
            if (text_no == 0) {
                std::printf("eval callback (flash attention off) sees:\n");
                for (const auto & s2 : tap.stats.shapes) std::printf("  %s\n", s2.c_str());
                std::printf("  last token's cell (layer-0 K SET_ROWS index): %lld; softmax rows sum to 1 within %.2g\n",
                            tap.last_cells.empty() ? -1LL : (long long) tap.last_cells[0], tap.stats.kq_rowsum_max_err);
                probe_stats = tap.stats;
                have_probe = true;
            }
            rep.rows.push_back(r);
        }
        if (has_mode(o, "state")) rep.rows.push_back(run_state(model, mi, o, toks));
        if (has_mode(o, "dump")) {
            const std::string tag = std::string("text") + (char) ('A' + text_no);
            Options od = o;
            if (text_no != 0) od.realkv_dir.clear();  // the reference data is of text A only
            rep.rows.push_back(run_dump(model, mi, od, toks, path, text, tag));
        }
        print_table(rep, o);
        reports.push_back(std::move(rep));
        text_no++;
    }
    if (!o.json.empty()) write_json(o.json, o, mi, reports, have_probe ? &probe_stats : nullptr);
    llama_backend_free();
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    try {
        return run(argc, argv);
    } catch (const UsageError & e) {
        std::fprintf(stderr, "kvc_llama_eval: %s\n", e.what());
        return 2;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "kvc_llama_eval: %s\n", e.what());
        return 1;
    }
}
