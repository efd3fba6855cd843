// kvc_llama_eval, the eval callback: per-cell attention (softmax or the flash-attention
// recompute), row hooks, SET_ROWS checks (eval_tap.hpp).
#include "eval_tap.hpp"

#include "fattn_bound.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

namespace kvc_llama {

namespace {

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

}  // namespace

std::string shape_str(const ggml_tensor * t) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "'%s' op %s type %s ne=[%lld,%lld,%lld,%lld]", ggml_get_name(t),
                  ggml_op_name(t->op), ggml_type_name(t->type), (long long) t->ne[0], (long long) t->ne[1],
                  (long long) t->ne[2], (long long) t->ne[3]);
    return buf;
}

namespace {

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

// The queries attention sees: 'Qcur-<il>' after RoPE, f32 [head_dim, n_head, n_tokens].
bool is_q_target(const EvalTap * tap, const ggml_tensor * t, int * il) {
    const int iq = layer_of(ggml_get_name(t), "Qcur-");
    if (iq < 0 || iq >= tap->n_layer || t->op != GGML_OP_ROPE) return false;
    if (t->ne[0] != tap->head_dim || t->ne[1] != tap->n_head || t->ne[3] != 1) return false;
    *il = iq;
    return true;
}

}  // namespace


// 65536-entry f16 -> f32 table (the recompute converts every cached K and V element)
const std::vector<float> & f16_table() {
    static const std::vector<float> table = [] {
        std::vector<float> x(65536);
        for (uint32_t i = 0; i < 65536; ++i) x[i] = ggml_fp16_to_fp32((ggml_fp16_t) i);
        return x;
    }();
    return table;
}

namespace {

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

}  // namespace

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
        if (tap->capture_q && is_q_target(tap, t, &il)) return true;
        if (tap->capture_q && layer_of(name, "kq_soft_max-") == 0) return true;
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

namespace {

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
        if (tap->capture_q) {
            // dump mode: keep layer 0's attention of the last ubatch, to check the dumped Q against
            if (il == 0) {
                tap->kq0_nkv = t->ne[0];
                tap->kq0_ntok = t->ne[1];
                tap->kq0.resize((size_t) (t->ne[0] * t->ne[1] * t->ne[2]));
                for (int64_t h = 0; h < t->ne[2]; ++h)
                    for (int64_t q = 0; q < t->ne[1]; ++q)
                        for (int64_t c = 0; c < t->ne[0]; ++c)
                            tap->kq0[(size_t) ((h * t->ne[1] + q) * t->ne[0] + c)] = f32_at(t, c, q, h);
            }
            return true;
        }
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

    if (tap->capture_q && is_q_target(tap, t, &il)) {
        if (t->type != GGML_TYPE_F32) fail("Qcur: unexpected " + shape_str(t));
        if ((int) tap->q_rows.size() < tap->n_layer) tap->q_rows.resize(tap->n_layer);
        auto & dst = tap->q_rows[il];
        for (int64_t tok = 0; tok < t->ne[2]; ++tok)
            for (int64_t h = 0; h < t->ne[1]; ++h)
                for (int64_t d = 0; d < t->ne[0]; ++d) dst.push_back(f32_at(t, d, h, tok));
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
        if ((is_k || is_v) && tap->hook) {
            const char * digits = std::strstr(name, is_k ? "cache_k_l" : "cache_v_l") + 9;
            char * end = nullptr;
            const long l = std::strtol(digits, &end, 10);
            if (end == digits || l < 0 || l >= tap->n_layer) fail(std::string("SET_ROWS: no layer in the name '") + name + "'");
            tap->hook->on_set_rows((int) l, is_v, t);
        }
        tap->stats.set_rows_calls++;
        return true;
    }
    return true;
}

}  // namespace

}  // namespace kvc_llama
