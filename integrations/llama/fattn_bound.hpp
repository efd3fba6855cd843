// fattn_bound: how far llama.cpp's CPU flash attention may lawfully be from exact attention.
//
// The harness recomputes each flash-attention call in double (eval_tap.cpp,
// on_flash_attn) to get the per-cell attention that eviction policies need, and checks its
// output against the node's. The allowed difference is not a constant: it is derived here,
// per output element, from the arithmetic the kernel does (ggml-cpu ops.cpp,
// ggml_compute_forward_flash_attn_ext_f16_one_chunk, the least precise of its three paths):
//
//  1. Q is rounded to f16 (K's vec_dot_type) and q.k is summed in f32 lanes, so a score is off
//     by at most  ds_c = scale * (u16 + D * u32) * sum_d |q_d k_cd|.  A score error moves the
//     output by sum_c p_c ds_c (v_cd - o_d), at most  sum_c p_c ds_c |v_cd - o_d|.
//  2. The V accumulator is f16 (VKQ16). Each unmasked cell is one fused multiply-add rounded to
//     f16 and, on a new running maximum, one rescale rounded to f16: two roundings of at most
//     u16 times the accumulator's magnitude. In the units of the final output the accumulator
//     after cell t is sum_{c<=t} p_c v_cd, whose magnitude is at most the prefix
//     A_t = sum_{c<=t} p_c |v_cd|; this also holds when the split-KV path accumulates chunks
//     apart and merges them in f32. So this part is at most  2 * u16 * sum_t A_t.
//  3. expf, the f32 running sum S and the final 1/S: a few f32 roundings per cell, at most
//     (8 + n) * u32 * sum_c p_c |v_cd|.
//
// Summed at their largest and all the same way (worst_case = true) these make a rigorous
// first-order bound; but on a long, flat row it grows as n while the output does not, and then a
// real mistake hides inside it. The check therefore uses the probabilistic rule of Higham and
// Mary (SIAM J. Sci. Comput. 41(5), 2019): roundings are independent, zero-mean and bounded, so
// by Hoeffding's inequality their sum exceeds lambda times the root of the sum of their squared
// bounds with probability at most 2 exp(-lambda^2 / 2); lambda = 7 makes that 5e-11 per output
// element. Parts 2 and the Q rounding of part 1 are summed that way; part 3 stays worst case.
// The rule holds on any x86-64 build: AVX2 and AVX-512 change only the order of f32 sums and
// where f16 roundings fall, which it already allows for; it scales with the output's magnitude.
// The tiled path (prompt batches, f32 throughout) and the split-KV path (long decodes, f16 chunks
// merged in f32) are at least as precise as the one-chunk path modelled here.
//
// It must still catch real mistakes: kvc_llama_eval measures, on every checked call, that a
// wrong KV-head mapping, a missing cell and a 25 % scale error each exceed it (negative
// controls), and fattn_bound_test.cpp checks both the kernel's error and those controls on
// synthetic rows through a software model of the kernel's f16 arithmetic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace fattn {

constexpr double kU16 = 1.0 / 2048.0;      // unit roundoff of f16 (11-bit significand), 2^-11
constexpr double kU32 = 1.0 / 16777216.0;  // unit roundoff of f32, 2^-24

// Softmax of one row of logits (scale * q.k + mask; -inf where masked), in double.
// Returns false when every cell is masked.
inline bool softmax(const std::vector<double> & logits, std::vector<double> & p) {
    double mx = -INFINITY;
    for (double l : logits) mx = std::max(mx, l);
    p.assign(logits.size(), 0.0);
    if (!std::isfinite(mx)) return false;
    double sum = 0.0;
    for (size_t c = 0; c < logits.size(); ++c) {
        if (logits[c] == -INFINITY) continue;
        p[c] = std::exp(logits[c] - mx);
        sum += p[c];
    }
    for (double & x : p) x /= sum;
    return true;
}

// out[d] = sum_c p_c v_cd, V rows [n_kv][D] (row stride D).
inline void attend(const std::vector<double> & p, const float * v, int64_t D, std::vector<double> & out) {
    out.assign((size_t) D, 0.0);
    for (size_t c = 0; c < p.size(); ++c) {
        if (p[c] == 0.0) continue;
        const float * vr = v + c * D;
        for (int64_t d = 0; d < D; ++d) out[d] += p[c] * vr[d];
    }
}

// The bound of the header comment, per output element. live[c] is false for masked cells (the
// kernel skips them: no rounding); qk_abs[c] = sum_d |q_d k_cd| and qk_sq[c] = sum_d (q_d k_cd)^2;
// o is the exact output.
//
// worst_case = true adds every rounding at its largest, the same way (rigorous, but on a long,
// flat row it grows as n while the output does not, and then it cannot tell a real mistake from
// rounding). worst_case = false is the probabilistic rule of Higham and Mary (SIAM J. Sci.
// Comput. 2019): roundings are independent, zero-mean and bounded, so by Hoeffding's inequality
// their sum exceeds lambda * sqrt(sum of squared bounds) with probability at most
// 2 exp(-lambda^2 / 2); lambda = 7 gives 5e-11 per element.
inline void output_bound(const std::vector<double> & p, const std::vector<uint8_t> & live,
                         const std::vector<double> & qk_abs, const std::vector<double> & qk_sq, double scale,
                         const float * v, int64_t D, const std::vector<double> & o, bool worst_case,
                         std::vector<double> & bound) {
    constexpr double lambda = 7.0;
    bound.assign((size_t) D, 0.0);
    int64_t n_live = 0;
    for (uint8_t l : live) n_live += l;
    for (int64_t d = 0; d < D; ++d) {
        double prefix = 0.0, prefix_sum = 0.0, prefix_sq = 0.0, score_part = 0.0;
        for (size_t c = 0; c < p.size(); ++c) {
            if (!live[c]) continue;
            const double vd = v[c * D + d];
            prefix += p[c] * std::fabs(vd);
            prefix_sum += prefix;
            prefix_sq += prefix * prefix;
            // Q's f16 rounding errors are shared by every cell of the row: summed over d per cell
            const double ds = worst_case ? std::fabs(scale) * (kU16 + (double) D * kU32) * qk_abs[c]
                                         : std::fabs(scale) * (lambda * kU16 * std::sqrt(qk_sq[c]) + (double) D * kU32 * qk_abs[c]);
            score_part += p[c] * ds * std::fabs(vd - o[d]);
        }
        // two f16 roundings per cell (multiply-add, rescale), each at most u16 times the prefix
        const double acc_part = worst_case ? 2.0 * kU16 * prefix_sum : lambda * kU16 * std::sqrt(2.0 * prefix_sq);
        bound[d] = score_part + acc_part + (8.0 + (double) n_live) * kU32 * prefix;
    }
}

// max_d |a_d - b_d| / bound_d: above 1 means the difference is more than rounding can explain.
inline double excess(const std::vector<double> & a, const std::vector<double> & b, const std::vector<double> & bound) {
    double worst = 0.0;
    for (size_t d = 0; d < a.size(); ++d) {
        const double e = std::fabs(a[d] - b[d]);
        // a zero bound (an all-zero V column) allows no difference at all
        worst = std::max(worst, bound[d] > 0.0 ? e / bound[d] : (e > 0.0 ? INFINITY : 0.0));
    }
    return worst;
}

// The output without the cell of largest weight, the rest renormalized (the "missing cell"
// control). Returns false when that cell holds (almost) all the weight.
inline bool without_top_cell(const std::vector<double> & p, const float * v, int64_t D, const std::vector<double> & o,
                             std::vector<double> & out) {
    size_t top = 0;
    for (size_t c = 1; c < p.size(); ++c)
        if (p[c] > p[top]) top = c;
    const double rest = 1.0 - p[top];
    if (rest < 1e-3) return false;
    out.resize((size_t) D);
    for (int64_t d = 0; d < D; ++d) out[d] = (o[d] - p[top] * v[top * D + d]) / rest;
    return true;
}

}  // namespace fattn
