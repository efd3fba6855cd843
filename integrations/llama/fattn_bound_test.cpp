// fattn_bound_test: the flash-attention rounding bound (fattn_bound.hpp) against a software model
// of ggml-cpu's f16 flash-attention kernel (ggml_compute_forward_flash_attn_ext_f16_one_chunk:
// Q rounded to f16, q.k in f32, online softmax with expf, the V accumulator rounded to f16 after
// every multiply-add and every rescale, 1/S in f32), on synthetic rows shaped like a small
// model's attention (a heavy sink cell, outlier channels, long and short rows).
//
// Passes when (1) the modelled kernel's output lies within the bound on every row, and (2) each
// deliberate mistake — a wrong KV-head mapping, the heaviest cell missing, the scale 25 % off —
// lands outside the bound on every batch of rows (the scale on rows of up to 600 cells). A causal
// mask one cell short is measured and printed: on long rows it moves the output less than f16
// accumulation may. Exit status 0 on
// success, 1 with a message otherwise.
#include "fattn_bound.hpp"
#include "ggml.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

float r16(float x) { return ggml_fp16_to_fp32(ggml_fp32_to_fp16(x)); }

struct Head {
    std::vector<float> k, v;  // [n_kv][D], values already f16-representable
};

Head make_head(std::mt19937_64 & rng, int64_t n_kv, int64_t D, const std::vector<float> & q) {
    std::normal_distribution<float> g(0.0f, 1.0f);
    Head h;
    h.k.resize((size_t) (n_kv * D));
    h.v.resize((size_t) (n_kv * D));
    for (int64_t c = 0; c < n_kv; ++c) {
        for (int64_t d = 0; d < D; ++d) {
            // K: a few outlier channels, as post-RoPE K has; V: mostly small, some large
            const float ks = (d % 16 == 3) ? 6.0f : 1.0f;
            h.k[c * D + d] = r16(ks * g(rng));
            h.v[c * D + d] = r16((d % 21 == 5 ? 4.0f : 0.7f) * g(rng));
        }
    }
    // cell 0 is an attention sink: its logit about 4 above the others' spread
    double qq = 0.0;
    for (float x : q) qq += (double) x * x;
    const float a = (float) (4.0 * std::sqrt((double) D) / qq);
    for (int64_t d = 0; d < D; ++d) h.k[d] = r16(h.k[d] + a * q[d]);
    return h;
}

// the kernel's arithmetic, row by row (cells in index order, masked cells skipped)
std::vector<double> kernel_row(const std::vector<float> & q, const Head & h, const std::vector<uint8_t> & live,
                               float scale, int64_t D) {
    const int64_t n_kv = (int64_t) live.size();
    std::vector<float> q16((size_t) D), acc((size_t) D, 0.0f);
    for (int64_t d = 0; d < D; ++d) q16[d] = r16(q[d]);
    float S = 0.0f, M = -INFINITY;
    for (int64_t c = 0; c < n_kv; ++c) {
        if (!live[c]) continue;
        float s = 0.0f;
        for (int64_t d = 0; d < D; ++d) s = std::fma(q16[d], h.k[c * D + d], s);
        s *= scale;
        const float Mold = M;
        float ms = 1.0f, vs = 1.0f;
        if (s > M) {
            M = s;
            ms = std::exp(Mold - M);
            for (int64_t d = 0; d < D; ++d) acc[d] = r16(acc[d] * ms);
        } else {
            vs = std::exp(s - M);
        }
        for (int64_t d = 0; d < D; ++d) acc[d] = r16(std::fma(h.v[c * D + d], vs, acc[d]));
        S = S * ms + vs;
    }
    const float inv = 1.0f / S;
    std::vector<double> o((size_t) D);
    for (int64_t d = 0; d < D; ++d) o[d] = (double) (acc[d] * inv);
    return o;
}

void logits_of(const std::vector<float> & q, const Head & h, const std::vector<uint8_t> & live, double scale,
               int64_t D, std::vector<double> & logits, std::vector<double> * qk_abs, std::vector<double> * qk_sq) {
    const size_t n_kv = live.size();
    logits.assign(n_kv, -INFINITY);
    if (qk_abs) qk_abs->assign(n_kv, 0.0);
    if (qk_sq) qk_sq->assign(n_kv, 0.0);
    for (size_t c = 0; c < n_kv; ++c) {
        if (!live[c]) continue;
        double dot = 0.0, mag = 0.0, sq = 0.0;
        for (int64_t d = 0; d < D; ++d) {
            const double x = (double) q[d] * h.k[c * D + d];
            dot += x;
            mag += std::fabs(x);
            sq += x * x;
        }
        logits[c] = scale * dot;
        if (qk_abs) (*qk_abs)[c] = mag;
        if (qk_sq) (*qk_sq)[c] = sq;
    }
}

}  // namespace

int main() {
    const int64_t D = 64;
    const float scale = 1.0f / std::sqrt((float) D);
    std::mt19937_64 rng(20261124);
    std::normal_distribution<float> g(0.0f, 1.0f);
    double worst = 0.0, worst_wc = 0.0, head_min = INFINITY, cell_min = INFINITY, scale_min = INFINITY, mask_min = INFINITY;
    int rows = 0, batches = 0;
    for (int64_t n_kv : {16, 64, 320, 600, 2048}) {
        for (int batch = 0; batch < 6; ++batch) {
            // one batch: 8 query rows over one layer's two KV heads, as one checked call
            double head_b = 0.0, cell_b = 0.0, scale_b = 0.0, mask_b = 0.0;
            for (int r = 0; r < 8; ++r) {
                std::vector<float> q((size_t) D);
                for (int64_t d = 0; d < D; ++d) q[d] = g(rng) * (batch % 2 ? 2.0f : 0.8f);
                const Head h = make_head(rng, n_kv, D, q), other = make_head(rng, n_kv, D, q);
                // causal: the row sees a prefix of the cells; some cells in the middle evicted
                const int64_t visible = n_kv - (r % 3);
                std::vector<uint8_t> live((size_t) n_kv, 0);
                for (int64_t c = 0; c < visible; ++c) live[c] = (c % 37 != 11);
                std::vector<double> logits, qk_abs, qk_sq, p, exact, bound, bound_wc, ctrl, lc, pc;
                logits_of(q, h, live, scale, D, logits, &qk_abs, &qk_sq);
                fattn::softmax(logits, p);
                fattn::attend(p, h.v.data(), D, exact);
                fattn::output_bound(p, live, qk_abs, qk_sq, scale, h.v.data(), D, exact, false, bound);
                fattn::output_bound(p, live, qk_abs, qk_sq, scale, h.v.data(), D, exact, true, bound_wc);
                const std::vector<double> node = kernel_row(q, h, live, scale, D);
                worst = std::max(worst, fattn::excess(exact, node, bound));
                worst_wc = std::max(worst_wc, fattn::excess(exact, node, bound_wc));
                rows++;
                // controls, measured against the kernel's output as the harness does
                logits_of(q, other, live, scale, D, lc, nullptr, nullptr);
                fattn::softmax(lc, pc);
                fattn::attend(pc, other.v.data(), D, ctrl);
                head_b = std::max(head_b, fattn::excess(ctrl, node, bound));
                if (fattn::without_top_cell(p, h.v.data(), D, exact, ctrl)) cell_b = std::max(cell_b, fattn::excess(ctrl, node, bound));
                logits_of(q, h, live, 0.75 * scale, D, lc, nullptr, nullptr);
                fattn::softmax(lc, pc);
                fattn::attend(pc, h.v.data(), D, ctrl);
                scale_b = std::max(scale_b, fattn::excess(ctrl, node, bound));
                // causal mask one cell short: the newest visible cell hidden
                std::vector<uint8_t> short_live = live;
                for (int64_t c = visible - 1; c >= 0; --c)
                    if (short_live[c]) {
                        short_live[c] = 0;
                        break;
                    }
                logits_of(q, h, short_live, scale, D, lc, nullptr, nullptr);
                fattn::softmax(lc, pc);
                fattn::attend(pc, h.v.data(), D, ctrl);
                mask_b = std::max(mask_b, fattn::excess(ctrl, node, bound));
            }
            head_min = std::min(head_min, head_b);
            cell_min = std::min(cell_min, cell_b);
            // on a 2048-cell flat row a quarter off the scale barely reweights the cells: required
            // up to the longest rows the harness checks (its budgets stay under 1200 cells)
            if (n_kv <= 600) scale_min = std::min(scale_min, scale_b);
            if (std::getenv("FATTN_DEBUG")) std::printf("n_kv %lld batch %d: head %.2f cell %.2f scale %.2f mask %.3f\n", (long long) n_kv, batch, head_b, cell_b, scale_b, mask_b);
            mask_min = std::min(mask_min, mask_b);
            batches++;
        }
    }
    std::printf("fattn_bound_test: %d rows, %d batches; kernel error / bound max %.4f (worst-case bound: %.4f); "
                "weakest control (error / bound, min over batches): wrong head %.1f, missing cell %.1f, scale x0.75 %.1f, "
                "mask one short %.2f\n",
                rows, batches, worst, worst_wc, head_min, cell_min, scale_min, mask_min);
    if (!(worst <= 1.0)) {
        std::fprintf(stderr, "fattn_bound_test: the modelled kernel exceeds the bound (%.4f)\n", worst);
        return 1;
    }
    // a causal mask one cell short moves the output by about |v| / n, less than f16 accumulation
    // may lawfully do on a long row; it is printed, not required (the harness checks the cell
    // mapping of the attention separately)
    if (!(head_min > 1.0 && cell_min > 1.0 && scale_min > 1.0)) {
        std::fprintf(stderr, "fattn_bound_test: a deliberate mistake stays inside the bound\n");
        return 1;
    }
    std::printf("fattn_bound_test: passed\n");
    return 0;
}
