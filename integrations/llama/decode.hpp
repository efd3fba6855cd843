// kvc_llama_eval, contexts and the token-by-token decode loop every PPL/KL mode runs through.
// Part of the one kvc_llama_eval program (one translation unit: kvc_llama_eval.cpp includes
// every part in this order; each part includes the one before it).
#pragma once

#include "kvc_h2o_policy.hpp"

namespace {

// ------------------------------------------------------------------------------------------
// contexts and decoding

struct CtxDeleter {
    void operator()(llama_context * c) const { llama_free(c); }
};
using CtxPtr = std::unique_ptr<llama_context, CtxDeleter>;

struct CtxConfig {
    int n_ctx = 0;
    int n_batch = 512;
    ggml_type type_k = GGML_TYPE_F16;
    ggml_type type_v = GGML_TYPE_F16;
    bool flash_attn = false;
    EvalTap * tap = nullptr;
    std::string kvc_plan;  // a kvq plan file: per-layer kvq cache types (patched llama.cpp)
};

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

// decodes tokens [first, first+n) at positions pos0.. in one llama_decode (split into ubatches
// by llama.cpp); logits for the positions flagged by want_logits
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

// Reference log-softmax rows of the full-cache run, kept in a temporary file and read back in
// order by the other modes (1535 rows x 49152 floats would be 300 MB in memory).
class RefStore {
public:
    RefStore() : f_(std::tmpfile()) {
        if (!f_) fail("cannot create a temporary file for the reference logits");
    }
    ~RefStore() { std::fclose(f_); }
    RefStore(const RefStore &) = delete;
    RefStore & operator=(const RefStore &) = delete;
    void append(const std::vector<float> & row) {
        if (std::fwrite(row.data(), sizeof(float), row.size(), f_) != row.size()) fail("reference write failed");
        rows_++;
    }
    void rewind_for_read() { std::fflush(f_); std::rewind(f_); }
    void read(std::vector<float> & row, size_t n) {
        row.resize(n);
        if (std::fread(row.data(), sizeof(float), n, f_) != n) fail("reference read failed");
    }
    long rows() const { return rows_; }

private:
    std::FILE * f_;
    long rows_ = 0;
};

struct RunResult {
    std::string mode;
    std::string detail;
    double ppl = NAN;
    double kl = NAN;
    long n_scored = 0;
    double tok_s = NAN;          // token-by-token part only
    double held_bytes_end = 0;   // occupied cells at the end x bytes per cell
    double held_ratio_end = NAN; // full f16 bytes of all tokens / held bytes, at the end
    double held_ratio_mean = NAN;// mean over the scored steps of (full f16 bytes so far / held)
    double alloc_bytes = 0;      // the cache llama.cpp allocated (kv_size cells)
    long cells_end = 0;
    long cells_verified = -1;    // cells in llama_state_seq_get_data at the end
    long cells_peak = 0;         // most cells held at any step
    std::vector<std::pair<std::string, std::string>> extra;  // JSON-ready key -> value
};

// A llama_state_seq_get_data blob opens with llama.cpp's state magic and the sequence id,
// then the cache's own state (see parse_f16_state).
constexpr uint32_t kStateMagic = 0xaf143cd8u;
constexpr size_t kStateHeader = 8;

// The state blob of sequence 0: the cell count of its (single) stream, or -1.
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

// Changes the cache itself (not only which cells stay) before a decode step: the mlp modes
// rewrite the sequence's state with fewer cells (mlp_mode.hpp). It keeps `held` in step with
// what llama.cpp holds, in position order, and never moves a position: the next token goes in
// at its true position.
class CacheEditor {
public:
    virtual ~CacheEditor() = default;
    // Called before the single-token decode of token n_seen (n_seen tokens decoded so far).
    virtual void edit(llama_context * ctx, std::vector<HeldToken> & held, int n_seen) = 0;
};

struct DecodeSpec {
    std::string mode;
    CtxConfig cfg;
    EvictionPolicy * policy = nullptr;  // null: nothing is evicted
    CacheEditor * editor = nullptr;     // null: the cache is not rewritten
    bool shift_positions = true;
    bool is_reference = false;
    // memory accounting other than the cache type's (C8: int8 bytes per cell + the scales)
    double cell_bytes = 0;   // 0: the cache type's row sizes
    // the cache's bytes per cell are what llama.cpp allocated (llama_kvc_cache_bytes / cells);
    // with cell_bytes > 0 as well, the two must agree exactly
    bool cell_bytes_from_alloc = false;
    double fixed_bytes = 0;  // held whatever the cell count
    // when set, the bytes held with n cells, in place of n * cell_bytes + fixed_bytes (a cache
    // whose bytes per cell change as groups fill)
    std::function<double(size_t)> held_bytes;
};

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
        if (spec.cell_bytes_from_alloc) {
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
        const double bytes = spec.held_bytes ? spec.held_bytes(held.size()) : (double) held.size() * cell_bytes + spec.fixed_bytes;
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
        spec.held_bytes ? spec.held_bytes(held.size()) : (double) held.size() * cell_bytes + spec.fixed_bytes;
    r.held_ratio_end = (double) n * (double) full_cell_bytes / r.held_bytes_end;
    r.held_ratio_mean = ratio_steps ? ratio_sum / (double) ratio_steps : NAN;
    r.cells_verified = state_cell_count(get_seq_state(ctx.get()));
    r.extra.push_back({"state_seq_bytes", std::to_string(llama_state_seq_get_size(ctx.get(), 0))});
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

// ------------------------------------------------------------------------------------------
// kvq rows, alone or combined with another mode (kvq_hooks.hpp)

// One kvq row's quantizer, hook and memory accounting, from a "kvq:CONFIG" / "kvq-plan:FILE"
// mode string; attach() sets a decode up with it, finish() checks and reports what it did.
struct KvqSetup {
    std::string config;
    bool from_plan;
    std::string plan_json;
    KvqPtr kvq;
    std::unique_ptr<KvqPtr> window;  // --kvq-recent-bits B <= 8: the window as kvq k<B>v<B> rows
    double k_bits = 0, v_bits = 0, cell = 0, f16_cell = 0, window_cell = 0;
    int sink, recent, window_bits;
    bool center;
    KvqRoundTripHook hook;

    KvqSetup(const std::string & kvq_mode, const ModelInfo & mi, const Options & o)
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
        window_cell = window ? kvq_cell_bytes(window->q, mi) : f16_cell;
    }

    void attach(EvalTap & tap, DecodeSpec & s) {
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

    // Checks the hook saw every row SET_ROWS wrote, adds kvq's numbers to the row and returns
    // the detail text.
    std::string finish(const EvalTap & tap, RunResult & r) const {
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
