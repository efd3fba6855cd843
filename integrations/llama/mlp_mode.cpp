// kvc_llama_eval, mlp modes: kvc-mlp's learned compressor on the cache llama.cpp holds
// (mlp_mode.hpp says what and how).
#include "mlp_mode.hpp"

#include "kvc_api.hpp"
#include "kvq_hooks.hpp"
#include "llama_state_parse.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvc_llama {

namespace {

using kvc_llama_state::CacheDump;

// ------------------------------------------------------------------------------------------
// weights

struct MlpFree {
    void operator()(kvc_mlp * m) const { kvc_mlp_free(m); }
};

// The mode without its "+kvq:" / "+kvq-plan:" suffix (kvq_hooks.hpp), if any.
std::string mlp_base_mode(const std::string & m) {
    std::string base = m, kvq_mode;
    split_kvq_suffix(m, &base, &kvq_mode);
    return base;
}

}  // namespace

bool is_mlp_mode(const std::string & mode) {
    const std::string m = mlp_base_mode(mode);
    return m == "mlp" || m.rfind("mlp@", 0) == 0 || m.rfind("mlp-meanpool@", 0) == 0;
}

namespace {

// The factor a mode names, 0 for plain mlp (parse_options has checked it is 2..64).
int mlp_mode_factor(const std::string & mode) {
    const std::string m = mlp_base_mode(mode);
    const auto at = m.find('@');
    return at == std::string::npos ? 0 : std::atoi(m.c_str() + at + 1);
}

// ReLU offset of the mean-pool weights: relu(mean + c) - c is the mean for every value above
// -c. SmolLM2-135M's largest |K| and |V| are about 24 (the realkv dumps); the check in
// MlpCompressEditor catches any value that was clipped.
constexpr float kMeanpoolOffset = 256.0f;

// A .bin v1 file (f32, text MLPs only, min_seq_len 1) whose K and V MLPs of every layer map a
// group of `factor` tokens to their mean, exactly up to f32 rounding: Linear 1 averages and adds
// the offset, Linear 2 is the identity, Linear 3 takes the offset away. The same weights as
// scripts/mlp_meanpool_weights.py writes.
std::vector<uint8_t> meanpool_weights(const ModelInfo & mi, int factor) {
    const uint32_t d = (uint32_t) mi.head_dim, f = (uint32_t) factor;
    std::vector<uint8_t> out;
    auto u32 = [&](uint32_t x) { out.insert(out.end(), (uint8_t *) &x, (uint8_t *) &x + 4); };
    auto f32 = [&](float x) { out.insert(out.end(), (uint8_t *) &x, (uint8_t *) &x + 4); };
    u32(0x4B56434Du);          // magic
    u32(1);                    // version
    u32(2);                    // dtype fp32 (u16) and reserved 0 (u16)
    u32((uint32_t) mi.n_layer);
    u32((uint32_t) mi.n_head_kv);
    u32(d);
    u32(d * f);                // hidden_size: the first Linear's input width, as the converter writes it
    u32(f);
    u32(1);                    // min_seq_len
    u32(6);                    // text K and V, 3 Linear each
    u32(0);                    // no metadata
    auto linear = [&](uint32_t cols, float diag, float bias, bool group) {
        u32(d);
        u32(cols);
        u32(1);
        for (uint32_t r = 0; r < d; ++r) {
            for (uint32_t c = 0; c < cols; ++c) f32((group ? c % d == r : c == r) ? diag : 0.0f);
        }
        for (uint32_t r = 0; r < d; ++r) f32(bias);
    };
    for (int l = 0; l < mi.n_layer; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
            linear(d * f, 1.0f / (float) f, kMeanpoolOffset, true);
            linear(d, 1.0f, 0.0f, false);
            linear(d, 1.0f, -kMeanpoolOffset, false);
        }
    }
    return out;
}

// Loads a compressor (from `path`, or from `bytes` when given) and checks it fits the model:
// every layer, the model's head_dim, its KV head count where the file records one (0: not
// recorded; the MLPs are per head and shared, so any count runs), a factor of at least 2.
// Anything else is a usage error (status 2) before a token is decoded.
MlpWeights load_mlp(const std::string & path, const std::vector<uint8_t> * bytes, const ModelInfo & mi) {
    MlpWeights w;
    w.source = path;
    const std::string what = bytes ? path : "--mlp-weights " + path;
    kvc_mlp * raw = nullptr;
    const kvc_status st = bytes ? kvc_mlp_new_from_memory(bytes->data(), bytes->size(), &raw) : kvc_mlp_new(path.c_str(), &raw);
    if (st != KVC_OK) {
        throw UsageError(what + ": not a compressor kvc can load (.bin v1): " + kvc_status_name((int) st) + ": " +
                         kvc_message());
    }
    w.h.reset(raw, MlpFree());
    kvc_ok(kvc_mlp_get_info(raw, &w.info), "kvc_mlp_get_info");
    const kvc_mlp_info & i = w.info;
    auto refuse = [&](const std::string & why) {
        throw UsageError(what + ": weights for another model shape: " + why + " (model " + mi.desc + ": " +
                         std::to_string(mi.n_layer) + " layers, " + std::to_string(mi.n_head_kv) + " KV heads, head_dim " +
                         std::to_string(mi.head_dim) + ")");
    };
    if ((int) i.num_layers != mi.n_layer) refuse(std::to_string(i.num_layers) + " layers");
    if ((int) i.head_dim != mi.head_dim) refuse("head_dim " + std::to_string(i.head_dim));
    if (i.num_heads != 0 && (int) i.num_heads != mi.n_head_kv) refuse(std::to_string(i.num_heads) + " KV heads");
    if (i.compression_factor < 2 || i.compression_factor > 64) {
        throw UsageError(what + ": compression factor " + std::to_string(i.compression_factor) +
                         "; the mlp modes take 2..64");
    }
    return w;
}

}  // namespace

const MlpWeights & MlpSet::pick(const std::string & mode) const {
    const int f = mlp_mode_factor(mode);
    std::string given;
    for (const auto & w : files) {
        given += (given.empty() ? "" : ", ") + w.source + " (factor " + std::to_string(w.info.compression_factor) + ")";
    }
    if (f == 0) {
        if (files.size() != 1) {
            throw UsageError("--modes mlp: takes exactly one --mlp-weights file (given: " + given +
                             "); name the factor instead, e.g. mlp@4");
        }
        return files[0];
    }
    const MlpWeights * hit = nullptr;
    for (const auto & w : files) {
        if ((int) w.info.compression_factor != f) continue;
        if (hit) throw UsageError("--modes " + mode + ": two --mlp-weights files have factor " + std::to_string(f));
        hit = &w;
    }
    if (!hit) {
        throw UsageError("--modes " + mode + ": no --mlp-weights file has factor " + std::to_string(f) +
                         " (given: " + given + ")");
    }
    return *hit;
}

MlpSet load_mlp_set(const Options & o, const ModelInfo & mi) {
    MlpSet s;
    for (const auto & p : o.mlp_weights) s.files.push_back(load_mlp(p, nullptr, mi));
    for (const auto & m : o.modes) {
        if (is_mlp_mode(m) && mlp_base_mode(m).rfind("mlp-meanpool@", 0) != 0) s.pick(m);
    }
    return s;
}

namespace {

// ------------------------------------------------------------------------------------------
// the compression, as a CacheEditor of the decode loop

class MlpCompressEditor : public CacheEditor {
public:
    // kvq: null, or the quantizer every compressed row goes through before it is written back
    MlpCompressEditor(const ModelInfo & mi, const Options & o, const MlpWeights & w, const kvc_kvq * kvq = nullptr)
        : mi_(mi), o_(o), w_(w), kvq_(kvq), factor_((int) w.info.compression_factor),
          min_groups_(std::max<long>(1, (long) w.info.min_seq_len)) {}

    long target(int n_seen) const {
        const double base = o_.budget == "adaptive" ? (double) n_seen : (double) o_.n_tokens;
        return (long) std::ceil(base / o_.ratio);
    }

    void edit(llama_context * ctx, std::vector<HeldToken> & held, int n_seen) override {
        if (n_seen < o_.trigger || (n_seen - o_.trigger) % o_.interval != 0) return;
        checks_++;
        const long n = (long) held.size();
        const long tgt = target(n_seen);
        if (n <= tgt) return;
        // [sink][compressed cells][raw cells...][recent]: the raw cells after the compressed
        // ones, in whole groups, up to the recent window
        const long first = std::min<long>(o_.sink, n) + compressed_cells_;
        const long avail = n - o_.recent - first;
        const long groups_avail = avail > 0 ? avail / factor_ : 0;
        const long need = (n - tgt + factor_ - 2) / (factor_ - 1);  // each group saves F - 1 cells
        const long g = std::min(groups_avail, std::max(need, min_groups_));
        if (g < min_groups_) {
            short_++;  // over budget, but not enough cells outside sink and recent
            return;
        }
        compress(ctx, held, (size_t) first, (size_t) g);
        if ((long) held.size() > tgt) short_++;
    }

    void report(RunResultExtra & extra) const {
        extra.push_back({"mlp_factor", std::to_string(factor_)});
        extra.push_back({"mlp_weights", "\"" + json_escape(w_.source) + "\""});
        extra.push_back({"mlp_weights_meanpool", w_.meanpool ? "true" : "false"});
        extra.push_back({"mlp_min_seq_len", std::to_string(w_.info.min_seq_len)});
        extra.push_back({"mlp_weights_num_heads", std::to_string(w_.info.num_heads)});
        extra.push_back({"mlp_rewrites", std::to_string(rewrites_)});
        extra.push_back({"mlp_groups", std::to_string(groups_)});
        extra.push_back({"mlp_tokens_compressed", std::to_string(groups_ * factor_)});
        extra.push_back({"mlp_compressed_cells_end", std::to_string(compressed_cells_)});
        extra.push_back({"mlp_schedule_points", std::to_string(checks_)});
        extra.push_back({"mlp_points_over_budget", std::to_string(short_)});
        extra.push_back({"mlp_rewrite_s", json_num(seconds_)});
        extra.push_back({"mlp_writer_checked", writer_checked_ ? "true" : "false"});
        extra.push_back({"target_ratio", json_num(o_.ratio)});
        extra.push_back({"sink", std::to_string(o_.sink)});
        extra.push_back({"recent", std::to_string(o_.recent)});
        if (kvq_) {
            extra.push_back({"mlp_kvq_requantized_rows", std::to_string(requant_rows_)});
            extra.push_back({"mlp_kvq_requant_k_rel_rms_err", json_num(std::sqrt(requant_sq_[0] / std::max(1e-30, requant_ref_[0])))});
            extra.push_back({"mlp_kvq_requant_v_rel_rms_err", json_num(std::sqrt(requant_sq_[1] / std::max(1e-30, requant_ref_[1])))});
        }
        if (w_.meanpool) {
            extra.push_back({"meanpool_values_checked", std::to_string(mean_values_)});
            extra.push_back({"meanpool_max_abs_err", json_num(mean_max_abs_)});
            extra.push_back({"meanpool_err_over_tolerance", json_num(mean_over_tol_)});
        }
    }

    std::string detail() const {
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "kvc_mlp factor %d (%s), cells outside sink %d + recent %d, %s 1/%s every %d from %d; "
                      "%ld groups in %ld rewrites; positions kept (RoPE-decoupled)",
                      factor_, w_.meanpool ? "mean-pool, not trained" : base_name(w_.source).c_str(), o_.sink, o_.recent,
                      o_.budget.c_str(), json_num(o_.ratio).c_str(), o_.interval, o_.trigger, groups_, rewrites_);
        return buf;
    }

    long rewrites() const { return rewrites_; }
    long requantized_rows() const { return requant_rows_; }
    long mean_values() const { return mean_values_; }
    double mean_over_tol() const { return mean_over_tol_; }

private:
    // Compresses held[first, first + g * F) into g cells.
    void compress(llama_context * ctx, std::vector<HeldToken> & held, size_t first, size_t g) {
        const double t0 = now_s();
        const size_t F = (size_t) factor_, span = g * F;
        const size_t ne = (size_t) mi_.n_embd_kv(), H = (size_t) mi_.n_head_kv, D = (size_t) mi_.head_dim;
        const size_t nl = (size_t) mi_.n_layer;
        const auto blob = get_seq_state(ctx);
        const CacheDump d = kvc_llama_state::parse_f16_state(blob, mi_.n_layer, (size_t) mi_.n_embd_kv());
        if (d.n_rot_k != 0 || d.n_rot_v != 0) fail("mlp: the cache holds Hadamard-rotated rows (a quantized cache?)");
        const size_t n = (size_t) d.n_cells;
        if (n != held.size()) {
            fail("mlp: llama.cpp holds " + std::to_string(n) + " cells, the harness counted " + std::to_string(held.size()));
        }
        if (!writer_checked_) {
            // the writer must give back what llama.cpp wrote before it writes anything of its own
            if (kvc_llama_state::write_f16_state(d, ne) != blob) fail("mlp: the state writer does not reproduce llama.cpp's state");
            writer_checked_ = true;
        }
        // The blob lists cells in llama.cpp's cell order; the held list is in position order.
        std::vector<size_t> at(n);
        for (size_t c = 0; c < n; ++c) at[c] = c;
        std::sort(at.begin(), at.end(), [&](size_t a, size_t b) { return d.pos[a] < d.pos[b]; });
        for (size_t i = 0; i < n; ++i) {
            if (d.pos[at[i]] != held[i].pos) {
                fail("mlp: llama.cpp's cell positions differ from the harness's at index " + std::to_string(i));
            }
        }
        const size_t n2 = n - span + g;
        CacheDump nd;
        nd.n_cells = (int) n2;
        nd.v_trans = d.v_trans;
        nd.n_layer = d.n_layer;
        nd.n_rot_k = d.n_rot_k;
        nd.n_rot_v = d.n_rot_v;
        nd.pos.resize(n2);
        nd.k.resize(nl * n2 * ne);
        nd.v.resize(nl * n2 * ne);
        // the cell i of the new state: held index i before the span, a group, or i + span - g after it
        auto src_of = [&](size_t i) { return i < first ? at[i] : at[i + span - g]; };
        for (size_t i = 0; i < n2; ++i) {
            if (i >= first && i < first + g) nd.pos[i] = d.pos[at[first + (i - first + 1) * F - 1]];
            else nd.pos[i] = d.pos[src_of(i)];
        }
        std::vector<uint16_t> kb(H * span * D), vb(H * span * D);
        for (size_t l = 0; l < nl; ++l) {
            const uint16_t * K = &d.k[l * n * ne];
            const uint16_t * V = &d.v[l * n * ne];
            uint16_t * K2 = &nd.k[l * n2 * ne];
            uint16_t * V2 = &nd.v[l * n2 * ne];
            // gather the span as kvc's [heads, tokens, head_dim]; a cell's row is [heads][head_dim]
            for (size_t t = 0; t < span; ++t) {
                const size_t c = at[first + t];
                for (size_t h = 0; h < H; ++h) {
                    std::memcpy(&kb[(h * span + t) * D], &K[c * ne + h * D], D * 2);
                    std::memcpy(&vb[(h * span + t) * D], &V[c * ne + h * D], D * 2);
                }
            }
            size_t new_len = 0, rope = 0;
            kvc_ok(kvc_mlp_compress_inplace(w_.h.get(), l, KVC_DTYPE_F16, kb.data(), vb.data(), H, span, span, D, 0, &new_len,
                                            &rope),
                   "kvc_mlp_compress_inplace");
            if (new_len != g || rope != span) {
                fail("mlp: kvc_mlp_compress_inplace made " + std::to_string(new_len) + " tokens of " + std::to_string(span) +
                     " (expected " + std::to_string(g) + "), next position " + std::to_string(rope));
            }
            // a compressor whose weights hold NaN or inf (or overflow f16) must not reach the cache
            for (size_t h = 0; h < H; ++h) {
                for (size_t e = 0; e < g * D; ++e) {
                    if ((kb[h * span * D + e] & 0x7c00u) == 0x7c00u || (vb[h * span * D + e] & 0x7c00u) == 0x7c00u) {
                        throw UsageError(w_.source + ": the compressor gave a NaN or infinite K/V value (layer " +
                                         std::to_string(l) + "): the weights are not usable");
                    }
                }
            }
            if (w_.meanpool && rewrites_ == 0) check_mean(K, V, at, first, g, kb, vb);
            if (kvq_) {
                // the compressed cells as a kvq cache would hold them: row (cell j, head h) of
                // the [heads, tokens, head_dim] buffer, first g tokens of each head
                for (size_t h = 0; h < H; ++h) {
                    kvq_requantize_f16(kvq_, mi_, (int) l, false, &kb[h * span * D], g, &requant_sq_[0], &requant_ref_[0]);
                    kvq_requantize_f16(kvq_, mi_, (int) l, true, &vb[h * span * D], g, &requant_sq_[1], &requant_ref_[1]);
                }
                requant_rows_ += (long) (2 * H * g);
            }
            for (size_t i = 0; i < n2; ++i) {
                if (i >= first && i < first + g) {
                    for (size_t h = 0; h < H; ++h) {
                        std::memcpy(&K2[i * ne + h * D], &kb[(h * span + (i - first)) * D], D * 2);
                        std::memcpy(&V2[i * ne + h * D], &vb[(h * span + (i - first)) * D], D * 2);
                    }
                } else {
                    std::memcpy(&K2[i * ne], &K[src_of(i) * ne], ne * 2);
                    std::memcpy(&V2[i * ne], &V[src_of(i) * ne], ne * 2);
                }
            }
        }
        const auto nb = kvc_llama_state::write_f16_state(nd, ne);
        const size_t used = llama_state_seq_set_data(ctx, nb.data(), nb.size(), 0);
        if (used != nb.size()) {
            fail("mlp: llama_state_seq_set_data took " + std::to_string(used) + " of " + std::to_string(nb.size()) +
                 " bytes of the compressed state");
        }
        std::vector<HeldToken> groups(g);
        for (size_t j = 0; j < g; ++j) {
            const HeldToken & last = held[first + (j + 1) * F - 1];
            groups[j] = HeldToken{last.pos, last.token_index, -1};
        }
        held.erase(held.begin() + (long) first, held.begin() + (long) (first + span));
        held.insert(held.begin() + (long) first, groups.begin(), groups.end());
        compressed_cells_ += (long) g;
        groups_ += (long) g;
        rewrites_++;
        seconds_ += now_s() - t0;
    }

    // Mean-pool weights: every output value is the mean of its group's F inputs, within f16
    // rounding of the output (half an ulp, 2^-11 relative) plus the f32 rounding at the offset.
    void check_mean(const uint16_t * K, const uint16_t * V, const std::vector<size_t> & at, size_t first, size_t g,
                    const std::vector<uint16_t> & kb, const std::vector<uint16_t> & vb) {
        const size_t F = (size_t) factor_, span = g * F, ne = (size_t) mi_.n_embd_kv();
        const size_t H = (size_t) mi_.n_head_kv, D = (size_t) mi_.head_dim;
        for (int kv = 0; kv < 2; ++kv) {
            const uint16_t * X = kv ? V : K;
            const std::vector<uint16_t> & out = kv ? vb : kb;
            for (size_t j = 0; j < g; ++j) {
                for (size_t h = 0; h < H; ++h) {
                    for (size_t e = 0; e < D; ++e) {
                        double m = 0.0;
                        for (size_t f = 0; f < F; ++f) m += ggml_fp16_to_fp32(X[at[first + j * F + f] * ne + h * D + e]);
                        m /= (double) F;
                        const double y = ggml_fp16_to_fp32(out[(h * span + j) * D + e]);
                        const double err = std::fabs(y - m);
                        const double tol = std::fabs(m) * std::ldexp(1.0, -10) + 1e-4;
                        mean_max_abs_ = std::max(mean_max_abs_, err);
                        mean_over_tol_ = std::max(mean_over_tol_, err / tol);
                        mean_values_++;
                    }
                }
            }
        }
    }

    const ModelInfo & mi_;
    const Options & o_;
    const MlpWeights & w_;
    const kvc_kvq * kvq_;
    int factor_;
    long min_groups_;
    long compressed_cells_ = 0, groups_ = 0, rewrites_ = 0, checks_ = 0, short_ = 0;
    double seconds_ = 0.0;
    bool writer_checked_ = false;
    long mean_values_ = 0;
    double mean_max_abs_ = 0.0, mean_over_tol_ = 0.0;
    double requant_sq_[2] = {0, 0}, requant_ref_[2] = {0, 0};
    long requant_rows_ = 0;
};

}  // namespace

// ------------------------------------------------------------------------------------------
// one mlp row

RunResult run_mlp(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks,
                  RefStore & ref, const std::string & mode, const MlpSet & set) {
    MlpWeights generated;
    const MlpWeights * w = nullptr;
    std::string base = mode, kvq_mode;
    split_kvq_suffix(mode, &base, &kvq_mode);
    if (base.rfind("mlp-meanpool@", 0) == 0) {
        const std::vector<uint8_t> bytes = meanpool_weights(mi, mlp_mode_factor(mode));
        generated = load_mlp("mean-pool weights generated for " + mi.file, &bytes, mi);
        generated.meanpool = true;
        w = &generated;
    } else {
        w = &set.pick(mode);
    }
    std::unique_ptr<KvqSetup> kq;
    EvalTap tap(mi);
    DecodeSpec s;
    if (!kvq_mode.empty()) {
        kq.reset(new KvqSetup(kvq_mode, mi, o));
        kq->attach(tap, s);
    }
    MlpCompressEditor ed(mi, o, *w, kq ? kq->kvq.q : nullptr);
    s.mode = (base == "mlp" ? "mlp@" + std::to_string(w->info.compression_factor) : base) +
             (kvq_mode.empty() ? "" : "+" + kvq_mode);
    s.cfg.n_ctx = o.n_tokens;
    s.editor = &ed;
    s.shift_positions = false;
    RunResult r = run_decode(model, mi, o, toks, ref, s);
    ed.report(r.extra);
    r.detail = ed.detail();
    if (kq) {
        if (ed.rewrites() > 0 && ed.requantized_rows() == 0) fail(s.mode + ": compressed cells skipped kvq's quantizer");
        r.detail += "; " + kq->finish(tap, r);
    }
    if (w->meanpool && ed.rewrites() > 0) {
        // the generated weights compute the mean: anything else is a layout or offset mistake
        if (ed.mean_values() == 0 || !(ed.mean_over_tol() <= 1.0)) {
            fail(s.mode + ": the mean-pool weights missed the exact mean by " + json_num(ed.mean_over_tol()) +
                 " times the f16 tolerance");
        }
    }
    return r;
}

}  // namespace kvc_llama
