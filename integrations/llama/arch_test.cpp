// kvc_arch_test: one model, one K/V cache type, checked layer by layer inside llama.cpp.
//
// Every kvc quality number used to come from one model (SmolLM2-135M). This program takes any
// GGUF llama.cpp runs (testmodels/make_models.py makes small random-weight ones of several
// architectures) and a cache type by NAME (f16, q8_0, q4_0, kvq4_128, ...: looked up by
// ggml_type_name over every ggml type id, so types added later work unchanged), runs the same
// seeded random token batch (a prefill, then single-token decode steps) with flash attention on,
// once with an f16 cache and once with the asked type, and checks:
//
//  1. attention, per layer: every flash-attention call's output against exact attention on the
//     unquantized K/V rows, within a bound derived from the asked type's per-row error (below);
//     two deliberate mistakes (wrong KV head, wrong head size) must fall outside that bound, so
//     the check is shown to be able to fail; where a layer's inputs are bit-identical in both
//     runs (the first layer) the asked run's output is also compared with the f16 run's node;
//  2. the cache rows: every live cell's packed row is exactly what the type's quantizer gives
//     for the row llama.cpp wrote (SET_ROWS), and for kvq types also what kvc's C API
//     (kvc_kvq_block_quantize) gives;
//  3. types and bytes: every layer's K and V cache holds the asked type (a head-size-agnostic
//     name "kvqB" may resolve to "kvqB_<head size>"), and its bytes equal cells x KV heads x
//     the type's row bytes (kvc_kvq_block_bytes for kvq types, ggml's block size and type size
//     otherwise); llama_kvc_cache_bytes' totals equal the sum over layers where it answers;
//  4. the sequence state: llama_state_seq_get_data, set_data into a fresh context, and the
//     next token's logits are bit-identical in both contexts;
//  5. bad input (a missing model, an unknown type name, a type the model cannot hold) is
//     refused with one line on stderr and exit status 2.
// It prints one JSON line; exit status 0 only if every check passed, 1 if one failed.
//
// --protect SINK,WINDOW,BITS,CENTER instead runs kvc's kvq cells (llama_context_params::kvc_sink
// and the rest) on the asked kvq types, whose rows are then of three formats, so checks 1 and 2
// do not apply: see run_protected (KL below the plain kvq run's before and after a context
// shift, the state round trip, bytes beside the tensors, interrupted batches and rollbacks
// against a fresh context; every cache of a sliding-window model).
//
// The bound of check 1. Per query row (token, query head h reading KV head h / group) of one
// flash-attention call, with exact rows K_c, V_c (f32 as written), the rows the cache holds
// K^_c = K_c + e_c, V^_c = V_c + f_c (dequantized from the cache; e, f are the type's per-row
// errors on this layer's real rows), the query q and q^ (q through K's vec_dot_type, which is
// what the kernel dots with: f16, q8_0, or kvq's rotation), scale s and mask m:
//   p  = softmax(s q.K_c + m_c),  o  = sum_c p_c V_c            (exact attention, double)
//   p^ = softmax(s q^.K^_c + m_c), o^ = sum_c p^_c V^_c         (exact on the cached rows)
// and since sum_c (p^_c - p_c) = 0,
//   o^ - o = sum_c p^_c f_c + sum_c (p^_c - p_c) (V_c - o),
// so per output element d
//   |node_d - o_d| <= |sum_c p^_c f_cd| + |sum_c (p^_c - p_c)(V_cd - o_d)| + R_d
// where the first term is V's row error seen through the attention weights, the second K's
// (and Q's) row error moving the weights, and R_d the kernel's rounding around o^ (fattn_bound.hpp:
// f16 Q and V accumulation, Higham-Mary rule; for kvq types also the f32 rounding of the rotation
// in which their kernels dot and accumulate, which spreads over a whole row: see on_flash_attn).
// Nothing here is a tuned constant: the first two terms are computed from the actual per-row
// errors, R_d from the kernel's arithmetic. The bound is exact up to R_d (the two terms sum to
// |o^ - o| where they have the same sign), so bound_excess near 1 is expected for lossy types;
// kernel_excess = max |node - o^| / R_d, required <= 1 as well, is how close the kernel is to
// exact attention on the rows it holds. The report gives both terms relative to |o| per layer
// (how much of the attention error K and V each cause) and the node's largest |node - o| / bound.
// Controls, evaluated against the same bound and required to exceed it in every call:
//   wrong_head: o computed with the next KV head ((kvh + 1) % n_kv_head; with one KV head, the
//     next query head's o), as a cache written or read with a wrong head mapping would give;
//   wrong_head_size: heads of half the size (each q, K, V row split into two heads), as a cache
//     that cut rows at a wrong head size would give.
// Layers whose inputs differ between the two runs (all after the first, since the earlier
// layers' outputs differ) cannot be compared with the f16 run's node directly; their relative
// difference from the f16 run is reported (rel_err_vs_f16_run), not bounded.
//
// Usage: kvc_arch_test --model FILE --type NAME [--type-v NAME] [--prefill N] [--decode N]
//                      [--seed S] [--threads T] [--protect S,W,B,C] [--verbose]
#include "fattn_bound.hpp"

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-kvc.h"
#include "ggml.h"
#include "llama.h"

#include <kvc.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

std::string g_last_llama_error;

void log_cb(ggml_log_level level, const char * text, void * ud) {
    if (ud != nullptr) std::fputs(text, stderr);
    if (level == GGML_LOG_LEVEL_ERROR) {
        g_last_llama_error += text;
        if (g_last_llama_error.size() > 2000) g_last_llama_error.erase(0, g_last_llama_error.size() - 2000);
    }
}

std::string json_str(const std::string & s) {
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') {
            o += '\\';
            o += c;
        } else if ((unsigned char) c < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            o += b;
        } else {
            o += c;
        }
    }
    return o + "\"";
}

std::string json_num(double x) {
    if (!std::isfinite(x)) return std::isnan(x) ? "null" : (x > 0 ? "1e308" : "-1e308");
    char b[64];
    std::snprintf(b, sizeof b, "%.6g", x);
    return b;
}

// the ggml type whose name is `name`, over every id ggml has (no id is written here)
ggml_type type_by_name(const std::string & name) {
    for (int i = 0; i < GGML_TYPE_COUNT; ++i) {
        const char * n = ggml_type_name((ggml_type) i);
        // (a name may stand for a choice llama.cpp resolves per layer, with no block of its own:
        // "kvq4" -> kvq4_<that layer's head size>; the per-layer check below accepts that)
        if (n != nullptr && name == n) return (ggml_type) i;
    }
    throw UsageError("unknown cache type name '" + name + "' (a ggml type name: f16, q8_0, q4_0, kvq4_64, ...)");
}

int layer_of(const char * name, const char * prefix) {
    const size_t n = std::strlen(prefix);
    if (std::strncmp(name, prefix, n) != 0) return -1;
    const char * p = name + n;
    if (*p < '0' || *p > '9') return -1;
    char * end = nullptr;
    const long il = std::strtol(p, &end, 10);
    if (*end != '\0' && *end != ' ') return -1;  // "cache_k_l3" or "cache_k_l3 (view)"
    return (int) il;
}

const ggml_tensor * view_root(const ggml_tensor * t) {
    while (t->view_src) t = t->view_src;
    return t;
}

bool is_kvq(ggml_type t, int * bits = nullptr, int * hd = nullptr) {
    return ggml_kvc_type_info(t, bits, hd);
}

// bytes of one row of `d` values of type `t`: kvc's formula for kvq types, ggml's otherwise;
// 0 when `d` is not a whole number of the type's blocks
size_t row_bytes_formula(ggml_type t, int64_t d) {
    int bits = 0, hd = 0;
    if (is_kvq(t, &bits, &hd)) {
        size_t b = 0;
        if (hd != d || kvc_kvq_block_bytes((uint32_t) hd, (uint32_t) bits, &b) != KVC_OK) return 0;
        return b;
    }
    const int64_t blck = ggml_blck_size(t);
    if (blck <= 0 || d % blck != 0) return 0;
    return (size_t) (d / blck) * ggml_type_size(t);
}

bool type_name_exists(const std::string & name) {
    for (int i = 0; i < GGML_TYPE_COUNT; ++i) {
        const char * n = ggml_type_name((ggml_type) i);
        if (n != nullptr && name == n) return true;
    }
    return false;
}

// does the cache type `got` satisfy the asked `want` for rows of `d` values: the same type, or
// a head-size-agnostic name (no block of its own) resolved to the type of this head size ("kvq4"
// -> "kvq4_128"); where this build has no type of that head size, llama.cpp falls back to a type
// of its own (patch 0003: q8_0, or f16), which is accepted and reported (*fallback)
bool type_matches(ggml_type want, ggml_type got, int64_t d, bool * fallback) {
    if (want == got) return true;
    const std::string resolved = std::string(ggml_type_name(want)) + "_" + std::to_string(d);
    if (ggml_type_name(got) == resolved) return true;
    if (ggml_blck_size(want) == 0 && !type_name_exists(resolved) && !is_kvq(got) && ggml_blck_size(got) > 0) {
        *fallback = true;
        return true;
    }
    return false;
}

struct Options {
    std::string model;
    std::string type_k, type_v;
    int prefill = 96;
    int decode = 4;
    uint64_t seed = 1;
    int threads = 2;
    bool verbose = false;
    // --protect SINK,WINDOW,BITS,CENTER: kvc's kvq cells on the asked kvq types (run_protected)
    bool protect = false;
    uint32_t sink = 0, window = 0, window_bits = 8;
    bool center = false;
};

Options parse(int argc, char ** argv) {
    Options o;
    auto need = [&](int & i) -> std::string {
        if (i + 1 >= argc) throw UsageError(std::string(argv[i]) + " needs a value");
        return argv[++i];
    };
    auto to_int = [](const std::string & flag, const std::string & v, long lo, long hi) {
        char * end = nullptr;
        const long x = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || x < lo || x > hi)
            throw UsageError(flag + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'");
        return x;
    };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--model") o.model = need(i);
        else if (a == "--type") o.type_k = need(i);
        else if (a == "--type-v") o.type_v = need(i);
        else if (a == "--prefill") o.prefill = (int) to_int(a, need(i), 2, 4096);
        else if (a == "--decode") o.decode = (int) to_int(a, need(i), 0, 4096);
        else if (a == "--seed") o.seed = (uint64_t) to_int(a, need(i), 0, 1L << 40);
        else if (a == "--threads") o.threads = (int) to_int(a, need(i), 1, 256);
        else if (a == "--verbose") o.verbose = true;
        else if (a == "--protect") {
            // SINK,WINDOW,BITS,CENTER(0|1)
            const std::string v = need(i);
            std::vector<std::string> f;
            size_t b = 0;
            for (size_t e; (e = v.find(',', b)) != std::string::npos; b = e + 1) f.push_back(v.substr(b, e - b));
            f.push_back(v.substr(b));
            if (f.size() != 4) throw UsageError("--protect SINK,WINDOW,BITS,CENTER, got '" + v + "'");
            o.protect = true;
            o.sink = (uint32_t) to_int(a, f[0], 0, 1 << 20);
            o.window = (uint32_t) to_int(a, f[1], 0, 1 << 20);
            o.window_bits = (uint32_t) to_int(a, f[2], 2, 8);
            o.center = to_int(a, f[3], 0, 1) == 1;
        }
        else throw UsageError("unknown argument '" + a + "' (usage: --model FILE --type NAME [--type-v NAME] [--prefill N] "
                              "[--decode N] [--seed S] [--threads T] [--protect S,W,B,C] [--verbose])");
    }
    if (o.model.empty()) throw UsageError("--model FILE is required");
    if (o.type_k.empty()) throw UsageError("--type NAME is required");
    if (o.type_v.empty()) o.type_v = o.type_k;
    return o;
}

struct ModelFacts {
    std::string arch;
    int n_layer = 0, n_head = 0, n_head_kv = 0, n_vocab = 0;
    int head_k = 0, head_v = 0;  // per-head K and V sizes (GGUF key_length / value_length)
};

int meta_int(const llama_model * m, const std::string & key, int fallback) {
    char buf[64] = {0};
    if (llama_model_meta_val_str(m, key.c_str(), buf, sizeof buf) <= 0) return fallback;
    return (int) std::strtol(buf, nullptr, 10);
}

// ---- what one run records, per layer --------------------------------------------------------

struct CallRecord {  // one flash-attention call of one layer, for the comparison between runs
    uint64_t input_hash = 0;        // Q, the exact K and V rows and the mask of the call
    std::vector<float> node;        // the node's output [n_tok][n_head][Dv]
    std::vector<double> bound;      // its bound around exact attention, same layout
    std::vector<double> exact;      // exact attention o, same layout
};

struct LayerRecord {
    bool seen = false;
    ggml_type type_k = GGML_TYPE_COUNT, type_v = GGML_TYPE_COUNT;
    size_t bytes_k = 0, bytes_v = 0, formula_k = 0, formula_v = 0;
    int64_t cells = 0;
    bool bytes_ok = true, type_ok = true;
    // per-row errors of the cache against the rows written (sums of squares)
    double k_err2 = 0, k_ref2 = 0, v_err2 = 0, v_ref2 = 0;
    int64_t rows_checked = 0, rows_not_quantizer = 0, rows_kvc_checked = 0, rows_not_kvc = 0, cells_unwritten = 0;
    // attention outputs
    double out_err2 = 0, out_ref2 = 0, part_v2 = 0, part_k2 = 0;
    double excess = 0;                                    // max |node - o| / bound
    double kernel_excess = 0;                             // max |node - o^| / R (rounding alone)
    double ctrl_head_min = INFINITY, ctrl_size_min = INFINITY;  // min over calls of the control's max excess
    int64_t calls = 0;
    std::vector<CallRecord> records;
};

struct Tap {
    const ModelFacts * mf = nullptr;
    bool active = true;
    bool keep_records = false;       // the f16 run keeps its calls for the asked run
    const std::vector<LayerRecord> * ref_layers = nullptr;  // the f16 run, during the asked run
    std::vector<LayerRecord> layers;
    // exact rows written, per layer: cell -> n_kv_head * head values (f32 as SET_ROWS read them)
    std::vector<std::map<int64_t, std::vector<float>>> rows_k, rows_v;
    std::vector<std::string> failures;
    // the state check's diagnosis: per layer, the packed K and V bytes of every cell the last
    // query may see, in cell order (recorded instead of the checks when set)
    std::vector<std::vector<std::string>> * snapshot = nullptr;
    // comparison with the f16 run where a call's inputs are bit-identical
    int64_t cross_calls = 0;
    double cross_excess = 0, cross_err2 = 0, cross_ref2 = 0;
    std::vector<double> vs_f16_err2, vs_f16_ref2;
    // flash-attention ops scheduled, and those the CPU kernel takes its grouped-query path for
    // (ggml_kvc_fattn_grouped: the kernel's own test)
    int64_t fa_ops = 0, fa_grouped = 0;
    std::vector<int64_t> vs_f16_calls;
    std::vector<int64_t> call_index;  // per layer, calls so far (to pair with the f16 run's)

    void fail(const std::string & why) {
        if (failures.size() < 20) failures.push_back(why);
    }
};

uint64_t fnv(uint64_t h, const void * p, size_t n) {
    const auto * b = (const unsigned char *) p;
    for (size_t i = 0; i < n; ++i) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

float f32_at(const ggml_tensor * t, int64_t i0, int64_t i1, int64_t i2) {
    float x;
    std::memcpy(&x, (const char *) t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2], 4);
    return x;
}

float f16_at(const ggml_tensor * t, int64_t i0, int64_t i1) {
    ggml_fp16_t h;
    std::memcpy(&h, (const char *) t->data + i0 * t->nb[0] + i1 * t->nb[1], 2);
    return ggml_fp16_to_fp32(h);
}

// SET_ROWS into cache_k_l<il> / cache_v_l<il>: the f32 rows written and their cells
void on_set_rows(ggml_tensor * t, Tap * tap) {
    const ggml_tensor * root = view_root(t);
    const char * name = ggml_get_name(root);
    int il = layer_of(name, "cache_k_l");
    bool is_v = false;
    if (il < 0) {
        il = layer_of(name, "cache_v_l");
        is_v = true;
    }
    if (il < 0) return;
    if (il >= tap->mf->n_layer) return tap->fail(std::string("SET_ROWS into an unknown layer: ") + name);
    const ggml_tensor * src = t->src[0];
    const ggml_tensor * idx = t->src[1];
    if (src->type != GGML_TYPE_F32 || (idx->type != GGML_TYPE_I64 && idx->type != GGML_TYPE_I32))
        return tap->fail(std::string("SET_ROWS with unexpected types into ") + name);
    const int64_t width = src->ne[0], n = src->ne[1];
    const int64_t want = (int64_t) tap->mf->n_head_kv * (is_v ? tap->mf->head_v : tap->mf->head_k);
    if (width != want)
        return tap->fail(std::string("SET_ROWS into ") + name + ": rows of " + std::to_string(width) + " values, the model's " +
                         "KV heads x head size is " + std::to_string(want) + " (V transposed? flash attention must be on)");
    auto & dst = is_v ? tap->rows_v[il] : tap->rows_k[il];
    for (int64_t r = 0; r < n; ++r) {
        int64_t cell;
        if (idx->type == GGML_TYPE_I64) {
            std::memcpy(&cell, (const char *) idx->data + r * idx->nb[0], 8);
        } else {
            int32_t c32;
            std::memcpy(&c32, (const char *) idx->data + r * idx->nb[0], 4);
            cell = c32;
        }
        std::vector<float> row((size_t) width);
        for (int64_t i = 0; i < width; ++i) std::memcpy(&row[i], (const char *) src->data + i * src->nb[0] + r * src->nb[1], 4);
        dst[cell] = std::move(row);
    }
}

// dequantize a row of `d` values of type `t` (any type ggml can convert to f32)
void to_f32(ggml_type t, const void * src, float * dst, int64_t d) {
    if (t == GGML_TYPE_F32) {
        std::memcpy(dst, src, (size_t) d * 4);
        return;
    }
    ggml_get_type_traits(t)->to_float(src, dst, d);
}

// attention of one query row in double: logits s q.K_c + m_c, softmax, sum of p V
struct Rows {  // [cell][d] views, row stride = d
    const float * k;
    const float * v;
};

void logits_of(const std::vector<double> & q, const float * k, int64_t n_kv, int64_t D, double s,
               const std::vector<float> & mask_row, std::vector<double> & out) {
    out.assign((size_t) n_kv, -INFINITY);
    for (int64_t c = 0; c < n_kv; ++c) {
        if (mask_row[c] == -INFINITY) continue;
        const float * kr = k + c * D;
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q[d] * kr[d];
        out[c] = s * dot + mask_row[c];
    }
}

void on_flash_attn(ggml_tensor * t, Tap * tap) {
    const ggml_tensor * q = t->src[0];
    const ggml_tensor * k = t->src[1];
    const ggml_tensor * v = t->src[2];
    const ggml_tensor * m = t->src[3];
    const ggml_tensor * root_k = view_root(k);
    const ggml_tensor * root_v = view_root(v);
    const int il = layer_of(ggml_get_name(root_k), "cache_k_l");
    const ModelFacts & mf = *tap->mf;
    if (il < 0 || il >= mf.n_layer) return tap->fail(std::string("flash attention whose K is not a layer's cache: ") + ggml_get_name(root_k));
    float scale, max_bias, softcap;
    std::memcpy(&scale, &t->op_params[0], 4);
    std::memcpy(&max_bias, &t->op_params[1], 4);
    std::memcpy(&softcap, &t->op_params[2], 4);
    if (max_bias != 0.0f || softcap != 0.0f || t->src[4] != nullptr)
        return tap->fail("layer " + std::to_string(il) + ": ALiBi, softcap or attention sinks are not modelled by this test");
    const int64_t D = q->ne[0], n_tok = q->ne[1], n_head = q->ne[2], n_kv = k->ne[1], n_kvh = k->ne[2], Dv = v->ne[0];
    if (q->type != GGML_TYPE_F32 || !m || m->type != GGML_TYPE_F16 || k->ne[0] != D || v->ne[1] != n_kv ||
        v->ne[2] != n_kvh || q->ne[3] != 1 || k->ne[3] != 1 || t->type != GGML_TYPE_F32) {
        return tap->fail("layer " + std::to_string(il) + ": unexpected flash-attention operand types or shapes");
    }
    if (D != mf.head_k || Dv != mf.head_v || n_head != mf.n_head || n_kvh != mf.n_head_kv) {
        return tap->fail("layer " + std::to_string(il) + ": attention on heads of " + std::to_string(D) + "/" + std::to_string(Dv) +
                         " values, " + std::to_string(n_head) + "/" + std::to_string(n_kvh) + " heads; the GGUF says " +
                         std::to_string(mf.head_k) + "/" + std::to_string(mf.head_v) + ", " + std::to_string(mf.n_head) + "/" +
                         std::to_string(mf.n_head_kv));
    }
    if (k->view_offs != 0 || v->view_offs != 0 || k->nb[1] != root_k->nb[1] || v->nb[1] != root_v->nb[1])
        return tap->fail("layer " + std::to_string(il) + ": the K/V views do not start at cell 0 of one stream");

    LayerRecord & L = tap->layers[il];
    // check 3: the type and bytes of this layer's cache tensors
    if (!L.seen) {
        L.seen = true;
        L.type_k = root_k->type;
        L.type_v = root_v->type;
        L.bytes_k = ggml_nbytes(root_k);
        L.bytes_v = ggml_nbytes(root_v);
        L.cells = root_k->ne[1] * root_k->ne[2];
        L.formula_k = (size_t) (root_k->ne[1] * root_k->ne[2]) * (size_t) n_kvh * row_bytes_formula(root_k->type, D);
        L.formula_v = (size_t) (root_v->ne[1] * root_v->ne[2]) * (size_t) n_kvh * row_bytes_formula(root_v->type, Dv);
        L.bytes_ok = L.formula_k != 0 && L.formula_v != 0 && L.bytes_k == L.formula_k && L.bytes_v == L.formula_v &&
                     root_k->ne[0] == n_kvh * D && root_v->ne[0] == n_kvh * Dv;
    }
    const ggml_type tk = k->type, tv = v->type;

    // the rows the cache holds (dequantized) and the rows written, [kv head][cell][d]
    std::vector<float> kh((size_t) n_kvh * n_kv * D), vh((size_t) n_kvh * n_kv * Dv);
    std::vector<float> kx((size_t) n_kvh * n_kv * D, 0.0f), vx((size_t) n_kvh * n_kv * Dv, 0.0f);
    std::vector<uint8_t> live((size_t) n_kv, 0);
    std::vector<std::vector<float>> mask((size_t) n_tok, std::vector<float>((size_t) n_kv));
    for (int64_t qi = 0; qi < n_tok; ++qi)
        for (int64_t c = 0; c < n_kv; ++c) {
            mask[qi][c] = f16_at(m, c, qi);
            if (mask[qi][c] != -INFINITY) live[c] = 1;
        }
    const size_t rbk = ggml_row_size(tk, D), rbv = ggml_row_size(tv, Dv);
    std::vector<uint8_t> packed(std::max(rbk, rbv) + 64);
    int bits_k = 0, hd_k = 0, bits_v = 0, hd_v = 0;
    const bool kvq_k = is_kvq(tk, &bits_k, &hd_k), kvq_v = is_kvq(tv, &bits_v, &hd_v);
    const auto * cpu_k = ggml_get_type_traits_cpu(tk);
    const auto * cpu_v = ggml_get_type_traits_cpu(tv);
    uint64_t h_in = 1469598103934665603ull;
    for (int64_t c = 0; c < n_kv; ++c) {
        if (!live[c]) continue;
        const auto itk = tap->rows_k[il].find(c), itv = tap->rows_v[il].find(c);
        if (itk == tap->rows_k[il].end() || itv == tap->rows_v[il].end()) {
            ++L.cells_unwritten;
            continue;
        }
        for (int64_t h = 0; h < n_kvh; ++h) {
            for (int tensor = 0; tensor < 2; ++tensor) {
                const bool isv = tensor == 1;
                const ggml_tensor * x = isv ? v : k;
                const int64_t d = isv ? Dv : D;
                const ggml_type ty = isv ? tv : tk;
                const float * exact = (isv ? itv : itk)->second.data() + h * d;
                const void * cached = (const char *) x->data + c * x->nb[1] + h * x->nb[2];
                float * deq = (isv ? vh.data() : kh.data()) + ((size_t) h * n_kv + c) * d;
                float * ex = (isv ? vx.data() : kx.data()) + ((size_t) h * n_kv + c) * d;
                std::memcpy(ex, exact, (size_t) d * 4);
                h_in = fnv(h_in, exact, (size_t) d * 4);
                to_f32(ty, cached, deq, d);
                // check 2: the cached bytes are the type's quantizer's on the row written
                const size_t rb = isv ? rbv : rbk;
                const auto * cpu = isv ? cpu_v : cpu_k;
                ++L.rows_checked;
                if (ty == GGML_TYPE_F32) {
                    if (std::memcmp(cached, exact, rb) != 0) ++L.rows_not_quantizer;
                } else if (cpu->from_float) {
                    cpu->from_float(exact, packed.data(), d);
                    if (std::memcmp(cached, packed.data(), rb) != 0) ++L.rows_not_quantizer;
                } else {
                    ++L.rows_not_quantizer;
                }
                int bits = 0, hd = 0;
                if (isv ? kvq_v : kvq_k) {
                    bits = isv ? bits_v : bits_k;
                    hd = isv ? hd_v : hd_k;
                    ++L.rows_kvc_checked;
                    if (kvc_kvq_block_quantize((uint32_t) hd, (uint32_t) bits, exact, (size_t) d, packed.data(), rb) != KVC_OK ||
                        std::memcmp(cached, packed.data(), rb) != 0) {
                        ++L.rows_not_kvc;
                    }
                }
                double e2 = 0, r2 = 0;
                for (int64_t i = 0; i < d; ++i) {
                    const double e = (double) deq[i] - exact[i];
                    e2 += e * e;
                    r2 += (double) exact[i] * exact[i];
                }
                (isv ? L.v_err2 : L.k_err2) += e2;
                (isv ? L.v_ref2 : L.k_ref2) += r2;
            }
        }
    }
    if (L.cells_unwritten > 0) {
        tap->fail("layer " + std::to_string(il) + ": " + std::to_string(L.cells_unwritten) +
                  " live cells were never written by SET_ROWS (cell mapping)");
        return;
    }
    for (int64_t qi = 0; qi < n_tok; ++qi) h_in = fnv(h_in, mask[qi].data(), (size_t) n_kv * 4);

    // the query as the kernel dots it: through K's vec_dot_type and back
    const ggml_type vdt = cpu_k->vec_dot_type;
    const auto * cpu_vdt = ggml_get_type_traits_cpu(vdt);
    std::vector<uint8_t> qbuf(ggml_row_size(vdt, D) + 64);
    std::vector<float> qf((size_t) D), qr((size_t) D);
    const int64_t group = n_head / n_kvh;
    const double s = scale;

    CallRecord rec;
    const size_t n_out = (size_t) n_tok * n_head * Dv;
    rec.node.resize(n_out);
    rec.bound.resize(n_out);
    rec.exact.resize(n_out);
    double call_ctrl_head = 0, call_ctrl_size = 0;
    std::vector<double> qd((size_t) D), qhd((size_t) D), lg, lgh, p, ph, o, oh, bound, node((size_t) Dv), qk_abs, qk_sq, ctrl, pc, lc;
    for (int64_t qi = 0; qi < n_tok; ++qi) {
        for (int64_t h = 0; h < n_head; ++h) {
            const int64_t kvh = h / group;
            for (int64_t d = 0; d < D; ++d) qf[d] = f32_at(q, d, qi, h);
            h_in = fnv(h_in, qf.data(), (size_t) D * 4);
            if (vdt == GGML_TYPE_F32 || !cpu_vdt->from_float) {
                qr = qf;
            } else {
                cpu_vdt->from_float(qf.data(), qbuf.data(), D);
                to_f32(vdt, qbuf.data(), qr.data(), D);
            }
            for (int64_t d = 0; d < D; ++d) {
                qd[d] = qf[d];
                qhd[d] = qr[d];
            }
            const float * kx_h = kx.data() + (size_t) kvh * n_kv * D;
            const float * vx_h = vx.data() + (size_t) kvh * n_kv * Dv;
            const float * kh_h = kh.data() + (size_t) kvh * n_kv * D;
            const float * vh_h = vh.data() + (size_t) kvh * n_kv * Dv;
            logits_of(qd, kx_h, n_kv, D, s, mask[qi], lg);
            logits_of(qhd, kh_h, n_kv, D, s, mask[qi], lgh);
            if (!fattn::softmax(lg, p) || !fattn::softmax(lgh, ph)) {
                tap->fail("layer " + std::to_string(il) + ": a query row with every cell masked");
                return;
            }
            fattn::attend(p, vx_h, Dv, o);
            fattn::attend(ph, vh_h, Dv, oh);
            // the kernel's rounding around o^ (fattn_bound.hpp)
            qk_abs.assign((size_t) n_kv, 0.0);
            qk_sq.assign((size_t) n_kv, 0.0);
            std::vector<uint8_t> row_live((size_t) n_kv);
            for (int64_t c = 0; c < n_kv; ++c) {
                row_live[c] = lgh[c] != -INFINITY;
                if (!row_live[c]) continue;
                for (int64_t d = 0; d < D; ++d) {
                    const double x = qhd[d] * kh_h[c * D + d];
                    qk_abs[c] += std::fabs(x);
                    qk_sq[c] += x * x;
                }
            }
            fattn::output_bound(ph, row_live, qk_abs, qk_sq, s, vh_h, Dv, oh, false, bound);
            // kvq rows are read in their rotated basis (ggml-cpu's kvq path, patch 0002): the query
            // is rotated in f32 and dotted with rotated rows, V rows are summed rotated and the sum is
            // un-rotated once. An orthonormal fast Hadamard transform of n values in f32 rounds each
            // value once per butterfly stage, so it errs by at most about (log2 n) u32 |x|_2 in every
            // element, spread over all elements (unlike the per-element f16 rounding above); counted
            // twice (rotate and un-rotate) plus 4 for the dot and the dequantization.
            if (kvq_k || kvq_v) {
                const double c_rot = 2.0 * (std::ceil(std::log2((double) std::max(D, Dv))) + 4.0);
                double qn = 0;
                for (int64_t d = 0; d < D; ++d) qn += qhd[d] * qhd[d];
                qn = std::sqrt(qn);
                double vsum = 0;
                std::vector<double> kn((size_t) n_kv, 0.0);
                for (int64_t c = 0; c < n_kv; ++c) {
                    if (!row_live[c]) continue;
                    double k2 = 0, v2 = 0;
                    for (int64_t d = 0; d < D; ++d) k2 += (double) kh_h[c * D + d] * kh_h[c * D + d];
                    for (int64_t d = 0; d < Dv; ++d) v2 += (double) vh_h[c * Dv + d] * vh_h[c * Dv + d];
                    kn[c] = std::sqrt(k2);
                    vsum += ph[c] * std::sqrt(v2);
                }
                for (int64_t d = 0; d < Dv; ++d) {
                    double extra = kvq_v ? c_rot * fattn::kU32 * vsum : 0.0;
                    if (kvq_k)
                        for (int64_t c = 0; c < n_kv; ++c)
                            if (row_live[c])
                                extra += ph[c] * std::fabs(s) * c_rot * fattn::kU32 * qn * kn[c] * std::fabs(vh_h[c * Dv + d] - oh[d]);
                    bound[d] += extra;
                }
            }
            for (int64_t d = 0; d < Dv; ++d) node[d] = f32_at(t, d, h, qi);
            // the kernel against exact attention on the rows it holds: rounding alone
            {
                const double ke = fattn::excess(oh, node, bound);
                L.kernel_excess = std::isfinite(ke) ? std::max(L.kernel_excess, ke) : INFINITY;
            }
            for (int64_t d = 0; d < Dv; ++d) {
                double pv = 0, pk = 0, mag = 0;
                for (int64_t c = 0; c < n_kv; ++c) {
                    if (!row_live[c]) continue;
                    pv += ph[c] * ((double) vh_h[c * Dv + d] - vx_h[c * Dv + d]);
                    pk += (ph[c] - p[c]) * ((double) vx_h[c * Dv + d] - o[d]);
                    mag += (ph[c] + p[c]) * (std::fabs(vh_h[c * Dv + d]) + std::fabs(vx_h[c * Dv + d]));
                }
                // plus the double rounding of these sums and of o and o^ themselves (2^-52 per
                // operation on magnitudes up to `mag`), which matters only where the bound is exact
                // (a V column the type rounds to zero: o^ = node = 0 and |o| = |pv| + |pk|)
                bound[d] += std::fabs(pv) + std::fabs(pk) + 4.0 * (double) (n_kv + D) * std::ldexp(1.0, -52) * mag;
                L.part_v2 += pv * pv;
                L.part_k2 += pk * pk;
                const double e = node[d] - o[d];
                L.out_err2 += e * e;
                L.out_ref2 += o[d] * o[d];
                const size_t at = ((size_t) qi * n_head + h) * Dv + d;
                rec.node[at] = (float) node[d];
                rec.bound[at] = bound[d];
                rec.exact[at] = o[d];
            }
            L.excess = std::max(L.excess, fattn::excess(o, node, bound));
            if (!std::isfinite(fattn::excess(o, node, bound))) L.excess = INFINITY;
            // control: wrong head mapping
            if (n_kvh > 1) {
                const int64_t w = (kvh + 1) % n_kvh;
                logits_of(qd, kx.data() + (size_t) w * n_kv * D, n_kv, D, s, mask[qi], lc);
                fattn::softmax(lc, pc);
                fattn::attend(pc, vx.data() + (size_t) w * n_kv * Dv, Dv, ctrl);
            } else if (n_head > 1) {
                // one KV head: the next query head's exact output in this head's place
                const int64_t h2 = (h + 1) % n_head;
                std::vector<double> q2((size_t) D);
                for (int64_t d = 0; d < D; ++d) q2[d] = f32_at(q, d, qi, h2);
                logits_of(q2, kx_h, n_kv, D, s, mask[qi], lc);
                fattn::softmax(lc, pc);
                fattn::attend(pc, vx_h, Dv, ctrl);
            }
            // (one head in all: no wrong head exists, the control does not apply)
            call_ctrl_head = n_head > 1 ? std::max(call_ctrl_head, fattn::excess(ctrl, node, bound)) : INFINITY;
            // control: wrong head size (each row cut into two heads of half the size)
            if (D % 2 == 0 && Dv % 2 == 0) {
                ctrl.assign((size_t) Dv, 0.0);
                const int64_t hD = D / 2, hV = Dv / 2;
                for (int half = 0; half < 2; ++half) {
                    std::vector<double> lh((size_t) n_kv, -INFINITY), ph2;
                    for (int64_t c = 0; c < n_kv; ++c) {
                        if (mask[qi][c] == -INFINITY) continue;
                        double dot = 0;
                        for (int64_t d = 0; d < hD; ++d) dot += qd[half * hD + d] * kx_h[c * D + half * hD + d];
                        lh[c] = s * dot + mask[qi][c];
                    }
                    fattn::softmax(lh, ph2);
                    for (int64_t c = 0; c < n_kv; ++c)
                        for (int64_t d = 0; d < hV; ++d) ctrl[half * hV + d] += ph2[c] * vx_h[c * Dv + half * hV + d];
                }
                call_ctrl_size = std::max(call_ctrl_size, fattn::excess(ctrl, node, bound));
            } else {
                call_ctrl_size = INFINITY;  // an odd head size cannot be halved: the control does not apply
            }
        }
    }
    L.ctrl_head_min = std::min(L.ctrl_head_min, call_ctrl_head);
    L.ctrl_size_min = std::min(L.ctrl_size_min, call_ctrl_size);
    rec.input_hash = h_in;
    const int64_t ci = tap->call_index[il]++;
    ++L.calls;
    // the f16 run's node for the same call: with bit-identical inputs both nodes are within
    // their own bounds of the same o, so within the sum of the two bounds of each other
    if (tap->ref_layers != nullptr) {
        const auto & rl = (*tap->ref_layers)[il];
        if (ci < (int64_t) rl.records.size() && rl.records[ci].node.size() == n_out) {
            const CallRecord & fr = rl.records[ci];
            // (llama.cpp's own Hadamard rotation of q8_0 / q4_0 caches changes Q, K and V, so
            // for those types no call's inputs are identical and nothing is compared here)
            if (fr.input_hash == rec.input_hash) {
                ++tap->cross_calls;
                ++tap->vs_f16_calls[il];
                for (size_t i = 0; i < n_out; ++i) {
                    const double d = (double) rec.node[i] - fr.node[i];
                    tap->vs_f16_err2[il] += d * d;
                    tap->vs_f16_ref2[il] += (double) fr.node[i] * fr.node[i];
                    const double e = std::fabs((double) rec.node[i] - fr.node[i]);
                    const double b = rec.bound[i] + fr.bound[i];
                    tap->cross_excess = std::max(tap->cross_excess, b > 0 ? e / b : (e > 0 ? INFINITY : 0.0));
                }
            }
        }
    }
    if (tap->keep_records) L.records.push_back(std::move(rec));
}

// the live cells' packed K and V rows of one flash-attention call, in cell order
void on_flash_attn_snapshot(ggml_tensor * t, Tap * tap) {
    const ggml_tensor * k = t->src[1];
    const ggml_tensor * v = t->src[2];
    const ggml_tensor * m = t->src[3];
    const int il = layer_of(ggml_get_name(view_root(k)), "cache_k_l");
    if (il < 0 || il >= (int) tap->snapshot->size() || !m) return;
    const int64_t n_kv = k->ne[1], n_kvh = k->ne[2], last = t->src[0]->ne[1] - 1;
    auto & out = (*tap->snapshot)[il];
    out.clear();
    for (int64_t c = 0; c < n_kv; ++c) {
        if (f16_at(m, c, last) == -INFINITY) continue;
        std::string row;
        for (int64_t h = 0; h < n_kvh; ++h) {
            row.append((const char *) k->data + c * k->nb[1] + h * k->nb[2], ggml_row_size(k->type, k->ne[0]));
            row.append((const char *) v->data + c * v->nb[1] + h * v->nb[2], ggml_row_size(v->type, v->ne[0]));
        }
        out.push_back(std::move(row));
    }
}

bool eval_cb(ggml_tensor * t, bool ask, void * ud) {
    auto * tap = (Tap *) ud;
    if (ask && t->op == GGML_OP_FLASH_ATTN_EXT) {
        ++tap->fa_ops;
        tap->fa_grouped += ggml_kvc_fattn_grouped(t) ? 1 : 0;
    }
    if (tap->snapshot) {
        if (ask) return t->op == GGML_OP_FLASH_ATTN_EXT;
        if (t->op == GGML_OP_FLASH_ATTN_EXT) on_flash_attn_snapshot(t, tap);
        return true;
    }
    if (!tap->active) return ask ? false : true;
    const bool want = t->op == GGML_OP_FLASH_ATTN_EXT || t->op == GGML_OP_SET_ROWS;
    if (ask) return want;
    if (t->op == GGML_OP_SET_ROWS) on_set_rows(t, tap);
    if (t->op == GGML_OP_FLASH_ATTN_EXT) on_flash_attn(t, tap);
    return true;
}

// ---- runs ---------------------------------------------------------------------------------

struct RunResult {
    std::vector<std::vector<float>> logits;  // after the prefill and each decode step
    std::vector<LayerRecord> layers;
    Tap tap;
    bool bytes_api = false;
    size_t api_k = 0, api_v = 0, api_buf = 0;
    size_t state_bytes = 0;
    std::string state;  // "identical", or what differed
    // the logits differ, but every layer's live cells hold the same packed rows (the new token's
    // own row aside above the first layer, which it gets from the layers below) in other cells
    bool state_moved_only = false;
    std::string corrupt_state;  // the flipped-bit control: "refused", "<n> logits differ" or "NOT DETECTED"
};

using CtxPtr = std::unique_ptr<llama_context, void (*)(llama_context *)>;

llama_context_params ctx_params(const Options & o, ggml_type tk, ggml_type tv, Tap * tap) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) (o.prefill + o.decode + 2);
    cp.n_batch = (uint32_t) o.prefill;
    cp.n_ubatch = (uint32_t) o.prefill;
    cp.n_seq_max = 1;
    cp.n_threads = o.threads;
    cp.n_threads_batch = o.threads;
    cp.type_k = tk;
    cp.type_v = tv;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    // plain kvq unless a run asks for the protections (llama.cpp's default gives kvq by bits them)
    cp.kvc_sink = 0;
    cp.kvc_window = 0;
    cp.kvc_window_bits = 0;
    cp.kvc_k_center = 0;
    cp.cb_eval = eval_cb;
    cp.cb_eval_user_data = tap;
    cp.no_perf = true;
    // sliding-window layers in their own small cache (window + ubatch cells, llama.cpp's iSWA),
    // as it saves memory, rather than a full-size one (llama.cpp's default): long runs then
    // reuse that cache's cells
    cp.swa_full = false;
    return cp;
}

CtxPtr make_ctx(llama_model * model, const llama_context_params & cp) {
    g_last_llama_error.clear();
    llama_context * c = llama_init_from_model(model, cp);
    if (!c) {
        std::string why = g_last_llama_error;
        while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
        for (auto & ch : why)
            if (ch == '\n') ch = ';';
        throw UsageError(std::string("llama.cpp refused a context with K ") + ggml_type_name(cp.type_k) + ", V " +
                         ggml_type_name(cp.type_v) + (why.empty() ? "" : ": " + why));
    }
    return CtxPtr(c, llama_free);
}

// llama_decode's status for `toks` at positions pos0.. of sequence 0, logits for the last one
int decode_status(llama_context * ctx, const std::vector<llama_token> & toks, int pos0) {
    llama_batch b = llama_batch_init((int32_t) toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); ++i) {
        b.token[i] = toks[i];
        b.pos[i] = pos0 + (int) i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = i + 1 == toks.size();
    }
    b.n_tokens = (int32_t) toks.size();
    const int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    return rc;
}

std::vector<float> decode_tokens(llama_context * ctx, const std::vector<llama_token> & toks, int pos0, int n_vocab) {
    const int rc = decode_status(ctx, toks, pos0);
    if (rc != 0) throw std::runtime_error("llama_decode failed (status " + std::to_string(rc) + ")");
    const float * lg = llama_get_logits_ith(ctx, -1);
    if (!lg) throw std::runtime_error("no logits after llama_decode");
    return std::vector<float>(lg, lg + n_vocab);
}

RunResult run_once(llama_model * model, const ModelFacts & mf, const Options & o, ggml_type tk, ggml_type tv,
                   const std::vector<llama_token> & toks, const RunResult * ref, bool keep) {
    RunResult r;
    r.tap.mf = &mf;
    r.tap.keep_records = keep;
    r.tap.ref_layers = ref ? &ref->tap.layers : nullptr;
    r.tap.layers.assign((size_t) mf.n_layer, LayerRecord());
    r.tap.rows_k.assign((size_t) mf.n_layer, {});
    r.tap.rows_v.assign((size_t) mf.n_layer, {});
    r.tap.call_index.assign((size_t) mf.n_layer, 0);
    r.tap.vs_f16_err2.assign((size_t) mf.n_layer, 0.0);
    r.tap.vs_f16_ref2.assign((size_t) mf.n_layer, 0.0);
    r.tap.vs_f16_calls.assign((size_t) mf.n_layer, 0);
    const llama_context_params cp = ctx_params(o, tk, tv, &r.tap);
    CtxPtr ctx = make_ctx(model, cp);
    r.bytes_api = llama_kvc_cache_bytes(ctx.get(), &r.api_k, &r.api_v, &r.api_buf);
    const std::vector<llama_token> pre(toks.begin(), toks.begin() + o.prefill);
    r.logits.push_back(decode_tokens(ctx.get(), pre, 0, mf.n_vocab));
    for (int j = 0; j < o.decode; ++j)
        r.logits.push_back(decode_tokens(ctx.get(), {toks[(size_t) o.prefill + j]}, o.prefill + j, mf.n_vocab));
    // check 4: the sequence state into a fresh context, then the next token in both
    r.tap.active = false;
    const size_t n = llama_state_seq_get_size(ctx.get(), 0);
    std::vector<uint8_t> st(n);
    const size_t got = llama_state_seq_get_data(ctx.get(), st.data(), n, 0);
    r.state_bytes = got;
    Tap idle;
    idle.active = false;
    std::vector<std::vector<std::string>> snap_a((size_t) mf.n_layer), snap_b((size_t) mf.n_layer);
    r.tap.snapshot = &snap_a;
    idle.snapshot = &snap_b;
    CtxPtr ctx2 = make_ctx(model, ctx_params(o, tk, tv, &idle));
    const int pos = o.prefill + o.decode;
    const llama_token next = toks[(size_t) pos];
    if (got != n || n == 0) {
        r.state = "llama_state_seq_get_data wrote " + std::to_string(got) + " of " + std::to_string(n) + " bytes";
    } else if (llama_state_seq_set_data(ctx2.get(), st.data(), n, 0) != n) {
        r.state = "llama_state_seq_set_data refused the state";
    } else {
        const auto a = decode_tokens(ctx.get(), {next}, pos, mf.n_vocab);
        const auto b = decode_tokens(ctx2.get(), {next}, pos, mf.n_vocab);
        // the check must be able to fail: the same state with one bit of its last byte flipped
        // (the last layer's V row of the newest cell, which every query attends to) restored into
        // a third context must be refused or give other logits than the clean restore
        {
            std::vector<uint8_t> bad = st;
            bad.back() ^= 1;
            Tap idle3;
            idle3.active = false;
            CtxPtr ctx3 = make_ctx(model, ctx_params(o, tk, tv, &idle3));
            if (llama_state_seq_set_data(ctx3.get(), bad.data(), bad.size(), 0) != bad.size()) {
                r.corrupt_state = "refused";
            } else {
                const auto c = decode_tokens(ctx3.get(), {next}, pos, mf.n_vocab);
                size_t d3 = 0;
                for (size_t i = 0; i < b.size(); ++i) d3 += std::memcmp(&b[i], &c[i], 4) != 0;
                r.corrupt_state = d3 > 0 ? std::to_string(d3) + " logits differ" : "NOT DETECTED";
            }
        }
        size_t diff = 0;
        double max_diff = 0, max_abs = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            diff += std::memcmp(&a[i], &b[i], 4) != 0;
            max_diff = std::max(max_diff, std::fabs((double) a[i] - b[i]));
            max_abs = std::max(max_abs, std::fabs((double) a[i]));
        }
        r.state = diff == 0 ? "identical"
                            : std::to_string(diff) + " of " + std::to_string(a.size()) + " logits differ, by up to " +
                                  json_num(max_diff) + " (largest logit " + json_num(max_abs) + ")";
        if (diff != 0) {
            // what the two contexts' attention saw for that token, per layer: the same packed rows
            // in the same cells ("same"), the same rows in other cells ("moved": flash attention
            // then sums in another order), those with the new token's own row different ("moved,
            // new row differs": it comes from the layers below), or other rows
            std::string why = "; live cells per layer:";
            bool moved_only = true, below_same = true;
            for (int il = 0; il < mf.n_layer; ++il) {
                auto x = snap_a[il], y = snap_b[il];
                std::string what;
                if (x == y) {
                    what = "same";
                } else {
                    std::sort(x.begin(), x.end());
                    std::sort(y.begin(), y.end());
                    std::vector<std::string> common;
                    std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(common));
                    what = x == y ? "moved"
                           : (x.size() == y.size() && common.size() + 1 == x.size()) ? "moved, new row differs"
                                                                                   : std::to_string(x.size() - common.size()) + " of " +
                                                                                         std::to_string(x.size()) + " rows differ";
                }
                why += " " + std::to_string(il) + " " + what + (il + 1 < mf.n_layer ? "," : "");
                // the lowest layer that is not "same" has identical inputs: only "moved" is allowed there
                if (what != "same" && what != "moved" && (what != "moved, new row differs" || below_same)) moved_only = false;
                if (what != "same") below_same = false;
            }
            r.state += why;
            r.state_moved_only = moved_only;
        }
    }
    r.layers = r.tap.layers;
    return r;
}

double rel(double e2, double r2) { return r2 > 0 ? std::sqrt(e2 / r2) : (e2 > 0 ? INFINITY : 0.0); }

// --protect: three runs of the same tokens without the tap (kvc's kvq cells keep rows of three
// formats, which checks 1 and 2 do not model): f16, the asked kvq types, and the same types with
// the protections (kvc_sink/kvc_window/kvc_window_bits/kvc_k_center), every cache of the model
// (both of a sliding-window model's) through the cells. Each run: a prefill, decode steps, the
// sequence state into a fresh context (the next logits bit-identical), then a context shift
// (positions [sink, sink + prefill/4) removed, the later ones moved down with seq_add: K-shifted
// through the cells) and decode steps after it. Checks: the protected run's KL against the f16
// run below the plain kvq run's before and after the shift (the cells hold 8-bit and f16 rows
// where plain kvq holds its bits), its state round trip identical, and kvc reporting bytes beside
// the tensors.
struct ProtectedRun {
    std::vector<std::vector<float>> before, after;  // logits: prefill + decode steps; steps after the shift
    std::string state;
    size_t api_bytes = 0;  // llama_kvc_cache_bytes' K + V: the tensors and what kvc holds beside them
    size_t stated_bytes = 0;  // llama_kvc_cache_get_info's tensors + kvq cells at capacity, as made
};

static ProtectedRun protected_once(llama_model * model, const ModelFacts & mf, const Options & o, ggml_type tk,
                                   ggml_type tv, bool prot, const std::vector<llama_token> & toks) {
    llama_context_params cp = ctx_params(o, tk, tv, nullptr);
    cp.cb_eval = nullptr;
    cp.cb_eval_user_data = nullptr;
    if (prot) {
        cp.kvc_sink = o.sink;
        cp.kvc_window = o.window;
        cp.kvc_window_bits = o.window_bits;
        cp.kvc_k_center = o.center;
    }
    ProtectedRun r;
    CtxPtr ctx = make_ctx(model, cp);
    {
        // what the size line states when the context is made, before any sequence exists
        llama_kvc_cache_info ki;
        if (!llama_kvc_cache_get_info(ctx.get(), &ki)) throw std::runtime_error("llama_kvc_cache_get_info failed");
        r.stated_bytes = ki.tensor_bytes + ki.cells_bytes;
    }
    const std::vector<llama_token> pre(toks.begin(), toks.begin() + o.prefill);
    r.before.push_back(decode_tokens(ctx.get(), pre, 0, mf.n_vocab));
    int pos = o.prefill;
    for (int j = 0; j < o.decode; ++j, ++pos) r.before.push_back(decode_tokens(ctx.get(), {toks[(size_t) pos]}, pos, mf.n_vocab));
    size_t k = 0, v = 0, buf = 0;
    if (!llama_kvc_cache_bytes(ctx.get(), &k, &v, &buf)) throw std::runtime_error("llama_kvc_cache_bytes failed");
    r.api_bytes = k + v;
    // the state round trip
    const size_t n = llama_state_seq_get_size(ctx.get(), 0);
    std::vector<uint8_t> st(n);
    CtxPtr ctx2 = make_ctx(model, cp);
    if (n == 0 || llama_state_seq_get_data(ctx.get(), st.data(), n, 0) != n) {
        r.state = "llama_state_seq_get_data failed";
    } else if (llama_state_seq_set_data(ctx2.get(), st.data(), n, 0) != n) {
        r.state = "llama_state_seq_set_data refused the state";
    } else {
        // a sliding-window cache past its size restores into other cells: flash attention then
        // sums in another order, so the logits may differ by rounding (reported, not failed)
        const auto a = decode_tokens(ctx.get(), {toks[(size_t) pos]}, pos, mf.n_vocab);
        const auto b = decode_tokens(ctx2.get(), {toks[(size_t) pos]}, pos, mf.n_vocab);
        double d = 0;
        for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (double) std::fabs(a[i] - b[i]));
        r.state = d == 0 ? "identical" : "logits differ by up to " + json_num(d);
        ++pos;
    }
    // a context shift: positions [s0, s1) out, the later ones down by s1 - s0
    llama_memory_t mem = llama_get_memory(ctx.get());
    const llama_pos s0 = (llama_pos) std::max<uint32_t>(o.sink, 1), s1 = s0 + o.prefill / 4;
    if (!llama_memory_seq_rm(mem, 0, s0, s1)) throw std::runtime_error("llama_memory_seq_rm refused the shift's range");
    llama_memory_seq_add(mem, 0, s1, -1, -(s1 - s0));
    pos -= s1 - s0;
    for (int j = 0; j < 4; ++j, ++pos) r.after.push_back(decode_tokens(ctx.get(), {toks[(size_t) (j % o.prefill)]}, pos, mf.n_vocab));
    return r;
}

// An abort callback that stops the graph at its `at`-th call (ggml's CPU backend asks it before
// each node), counting calls; `at` 0: never.
struct AbortAt {
    long calls = 0;
    long at = 0;
};

static bool abort_at_cb(void * data) {
    auto * a = (AbortAt *) data;
    return ++a->calls == a->at;
}

#ifdef KVC_ARCH_FAULTS
// kvc calls that fail on purpose: kvc_arch_test is linked with --wrap for kvc_kvq_cells_write
// and kvc_kvq_cells_scores (CMakeLists.txt, GNU ld), so ggml's calls to them pass through here.
// Call number `at` (counted over the process, from any thread) returns KVC_INVALID_STATE
// instead of running; every other call is kvc's own.
struct KvcFault {
    std::atomic<long> calls{0};
    std::atomic<long> at{0};
    bool hit() { return ++calls == at.load(); }
};
static KvcFault g_write_fault, g_scores_fault;

extern "C" {
enum kvc_status __real_kvc_kvq_cells_write(struct kvc_kvq_cells * cells, uint32_t tensor, const float * rows,
                                           size_t n_values, const int64_t * cell_idx, size_t n_rows, uint8_t * main,
                                           size_t main_len);
enum kvc_status __real_kvc_kvq_cells_scores(const struct kvc_kvq_cells * cells, uint32_t tensor, const uint8_t * main,
                                            size_t main_len, uint32_t kv_head, uint32_t cell0, size_t n, uint32_t token,
                                            const float * q_rot, size_t n_queries, float * scores, size_t scores_len);
enum kvc_status __wrap_kvc_kvq_cells_write(struct kvc_kvq_cells * cells, uint32_t tensor, const float * rows,
                                           size_t n_values, const int64_t * cell_idx, size_t n_rows, uint8_t * main,
                                           size_t main_len) {
    if (g_write_fault.hit()) return KVC_INVALID_STATE;
    return __real_kvc_kvq_cells_write(cells, tensor, rows, n_values, cell_idx, n_rows, main, main_len);
}
enum kvc_status __wrap_kvc_kvq_cells_scores(const struct kvc_kvq_cells * cells, uint32_t tensor, const uint8_t * main,
                                            size_t main_len, uint32_t kv_head, uint32_t cell0, size_t n, uint32_t token,
                                            const float * q_rot, size_t n_queries, float * scores, size_t scores_len) {
    if (g_scores_fault.hit()) return KVC_INVALID_STATE;
    return __real_kvc_kvq_cells_scores(cells, tensor, main, main_len, kv_head, cell0, n, token, q_rot, n_queries, scores,
                                       scores_len);
}
// a prefill's blocks of query positions read through this one (ABI 0.19): the same fault count
enum kvc_status __real_kvc_kvq_cells_scores_tokens(const struct kvc_kvq_cells * cells, uint32_t tensor, const uint8_t * main,
                                                   size_t main_len, uint32_t kv_head, uint32_t cell0, size_t n,
                                                   const uint32_t * tokens, size_t n_tokens, const float * q_rot,
                                                   size_t n_queries, float * scores, size_t scores_len);
enum kvc_status __wrap_kvc_kvq_cells_scores_tokens(const struct kvc_kvq_cells * cells, uint32_t tensor, const uint8_t * main,
                                                   size_t main_len, uint32_t kv_head, uint32_t cell0, size_t n,
                                                   const uint32_t * tokens, size_t n_tokens, const float * q_rot,
                                                   size_t n_queries, float * scores, size_t scores_len) {
    if (g_scores_fault.hit()) return KVC_INVALID_STATE;
    return __real_kvc_kvq_cells_scores_tokens(cells, tensor, main, main_len, kv_head, cell0, n, tokens, n_tokens, q_rot,
                                              n_queries, scores, scores_len);
}
}
#endif

// How a batch is interrupted: llama.cpp's abort callback (llama_decode returns 2), or a kvc
// call that fails inside the graph, writing rows or reading scores (llama_decode returns -3:
// ggml keeps kvc's error on the cache tensor, llama.cpp takes it after the graph and fails the
// batch; nothing aborts).
enum class Interrupt { abort_callback, kvc_write, kvc_scores };

struct Interrupter {
    Interrupt kind;
    AbortAt   ab;
    long calls() const {
        switch (kind) {
#ifdef KVC_ARCH_FAULTS
            case Interrupt::kvc_write:  return g_write_fault.calls.load();
            case Interrupt::kvc_scores: return g_scores_fault.calls.load();
#else
            case Interrupt::kvc_write:
            case Interrupt::kvc_scores: return 0;
#endif
            case Interrupt::abort_callback: break;
        }
        return ab.calls;
    }
    // the `k`-th call from now fails; k = 0 disarms
    void arm(long k) {
        const long at = k > 0 ? calls() + k : 0;
        switch (kind) {
#ifdef KVC_ARCH_FAULTS
            case Interrupt::kvc_write:  g_write_fault.at = at; return;
            case Interrupt::kvc_scores: g_scores_fault.at = at; return;
#else
            case Interrupt::kvc_write:
            case Interrupt::kvc_scores: return;
#endif
            case Interrupt::abort_callback: break;
        }
        ab.at = at;
    }
    int expected_rc() const { return kind == Interrupt::abort_callback ? 2 : -3; }
};

// Interrupted batches (issue 47): with the protections, a prefill of four ubatches interrupted
// midway through its third ubatch (llama_decode keeps the ubatches before), then the rest of the
// prompt and decode steps, one of them interrupted midway and decoded again. Every logit must
// equal a fresh context's that decoded the kept tokens, the rest and the steps in the same
// batches. Returns "identical", "not built" (a fault the build cannot inject) or what differed.
static std::string interrupted_matches_fresh(llama_model * model, const ModelFacts & mf, const Options & o, ggml_type tk,
                                             ggml_type tv, const std::vector<llama_token> & toks, Interrupt kind) {
#ifndef KVC_ARCH_FAULTS
    if (kind != Interrupt::abort_callback) return "not built";
#endif
    llama_context_params cp = ctx_params(o, tk, tv, nullptr);
    cp.cb_eval = nullptr;
    cp.cb_eval_user_data = nullptr;
    cp.kvc_sink = o.sink;
    cp.kvc_window = o.window;
    cp.kvc_window_bits = o.window_bits;
    cp.kvc_k_center = o.center;
    cp.n_ubatch = (uint32_t) std::max(1, o.prefill / 4);
    Interrupter in{kind, {}};
    if (kind == Interrupt::abort_callback) {
        cp.abort_callback = abort_at_cb;
        cp.abort_callback_data = &in.ab;
    }
    const std::vector<llama_token> pre(toks.begin(), toks.begin() + o.prefill);
    // the calls one prefill and one step make (a throwaway context)
    long prefill_calls = 0, step_calls = 0;
    {
        CtxPtr c = make_ctx(model, cp);
        const long c0 = in.calls();
        if (decode_status(c.get(), pre, 0) != 0) return "the counting prefill failed";
        prefill_calls = in.calls() - c0;
        if (decode_status(c.get(), {toks[(size_t) o.prefill]}, o.prefill) != 0) return "the counting step failed";
        step_calls = in.calls() - c0 - prefill_calls;
    }
    if (prefill_calls < 4 || step_calls < 2) return "too few calls to interrupt";
    CtxPtr a = make_ctx(model, cp);
    in.arm(prefill_calls * 5 / 8);
    const int rc = decode_status(a.get(), pre, 0);
    in.arm(0);
    if (rc != in.expected_rc())
        return "the interrupted prefill returned " + std::to_string(rc) + ", not " + std::to_string(in.expected_rc());
    const int kept = (int) llama_memory_seq_pos_max(llama_get_memory(a.get()), 0) + 1;
    if (kept <= 0 || kept >= o.prefill) return "the interrupted prefill kept " + std::to_string(kept) + " tokens";
    cp.abort_callback = nullptr;
    cp.abort_callback_data = nullptr;
    CtxPtr f = make_ctx(model, cp);
    if (kept > 0 && decode_status(f.get(), std::vector<llama_token>(pre.begin(), pre.begin() + kept), 0) != 0)
        return "the fresh context's first part failed";
    const std::vector<llama_token> rest(pre.begin() + kept, pre.end());
    std::vector<std::vector<float>> got, want;
    got.push_back(decode_tokens(a.get(), rest, kept, mf.n_vocab));
    want.push_back(decode_tokens(f.get(), rest, kept, mf.n_vocab));
    int pos = o.prefill;
    for (int j = 0; j < o.decode; ++j, ++pos) {
        if (j == 1) {
            in.arm(std::max<long>(1, step_calls / 2));
            const int r = decode_status(a.get(), {toks[(size_t) pos]}, pos);
            in.arm(0);
            if (r != in.expected_rc())
                return "the interrupted step returned " + std::to_string(r) + ", not " + std::to_string(in.expected_rc());
        }
        got.push_back(decode_tokens(a.get(), {toks[(size_t) pos]}, pos, mf.n_vocab));
        want.push_back(decode_tokens(f.get(), {toks[(size_t) pos]}, pos, mf.n_vocab));
    }
    for (size_t s = 0; s < got.size(); ++s) {
        double d = 0;
        for (size_t i = 0; i < got[s].size(); ++i) d = std::max(d, (double) std::fabs(got[s][i] - want[s][i]));
        if (d != 0) return "logits of step " + std::to_string(s) + " differ by up to " + json_num(d);
    }
    return "identical";
}

// Rollbacks (issue 52): with the protections, a sequence decoded to position N (a prefill, then
// one-token steps) is taken back by r positions (llama_memory_seq_rm(mem, 0, N - r, -1), on a
// context restored from its saved state) and continues with other tokens. Every logit must equal
// those of a fresh context that decoded the kept tokens in the same batches and the same
// continuation. With window rows kept 64 positions past the window (kvc_rollback 64), seq_rm
// must succeed for r <= 65 and refuse further back with nothing removed; the sequence
// then removed whole and decoded again must read as fresh, as must one first used for other
// tokens (its K center comes from the new ones). Returns "identical" or what differed; the
// rollbacks tried are in `tried` ("r:exact" or "r:refused").
static std::string rollbacks_match_fresh(llama_model * model, const ModelFacts & mf, const Options & o, ggml_type tk,
                                         ggml_type tv, std::string & tried) {
    const int kRollback = 64;  // llama_context_params::kvc_rollback, as the rollbacks ask
    const std::vector<int> backs = {500, kRollback + 3, kRollback + 2, kRollback + 1, kRollback, kRollback - 1, 1};
    const int n_end = o.prefill + 520;
    llama_context_params cp = ctx_params(o, tk, tv, nullptr);
    cp.cb_eval = nullptr;
    cp.cb_eval_user_data = nullptr;
    cp.kvc_sink = o.sink;
    cp.kvc_window = o.window;
    cp.kvc_window_bits = o.window_bits;
    cp.kvc_k_center = o.center;
    cp.kvc_rollback = (uint32_t) kRollback;
    cp.n_ctx = (uint32_t) (n_end + 16);
    std::mt19937_64 rng(o.seed + 52);
    auto draw = [&](int n) {
        std::vector<llama_token> v((size_t) n);
        for (auto & t : v) t = (llama_token) (rng() % (uint64_t) mf.n_vocab);
        return v;
    };
    const std::vector<llama_token> x = draw(n_end), y = draw(n_end), cont = draw(8);
    // positions [from, to) of `t`: the prefill as one batch, then one token at a time
    auto decode_span = [&](llama_context * c, const std::vector<llama_token> & t, int from, int to) {
        if (from < o.prefill && to > 0) {
            decode_tokens(c, std::vector<llama_token>(t.begin() + from, t.begin() + std::min(to, o.prefill)), from, mf.n_vocab);
            from = std::min(to, o.prefill);
        }
        for (int p = from; p < to; ++p) decode_tokens(c, {t[(size_t) p]}, p, mf.n_vocab);
    };
    // the continuation at p0: five tokens in one batch, then three one at a time
    auto continue_at = [&](llama_context * c, int p0) {
        std::vector<std::vector<float>> out;
        out.push_back(decode_tokens(c, std::vector<llama_token>(cont.begin(), cont.begin() + 5), p0, mf.n_vocab));
        for (int j = 5; j < 8; ++j) out.push_back(decode_tokens(c, {cont[(size_t) j]}, p0 + j, mf.n_vocab));
        return out;
    };
    auto save = [](llama_context * c) {
        std::vector<uint8_t> st(llama_state_seq_get_size(c, 0));
        if (st.empty() || llama_state_seq_get_data(c, st.data(), st.size(), 0) != st.size())
            throw std::runtime_error("llama_state_seq_get_data failed");
        return st;
    };
    auto restore = [&](const std::vector<uint8_t> & st) {
        CtxPtr c = make_ctx(model, cp);
        if (llama_state_seq_set_data(c.get(), st.data(), st.size(), 0) != st.size())
            throw std::runtime_error("llama_state_seq_set_data refused a state");
        return c;
    };
    auto max_diff = [](const std::vector<std::vector<float>> & a, const std::vector<std::vector<float>> & b) {
        double d = 0;
        for (size_t s = 0; s < a.size(); ++s)
            for (size_t i = 0; i < a[s].size(); ++i) d = std::max(d, (double) std::fabs(a[s][i] - b[s][i]));
        return d;
    };
    // the sequence to take back, saved at N; the fresh one, saved where each rollback lands
    CtxPtr a = make_ctx(model, cp);
    decode_span(a.get(), x, 0, n_end);
    const std::vector<uint8_t> at_end = save(a.get());
    CtxPtr f = make_ctx(model, cp);
    std::vector<std::vector<uint8_t>> fresh_at;
    int done = 0;
    for (int r : backs) {
        decode_span(f.get(), x, done, n_end - r);
        done = n_end - r;
        fresh_at.push_back(save(f.get()));
    }
    tried.clear();
    for (size_t i = 0; i < backs.size(); ++i) {
        const int r = backs[i], p0 = n_end - r;
        CtxPtr b = restore(at_end);
        llama_memory_t mem = llama_get_memory(b.get());
        const bool removed = llama_memory_seq_rm(mem, 0, p0, -1);
        const bool want_removed = r <= kRollback + 1;
        tried += (tried.empty() ? "" : ",") + std::to_string(r) + (removed ? ":exact" : ":refused");
        if (removed != want_removed)
            return "taking back " + std::to_string(r) + " positions " + (removed ? "succeeded" : "was refused");
        if (!removed) {
            if (llama_memory_seq_pos_max(mem, 0) != n_end - 1) return "a refused rollback of " + std::to_string(r) + " removed positions";
            // what an engine does then: the sequence removed whole and decoded again
            if (!llama_memory_seq_rm(mem, 0, -1, -1)) return "removing the whole sequence was refused";
            decode_span(b.get(), x, 0, p0);
        }
        CtxPtr g = restore(fresh_at[i]);
        const double d = max_diff(continue_at(b.get(), p0), continue_at(g.get(), p0));
        if (d != 0) return "after taking back " + std::to_string(r) + " positions the logits differ by up to " + json_num(d);
    }
    // a sequence first used for other tokens, removed whole, then decoding the first rollback's
    // kept tokens
    {
        CtxPtr h = make_ctx(model, cp);
        decode_span(h.get(), y, 0, o.prefill + 200);
        if (!llama_memory_seq_rm(llama_get_memory(h.get()), 0, -1, -1)) return "removing a whole sequence was refused";
        decode_span(h.get(), x, 0, n_end - backs[0]);
        CtxPtr g = restore(fresh_at[0]);
        const double d = max_diff(continue_at(h.get(), n_end - backs[0]), continue_at(g.get(), n_end - backs[0]));
        if (d != 0) return "a sequence reused after other tokens differs from a fresh one by up to " + json_num(d);
    }
    return "identical";
}

static double mean_kl(const std::vector<std::vector<float>> & ref, const std::vector<std::vector<float>> & got) {
    double kl = 0;
    for (size_t s = 0; s < ref.size(); ++s) {
        const auto & a = ref[s];
        const auto & b = got[s];
        double ma = -INFINITY, mb = -INFINITY, za = 0, zb = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            ma = std::max(ma, (double) a[i]);
            mb = std::max(mb, (double) b[i]);
        }
        for (size_t i = 0; i < a.size(); ++i) {
            za += std::exp(a[i] - ma);
            zb += std::exp(b[i] - mb);
        }
        for (size_t i = 0; i < a.size(); ++i) {
            const double la = a[i] - ma - std::log(za), lb = b[i] - mb - std::log(zb);
            kl += std::exp(la) * (la - lb);
        }
    }
    return kl / (double) std::max<size_t>(1, ref.size());
}

static int run_protected(llama_model * model, const ModelFacts & mf, const Options & o, ggml_type tk, ggml_type tv,
                         const std::vector<llama_token> & toks) {
    if (o.prefill / 4 < 1 || (int) o.sink + o.prefill / 4 >= o.prefill) throw UsageError("--protect: --prefill too short for the shift");
    const ggml_type f16 = type_by_name("f16");
    const ProtectedRun ref = protected_once(model, mf, o, f16, f16, false, toks);
    const ProtectedRun plain = protected_once(model, mf, o, tk, tv, false, toks);
    const ProtectedRun prot = protected_once(model, mf, o, tk, tv, true, toks);
    const double kl_plain = mean_kl(ref.before, plain.before), kl_prot = mean_kl(ref.before, prot.before);
    const double kl_plain_s = mean_kl(ref.after, plain.after), kl_prot_s = mean_kl(ref.after, prot.after);
    const std::string aborted = interrupted_matches_fresh(model, mf, o, tk, tv, toks, Interrupt::abort_callback);
    const std::string write_fault = interrupted_matches_fresh(model, mf, o, tk, tv, toks, Interrupt::kvc_write);
    const std::string read_fault = interrupted_matches_fresh(model, mf, o, tk, tv, toks, Interrupt::kvc_scores);
    const bool swa = llama_model_n_swa(model) > 0;
    // a sliding-window cache forgets positions a rollback would need, with any cache type
    std::string rollbacks_tried;
    const std::string rollbacks = swa ? "not for a sliding-window model" : rollbacks_match_fresh(model, mf, o, tk, tv, rollbacks_tried);
    std::vector<std::string> failures;
    if (!swa && rollbacks != "identical") failures.push_back("rollbacks: " + rollbacks);
    if (aborted != "identical") failures.push_back("after an interrupted batch: " + aborted);
    if (write_fault != "identical") failures.push_back("after a failed kvc write: " + write_fault);
    if (read_fault != "identical") failures.push_back("after a failed kvc read: " + read_fault);
    if (!(kl_prot < kl_plain)) failures.push_back("protected KL " + json_num(kl_prot) + " not below plain " + json_num(kl_plain));
    if (!(kl_prot_s < kl_plain_s))
        failures.push_back("after the shift, protected KL " + json_num(kl_prot_s) + " not below plain " + json_num(kl_plain_s));
    if (prot.state != "identical" && prot.state.rfind("logits differ", 0) != 0) failures.push_back("state: " + prot.state);
    if (!swa && prot.state != "identical") failures.push_back("state: " + prot.state);
    // the stated size (made before any token) against what the full context holds: within 1 %
    for (const ProtectedRun * run : {&plain, &prot}) {
        const double rel = std::fabs((double) run->stated_bytes - (double) run->api_bytes) / (double) run->api_bytes;
        if (!(rel <= 0.01))
            failures.push_back("the stated cache size " + std::to_string(run->stated_bytes) + " is " + json_num(100*rel) +
                               " % from the bytes held when full, " + std::to_string(run->api_bytes));
    }
    if (!(prot.api_bytes > plain.api_bytes))
        failures.push_back("llama_kvc_cache_bytes reports " + std::to_string(prot.api_bytes) + " bytes with the cells, " +
                           std::to_string(plain.api_bytes) + " without");
    std::ostringstream j;
    j << "{\"model\":" << json_str(o.model.substr(o.model.find_last_of('/') == std::string::npos ? 0 : o.model.find_last_of('/') + 1))
      << ",\"arch\":" << json_str(mf.arch) << ",\"type_k\":" << json_str(o.type_k) << ",\"type_v\":" << json_str(o.type_v)
      << ",\"protect\":{\"sink\":" << o.sink << ",\"window\":" << o.window << ",\"window_bits\":" << o.window_bits
      << ",\"center\":" << (o.center ? "true" : "false") << "},\"sliding_window\":" << (swa ? "true" : "false")
      << ",\"kl_plain\":" << json_num(kl_plain) << ",\"kl_protected\":" << json_num(kl_prot)
      << ",\"kl_plain_after_shift\":" << json_num(kl_plain_s) << ",\"kl_protected_after_shift\":" << json_num(kl_prot_s)
      << ",\"state\":" << json_str(prot.state) << ",\"aborted_batches\":" << json_str(aborted) << ",\"kvc_write_fault\":" << json_str(write_fault)
      << ",\"kvc_read_fault\":" << json_str(read_fault) << ",\"rollbacks\":" << json_str(rollbacks)
      << ",\"rollbacks_tried\":" << json_str(rollbacks_tried)
      << ",\"kv_bytes_plain\":" << plain.api_bytes
      << ",\"kv_bytes_protected\":" << prot.api_bytes << ",\"kv_bytes_stated_protected\":" << prot.stated_bytes
      << ",\"pass\":" << (failures.empty() ? "true" : "false")
      << ",\"failures\":[";
    for (size_t i = 0; i < failures.size(); ++i) j << (i ? "," : "") << json_str(failures[i]);
    j << "]}";
    std::printf("%s\n", j.str().c_str());
    return failures.empty() ? 0 : 1;
}

int run(int argc, char ** argv) {
    const Options o = parse(argc, argv);
    llama_log_set(log_cb, o.verbose ? (void *) 1 : nullptr);
    {
        std::ifstream f(o.model, std::ios::binary);
        if (!f) throw UsageError("cannot read model '" + o.model + "'");
    }
    const ggml_type tk = type_by_name(o.type_k), tv = type_by_name(o.type_v);
    llama_backend_init();
    ggml_cpu_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    std::unique_ptr<llama_model, void (*)(llama_model *)> model(llama_model_load_from_file(o.model.c_str(), mp), llama_model_free);
    if (!model) throw UsageError("cannot load model '" + o.model + "' (not a GGUF llama.cpp can read?)");

    ModelFacts mf;
    {
        char arch[64] = {0};
        llama_model_meta_val_str(model.get(), "general.architecture", arch, sizeof arch);
        mf.arch = arch;
    }
    mf.n_layer = llama_model_n_layer(model.get());
    mf.n_head = llama_model_n_head(model.get());
    mf.n_head_kv = llama_model_n_head_kv(model.get());
    mf.n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model.get()));
    const int n_embd = llama_model_n_embd(model.get());
    // the head sizes as llama.cpp reads them: key_length / value_length, else n_embd / n_head
    mf.head_k = meta_int(model.get(), mf.arch + ".attention.key_length", n_embd / std::max(1, mf.n_head));
    mf.head_v = meta_int(model.get(), mf.arch + ".attention.value_length", n_embd / std::max(1, mf.n_head));
    if (mf.n_head <= 0 || mf.n_head_kv <= 0 || mf.n_head % mf.n_head_kv != 0 || mf.n_vocab <= 0)
        throw UsageError("model '" + o.model + "' is not an attention model this test knows (heads " + std::to_string(mf.n_head) +
                         "/" + std::to_string(mf.n_head_kv) + ")");

    // the same seeded random tokens for every run
    std::mt19937_64 rng(o.seed);
    std::vector<llama_token> toks((size_t) o.prefill + o.decode + 1);
    for (auto & t : toks) t = (llama_token) (rng() % (uint64_t) mf.n_vocab);

    if (o.protect) return run_protected(model.get(), mf, o, tk, tv, toks);
    const ggml_type f16 = type_by_name("f16");
    RunResult ref = run_once(model.get(), mf, o, f16, f16, toks, nullptr, true);
    RunResult run = run_once(model.get(), mf, o, tk, tv, toks, &ref, false);

    // ---- checks -----------------------------------------------------------------------------
    std::vector<std::string> failures = run.tap.failures;
    for (const auto & f : ref.tap.failures) failures.push_back("f16 run: " + f);
    bool types_ok = true, bytes_ok = true, rows_ok = true, bound_ok = true, controls_ok = true, fallback = false;
    size_t sum_k = 0, sum_v = 0;
    std::ostringstream lj;
    lj << "[";
    for (int il = 0; il < mf.n_layer; ++il) {
        const LayerRecord & L = run.layers[il];
        if (!L.seen) {
            failures.push_back("layer " + std::to_string(il) + ": no flash-attention call was seen");
            types_ok = bytes_ok = bound_ok = false;
            continue;
        }
        bool fb_k = false, fb_v = false;
        const bool tok = type_matches(tk, L.type_k, mf.head_k, &fb_k) && type_matches(tv, L.type_v, mf.head_v, &fb_v);
        if (fb_k || fb_v) fallback = true;
        if (!tok) {
            types_ok = false;
            failures.push_back("layer " + std::to_string(il) + ": cache types " + ggml_type_name(L.type_k) + "/" +
                               ggml_type_name(L.type_v) + ", asked " + o.type_k + "/" + o.type_v);
        }
        if (!L.bytes_ok) {
            bytes_ok = false;
            failures.push_back("layer " + std::to_string(il) + ": K/V bytes " + std::to_string(L.bytes_k) + "/" +
                               std::to_string(L.bytes_v) + ", the formula gives " + std::to_string(L.formula_k) + "/" +
                               std::to_string(L.formula_v));
        }
        sum_k += L.bytes_k;
        sum_v += L.bytes_v;
        if (L.rows_not_quantizer > 0 || L.rows_not_kvc > 0 || L.rows_checked == 0) {
            rows_ok = false;
            failures.push_back("layer " + std::to_string(il) + ": " + std::to_string(L.rows_not_quantizer) + " of " +
                               std::to_string(L.rows_checked) + " cached rows are not the type's quantizer's, " +
                               std::to_string(L.rows_not_kvc) + " of " + std::to_string(L.rows_kvc_checked) + " not kvc's");
        }
        if (!(L.kernel_excess <= 1.0)) {
            bound_ok = false;
            failures.push_back("layer " + std::to_string(il) + ": attention output " + json_num(L.kernel_excess) +
                               "x the kernel's rounding bound around exact attention on the cached rows");
        }
        if (!(L.excess <= 1.0)) {
            bound_ok = false;
            failures.push_back("layer " + std::to_string(il) + ": attention output " + json_num(L.excess) + "x its bound");
        }
        if (!(L.ctrl_head_min > 1.0) || !(L.ctrl_size_min > 1.0)) {
            controls_ok = false;
            failures.push_back("layer " + std::to_string(il) + ": a deliberate mistake stayed inside the bound (wrong head " +
                               json_num(L.ctrl_head_min) + "x, wrong head size " + json_num(L.ctrl_size_min) + "x)");
        }
        const LayerRecord & F = ref.layers[il];
        if (!(F.excess <= 1.0)) {
            bound_ok = false;
            failures.push_back("f16 run, layer " + std::to_string(il) + ": attention output " + json_num(F.excess) + "x its bound");
        }
        lj << (il ? "," : "") << "{\"layer\":" << il << ",\"type_k\":" << json_str(ggml_type_name(L.type_k))
           << ",\"type_v\":" << json_str(ggml_type_name(L.type_v)) << ",\"cells\":" << L.cells << ",\"bytes_k\":" << L.bytes_k
           << ",\"bytes_v\":" << L.bytes_v << ",\"row_rel_err_k\":" << json_num(rel(L.k_err2, L.k_ref2))
           << ",\"row_rel_err_v\":" << json_num(rel(L.v_err2, L.v_ref2)) << ",\"rows_checked\":" << L.rows_checked
           << ",\"rows_kvc_checked\":" << L.rows_kvc_checked << ",\"attn_rel_err\":" << json_num(rel(L.out_err2, L.out_ref2))
           << ",\"attn_rel_part_v\":" << json_num(rel(L.part_v2, L.out_ref2))
           << ",\"attn_rel_part_k\":" << json_num(rel(L.part_k2, L.out_ref2)) << ",\"bound_excess\":" << json_num(L.excess)
           << ",\"f16_run_bound_excess\":" << json_num(F.excess) << ",\"ctrl_wrong_head\":" << json_num(L.ctrl_head_min)
           << ",\"ctrl_wrong_head_size\":" << json_num(L.ctrl_size_min)
           << ",\"kernel_excess\":" << json_num(L.kernel_excess)
           << ",\"rel_err_vs_f16_run\":"
           << (run.tap.vs_f16_calls[il] > 0 ? json_num(rel(run.tap.vs_f16_err2[il], run.tap.vs_f16_ref2[il])) : "null")
           << ",\"calls\":" << L.calls << "}";
    }
    lj << "]";
    bool api_ok = true;
    if (run.bytes_api && (run.api_k != sum_k || run.api_v != sum_v)) {
        api_ok = false;
        failures.push_back("llama_kvc_cache_bytes says K " + std::to_string(run.api_k) + ", V " + std::to_string(run.api_v) +
                           "; the layers' tensors hold " + std::to_string(sum_k) + ", " + std::to_string(sum_v));
    }
    // required where llama.cpp does not rotate the cache (f16 and kvq types: the patch series
    // turns llama.cpp's rotation off for kvq, which rotates inside its kernels)
    const bool cross_required = !run.layers.empty() && run.layers[0].seen &&
                                (run.layers[0].type_k == f16 || is_kvq(run.layers[0].type_k)) &&
                                (run.layers[0].type_v == f16 || is_kvq(run.layers[0].type_v));
    const bool cross_ok = (run.tap.cross_calls > 0 || !cross_required) && run.tap.cross_excess <= 1.0;
    if (!cross_ok)
        failures.push_back(run.tap.cross_calls == 0 ? "no call had inputs bit-identical to the f16 run's (first layer)"
                                                    : "an identical-input call differs from the f16 run's by " +
                                                          json_num(run.tap.cross_excess) + "x the sum of both bounds");
    // bit-identical logits, or (a sliding-window cache past its size, restored in another cell
    // order) the same packed rows in every layer's live cells, byte for byte, in other cells:
    // then flash attention sums them in another order and the logits differ by its rounding
    const bool state_ok = (run.state == "identical" || run.state_moved_only) && (ref.state == "identical" || ref.state_moved_only) &&
                          !run.corrupt_state.empty() && run.corrupt_state != "NOT DETECTED" && !ref.corrupt_state.empty() &&
                          ref.corrupt_state != "NOT DETECTED";
    if (!state_ok)
        failures.push_back("state round trip: " + run.state + " (f16 run: " + ref.state + "); a flipped bit: " + run.corrupt_state +
                           " (f16 run: " + ref.corrupt_state + ")");
    // the end-to-end effect, reported: the next-token distributions of both runs
    const double kl = mean_kl(ref.logits, run.logits);
    const bool pass = failures.empty() && types_ok && bytes_ok && rows_ok && bound_ok && controls_ok && api_ok && cross_ok &&
                      state_ok;

    std::ostringstream j;
    j << "{\"model\":" << json_str(o.model.substr(o.model.find_last_of('/') == std::string::npos ? 0 : o.model.find_last_of('/') + 1))
      << ",\"arch\":" << json_str(mf.arch) << ",\"type_k\":" << json_str(o.type_k) << ",\"type_v\":" << json_str(o.type_v)
      << ",\"n_layer\":" << mf.n_layer << ",\"n_head\":" << mf.n_head << ",\"n_head_kv\":" << mf.n_head_kv
      << ",\"head_k\":" << mf.head_k << ",\"head_v\":" << mf.head_v << ",\"prefill\":" << o.prefill << ",\"decode\":" << o.decode
      << ",\"seed\":" << o.seed << ",\"pass\":" << (pass ? "true" : "false") << ",\"checks\":{\"types\":" << (types_ok ? "true" : "false")
      << ",\"bytes\":" << (bytes_ok ? "true" : "false") << ",\"rows\":" << (rows_ok ? "true" : "false")
      << ",\"attn_bound\":" << (bound_ok ? "true" : "false") << ",\"controls_fail_bound\":" << (controls_ok ? "true" : "false")
      << ",\"vs_f16_identical_inputs\":" << (cross_ok ? "true" : "false") << ",\"cache_bytes_api\":" << (api_ok ? "true" : "false")
      << ",\"state\":" << (state_ok ? "true" : "false") << "}"
      << ",\"cache_bytes_api\":" << (run.bytes_api ? "{\"k\":" + std::to_string(run.api_k) + ",\"v\":" + std::to_string(run.api_v) +
                                                         ",\"buffers\":" + std::to_string(run.api_buf) + "}"
                                                   : std::string("null"))
      << ",\"fattn_ops\":" << run.tap.fa_ops << ",\"fattn_grouped\":" << run.tap.fa_grouped
      << ",\"type_fallback\":" << (fallback ? "true" : "false") << ",\"layer_bytes_k\":" << sum_k << ",\"layer_bytes_v\":" << sum_v << ",\"f16_bytes_k\":" << [&] {
             size_t s = 0;
             for (const auto & L : ref.layers) s += L.bytes_k;
             return s;
         }()
      << ",\"vs_f16_identical_required\":" << (cross_required ? "true" : "false")
      << ",\"vs_f16_identical_calls\":" << run.tap.cross_calls << ",\"vs_f16_identical_excess\":" << json_num(run.tap.cross_excess)
      << ",\"kl_vs_f16_run\":" << json_num(kl) << ",\"state_bytes\":" << run.state_bytes << ",\"state\":" << json_str(run.state)
      << ",\"state_logits_bit_identical\":" << (run.state == "identical" ? "true" : "false")
      << ",\"f16_run_state\":" << json_str(ref.state) << ",\"state_flipped_bit\":" << json_str(run.corrupt_state)
      << ",\"layers\":" << lj.str() << ",\"failures\":[";
    for (size_t i = 0; i < failures.size(); ++i) j << (i ? "," : "") << json_str(failures[i]);
    j << "]}";
    std::printf("%s\n", j.str().c_str());
    return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char ** argv) {
    try {
        return run(argc, argv);
    } catch (const UsageError & e) {
        std::fprintf(stderr, "kvc_arch_test: %s\n", e.what());
        return 2;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "kvc_arch_test: error: %s\n", e.what());
        return 1;
    }
}
