// kvc_llama_eval, kvq as llama.cpp's real cache: the kvq-native modes and the decode-speed
// table (kvq_native_mode.hpp).
#include "kvq_native_mode.hpp"

#include "eviction_policy.hpp"
#include "kvc_api.hpp"
#include "kvq_hooks.hpp"

#include "ggml-kvc.h"
#include "kvc.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>

namespace kvc_llama {

namespace {

// ------------------------------------------------------------------------------------------
// kvq-native:<config> and kvq-native-plan:<file>

struct NativeKvq {
    std::string mode;
    std::string config;       // "k4v4" or the plan file
    bool from_plan = false;
    ggml_type type_k = GGML_TYPE_COUNT;  // config modes: one type per tensor
    ggml_type type_v = GGML_TYPE_COUNT;
    double cell_bytes = 0;    // kvc's packed bytes per cell, all layers
    double k_bits = 0, v_bits = 0;
    kvc_kvq_protections prot = {};  // a version-3 plan's sink, window and K center
    bool protected_cells = false;   // any of them: llama.cpp holds them through kvc's kvq cells
};

}  // namespace

bool is_native_mode(const std::string & m) {
    return m.rfind("kvq-native:", 0) == 0 || m.rfind("kvq-native-plan:", 0) == 0;
}

namespace {

// Resolves a kvq-native mode with kvc: the config or plan must be a block format
// (kvc_kvq_block_bits), and a head_dim without kvq types is refused. Both are UsageErrors.
NativeKvq resolve_native(const std::string & m, const ModelInfo & mi) {
    NativeKvq n;
    n.mode = m;
    n.from_plan = m.rfind("kvq-native-plan:", 0) == 0;
    n.config = m.substr(n.from_plan ? 16 : 11);
    kvc_kvq * raw = nullptr;
    if (n.from_plan) {
        // Only read here: whether the plan fits the model is llama.cpp's check at context
        // creation (patch 0003), which this mode exercises rather than pre-empts.
        const std::string json = read_file(n.config);
        if (kvc_kvq_new_from_plan(json.data(), json.size(), &raw) != KVC_OK) {
            throw UsageError(m + ": " + kvc_message());
        }
    } else if (kvc_kvq_new(n.config.c_str(), (uint32_t) mi.head_dim, (uint32_t) mi.n_layer, (uint32_t) mi.n_head_kv,
                           &raw) != KVC_OK) {
        throw UsageError(m + ": " + kvc_message());
    }
    std::unique_ptr<kvc_kvq, void (*)(kvc_kvq *)> kvq(raw, kvc_kvq_free);
    uint32_t pl = 0, ph = 0, pd = 0;
    kvc_ok(kvc_kvq_shape(kvq.get(), &pl, &ph, &pd), "kvc_kvq_shape");
    if ((int) pl == mi.n_layer && (int) ph == mi.n_head_kv && (int) pd == mi.head_dim) {
        n.cell_bytes = kvq_cell_bytes(kvq.get(), mi, &n.k_bits, &n.v_bits);
    }
    uint32_t kb = 0, vb = 0;
    if (kvc_kvq_block_bits(kvq.get(), 0, KVC_TENSOR_K, &kb) != KVC_OK ||
        kvc_kvq_block_bits(kvq.get(), 0, KVC_TENSOR_V, &vb) != KVC_OK) {
        throw UsageError(m + ": " + kvc_message());
    }
    n.type_k = ggml_kvc_type((int) kb, mi.head_dim);
    n.type_v = ggml_kvc_type((int) vb, mi.head_dim);
    kvc_ok(kvc_kvq_get_protections(kvq.get(), &n.prot), "kvc_kvq_get_protections");
    n.protected_cells = n.prot.sink > 0 || n.prot.window > 0 || n.prot.k_center != 0;
    if (!n.from_plan && (n.type_k == GGML_TYPE_COUNT || n.type_v == GGML_TYPE_COUNT)) {
        throw UsageError(m + ": head_dim " + std::to_string(mi.head_dim) + " has no kvq cache type (64 and 128 have)");
    }
    return n;
}

CtxConfig native_ctx_config(const NativeKvq & n, int n_ctx, bool flash_attn = true) {
    CtxConfig c;
    c.n_ctx = n_ctx;
    c.flash_attn = flash_attn;
    if (n.from_plan) {
        c.kvc_plan = n.config;
    } else {
        c.type_k = n.type_k;
        c.type_v = n.type_v;
    }
    return c;
}

}  // namespace

RunResult run_kvq_native(llama_model * model, const ModelInfo & mi, const Options & o,
                         const std::vector<llama_token> & toks, RefStore & ref, const std::string & m) {
    const NativeKvq n = resolve_native(m, mi);
    DecodeSpec s;
    s.mode = m;
    s.cfg = native_ctx_config(n, o.n_tokens, o.kvq_native_fa);
    s.cell_bytes = n.cell_bytes;          // kvc's row sizes ...
    s.cell_bytes_from_alloc = !n.protected_cells;  // ... must be what llama.cpp allocated
    s.side_bytes_from_alloc = n.protected_cells;   // and kvc's kvq cells hold more beside them
    RunResult r = run_decode(model, mi, o, toks, ref, s);
    r.extra.push_back({"kvq_config", "\"" + json_escape(n.config) + "\""});
    r.extra.push_back({"kvq_sink", std::to_string(n.prot.sink)});
    r.extra.push_back({"kvq_recent", std::to_string(n.prot.window)});
    r.extra.push_back({"kvq_recent_bits", std::to_string(n.prot.window_bits)});
    r.extra.push_back({"kvq_center", n.prot.k_center ? "true" : "false"});
    r.extra.push_back({"kvq_cell_bytes", json_num(n.cell_bytes)});
    r.extra.push_back({"kvq_k_bits_per_value", json_num(n.k_bits)});
    r.extra.push_back({"kvq_v_bits_per_value", json_num(n.v_bits)});
    r.extra.push_back({"kv_accounting", "\"llama.cpp's own allocation (llama_kvc_cache_bytes): kvq cache types, packed rows\""});
    char buf[240];
    std::snprintf(buf, sizeof buf,
                  "llama.cpp cache in kvq types (%s), %.3g+%.3g bits/value K+V, sink %u f16, window %u at %u bits, K center %s, "
                  "flash attention on",
                  n.from_plan ? ("plan " + base_name(n.config)).c_str() : n.config.c_str(), n.k_bits, n.v_bits, n.prot.sink,
                  n.prot.window, n.prot.window_bits, n.prot.k_center ? "on" : "off");
    r.detail = buf;
    return r;
}

bool is_streaming_native_mode(const std::string & m) {
    return m.rfind("streaming+", 0) == 0 && is_native_mode(m.substr(10));
}

RunResult run_streaming_native(llama_model * model, const ModelInfo & mi, const Options & o,
                               const std::vector<llama_token> & toks, RefStore & ref, const std::string & m) {
    const NativeKvq n = resolve_native(m.substr(10), mi);
    SinkWindowPolicy pol(o.sink, o.recent, o.ratio, o.trigger, o.interval, o.budget == "adaptive", o.n_tokens);
    DecodeSpec s;
    s.mode = m;
    s.cfg = native_ctx_config(n, std::max(pol.max_cells() + 1, o.prompt + 1), o.kvq_native_fa);
    s.policy = &pol;
    s.shift_positions = o.positions == "shift";
    s.cell_bytes = n.cell_bytes;
    s.cell_bytes_from_alloc = !n.protected_cells;
    s.side_bytes_from_alloc = n.protected_cells;
    RunResult r = run_decode(model, mi, o, toks, ref, s);
    r.detail = "sink " + std::to_string(o.sink) + " + window, " + o.budget + " 1/" + json_num(o.ratio) + ", positions " +
               o.positions + ", on llama.cpp's kvq cache" + (n.protected_cells ? " with kvc's kvq cells" : "");
    return r;
}

namespace {

CtxConfig speed_ctx_config(const std::string & m, const ModelInfo & mi, int n_ctx) {
    CtxConfig c;
    c.n_ctx = n_ctx;
    c.flash_attn = true;
    if (m == "f16") return c;
    if (m == "q8_0" || m == "q4_0" || m == "q8_0-q4_0") {
        c.type_k = m == "q4_0" ? GGML_TYPE_Q4_0 : GGML_TYPE_Q8_0;
        c.type_v = m == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_Q4_0;
        return c;
    }
    if (is_native_mode(m)) return native_ctx_config(resolve_native(m, mi), n_ctx);
    throw UsageError("--speed-modes: unknown mode '" + m + "' (f16, q8_0, q4_0, q8_0-q4_0, kvq-native:...)");
}

}  // namespace

std::vector<SpeedRow> run_speed(llama_model * model, const ModelInfo & mi, const Options & o,
                                const std::vector<llama_token> & text_toks) {
    std::vector<SpeedRow> rows;
    if (text_toks.empty()) fail("speed: the text has no tokens");
    const int n_decode = o.speed_decode;
    const int repeats = o.speed_repeats;
    std::vector<int> thread_counts = {1};
    if (o.threads > 1) thread_counts.push_back(o.threads);
    // cells beyond the fill: every timed round of every thread count appends its tokens
    const int extra = n_decode * (int) thread_counts.size() * repeats;
    for (int n_ctx : o.speed_ctx) {
        // the text repeated until it fills the cache, then the decoded tokens
        std::vector<llama_token> toks;
        while ((int) toks.size() < n_ctx + extra) {
            toks.insert(toks.end(), text_toks.begin(), text_toks.end());
        }
        // every mode's cache filled by batched prefill (512 per batch, --threads), held at once,
        // so that the repeats interleave the modes (machine noise spreads over all of them)
        struct Held {
            std::string mode;
            CtxPtr ctx;
            double alloc = 0;
            int pos = 0;
            std::vector<std::vector<double>> tok_s;  // per thread count, per repeat
        };
        std::vector<Held> held;
        for (const auto & m : o.speed_modes) {
            Options op = o;
            op.prompt = 0;
            CtxConfig c = speed_ctx_config(m, mi, n_ctx + extra);
            Held h{m, make_context(model, op, c)};
            size_t ak = 0, av = 0, ab = 0;
            if (!llama_kvc_cache_bytes(h.ctx.get(), &ak, &av, &ab)) fail("speed: llama_kvc_cache_bytes failed");
            h.alloc = (double) (ak + av);
            llama_set_n_threads(h.ctx.get(), std::max(thread_counts.back(), 1), std::max(thread_counts.back(), 1));
            for (int i = 0; i < n_ctx; i += 512) {
                const int nb = std::min(512, n_ctx - i);
                std::vector<bool> want(nb, false);
                want[nb - 1] = true;
                decode_batch(h.ctx.get(), toks, i, nb, i, want);
            }
            h.pos = n_ctx;
            h.tok_s.assign(thread_counts.size(), {});
            held.push_back(std::move(h));
        }
        for (int rep = 0; rep < repeats; ++rep) {
            for (auto & h : held) {
                for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
                    const int th = thread_counts[ti];
                    llama_set_n_threads(h.ctx.get(), th, th);
                    // one untimed step first (thread start-up, first touch of buffers)
                    std::vector<bool> one(1, true);
                    decode_batch(h.ctx.get(), toks, h.pos, 1, h.pos, one);
                    h.pos++;
                    const double t0 = now_s();
                    for (int j = 1; j < n_decode; ++j, ++h.pos) decode_batch(h.ctx.get(), toks, h.pos, 1, h.pos, one);
                    h.tok_s[ti].push_back((n_decode - 1) / (now_s() - t0));
                }
            }
        }
        for (auto & h : held) {
            for (size_t ti = 0; ti < thread_counts.size(); ++ti) {
                std::vector<double> v = h.tok_s[ti];
                std::sort(v.begin(), v.end());
                SpeedRow r;
                r.mode = h.mode;
                r.n_ctx = n_ctx;
                r.threads = thread_counts[ti];
                r.tok_s = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
                r.tok_s_runs = h.tok_s[ti];
                r.alloc_bytes = h.alloc;
                rows.push_back(r);
                std::printf("speed  %-28s ctx %6d  threads %2d  %8.2f tok/s (median of %d)  KV %8.2f MiB (llama.cpp "
                            "allocation)\n",
                            h.mode.c_str(), n_ctx, r.threads, r.tok_s, repeats, r.alloc_bytes / 1048576.0);
                std::fflush(stdout);
            }
        }
    }
    return rows;
}

}  // namespace kvc_llama
