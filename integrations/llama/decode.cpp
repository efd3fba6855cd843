// kvc_llama_eval, contexts and the token-by-token decode loop (decode.hpp).
#include "decode.hpp"

#include "eval_tap.hpp"
#include "llama_state_parse.hpp"

#include "ggml-kvc.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace kvc_llama {

namespace {

// A llama_state_seq_get_data blob opens with llama.cpp's state magic and the sequence id,
// then the cache's own state (see parse_f16_state).
constexpr uint32_t kStateMagic = 0xaf143cd8u;
constexpr size_t kStateHeader = 8;

// The state container's parser: llama_state_parse.hpp (no llama calls; fuzzed alone) restates
// these; the dump, state, share and mlp modes read and write blobs with it.
static_assert(kvc_llama_state::kMagic == kStateMagic, "llama_state_parse.hpp's magic");
static_assert(kvc_llama_state::kGgmlTypeF16 == GGML_TYPE_F16, "llama_state_parse.hpp's GGML_TYPE_F16");
static_assert(kvc_llama_state::kStateSeqVersion == LLAMA_STATE_SEQ_VERSION, "llama_state_parse.hpp's state version");
static_assert(std::is_same<llama_pos, int32_t>::value, "CacheDump::pos holds llama_pos");

}  // namespace

CtxPtr make_context(llama_model * model, const Options & o, const CtxConfig & c) {
    llama_context_params p = llama_context_default_params();
    p.n_ctx = (uint32_t) c.n_ctx;
    p.n_batch = (uint32_t) std::max(c.n_batch, o.prompt);
    p.n_ubatch = 512;
    p.n_seq_max = 1;
    p.n_threads = o.threads;
    p.n_threads_batch = o.threads;
    p.flash_attn_type = c.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    p.type_k = c.type_k;
    p.type_v = c.type_v;
    p.kvc_kvq_plan = c.kvc_plan.empty() ? nullptr : c.kvc_plan.c_str();
    // each mode says its cache exactly: kvq by bits plain, a plan's protections only from the plan
    // (llama.cpp's default gives kvq by bits the protections)
    p.kvc_sink = 0;
    p.kvc_window = 0;
    p.kvc_window_bits = 0;
    p.kvc_k_center = 0;
    p.no_perf = true;
    if (c.tap) {
        p.cb_eval = eval_callback;
        p.cb_eval_user_data = c.tap;
    }
    g_llama_last_error.clear();
    llama_context * ctx = llama_init_from_model(model, p);
    if (!ctx) {
        std::string why = g_llama_last_error;
        while (!why.empty() && why.back() == '\n') why.pop_back();
        const std::string msg = "llama_init_from_model failed (n_ctx " + std::to_string(c.n_ctx) + ")" +
                                (why.empty() ? std::string() : ": " + why);
        // a cache type or plan llama.cpp refuses is bad input, not a crash
        if (!c.kvc_plan.empty() || ggml_kvc_type_info(c.type_k, nullptr, nullptr) ||
            ggml_kvc_type_info(c.type_v, nullptr, nullptr)) {
            throw UsageError(msg);
        }
        fail(msg);
    }
    return CtxPtr(ctx);
}

void decode_batch(llama_context * ctx, const std::vector<llama_token> & toks, int first, int n, llama_pos pos0,
                  const std::vector<bool> & want_logits) {
    llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        b.token[i] = toks[first + i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = want_logits[i] ? 1 : 0;
    }
    b.n_tokens = n;
    const int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    if (rc != 0) fail("llama_decode failed with status " + std::to_string(rc));
}

RefStore::RefStore() : f_(std::tmpfile()) {
    if (!f_) fail("cannot create a temporary file for the reference logits");
}

RefStore::~RefStore() { std::fclose(f_); }

void RefStore::append(const std::vector<float> & row) {
    if (std::fwrite(row.data(), sizeof(float), row.size(), f_) != row.size()) fail("reference write failed");
    rows_++;
}

void RefStore::rewind_for_read() { std::fflush(f_); std::rewind(f_); }

void RefStore::read(std::vector<float> & row, size_t n) {
    row.resize(n);
    if (std::fread(row.data(), sizeof(float), n, f_) != n) fail("reference read failed");
}

long state_cell_count(const std::vector<uint8_t> & s) {
    if (s.size() < kStateHeader + 8) return -1;
    uint32_t magic, n_stream, cells;
    int32_t seq;
    std::memcpy(&magic, s.data(), 4);
    std::memcpy(&seq, s.data() + 4, 4);
    std::memcpy(&n_stream, s.data() + 8, 4);
    std::memcpy(&cells, s.data() + 12, 4);
    if (magic != kStateMagic || seq != 0 || n_stream != 1) return -1;
    return (long) cells;
}

std::vector<uint8_t> get_seq_state(llama_context * ctx) {
    const size_t n = llama_state_seq_get_size(ctx, 0);
    std::vector<uint8_t> buf(n);
    const size_t got = llama_state_seq_get_data(ctx, buf.data(), buf.size(), 0);
    if (got == 0 || got > n) fail("llama_state_seq_get_data failed");
    buf.resize(got);
    return buf;
}

// Decodes `probe` after the cache's sequence 0, then clears the cache, loads `state` into
// sequence 0 and decodes it again: the largest difference between the two steps' logits.
static double state_round_trip(llama_context * ctx, const std::vector<uint8_t> & state, llama_token probe, int n_vocab) {
    auto step = [&]() {
        llama_token t = probe;
        const int rc = llama_decode(ctx, llama_batch_get_one(&t, 1));
        if (rc != 0) fail("state round trip: llama_decode failed with status " + std::to_string(rc));
        const float * l = llama_get_logits_ith(ctx, -1);
        return std::vector<float>(l, l + n_vocab);
    };
    const std::vector<float> before = step();
    llama_memory_clear(llama_get_memory(ctx), true);
    if (llama_state_seq_set_data(ctx, state.data(), state.size(), 0) != state.size()) {
        fail("state round trip: llama_state_seq_set_data refused the state llama.cpp saved");
    }
    const std::vector<float> after = step();
    double diff = 0.0;
    for (int i = 0; i < n_vocab; ++i) diff = std::max(diff, (double) std::fabs(before[i] - after[i]));
    return diff;
}

RunResult run_decode(llama_model * model, const ModelInfo & mi, const Options & o,
                     const std::vector<llama_token> & toks, RefStore & ref, const DecodeSpec & spec) {
    const int n = o.n_tokens;
    CtxPtr ctx = make_context(model, o, spec.cfg);
    llama_memory_t mem = llama_get_memory(ctx.get());
    double cell_bytes =
        spec.cell_bytes > 0 ? spec.cell_bytes : (double) mi.cell_bytes(spec.cfg.type_k, spec.cfg.type_v);
    const size_t full_cell_bytes = mi.cell_bytes(GGML_TYPE_F16, GGML_TYPE_F16);

    RunResult r;
    r.mode = spec.mode;
    r.alloc_bytes = (double) llama_n_ctx(ctx.get()) * (double) mi.cell_bytes(spec.cfg.type_k, spec.cfg.type_v);
    // what llama.cpp itself allocated for K and V (the patched build reports it)
    size_t alloc_k = 0, alloc_v = 0, alloc_buf = 0;
    if (llama_kvc_cache_bytes(ctx.get(), &alloc_k, &alloc_v, &alloc_buf)) {
        r.alloc_bytes = (double) (alloc_k + alloc_v);
        r.extra.push_back({"kv_alloc_k_bytes", std::to_string(alloc_k)});
        r.extra.push_back({"kv_alloc_v_bytes", std::to_string(alloc_v)});
        r.extra.push_back({"kv_buffer_bytes", std::to_string(alloc_buf)});
        if (spec.side_bytes_from_alloc) {
            // the cells as kvc's row sizes say; what is beyond them is the side bytes, measured per step
            if ((double) (alloc_k + alloc_v) < (double) llama_n_ctx(ctx.get()) * cell_bytes) {
                fail(spec.mode + ": llama.cpp reports fewer K and V bytes than its cells hold");
            }
        } else if (spec.cell_bytes_from_alloc) {
            const double alloc_cell = (double) (alloc_k + alloc_v) / (double) llama_n_ctx(ctx.get());
            if (spec.cell_bytes > 0 && alloc_cell != spec.cell_bytes) {
                fail(spec.mode + ": llama.cpp allocated " + json_num(alloc_cell) + " bytes per cell, kvc's rows are " +
                     json_num(spec.cell_bytes));
            }
            cell_bytes = alloc_cell;
        }
    } else if (spec.cell_bytes_from_alloc) {
        fail(spec.mode + ": llama_kvc_cache_bytes: the context has no KV cache");
    }

    std::vector<HeldToken> held;
    EvalTap * tap = spec.cfg.tap;
    if (spec.policy) spec.policy->bind(&held, tap);
    // after a llama_decode: the callback's error if any, and the cells of the new tokens
    auto after_decode = [&](size_t first_new) {
        if (!tap) return;
        if (!tap->error.empty()) fail(spec.mode + ": " + tap->error);
        if (!tap->want_set_rows) return;
        if (tap->decode_cells.size() != held.size() - first_new) {
            fail(spec.mode + ": SET_ROWS wrote " + std::to_string(tap->decode_cells.size()) + " cells for " +
                 std::to_string(held.size() - first_new) + " tokens");
        }
        for (size_t j = first_new; j < held.size(); ++j) held[j].cell = tap->decode_cells[j - first_new];
        tap->decode_cells.clear();
    };
    size_t peak = 0;
    std::vector<float> lp, lp_ref;
    double nll = 0.0, kl = 0.0, ratio_sum = 0.0;
    long scored = 0, ratio_steps = 0;
    if (!spec.is_reference) ref.rewind_for_read();

    // kvc's kvq cells: the bytes beside the cells now (K and V reported beyond the cells)
    double side_bytes_end = 0;
    auto side_bytes = [&]() -> double {
        if (!spec.side_bytes_from_alloc) return 0.0;
        size_t k = 0, v = 0, b = 0;
        if (!llama_kvc_cache_bytes(ctx.get(), &k, &v, &b)) fail(spec.mode + ": llama_kvc_cache_bytes failed");
        side_bytes_end = (double) (k + v) - (double) llama_n_ctx(ctx.get()) * cell_bytes;
        return side_bytes_end;
    };
    auto score = [&](const float * logits, int target_pos) {
        if (target_pos < o.ppl_from || target_pos >= n) return;
        log_softmax(logits, mi.n_vocab, lp);
        nll -= (double) lp[toks[target_pos]];
        if (spec.is_reference) {
            ref.append(lp);
        } else {
            ref.read(lp_ref, (size_t) mi.n_vocab);
            kl += kl_div(lp_ref, lp);
        }
        scored++;
        // memory at the moment this prediction was made: target_pos tokens seen
        const double bytes = (spec.held_bytes ? spec.held_bytes(held.size()) : (double) held.size() * cell_bytes + spec.fixed_bytes) +
                             side_bytes();
        ratio_sum += (double) target_pos * (double) full_cell_bytes / bytes;
        ratio_steps++;
    };

    // optional prompt as one batch
    llama_pos next_pos = 0;
    int i = 0;
    if (o.prompt > 0) {
        std::vector<bool> want(o.prompt);
        for (int j = 0; j < o.prompt; ++j) want[j] = j + 1 >= o.ppl_from;
        if (tap) tap->decode_cells.clear();
        decode_batch(ctx.get(), toks, 0, o.prompt, 0, want);
        for (int j = 0; j < o.prompt; ++j) held.push_back({j, j});
        after_decode(0);
        peak = held.size();
        for (int j = 0; j < o.prompt; ++j) {
            if (want[j]) score(llama_get_logits_ith(ctx.get(), j), j + 1);
        }
        next_pos = o.prompt;
        i = o.prompt;
    }

    llama_batch b = llama_batch_init(1, 0, 1);
    const double t0 = now_s();
    const int n_steps = n - i;
    try {
        for (; i < n; ++i) {
            if (spec.policy) {
                const auto plan = spec.policy->plan(held, i);
                if (!plan.empty()) {
                    apply_evictions(mem, held, plan, spec.shift_positions);
                    next_pos = spec.shift_positions ? (held.empty() ? 0 : held.back().pos + 1) : i;
                }
            }
            if (spec.editor) spec.editor->edit(ctx.get(), held, i);
            b.n_tokens = 1;
            b.token[0] = toks[i];
            b.pos[0] = next_pos;
            b.n_seq_id[0] = 1;
            b.seq_id[0][0] = 0;
            b.logits[0] = 1;
            if (tap) tap->decode_cells.clear();
            const int rc = llama_decode(ctx.get(), b);
            if (rc != 0) fail("llama_decode failed with status " + std::to_string(rc) + " at token " + std::to_string(i));
            held.push_back({next_pos, i});
            after_decode(held.size() - 1);
            peak = std::max(peak, held.size());
            next_pos++;
            if (i + 1 < n) score(llama_get_logits_ith(ctx.get(), -1), i + 1);
        }
    } catch (...) {
        llama_batch_free(b);
        throw;
    }
    llama_batch_free(b);
    const double dt = now_s() - t0;

    r.tok_s = n_steps / dt;
    r.n_scored = scored;
    r.ppl = std::exp(nll / (double) std::max<long>(1, scored));
    r.kl = spec.is_reference ? 0.0 : kl / (double) std::max<long>(1, scored);
    r.cells_end = (long) held.size();
    r.cells_peak = (long) peak;
    r.held_bytes_end =
        (spec.held_bytes ? spec.held_bytes(held.size()) : (double) held.size() * cell_bytes + spec.fixed_bytes) + side_bytes();
    if (spec.side_bytes_from_alloc) {
        r.extra.push_back({"kvq_cells_side_bytes_end", json_num(side_bytes_end)});
        // the window rows kept past the window (llama.cpp's --kvc-rollback): a sequence can be
        // taken back exactly by one more position than that
        llama_kvc_cache_info ki;
        if (llama_kvc_cache_get_info(ctx.get(), &ki)) r.extra.push_back({"kvc_exact_rollback", std::to_string(ki.rollback)});
    }
    r.held_ratio_end = (double) n * (double) full_cell_bytes / r.held_bytes_end;
    r.held_ratio_mean = ratio_steps ? ratio_sum / (double) ratio_steps : NAN;
    if (spec.side_bytes_from_alloc) {
        // kvc's kvq cells: the state carries them (kvc's saved cells after the rows); loaded
        // back into a cleared cache, the next step's logits must be the same
        const std::vector<uint8_t> st = get_seq_state(ctx.get());
        r.cells_verified = state_cell_count(st);
        r.extra.push_back({"state_seq_bytes", std::to_string(st.size())});
        // the cache is full: the round trip re-decodes its last token
        llama_memory_t m = llama_get_memory(ctx.get());
        const llama_pos last = llama_memory_seq_pos_max(m, 0);
        if (last < 0 || !llama_memory_seq_rm(m, 0, last, -1)) fail(spec.mode + ": llama_memory_seq_rm failed");
        const double diff = state_round_trip(ctx.get(), get_seq_state(ctx.get()), toks[n - 1], mi.n_vocab);
        r.extra.push_back({"state_round_trip_max_abs_logit_diff", json_num(diff)});
        if (diff != 0.0) {
            fail(spec.mode + ": after saving and loading the state, the next logits differ by up to " + json_num(diff));
        }
    } else {
        r.cells_verified = state_cell_count(get_seq_state(ctx.get()));
        r.extra.push_back({"state_seq_bytes", std::to_string(llama_state_seq_get_size(ctx.get(), 0))});
    }
    if (r.cells_verified != r.cells_end) {
        fail(spec.mode + ": llama.cpp holds " + std::to_string(r.cells_verified) + " cells, the harness counted " +
             std::to_string(r.cells_end));
    }
    if (spec.policy) r.detail = spec.policy->name();
    if (o.progress) {
        std::fprintf(stderr, "kvc_llama_eval: %s: PPL %.4f KL %.5f mean ratio %.4f end ratio %.4f cells %ld, %.1f tok/s\n",
                     spec.mode.c_str(), r.ppl, r.kl, r.held_ratio_mean, r.held_ratio_end, r.cells_end, r.tok_s);
        std::fflush(stderr);
    }
    return r;
}

std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool bos) {
    int n = -llama_tokenize(vocab, text.data(), (int32_t) text.size(), nullptr, 0, bos, false);
    if (n <= 0) fail("tokenization failed");
    std::vector<llama_token> toks(n);
    const int got = llama_tokenize(vocab, text.data(), (int32_t) text.size(), toks.data(), n, bos, false);
    if (got != n) fail("tokenization failed");
    return toks;
}

}  // namespace kvc_llama
