// kvc_llama_eval, C8 through kvc_quant: calibration, the quantize/dequantize row hook and the
// c8 / c8-h2o rows (c8_hooks.hpp).
#include "c8_hooks.hpp"

#include "eval_tap.hpp"
#include "kvc_api.hpp"
#include "kvc_h2o_policy.hpp"

#include "kvc.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

namespace kvc_llama {

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

void run_c8(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks,
            RefStore & ref, std::vector<RunResult> & rows) {
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
        EvalTap tap(mi);
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
        EvalTap tap(mi);
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
        rows.push_back(r);
    }
}

}  // namespace kvc_llama
