// kvc_llama_eval, kvq through kvc_kvq: the row round trip, its hook, KvqSetup and the kvq: /
// kvq-plan: rows (kvq_hooks.hpp).
#include "kvq_hooks.hpp"

#include "kvc_api.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvc_llama {

KvqPtr::KvqPtr(const std::string & config, const ModelInfo & mi, const std::string * plan_json) {
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

KvqPtr::~KvqPtr() { kvc_kvq_free(q); }

double kvq_cell_bytes(const kvc_kvq * q, const ModelInfo & mi, double * k_bits, double * v_bits) {
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

void kvq_round_trip_rows(const kvc_kvq * q, int il, kvc_tensor which, float * rows, size_t n_rows,
                         std::vector<uint8_t> & packed, const std::vector<float> & center) {
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

KvqRoundTripHook::KvqRoundTripHook(const kvc_kvq * q, const ModelInfo & mi, int sink, int recent, const kvc_kvq * window,
                                   bool center)
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

void KvqRoundTripHook::on_rows(int il, bool is_v, ggml_tensor * t) {
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

void KvqRoundTripHook::on_set_rows(int il, bool is_v, ggml_tensor * node) {
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
        // the mean of the window's rows as held (the window codes' values, as kvc's kvq cells
        // take it in llama.cpp's real cache: docs/formats/kvq.md, "Cells")
        c.resize(H * D);
        kvc_ok(kvc_kvq_mean_center(rows.data(), rows.size(), (uint32_t) H, (uint32_t) D, c.data(), c.size()),
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

void KvqRoundTripHook::round_trip(int il, bool is_v, float * first, size_t n_rows, const float * reference) {
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

KvqSetup::KvqSetup(const std::string & kvq_mode, const ModelInfo & mi, const Options & o)
    : config(kvq_mode.substr(kvq_mode.rfind("kvq-plan:", 0) == 0 ? 9 : 4)),
      from_plan(kvq_mode.rfind("kvq-plan:", 0) == 0),
      plan_json(from_plan ? read_file(config) : std::string()),
      kvq(config, mi, from_plan ? &plan_json : nullptr),
      window(o.kvq_recent > 0 && o.kvq_recent_bits <= 8
                 ? new KvqPtr("k" + std::to_string(o.kvq_recent_bits) + "v" + std::to_string(o.kvq_recent_bits), mi)
                 : nullptr),
      sink(std::min(o.kvq_sink, o.n_tokens)),
      recent(o.kvq_recent),
      window_bits(o.kvq_recent_bits),
      center(o.kvq_center),
      hook(kvq.q, mi, sink, recent, window ? window->q : nullptr, center) {
    cell = kvq_cell_bytes(kvq.q, mi, &k_bits, &v_bits);
    f16_cell = (double) mi.cell_bytes(GGML_TYPE_F16, GGML_TYPE_F16);
    // a version-3 plan declares its protections: the twin applies exactly those, from the flags
    kvc_kvq_protections p = {};
    kvc_ok(kvc_kvq_get_protections(kvq.q, &p), "kvc_kvq_get_protections");
    if (p.sink > 0 || p.window > 0 || p.k_center) {
        const bool same = (uint32_t) o.kvq_sink == p.sink && (uint32_t) o.kvq_recent == p.window &&
                          (p.window == 0 || (uint32_t) o.kvq_recent_bits == p.window_bits) && o.kvq_center == (p.k_center != 0);
        if (!same) {
            throw UsageError(kvq_mode + ": the plan declares sink " + std::to_string(p.sink) + ", window " +
                             std::to_string(p.window) + " at " + std::to_string(p.window_bits) + " bits, K center " +
                             (p.k_center ? "on" : "off") + "; pass the same --kvq-sink/--kvq-recent/--kvq-recent-bits/" +
                             "--kvq-center (the fake-quant twin applies what the native cache applies)");
        }
    }
    window_cell = window ? kvq_cell_bytes(window->q, mi) : f16_cell;
}

void KvqSetup::attach(EvalTap & tap, DecodeSpec & s) {
    tap.want_rows = true;
    tap.want_set_rows = true;
    tap.hook = &hook;
    s.cfg.tap = &tap;
    // memory as a kvq cache holds it: packed rows per cell; the protected sink cells and
    // the --kvq-recent newest cells at f16
    s.cell_bytes = cell;
    s.fixed_bytes = (double) sink * (f16_cell - cell);
    if (recent > 0) {
        // --kvq-center: one f16 K center per layer and KV head, counted from the start
        const double centers = center ? f16_cell / 2 : 0.0;
        s.held_bytes = [this, centers](size_t n) {
            const size_t sk = std::min(n, (size_t) sink), w = std::min(n - sk, (size_t) recent);
            return (double) sk * f16_cell + (double) w * window_cell + (double) (n - sk - w) * cell + centers;
        };
    }
}

std::string KvqSetup::finish(const EvalTap & tap, RunResult & r) const {
    if (!tap.stats.set_rows_reads_hooked_tensor) fail(r.mode + ": a SET_ROWS node reads rows the hook did not see");
    for (int v = 0; v < 2; ++v) {
        const auto & e = hook.err(v == 1);
        const std::string k = v ? "kvq_v_" : "kvq_k_";
        if (e.n == 0) fail(r.mode + ": the kvq hook saw no rows");
        r.extra.push_back({k + "rel_rms_err", json_num(std::sqrt(e.sq / std::max(1e-30, e.ref)))});
        r.extra.push_back({k + "max_abs_err", json_num(e.max)});
        r.extra.push_back({k + "rows", std::to_string(e.rows)});
        r.extra.push_back({k + "packed_bytes", json_num(e.bytes)});
        r.extra.push_back({k + "bits_per_value", json_num(v ? v_bits : k_bits)});
    }
    r.extra.push_back({"kvq_config", "\"" + json_escape(config) + "\""});
    r.extra.push_back({"kvq_sink", std::to_string(sink)});
    r.extra.push_back({"kvq_recent", std::to_string(recent)});
    r.extra.push_back({"kvq_recent_cell_bytes", json_num(recent > 0 ? window_cell : 0.0)});
    r.extra.push_back({"kvq_recent_bits", std::to_string(recent > 0 ? (window ? window_bits : 16) : 0)});
    r.extra.push_back({"kvq_center", center ? "true" : "false"});
    r.extra.push_back({"kvq_cell_bytes", json_num(cell)});
    r.extra.push_back({"kv_accounting", "\"kvq: packed rows per cell (kvc_kvq_row_bytes, scales included), sink cells at f16 (llama.cpp holds f16: kvc dequantizes)\""});
    char buf[240];
    const auto & ek = hook.err(false);
    const auto & ev = hook.err(true);
    std::snprintf(buf, sizeof buf, "kvc kvq %s, %.3g+%.3g bits/value (K+V, scales included), sink %d f16, recent %d %s; rel RMS err K %.4f V %.4f",
                  config.c_str(), k_bits, v_bits, sink, recent, window ? "kvq rows" : "f16", std::sqrt(ek.sq / std::max(1e-30, ek.ref)),
                  std::sqrt(ev.sq / std::max(1e-30, ev.ref)));
    return buf;
}

RunResult run_kvq(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks,
                  RefStore & ref, const std::string & m) {
    KvqSetup kq(m, mi, o);
    EvalTap tap(mi);
    DecodeSpec s;
    s.mode = m;
    s.cfg.n_ctx = o.n_tokens;
    s.cfg.flash_attn = o.kvq_fa;
    kq.attach(tap, s);
    RunResult r = run_decode(model, mi, o, toks, ref, s);
    r.detail = kq.finish(tap, r);
    return r;
}

}  // namespace kvc_llama
