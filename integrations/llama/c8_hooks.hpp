// kvc_llama_eval, C8 through kvc_quant: calibration and the quantize/dequantize row hook.
// Part of the one kvc_llama_eval program (one translation unit: kvc_llama_eval.cpp includes
// every part in this order; each part includes the one before it).
#pragma once

#include "kvc_api.hpp"

namespace {

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

}  // namespace
