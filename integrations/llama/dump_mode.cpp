// kvc_llama_eval, dump mode: post-RoPE K and V as the cache holds them, in the realkv format
// (dump_mode.hpp).
#include "dump_mode.hpp"

#include "eval_tap.hpp"
#include "llama_state_parse.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <utility>

namespace kvc_llama {

namespace {

// The state container's parser: llama_state_parse.hpp (no llama calls; fuzzed alone).
using kvc_llama_state::CacheDump;

CacheDump parse_f16_state(const std::vector<uint8_t> & blob, const ModelInfo & mi) {
    return kvc_llama_state::parse_f16_state(blob, mi.n_layer, (size_t) mi.n_embd_kv());
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

// dtype: "f16" (the cache bytes), "bf16" (RNE of the callback's f32) or "f32" (the callback's f32);
// n_swa > 0: a sliding-window model, whose f16 files are the callback's f32 rounded to f16 (its
// state holds only the window's cells of those layers)
void write_sidecar(const std::string & path, const std::string & file, const char * tensor, const std::string & dtype,
                   const ModelInfo & mi, int n_tok, const Options & o, const std::string & text_path,
                   const std::string & text, long text_tokens_total, int n_swa) {
    const bool bf16 = dtype == "bf16", f32 = dtype == "f32", from_f32 = bf16 || f32 || n_swa > 0;
    std::ostringstream j;
    j << "{\n";
    j << "  \"file\": \"" << json_escape(file) << "\",\n";
    j << "  \"tensor\": \"" << tensor << "\",\n";
    j << "  \"dtype\": \""
      << (bf16  ? "bfloat16 (RNE from float32)"
          : f32 ? "float32 (the rows the model computed, before the f16 cache)"
          : n_swa > 0 ? "float16 IEEE binary16 (the rows the model computed, rounded as the f16 cache rounds them)"
                : "float16 IEEE binary16 (bytes read back from the llama.cpp f16 KV cache)")
      << "\",\n";
    if (n_swa > 0) {
        // informational: kvc quant plan's layer-local errors attend over every token
        j << "  \"sliding_window\": " << n_swa << ",\n";
    }
    j << "  \"byte_order\": \"little-endian\",\n";
    const bool q = tensor[0] == 'Q';  // queries have n_head heads, K and V n_kv_head
    j << "  \"layout\": \"[n_layer][n_tokens][" << (q ? "n_head" : "n_kv_head") << "][head_dim]\",\n";
    j << "  \"shape\": [" << mi.n_layer << ", " << n_tok << ", " << (q ? mi.n_head : mi.n_head_kv) << ", " << mi.head_dim
      << "],\n";
    j << "  \"n_layer\": " << mi.n_layer << ",\n";
    j << "  \"n_tokens\": " << n_tok << ",\n";
    j << "  \"n_kv_head\": " << mi.n_head_kv << ",\n";
    j << "  \"n_head\": " << mi.n_head << ",\n";
    j << "  \"head_dim\": " << mi.head_dim << ",\n";
    {
        // the model's RoPE, for tools that undo it (kvc tc calibrate); freq_base 0 and n_rot 0
        // mean the metadata has no such key (llama.cpp's defaults then apply)
        char num[64];
        std::snprintf(num, sizeof num, "%.17g", mi.rope_freq_base);
        j << "  \"rope\": {\"type\": \"" << mi.rope_type << "\", \"freq_base\": " << num;
        std::snprintf(num, sizeof num, "%.9g", mi.rope_freq_scale);
        j << ", \"freq_scale\": " << num << ", \"n_rot\": " << mi.rope_n_rot << "},\n";
    }
    j << "  \"model\": \"" << json_escape(mi.file) << "\",\n";
    j << "  \"model_desc\": \"" << json_escape(mi.desc) << "\",\n";
    j << "  \"runtime\": \"llama.cpp 0c1e57098 (llama-cpp-python 0.3.36 sdist, kvc's patch series), CPU, kv cache type f16, flash_attn off, "
         "n_ctx 4096, n_ubatch 512\",\n";
    j << "  \"text_source\": \"" << json_escape(base_name(text_path)) << ", first " << n_tok << " tokens\",\n";
    j << "  \"text_file_tokens_total\": " << text_tokens_total << ",\n";
    j << "  \"token_count\": " << n_tok << ",\n";
    j << "  \"bos_prepended\": " << (o.bos ? "true" : "false") << ",\n";
    j << "  \"text_first_200_chars\": \"" << json_escape(text.substr(0, 200)) << "\",\n";
    if (q) {
        j << "  \"capture\": \"eval callback on 'Qcur-<il>' (op ROPE, f32): the queries attention sees, before its "
             "1/sqrt(head_dim) scale\",\n";
        j << "  \"post_rope\": true,\n";
    } else if (tensor[0] == 'K') {
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

uint16_t f32_to_bf16_rne(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t) ((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t) (u >> 16);
}

}  // namespace

RunResult run_dump(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks,
                   const std::string & text_path, const std::string & text, const std::string & tag) {
    const int n = std::min<int>(o.dump_tokens > 0 ? o.dump_tokens : o.n_tokens, (int) toks.size());
    if (n > 4096) fail("dump: at most 4096 tokens (the realkv setup uses n_ctx 4096)");
    EvalTap tap(mi);
    tap.capture_f32 = true;
    tap.capture_q = true;
    tap.k_rows.resize(mi.n_layer);
    tap.v_rows.resize(mi.n_layer);
    tap.q_rows.resize(mi.n_layer);
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
    const size_t ne = (size_t) mi.n_embd_kv();
    // A sliding-window model's state holds two caches, the window's layers only their last
    // cells (llama.cpp's iSWA): its rows come from the eval callback alone, and the checks that
    // read the state (cells, positions, layer 0's attention, f16 bytes) are not made.
    const int n_swa = llama_model_n_swa(model);
    std::vector<uint8_t> blob;
    CacheDump d;
    if (n_swa == 0) {
        blob = get_seq_state(ctx.get());
        d = parse_f16_state(blob, mi);
        if (d.n_cells != n) fail("dump: cache holds " + std::to_string(d.n_cells) + " cells, expected " + std::to_string(n));
        for (int c = 0; c < n; ++c) {
            if (d.pos[c] != c) fail("dump: cell " + std::to_string(c) + " holds position " + std::to_string(d.pos[c]));
        }
    }
    for (int l = 0; l < mi.n_layer; ++l) {
        if (tap.k_rows[l].size() != (size_t) n * ne || tap.v_rows[l].size() != (size_t) n * ne) {
            fail("dump: eval callback captured the wrong number of rows for layer " + std::to_string(l));
        }
        if (tap.q_rows[l].size() != (size_t) n * mi.n_head * mi.head_dim) {
            fail("dump: eval callback captured the wrong number of query rows for layer " + std::to_string(l));
        }
    }
    // The dumped queries are the ones attention used: layer 0's softmax(Q K^T / sqrt(head_dim))
    // over the cached K, recomputed from the captured Q (rounded to f16 as the f16 K x f32 Q
    // product does) for every query of the last ubatch and every head, must match llama.cpp's
    // kq_soft_max-0. A wrong head, token or layer order gives differences of order 0.1.
    if (n_swa > 0) {
        d.n_cells = n;
        d.k.resize((size_t) mi.n_layer * n * ne);
        d.v.resize(d.k.size());
        for (int l = 0; l < mi.n_layer; ++l) {
            for (size_t x = 0; x < (size_t) n * ne; ++x) {
                d.k[(size_t) l * n * ne + x] = ggml_fp32_to_fp16(tap.k_rows[l][x]);
                d.v[(size_t) l * n * ne + x] = ggml_fp32_to_fp16(tap.v_rows[l][x]);
            }
        }
    }
    double q_attention_max_err = n_swa > 0 ? -1.0 : 0.0;
    if (n_swa == 0) {
        const int last0 = ((n - 1) / 512) * 512, m = n - last0, D = mi.head_dim, H = mi.n_head;
        const int group = mi.n_head / mi.n_head_kv;
        if (tap.kq0_ntok != m || tap.kq0_nkv < n) fail("dump: layer 0's attention of the last ubatch was not captured");
        const auto & f16 = f16_table();
        std::vector<double> lg((size_t) n);
        for (int qi = 0; qi < m; ++qi) {
            const int pos = last0 + qi;
            for (int h = 0; h < H; ++h) {
                const float * qr = &tap.q_rows[0][((size_t) pos * H + h) * D];
                double mx = -INFINITY;
                for (int c = 0; c <= pos; ++c) {
                    const uint16_t * kr = &d.k[((size_t) c * mi.n_head_kv + h / group) * D];
                    double dot = 0.0;
                    for (int x = 0; x < D; ++x) dot += (double) ggml_fp16_to_fp32(ggml_fp32_to_fp16(qr[x])) * f16[kr[x]];
                    lg[c] = dot / std::sqrt((double) D);
                    mx = std::max(mx, lg[c]);
                }
                double sum = 0.0;
                for (int c = 0; c <= pos; ++c) sum += std::exp(lg[c] - mx);
                const float * ref = &tap.kq0[((size_t) h * m + qi) * tap.kq0_nkv];
                for (int c = 0; c < (int) tap.kq0_nkv; ++c) {
                    const double p = c <= pos ? std::exp(lg[c] - mx) / sum : 0.0;
                    q_attention_max_err = std::max(q_attention_max_err, std::fabs(p - (double) ref[c]));
                }
            }
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
    r.extra.push_back({"q_attention_max_err", n_swa > 0 ? std::string("null") : json_num(q_attention_max_err)});
    r.extra.push_back({"state_bytes", n_swa > 0 ? std::string("null") : std::to_string(blob.size())});
    if (n_swa > 0) r.detail += "; sliding-window model (window " + std::to_string(n_swa) + "): rows from the eval callback";

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
                          o, text_path, text, (long) toks.size(), n_swa);
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
                          (long) toks.size(), n_swa);
        }
        // Q: the post-RoPE queries of every layer, for training and checking compressors that
        // must keep attention's output (softmax(q K^T) V), not only K and V
        {
            const std::string bin = tag + ".Q.f32.bin";
            std::vector<float> all;
            all.reserve((size_t) mi.n_layer * n * mi.n_head * mi.head_dim);
            for (int l = 0; l < mi.n_layer; ++l) all.insert(all.end(), tap.q_rows[l].begin(), tap.q_rows[l].end());
            write_bytes(o.dump_dir + "/" + bin, all.data(), all.size() * sizeof(float));
            write_sidecar(pre + ".Q.f32.json", bin, "Q", "f32", mi, n, o, text_path, text, (long) toks.size(), n_swa);
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

}  // namespace kvc_llama
