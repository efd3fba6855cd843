// kvc_llama_eval, kvq through kvc_kvq: rotated 2-8-bit packed rows at the SET_ROWS write path.
// Part of the one kvc_llama_eval program (one translation unit: kvc_llama_eval.cpp includes
// every part in this order; each part includes the one before it).
#pragma once

#include "c8_hooks.hpp"

namespace {

// ------------------------------------------------------------------------------------------
// kvq through kvc_kvq: every K/V row the model writes (one token of one KV head, head_dim
// values) is packed by kvc exactly as a kvq cache would store it and unpacked again before
// llama.cpp writes it, so the cache holds kvq's values with the packed format's numerics,
// rotation included; memory is counted from kvc_kvq_row_bytes. Tokens at positions below
// --kvq-sink are kept as the f16 cache holds them (protected attention sinks) and counted at
// f16 bytes.

struct KvqPtr {
    kvc_kvq * q = nullptr;
    // from a config string ("k4v4", ...) or, with plan_json, from a kvq plan's JSON
    KvqPtr(const std::string & config, const ModelInfo & mi, const std::string * plan_json = nullptr) {
        if (plan_json) {
            kvc_ok(kvc_kvq_new_from_plan(plan_json->data(), plan_json->size(), &q),
                   ("kvc_kvq_new_from_plan(" + config + ")").c_str());
            // a plan for another model is refused here, never run
            size_t rb = 0;
            if (kvc_kvq_row_bytes(q, (uint32_t) (mi.n_layer - 1), KVC_TENSOR_K, &rb) != KVC_OK ||
                kvc_kvq_row_bytes(q, (uint32_t) mi.n_layer, KVC_TENSOR_K, &rb) == KVC_OK) {
                kvc_kvq_free(q);
                throw UsageError("kvq plan " + config + " is not for a model of " + std::to_string(mi.n_layer) + " layers");
            }
            return;
        }
        kvc_ok(kvc_kvq_new(config.c_str(), (uint32_t) mi.head_dim, (uint32_t) mi.n_layer, (uint32_t) mi.n_head_kv, &q),
               ("kvc_kvq_new(\"" + config + "\")").c_str());
    }
    ~KvqPtr() { kvc_kvq_free(q); }
    KvqPtr(const KvqPtr &) = delete;
    KvqPtr & operator=(const KvqPtr &) = delete;
};

// Bytes of one cell (one token, every layer, K and V, every KV head) in kvq's packed rows.
double kvq_cell_bytes(const kvc_kvq * q, const ModelInfo & mi, double * k_bits = nullptr, double * v_bits = nullptr) {
    double cell = 0.0, kb = 0.0, vb = 0.0;
    for (int l = 0; l < mi.n_layer; ++l) {
        size_t rk = 0, rv = 0;
        kvc_ok(kvc_kvq_row_bytes(q, (uint32_t) l, KVC_TENSOR_K, &rk), "kvc_kvq_row_bytes");
        kvc_ok(kvc_kvq_row_bytes(q, (uint32_t) l, KVC_TENSOR_V, &rv), "kvc_kvq_row_bytes");
        cell += (double) (rk + rv) * mi.n_head_kv;
        kb += 8.0 * (double) rk / mi.head_dim;
        vb += 8.0 * (double) rv / mi.head_dim;
    }
    if (k_bits) *k_bits = kb / mi.n_layer;
    if (v_bits) *v_bits = vb / mi.n_layer;
    return cell;
}

// Packs n_rows rows of layer il's K or V with `q` into `packed` (resized to their bytes) and
// unpacks them into `rows` in place: the values a kvq cache of those rows holds. With a
// center (n_kv_head * head_dim values), coded as row - center and unpacked as decoded + center.
void kvq_round_trip_rows(const kvc_kvq * q, int il, kvc_tensor which, float * rows, size_t n_rows,
                         std::vector<uint8_t> & packed, const std::vector<float> & center = {}) {
    size_t rb = 0;
    kvc_ok(kvc_kvq_row_bytes(q, (uint32_t) il, which, &rb), "kvc_kvq_row_bytes");
    packed.resize(n_rows * rb);
    if (center.empty()) {
        kvc_ok(kvc_kvq_quantize_rows(q, (uint32_t) il, which, rows, n_rows, packed.data(), packed.size()),
               "kvc_kvq_quantize_rows");
        kvc_ok(kvc_kvq_dequantize_rows(q, (uint32_t) il, which, packed.data(), packed.size(), rows, n_rows),
               "kvc_kvq_dequantize_rows");
        return;
    }
    kvc_ok(kvc_kvq_quantize_rows_centered(q, (uint32_t) il, which, rows, n_rows, center.data(), center.size(),
                                          packed.data(), packed.size()),
           "kvc_kvq_quantize_rows_centered");
    kvc_ok(kvc_kvq_dequantize_rows_centered(q, (uint32_t) il, which, packed.data(), packed.size(), center.data(),
                                            center.size(), rows, n_rows),
           "kvc_kvq_dequantize_rows_centered");
}

class KvqRoundTripHook : public RowHook {
public:
    // recent > 0: a token's rows stay as the f16 cache holds them (or, with `window`, as that
    // kvq handle's rows: 8-bit rows) until `recent` newer tokens have been written, then they
    // are coded and written back into their cells (on_set_rows)
    //
    // center (needs recent > 0): when the first tokens leave the window, the mean of the window's
    // K rows per KV head and channel (kvc_kvq_mean_center: rounded to f16) becomes that layer's K
    // center; every K row coded from then on is coded as row - center
    // (kvc_kvq_quantize_rows_centered) and written back as decoded + center. An engine never
    // adds the center back (q . center is the same for every cached token, so the softmax does
    // not change): these cells give exactly its scores. The sink tokens must stay f16 (the
    // options refuse --kvq-center without --kvq-sink): the attention sink's rows are unlike the
    // window's mean, and coded against it they lose what makes them the sink (200 tokens, no
    // f16 sink: KL 0.016 plain, 0.070 with K centered, 0.12 with K and V). V is not centered:
    // with an f16 sink it measured no better.
    KvqRoundTripHook(const kvc_kvq * q, const ModelInfo & mi, int sink, int recent = 0, const kvc_kvq * window = nullptr,
                     bool center = false)
        : q_(q), window_(window), mi_(mi), sink_(sink), recent_(recent), center_(center) {
        for (int v = 0; v < 2; ++v) {
            centers_[v].resize(mi.n_layer);
            written_[v].assign(mi.n_layer, 0);
            first_coded_[v].assign(mi.n_layer, 0);
            pending_[v].resize(mi.n_layer);
            pending_ref_[v].resize(mi.n_layer);
            cells_[v].resize(mi.n_layer);
        }
    }
    void on_rows(int il, bool is_v, ggml_tensor * t) override {
        const int64_t D = mi_.head_dim, H = mi_.n_head_kv, n_tok = t->ne[2];
        if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || t->ne[0] != D || t->ne[1] != H) {
            fail("kvq: unexpected K/V rows " + shape_str(t));
        }
        // the tokens of this call, in the order they were written: the first `sink_` positions
        // stay as the f16 cache would hold them
        long & seen = written_[is_v ? 1 : 0][il];
        const int64_t keep = std::max<int64_t>(0, std::min<int64_t>(n_tok, sink_ - seen));
        seen += n_tok;
        float * rows = (float *) t->data;
        if (recent_ > 0) {
            // held as the f16 cache holds them (or as window rows) until they leave the window
            const int v = is_v ? 1 : 0;
            first_coded_[v][il] = keep;
            auto & ref = pending_ref_[v][il];
            for (int64_t i = keep * H * D; i < n_tok * H * D; ++i) ref.push_back(ggml_fp16_to_fp32(ggml_fp32_to_fp16(rows[i])));
            if (window_ && n_tok > keep) {
                kvq_round_trip_rows(window_, il, is_v ? KVC_TENSOR_V : KVC_TENSOR_K, rows + keep * H * D,
                                    (size_t) ((n_tok - keep) * H), packed_);
            }
            auto & dst = pending_[v][il];
            for (int64_t i = keep * H * D; i < n_tok * H * D; ++i) dst.push_back(ggml_fp16_to_fp32(ggml_fp32_to_fp16(rows[i])));
            return;
        }
        const size_t n_rows = (size_t) ((n_tok - keep) * H);
        if (n_rows == 0) return;
        round_trip(il, is_v, rows + keep * H * D, n_rows);
    }
    void on_set_rows(int il, bool is_v, ggml_tensor * node) override {
        if (recent_ == 0) return;
        const int v = is_v ? 1 : 0;
        const ggml_tensor * idx = node->src[1];
        if (idx->type != GGML_TYPE_I64) fail("kvq: SET_ROWS indices are not I64: " + shape_str(idx));
        auto & cells = cells_[v][il];
        for (int64_t i = first_coded_[v][il]; i < idx->ne[0]; ++i) {
            cells.push_back(*(const int64_t *) ((const char *) idx->data + i * idx->nb[0]));
        }
        const size_t D = (size_t) mi_.head_dim, H = (size_t) mi_.n_head_kv;
        auto & rows = pending_[v][il];
        if (rows.size() != cells.size() * H * D) fail("kvq: rows and SET_ROWS cells disagree");
        if (cells.size() <= (size_t) recent_) return;
        ggml_tensor * cache = node->view_src ? node->view_src : node;
        if (cache->type != GGML_TYPE_F16 || cache->ne[0] != (int64_t) (H * D)) {
            fail("kvq: --kvq-recent needs the cache as f16 rows of n_head_kv * head_dim (V is stored transposed "
                 "without flash attention: add --kvq-fa): " + shape_str(cache));
        }
        const size_t out = cells.size() - (size_t) recent_;  // tokens leaving the window
        auto & ref = pending_ref_[v][il];
        auto & c = centers_[v][il];
        if (center_ && !is_v && c.empty()) {
            c.resize(H * D);
            kvc_ok(kvc_kvq_mean_center(ref.data(), ref.size(), (uint32_t) H, (uint32_t) D, c.data(), c.size()),
                   "kvc_kvq_mean_center");
        }
        round_trip(il, is_v, rows.data(), out * H, ref.data());
        for (size_t t = 0; t < out; ++t) {
            if (cells[t] < 0 || cells[t] >= cache->ne[1]) fail("kvq: a SET_ROWS cell is outside the cache");
            ggml_fp16_t * dst = (ggml_fp16_t *) ((char *) cache->data + (size_t) cells[t] * cache->nb[1]);
            for (size_t e = 0; e < H * D; ++e) dst[e] = ggml_fp32_to_fp16(rows[t * H * D + e]);
        }
        rows.erase(rows.begin(), rows.begin() + (long) (out * H * D));
        ref.erase(ref.begin(), ref.begin() + (long) (out * H * D));
        cells.erase(cells.begin(), cells.begin() + (long) out);
    }
    // Packs and unpacks n_rows rows in place; the error is against `reference` (the rows as
    // an f16 cache holds them), or, when null, against the f16 of the rows given
    void round_trip(int il, bool is_v, float * first, size_t n_rows, const float * reference = nullptr) {
        const int64_t D = mi_.head_dim;
        // the reference: the row as the f16 cache would have held it
        ref_.resize(n_rows * D);
        for (size_t i = 0; i < ref_.size(); ++i) ref_[i] = reference ? reference[i] : ggml_fp16_to_fp32(ggml_fp32_to_fp16(first[i]));
        // with a center: coded as row - center (rows are [token][head][dim]: the center repeats
        // every n_head_kv rows), written back as decoded + center
        kvq_round_trip_rows(q_, il, is_v ? KVC_TENSOR_V : KVC_TENSOR_K, first, n_rows, packed_,
                            centers_[is_v ? 1 : 0][il]);
        Err & e = err_[is_v ? 1 : 0];
        for (size_t i = 0; i < ref_.size(); ++i) {
            const double a = ref_[i], b = first[i];
            if (!std::isfinite(b)) fail("kvq: a dequantized value is not finite");
            e.sq += (a - b) * (a - b);
            e.ref += a * a;
            e.max = std::max(e.max, std::fabs(a - b));
            e.n++;
        }
        e.rows += (long) n_rows;
        e.bytes += (double) packed_.size();
    }
    struct Err {
        double sq = 0, ref = 0, max = 0, bytes = 0;
        long n = 0, rows = 0;
    };
    const Err & err(bool v) const { return err_[v ? 1 : 0]; }

private:
    const kvc_kvq * q_;
    const kvc_kvq * window_;
    const ModelInfo & mi_;
    int sink_, recent_;
    bool center_;
    std::vector<std::vector<float>> centers_[2];      // per layer: [head][dim] once set, else empty
    std::vector<long> written_[2];
    std::vector<int64_t> first_coded_[2];             // of the last call's tokens, the first past the sink
    std::vector<std::vector<float>> pending_[2];      // per layer: the window's rows, [token][head][dim]
    std::vector<std::vector<float>> pending_ref_[2];  // the same rows as an f16 cache holds them
    std::vector<std::vector<int64_t>> cells_[2];      // their cells
    std::vector<uint8_t> packed_;
    std::vector<float> ref_;
    Err err_[2];
};

// ------------------------------------------------------------------------------------------
// kvq combined with a mode that changes which cells the cache holds: "BASE+kvq:CONFIG" or
// "BASE+kvq-plan:FILE", BASE one of mlp@F, mlp-meanpool@F, mlp, h2o, kvc-streaming (at every
// --kv-ratios), h2o@R, kvc-streaming@R. Every cell the cache holds is a kvq cell: new rows go
// through the same SET_ROWS round trip as the kvq: modes, and cells the mode writes itself (the
// mlp modes' compressed groups) through kvq_requantize_f16 (KvqSetup, in decode.hpp, sets a decode up). Memory: kvq's packed row bytes per
// held cell, the --kvq-sink cells at f16, so the mean ratio is what a kvq engine running the
// mode would get.

// Splits a combined mode; false (base and kvq untouched) when m has no kvq suffix.
bool split_kvq_suffix(const std::string & m, std::string * base, std::string * kvq_mode) {
    for (const char * tag : {"+kvq:", "+kvq-plan:"}) {
        const auto at = m.find(tag);
        if (at == std::string::npos) continue;
        *base = m.substr(0, at);
        *kvq_mode = m.substr(at + 1);
        return true;
    }
    return false;
}

// Puts n_rows f16 rows of head_dim values (a cell's rows of one layer, K or V) through kvq's
// quantizer and back, in place: what a kvq cache would hold for rows the mode wrote itself.
// Returns the squared error and the squared reference summed into sq / ref.
void kvq_requantize_f16(const kvc_kvq * q, const ModelInfo & mi, int layer, bool is_v, uint16_t * rows, size_t n_rows,
                        double * sq, double * ref) {
    const size_t D = (size_t) mi.head_dim;
    std::vector<float> x(n_rows * D);
    std::vector<uint8_t> packed;
    for (size_t i = 0; i < x.size(); ++i) x[i] = ggml_fp16_to_fp32(rows[i]);
    std::vector<float> y = x;
    kvq_round_trip_rows(q, layer, is_v ? KVC_TENSOR_V : KVC_TENSOR_K, y.data(), n_rows, packed);
    for (size_t i = 0; i < x.size(); ++i) {
        if (!std::isfinite(y[i])) fail("kvq: a dequantized value is not finite");
        rows[i] = ggml_fp32_to_fp16(y[i]);
        *sq += ((double) x[i] - y[i]) * ((double) x[i] - y[i]);
        *ref += (double) x[i] * x[i];
    }
}

}  // namespace
