// kvc_llama_eval: kvc's quality and memory harness inside llama.cpp, built against llama.h only.
//
// It decodes a text token by token (batch of 1 after an optional prompt) and reports, per mode:
// perplexity over the positions after a warm-up, mean KL divergence of the next-token
// distribution against the full-cache reference run, tokens/s, and the KV memory actually held
// (bytes, and the ratio to the full f16 cache). Modes:
//   full       f16 cache, flash attention off: the reference every other mode is compared with
//   streaming  sink + recent window eviction through llama_memory_seq_rm, positions shifted
//              (llama_memory_seq_add) or kept; the policy is an EvictionPolicy object so that
//              kvc's policy plugs in through the C API later
//   q8_0 q4_0  llama.cpp's own quantized cache types (flash attention on), comparison rows;
//              q8_0-q4_0 is q8_0 K with q4_0 V
//   kvq:CFG    kvc's kvq rows (rotation, 2-8-bit codes) at the SET_ROWS write path;
//              kvq-plan:FILE the same with per-layer bits from a kvq plan (kvc quant plan);
//              kvq-kc<G>:CFG K per channel over groups of G tokens (KIVI), V as CFG's kvq rows
//   probe      the eval-callback plumbing the kvc modes need: kq_soft_max-<il> column sums per
//              cell, the SET_ROWS index (cell) of every new token, and a hook on Kcur-<il> /
//              Vcur-<il> before SET_ROWS writes them (identity for now); checks what it sees and
//              measures its overhead
//   dump       every layer's post-RoPE K and V as the cache holds them, in the realkv format
//              (raw + JSON sidecar), compared bit for bit with a reference directory
//   state      llama_state_seq_get_data / set_data round trip into a fresh context, next-token
//              logits compared bit for bit, truncated state rejected
//   share      (only when asked for) a prefix prefilled by this process and stored through kvc's
//              tiers (disk, or Redis with --redis), restored by --share-clients other processes
//              with fresh contexts, the logits after it compared bit for bit
//   mlp@F      kvc-mlp's learned compressor (--mlp-weights) on the older cells, in place, by
//              rewriting the sequence state with fewer cells; mlp-meanpool@F the same with
//              generated weights computing each group's mean (a baseline)
//   BASE+kvq:CFG an mlp mode or a kvc_h2o eviction (h2o, kvc-streaming, at every --kv-ratios,
//              or h2o@R, kvc-streaming@R) with every held cell a kvq cell (mlp@4+kvq:k8v4,
//              h2o@4.75+kvq:k4v4; BASE+kvq-plan:FILE likewise): memory in kvq's packed bytes
// Output: a table on stdout and, with --json FILE, the same numbers as JSON.
// Bad input (missing files, bad options, a text too short) exits with status 2 and one line.
//
// The program is one translation unit split along its modes; each part includes the one before:
//   eval_common.hpp      options, errors, small helpers, model facts
//   eviction_policy.hpp  the eviction seam and the local sink + window policy
//   eval_tap.hpp         the eval callback: attention per cell (softmax, or the flash-attention
//                        recompute checked with fattn_bound.hpp), row hooks, SET_ROWS checks
//   kvc_api.hpp          kvc through include/kvc.h: status checks, H2O budgets
//   c8_hooks.hpp         C8 through kvc_quant
//   kvq_hooks.hpp        kvq (rotated 2-8-bit packed rows) through kvc_kvq
//   kvc_h2o_policy.hpp   kvc's H2O / StreamingLLM as an EvictionPolicy
//   decode.hpp           contexts and the decode loop of every PPL/KL mode
//   dump_mode.hpp        the realkv-format dump and its comparison
//   state_mode.hpp       the sequence state, saved, restored and through kvc's codec
//   share_mode.hpp       a prefix shared between processes through kvc's tiers
//   mlp_mode.hpp         kvc-mlp's compressor on the older cells, through the sequence state
//   kvq_native_mode.hpp  llama.cpp's cache in kvc's kvq ggml types (patched build), decode speed
//   report.hpp           the table and the JSON
// and this file: which modes run, in order (run), and main.

#include "report.hpp"

namespace {

int run(int argc, char ** argv) {
    const Options o = parse_options(argc, argv);
    llama_log_set(quiet_log, o.verbose ? (void *) 1 : nullptr);
    llama_backend_init();

    {
        std::ifstream probe(o.model, std::ios::binary);
        if (!probe) throw UsageError("cannot read model '" + o.model + "'");
    }
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(o.model.c_str(), mp);
    if (!model) throw UsageError("cannot load model '" + o.model + "' (not a GGUF llama.cpp can read?)");
    std::unique_ptr<llama_model, void (*)(llama_model *)> model_guard(model, llama_model_free);

    ModelInfo mi;
    mi.n_layer = llama_model_n_layer(model);
    mi.n_head = llama_model_n_head(model);
    mi.n_head_kv = llama_model_n_head_kv(model);
    mi.head_dim = llama_model_n_embd(model) / std::max(1, mi.n_head);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    mi.n_vocab = llama_vocab_n_tokens(vocab);
    char desc[256];
    llama_model_desc(model, desc, sizeof desc);
    mi.desc = desc;
    mi.file = base_name(o.model);
    // a share-mode process 2, started by process 1: restore, decode, write its files, nothing else
    if (!o.share_child.empty()) return run_share_child(model, mi, o);
    const std::vector<std::string> args(argv, argv + argc);
    const bool share_only = o.modes.size() == 1 && o.modes[0] == "share";
    // every --mlp-weights file fits the model and every mlp mode has its file, before any decoding
    const MlpSet mlp_set = load_mlp_set(o, mi);

    std::vector<TextReport> reports;
    TapStats probe_stats;
    bool have_probe = false;
    int text_no = 0;
    for (const auto & path : o.texts) {
        const std::string text = read_file(path);
        const auto toks = tokenize(vocab, text, o.bos);
        if ((int) toks.size() < o.n_tokens) {
            throw UsageError("'" + path + "' has " + std::to_string(toks.size()) + " tokens, fewer than --n-tokens " +
                             std::to_string(o.n_tokens));
        }
        TextReport rep;
        rep.path = path;
        rep.tokens_total = (long) toks.size();
        RefStore ref;

        double full_tok_s = NAN;
        if (!share_only) {  // share compares with its own prefilled process
            DecodeSpec full;
            full.mode = "full";
            full.cfg.n_ctx = o.n_tokens;
            full.is_reference = true;
            rep.rows.push_back(run_decode(model, mi, o, toks, ref, full));
            full_tok_s = rep.rows.back().tok_s;
        }

        if (has_mode(o, "streaming")) {
            SinkWindowPolicy pol(o.sink, o.recent, o.ratio, o.trigger, o.interval, o.budget == "adaptive", o.n_tokens);
            DecodeSpec s;
            s.mode = "streaming";
            s.cfg.n_ctx = std::max(pol.max_cells() + 1, o.prompt + 1);
            s.policy = &pol;
            s.shift_positions = o.positions == "shift";
            RunResult r = run_decode(model, mi, o, toks, ref, s);
            r.detail = "sink " + std::to_string(o.sink) + " + window, " + o.budget + " 1/" + json_num(o.ratio) +
                       ", positions " + o.positions;
            rep.rows.push_back(r);
        }
        // one kvc_h2o row: mode kvc-streaming, h2o or h2o-fa at eviction ratio R (cells), its
        // held cells kvq cells when kvq_mode is given (the "+kvq:" combined modes)
        auto run_evict = [&](const std::string & mode, double R, const std::string & kvq_mode) {
            const bool fa = mode == "h2o-fa";
            const KvcBudget bud = kvc_budget(R, o);
            KvcH2oPolicy pol(mi, o, mode == "kvc-streaming", bud);
            EvalTap tap(mi);
            std::unique_ptr<KvqSetup> kq;
            DecodeSpec s;
            if (!kvq_mode.empty()) {
                kq.reset(new KvqSetup(kvq_mode, mi, o));
                kq->attach(tap, s);
            }
            tap.want_set_rows = true;
            tap.want_kq = !fa;
            tap.want_fattn = fa;
            tap.scorer = &pol;
            s.mode = mode + "@" + json_num(R) + (kvq_mode.empty() ? "" : "+" + kvq_mode);
            s.cfg.n_ctx = o.n_tokens;
            s.cfg.flash_attn = fa;
            s.cfg.tap = &tap;
            s.policy = &pol;
            s.shift_positions = o.positions == "shift";
            RunResult r = run_decode(model, mi, o, toks, ref, s);
            pol.report(r.extra);
            if (fa) {
                r.extra.push_back({"fattn_recompute_max_out_err", json_num(tap.fattn_max_out_err)});
                r.extra.push_back({"fattn_checked_calls", std::to_string(tap.fattn_checked)});
                r.extra.push_back({"fattn_err_over_bound", json_num(tap.fattn_max_excess)});
                r.extra.push_back({"fattn_control_head_caught", std::to_string(tap.fattn_ctrl_head_caught)});
                r.extra.push_back({"fattn_control_head_calls", std::to_string(tap.fattn_ctrl_head_calls)});
                r.extra.push_back({"fattn_control_cell_caught", std::to_string(tap.fattn_ctrl_cell_caught)});
                r.extra.push_back({"fattn_control_scale_caught", std::to_string(tap.fattn_ctrl_scale_caught)});
                // within the rounding bound of fattn_bound.hpp (derived from the kernel's f16
                // arithmetic, not tuned to one machine), and every checked call able to fail:
                // each deliberate mistake lands outside the same bound
                if (!(tap.fattn_checked > 0 && tap.fattn_max_excess <= 1.0)) {
                    fail(s.mode + ": recomputed attention output differs from llama.cpp's by " +
                         json_num(tap.fattn_max_out_err) + ", " + json_num(tap.fattn_max_excess) +
                         " times the rounding bound");
                }
                if (tap.fattn_ctrl_head_caught != tap.fattn_ctrl_head_calls ||
                    tap.fattn_ctrl_cell_caught != tap.fattn_checked || tap.fattn_ctrl_scale_caught != tap.fattn_checked) {
                    fail(s.mode + ": the attention check missed a deliberate mistake (caught: wrong head " +
                         std::to_string(tap.fattn_ctrl_head_caught) + ", missing cell " +
                         std::to_string(tap.fattn_ctrl_cell_caught) + ", scale " +
                         std::to_string(tap.fattn_ctrl_scale_caught) + " of " + std::to_string(tap.fattn_checked) +
                         " calls)");
                }
            }
            if (!(pol.unmapped_max() < 1e-3)) {
                fail(s.mode + ": " + json_num(pol.unmapped_max()) + " of the attention fell on cells the harness does not hold");
            }
            char buf[200];
            std::snprintf(buf, sizeof buf, "%s, cap %d cells (sink %d, recent %d, block %d), positions %s%s",
                          pol.name().c_str(), bud.cap, o.sink, bud.recent, o.block, o.positions.c_str(),
                          fa ? ", flash attention on (scores recomputed)" : "");
            r.detail = buf;
            if (kq) r.detail += "; " + kq->finish(tap, r);
            rep.rows.push_back(r);
        };
        for (double R : o.kv_ratios) {
            for (const char * m : {"kvc-streaming", "h2o", "h2o-fa"}) {
                if (has_mode(o, m)) run_evict(m, R, "");
            }
            for (const auto & m : o.modes) {  // h2o+kvq:CONFIG, kvc-streaming+kvq-plan:FILE, ...
                std::string base, kvq_mode;
                if (split_kvq_suffix(m, &base, &kvq_mode) && (base == "h2o" || base == "kvc-streaming")) {
                    run_evict(base, R, kvq_mode);
                }
            }
        }
        for (const auto & m : o.modes) {  // h2o@R, kvc-streaming@R, each with an optional +kvq suffix
            std::string base = m, kvq_mode;
            split_kvq_suffix(m, &base, &kvq_mode);
            const auto at = base.find('@');
            if (at == std::string::npos) continue;
            const std::string name = base.substr(0, at);
            if (name == "h2o" || name == "kvc-streaming") run_evict(name, std::atof(base.c_str() + at + 1), kvq_mode);
        }
        if (has_mode(o, "c8") || has_mode(o, "c8-h2o")) {
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
                rep.rows.push_back(r);
            }
        }
        for (const char * q : {"f16-fa", "q8_0", "q4_0", "q8_0-q4_0"}) {
            if (!has_mode(o, q)) continue;
            const std::string m = q;
            DecodeSpec s;
            s.mode = q;
            s.cfg.n_ctx = o.n_tokens;
            if (m != "f16-fa") {
                s.cfg.type_k = m == "q4_0" ? GGML_TYPE_Q4_0 : GGML_TYPE_Q8_0;
                s.cfg.type_v = m == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_Q4_0;
            }
            s.cfg.flash_attn = true;
            RunResult r = run_decode(model, mi, o, toks, ref, s);
            r.detail = m == "q8_0-q4_0" ? "llama.cpp cache types, q8_0 K and q4_0 V, flash attention on"
                       : m == "f16-fa"  ? "the full f16 cache with flash attention on: its own noise against full"
                                        : "llama.cpp cache type, flash attention on";
            rep.rows.push_back(r);
        }
        for (const auto & m : o.modes) {
            if (is_native_mode(m)) rep.rows.push_back(run_kvq_native(model, mi, o, toks, ref, m));
        }
        for (const auto & m : o.modes) {
            if (m.rfind("kvq:", 0) != 0 && m.rfind("kvq-plan:", 0) != 0) continue;
            KvqSetup kq(m, mi, o);
            EvalTap tap(mi);
            DecodeSpec s;
            s.mode = m;
            s.cfg.n_ctx = o.n_tokens;
            s.cfg.flash_attn = o.kvq_fa;
            kq.attach(tap, s);
            RunResult r = run_decode(model, mi, o, toks, ref, s);
            r.detail = kq.finish(tap, r);
            rep.rows.push_back(r);
        }
        for (const auto & m : o.modes) {
            ChannelMode cm;
            if (!parse_channel_mode(m, &cm)) continue;
            KvqChannelSetup kc(cm, mi, o);
            EvalTap tap(mi);
            DecodeSpec s;
            s.mode = m;
            s.cfg.n_ctx = o.n_tokens;
            s.cfg.flash_attn = o.kvq_fa;
            kc.attach(tap, s, mi);
            RunResult r = run_decode(model, mi, o, toks, ref, s);
            r.detail = kc.finish(tap, r, mi);
            rep.rows.push_back(r);
        }
        for (const auto & m : o.modes) {
            if (is_mlp_mode(m)) rep.rows.push_back(run_mlp(model, mi, o, toks, ref, m, mlp_set));
        }
        if (has_mode(o, "probe")) {
            EvalTap tap(mi);
            IdentityRowHook hook;
            tap.want_kq = tap.want_rows = tap.want_set_rows = true;
            tap.hook = &hook;
            DecodeSpec s;
            s.mode = "probe";
            s.cfg.n_ctx = o.n_tokens;
            s.cfg.tap = &tap;
            RunResult r = run_decode(model, mi, o, toks, ref, s);
            const RunResult & f = rep.rows.front();
            const bool same = r.ppl == f.ppl;
            r.detail = std::string("eval callback, identity hook; overhead ") + json_num(100.0 * (full_tok_s / r.tok_s - 1.0)) +
                       " %; PPL " + (same ? "identical to full" : "DIFFERS from full");
            r.extra.push_back({"overhead_pct", json_num(100.0 * (full_tok_s / r.tok_s - 1.0))});
            r.extra.push_back({"ppl_identical_to_full", same ? "true" : "false"});
            if (!same) fail("probe: an identity hook changed the perplexity");
            if (!tap.stats.set_rows_reads_hooked_tensor) fail("probe: a SET_ROWS node reads a tensor the hook did not see");
            if (tap.stats.kq_rowsum_max_err > 1e-3) fail("probe: kq_soft_max rows do not sum to 1");
            if (text_no == 0) {
                std::printf("eval callback (flash attention off) sees:\n");
                for (const auto & s2 : tap.stats.shapes) std::printf("  %s\n", s2.c_str());
                std::printf("  last token's cell (layer-0 K SET_ROWS index): %lld; softmax rows sum to 1 within %.2g\n",
                            tap.last_cells.empty() ? -1LL : (long long) tap.last_cells[0], tap.stats.kq_rowsum_max_err);
                probe_stats = tap.stats;
                have_probe = true;
            }
            rep.rows.push_back(r);
        }
        if (has_mode(o, "state")) rep.rows.push_back(run_state(model, mi, o, toks));
        if (has_mode(o, "share")) rep.rows.push_back(run_share(model, mi, o, toks, text_no, args));
        if (has_mode(o, "dump")) {
            const std::string tag = std::string("text") + (char) ('A' + text_no);
            Options od = o;
            if (text_no != 0) od.realkv_dir.clear();  // the reference data is of text A only
            rep.rows.push_back(run_dump(model, mi, od, toks, path, text, tag));
        }
        print_table(rep, o);
        reports.push_back(std::move(rep));
        text_no++;
    }
    std::vector<SpeedRow> speed;
    if (!o.speed_modes.empty()) {
        const std::string text = read_file(o.texts[0]);
        speed = run_speed(model, mi, o, tokenize(llama_model_get_vocab(model), text, o.bos));
    }
    if (!o.json.empty()) write_json(o.json, o, mi, reports, have_probe ? &probe_stats : nullptr, speed);
    llama_backend_free();
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    try {
        return run(argc, argv);
    } catch (const UsageError & e) {
        std::fprintf(stderr, "kvc_llama_eval: %s\n", e.what());
        return 2;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "kvc_llama_eval: %s\n", e.what());
        return 1;
    }
}
