// kvc_llama_eval, K per channel over token groups (KIVI) through kvc_kvq_channel_*, V as kvq
// rows: the hook, the memory accounting and the kvq-kc rows (kvq_channel_hooks.hpp).
#include "kvq_channel_hooks.hpp"

#include "eval_tap.hpp"
#include "kvc_api.hpp"
#include "kvq_hooks.hpp"

#include "kvc.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

namespace kvc_llama {

// ------------------------------------------------------------------------------------------
// "kvq-kc<G>:CONFIG": K per channel over groups of G tokens (kvc_kvq_channel_*, CONFIG's K
// bits), V through kvq rows (CONFIG's V bits and method). After the --kvq-sink tokens, each KV
// head's K rows are held as the f16 cache holds them until G of them have been written; the
// SET_ROWS that writes the G-th codes the group as one channel block and writes the block's
// values back into those G cells of llama.cpp's f16 cache, before attention reads them. So the
// cache holds, at every step, what a KIVI cache would hold: coded blocks, the newest unfilled
// group in f16. "kvq-kc<G>w8:CONFIG" holds the unfilled group as kvq 8-bit K rows instead
// (k8, rotated Lloyd-Max, 66 bytes a row at head_dim 64) and codes the group from their
// values. Memory: per KV head and layer, a block's bytes per G tokens, the unfilled group's
// K rows (f16 or 8-bit rows), V's packed rows, the sink cells at f16 (KvqChannelSetup).

bool parse_channel_mode(const std::string & m, ChannelMode * out) {
    if (m.rfind("kvq-kc", 0) != 0) return false;
    const auto colon = m.find(':');
    if (colon == std::string::npos || colon + 1 >= m.size()) {
        throw UsageError("--modes " + m + ": kvq-kc<G>:CONFIG needs a group and a config, e.g. kvq-kc32:k4v4");
    }
    std::string g = m.substr(6, colon - 6);
    out->window8 = g.size() > 2 && g.compare(g.size() - 2, 2, "w8") == 0;
    if (out->window8) g.resize(g.size() - 2);
    out->group = (uint32_t) parse_int("--modes " + m, g, 16, 256);
    out->config = m.substr(colon + 1);
    return true;
}

namespace {

// The K bits of a kvq config string ("k4v4:u32" -> 4), checked by kvc_kvq_new before use.
uint32_t config_k_bits(const std::string & config) {
    if (config.size() < 2 || config[0] != 'k' || !std::isdigit((unsigned char) config[1])) {
        throw UsageError("kvq config " + config + ": does not start with k<bits>");
    }
    return (uint32_t) (config[1] - '0');
}

class KvqChannelHook : public RowHook {
public:
    // window: null to hold the unfilled group's K rows as f16, else a kvq handle whose K
    // rows hold them (8-bit rows: the group is then coded from those rows' values)
    KvqChannelHook(const kvc_kvq * q, const ModelInfo & mi, int sink, uint32_t bits, uint32_t group,
                   const kvc_kvq * window = nullptr)
        : v_(q, mi, sink), mi_(mi), sink_(sink), bits_(bits), group_(group), window_(window) {
        kvc_ok(kvc_kvq_channel_block_bytes(bits, (uint32_t) mi.head_dim, group, &block_bytes_),
               "kvc_kvq_channel_block_bytes");
        seen_.assign(mi.n_layer, 0);
        first_coded_.assign(mi.n_layer, 0);
        rows_.resize(mi.n_layer);
        ref_.resize(mi.n_layer);
        cells_.resize(mi.n_layer);
    }

    size_t block_bytes() const { return block_bytes_; }

    void on_rows(int il, bool is_v, ggml_tensor * t) override {
        if (is_v) {
            v_.on_rows(il, true, t);
            return;
        }
        const int64_t D = mi_.head_dim, H = mi_.n_head_kv, n_tok = t->ne[2];
        if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || t->ne[0] != D || t->ne[1] != H) {
            fail("kvq-kc: unexpected K rows " + shape_str(t));
        }
        long & seen = seen_[il];
        const int64_t keep = std::max<int64_t>(0, std::min<int64_t>(n_tok, sink_ - seen));
        seen += n_tok;
        first_coded_[il] = keep;
        float * rows = (float *) t->data;
        auto & ref = ref_[il];
        for (int64_t i = keep * H * D; i < n_tok * H * D; ++i) ref.push_back(ggml_fp16_to_fp32(ggml_fp32_to_fp16(rows[i])));
        if (window_ && n_tok > keep) {
            // the unfilled group as kvq rows: the cache holds their values until the group fills
            kvq_round_trip_rows(window_, il, KVC_TENSOR_K, rows + keep * H * D, (size_t) ((n_tok - keep) * H), packed_);
        }
        // the rows as the cache holds them (f16 of the row or of its window row): what the
        // group is coded from once it fills
        auto & dst = rows_[il];
        for (int64_t i = keep * H * D; i < n_tok * H * D; ++i) dst.push_back(ggml_fp16_to_fp32(ggml_fp32_to_fp16(rows[i])));
    }

    void on_set_rows(int il, bool is_v, ggml_tensor * node) override {
        if (is_v) return;
        const ggml_tensor * idx = node->src[1];
        if (idx->type != GGML_TYPE_I64) fail("kvq-kc: SET_ROWS indices are not I64: " + shape_str(idx));
        auto & cells = cells_[il];
        for (int64_t i = first_coded_[il]; i < idx->ne[0]; ++i) {
            cells.push_back(*(const int64_t *) ((const char *) idx->data + i * idx->nb[0]));
        }
        const size_t D = (size_t) mi_.head_dim, H = (size_t) mi_.n_head_kv, G = group_;
        auto & rows = rows_[il];
        auto & ref = ref_[il];
        if (rows.size() != cells.size() * H * D || ref.size() != rows.size()) fail("kvq-kc: K rows and SET_ROWS cells disagree");
        if (cells.size() < G) return;
        ggml_tensor * cache = node->view_src ? node->view_src : node;
        if (cache->type != GGML_TYPE_F16 || cache->ne[0] != (int64_t) (H * D)) {
            fail("kvq-kc: the K cache is not f16 rows of n_head_kv * head_dim: " + shape_str(cache));
        }
        std::vector<float> x(G * D), y(G * D);
        std::vector<uint8_t> block(block_bytes_);
        size_t done = 0;
        for (; cells.size() - done >= G; done += G) {
            for (size_t h = 0; h < H; ++h) {
                for (size_t t = 0; t < G; ++t) std::memcpy(&x[t * D], &rows[((done + t) * H + h) * D], D * sizeof(float));
                kvc_ok(kvc_kvq_channel_quantize(bits_, (uint32_t) D, group_, x.data(), block.data(), block.size()),
                       "kvc_kvq_channel_quantize");
                kvc_ok(kvc_kvq_channel_dequantize(bits_, (uint32_t) D, group_, block.data(), block.size(), y.data()),
                       "kvc_kvq_channel_dequantize");
                for (size_t t = 0; t < G; ++t) {
                    const int64_t c = cells[done + t];
                    if (c < 0 || c >= cache->ne[1]) fail("kvq-kc: a SET_ROWS cell is outside the cache");
                    ggml_fp16_t * out = (ggml_fp16_t *) ((char *) cache->data + (size_t) c * cache->nb[1]) + h * D;
                    const float * r = &ref[((done + t) * H + h) * D];
                    for (size_t d = 0; d < D; ++d) {
                        // the error against the row as an f16 cache would hold it
                        const double a = r[d], b = y[t * D + d];
                        if (!std::isfinite(b)) fail("kvq-kc: a dequantized value is not finite");
                        out[d] = ggml_fp32_to_fp16(y[t * D + d]);
                        err_.sq += (a - b) * (a - b);
                        err_.ref += a * a;
                        err_.max = std::max(err_.max, std::fabs(a - b));
                        err_.n++;
                    }
                }
                err_.bytes += (double) block_bytes_;
            }
            err_.rows += (long) (G * H);
            blocks_ += (long) H;
        }
        rows.erase(rows.begin(), rows.begin() + (long) (done * H * D));
        ref.erase(ref.begin(), ref.begin() + (long) (done * H * D));
        cells.erase(cells.begin(), cells.begin() + (long) done);
    }

    const KvqRoundTripHook::Err & err(bool v) const { return v ? v_.err(true) : err_; }
    long blocks() const { return blocks_; }

private:
    KvqRoundTripHook v_;
    const ModelInfo & mi_;
    int sink_;
    uint32_t bits_, group_;
    const kvc_kvq * window_;
    size_t block_bytes_ = 0;
    std::vector<uint8_t> packed_;
    std::vector<long> seen_;
    std::vector<int64_t> first_coded_;  // of the last call's tokens, the first one past the sink
    std::vector<std::vector<float>> rows_;    // per layer: the unfilled group's rows, [token][head][dim]
    std::vector<std::vector<float>> ref_;     // the same rows as an f16 cache holds them
    std::vector<std::vector<int64_t>> cells_; // per layer: their cells
    KvqRoundTripHook::Err err_;
    long blocks_ = 0;
};

// K per channel over token groups, V as kvq rows (kvq_channel_hooks.hpp), from a
// "kvq-kc<G>:CONFIG" mode; attach() sets the decode up, finish() checks and reports it.
struct KvqChannelSetup {
    ChannelMode cm;
    KvqPtr kvq;
    std::unique_ptr<KvqPtr> window;  // "w8": the unfilled group's K as kvq k8 rows
    uint32_t k_bits;
    int sink;
    KvqChannelHook hook;
    double v_cell = 0, f16_cell = 0, k_bits_per_value = 0, v_bits = 0, open_row = 0;

    KvqChannelSetup(const ChannelMode & m, const ModelInfo & mi, const Options & o)
        : cm(m),
          kvq(m.config, mi),
          window(m.window8 ? new KvqPtr("k8v8", mi) : nullptr),
          k_bits(config_k_bits(m.config)),
          sink(std::min(o.kvq_sink, o.n_tokens)),
          hook(kvq.q, mi, sink, k_bits, m.group, window ? window->q : nullptr) {
        size_t wr = (size_t) mi.head_dim * 2;
        if (window) kvc_ok(kvc_kvq_row_bytes(window->q, 0, KVC_TENSOR_K, &wr), "kvc_kvq_row_bytes");
        open_row = (double) wr;
        double kb = 0;
        const double cell = kvq_cell_bytes(kvq.q, mi, &kb, &v_bits);
        size_t rk = 0;
        kvc_ok(kvc_kvq_row_bytes(kvq.q, 0, KVC_TENSOR_K, &rk), "kvc_kvq_row_bytes");
        v_cell = cell - (double) rk * mi.n_head_kv * mi.n_layer;  // V's packed rows of one cell
        f16_cell = (double) mi.cell_bytes(GGML_TYPE_F16, GGML_TYPE_F16);
        k_bits_per_value = 8.0 * (double) hook.block_bytes() / ((double) m.group * mi.head_dim);
    }

    // Bytes held with n cells: the sink at f16; past it V's rows, and per layer and KV head
    // the filled groups' blocks and the unfilled group's K rows at f16.
    double held_bytes(size_t n, const ModelInfo & mi) const {
        const size_t s = std::min(n, (size_t) sink), rest = n - s;
        const size_t blocks = rest / cm.group, open = rest % cm.group;
        const double per_layer_head = (double) blocks * (double) hook.block_bytes() + (double) open * open_row;
        return (double) s * f16_cell + (double) rest * v_cell + per_layer_head * mi.n_head_kv * mi.n_layer;
    }

    void attach(EvalTap & tap, DecodeSpec & s, const ModelInfo & mi) {
        tap.want_rows = true;
        tap.want_set_rows = true;
        tap.hook = &hook;
        s.cfg.tap = &tap;
        s.cell_bytes = f16_cell;  // unused: held_bytes counts
        s.held_bytes = [this, &mi](size_t n) { return held_bytes(n, mi); };
    }

    std::string finish(const EvalTap & tap, RunResult & r, const ModelInfo & mi) const {
        if (!tap.stats.set_rows_reads_hooked_tensor) fail(r.mode + ": a SET_ROWS node reads rows the hook did not see");
        for (int v = 0; v < 2; ++v) {
            const auto & e = hook.err(v == 1);
            const std::string k = v ? "kvq_v_" : "kvq_k_";
            if (e.n == 0) fail(r.mode + ": the kvq-kc hook coded no " + (v ? "V rows" : "K groups"));
            r.extra.push_back({k + "rel_rms_err", json_num(std::sqrt(e.sq / std::max(1e-30, e.ref)))});
            r.extra.push_back({k + "max_abs_err", json_num(e.max)});
            r.extra.push_back({k + "rows", std::to_string(e.rows)});
            r.extra.push_back({k + "packed_bytes", json_num(e.bytes)});
            r.extra.push_back({k + "bits_per_value", json_num(v ? v_bits : k_bits_per_value)});
        }
        // every K row past the sink and the unfilled group was coded
        const long n_tok = (long) r.cells_end, coded_tokens = n_tok <= sink ? 0 : (n_tok - sink) / (long) cm.group * (long) cm.group;
        if (hook.err(false).rows != coded_tokens * mi.n_head_kv * mi.n_layer) {
            fail(r.mode + ": " + std::to_string(hook.err(false).rows) + " K rows coded in groups, expected " +
                 std::to_string(coded_tokens * mi.n_head_kv * mi.n_layer));
        }
        r.extra.push_back({"kvq_config", "\"" + json_escape(cm.config) + "\""});
        r.extra.push_back({"kvq_k_group", std::to_string(cm.group)});
        r.extra.push_back({"kvq_k_block_bytes", std::to_string(hook.block_bytes())});
        r.extra.push_back({"kvq_k_open_row_bytes", json_num(open_row)});
        r.extra.push_back({"kvq_sink", std::to_string(sink)});
        r.extra.push_back({"kv_accounting", "\"kvq-kc: K channel blocks per group of tokens and KV head (scales included), the unfilled group's K at kvq_k_open_row_bytes a row (f16, or kvq k8 rows with w8), V packed rows per cell, sink cells at f16 (llama.cpp holds f16: kvc dequantizes)\""});
        char buf[240];
        const auto & ek = hook.err(false);
        const auto & ev = hook.err(true);
        std::snprintf(buf, sizeof buf,
                      "kvc K per channel over %u tokens, %.3g bits/value (open group %s), V kvq %s %.3g bits/value, sink %d f16; rel RMS err K %.4f V %.4f",
                      cm.group, k_bits_per_value, window ? "k8 rows" : "f16", cm.config.c_str(), v_bits, sink, std::sqrt(ek.sq / std::max(1e-30, ek.ref)),
                      std::sqrt(ev.sq / std::max(1e-30, ev.ref)));
        return buf;
    }
};

}  // namespace

RunResult run_kvq_channel(llama_model * model, const ModelInfo & mi, const Options & o,
                          const std::vector<llama_token> & toks, RefStore & ref, const ChannelMode & cm,
                          const std::string & m) {
    KvqChannelSetup kc(cm, mi, o);
    EvalTap tap(mi);
    DecodeSpec s;
    s.mode = m;
    s.cfg.n_ctx = o.n_tokens;
    s.cfg.flash_attn = o.kvq_fa;
    kc.attach(tap, s, mi);
    RunResult r = run_decode(model, mi, o, toks, ref, s);
    r.detail = kc.finish(tap, r, mi);
    return r;
}

}  // namespace kvc_llama
