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
// The program is one unit per mode family, each a header that declares what it offers and a
// .cpp with the definitions, in namespace kvc_llama:
//   eval_common          errors, options and their parser, small helpers, model facts
//   eviction_policy      the eviction seam and the local sink + window policy
//   eval_tap             the eval callback: attention per cell (softmax, or the flash-attention
//                        recompute checked with fattn_bound.hpp), row hooks, SET_ROWS checks
//   kvc_api              kvc through include/kvc.h: status checks, H2O budgets
//   decode               contexts, the decode loop of every PPL/KL mode, the sequence state
//   kvc_h2o_policy       kvc's H2O / StreamingLLM as an EvictionPolicy; the kvc eviction rows
//   c8_hooks             C8 through kvc_quant; the c8 and c8-h2o rows
//   kvq_hooks            kvq (rotated 2-8-bit packed rows) through kvc_kvq; the kvq: rows
//   kvq_channel_hooks    K per channel over token groups (KIVI); the kvq-kc rows
//   dump_mode            the realkv-format dump and its comparison
//   state_mode           the sequence state, saved, restored and through kvc's codec
//   share_mode           a prefix shared between processes through kvc's tiers
//   mlp_mode             kvc-mlp's compressor on the older cells, through the sequence state
//   kvq_native_mode      llama.cpp's cache in kvc's kvq ggml types (patched build), decode speed
//   report               the table and the JSON
// with two headers of their own: fattn_bound.hpp (the flash-attention rounding bound, tested
// alone by fattn_bound_test.cpp) and llama_state_parse.hpp (the sequence-state container, no
// llama call, fuzzed alone by fuzz/cpp/llama_state_fuzz.cpp). This file: which modes run, in
// order (run), the rows without a family of their own (full, streaming, f16-fa and llama.cpp's
// cache types, probe), and main.

#include <cstdlib>

#include "c8_hooks.hpp"
#include "decode.hpp"
#include "dump_mode.hpp"
#include "eval_common.hpp"
#include "eval_tap.hpp"
#include "eviction_policy.hpp"
#include "kvc_h2o_policy.hpp"
#include "kvq_channel_hooks.hpp"
#include "kvq_hooks.hpp"
#include "kvq_native_mode.hpp"
#include "mlp_mode.hpp"
#include "report.hpp"
#include "share_mode.hpp"
#include "state_mode.hpp"

#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvc_llama {
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
    // the head sizes llama.cpp uses: GGUF key_length / value_length, else n_embd / n_head (as
    // llama_model_base::load_hparams reads them); n_embd / n_head alone is wrong on e.g. Gemma 3
    // (640 / 4 heads of 256) and Qwen3 (1024 / 16 heads of 128)
    {
        const int fallback = llama_model_n_embd(model) / std::max(1, mi.n_head);
        char arch[64] = {0}, val[64] = {0};
        mi.head_dim_k = mi.head_dim_v = fallback;
        if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) > 0) {
            const std::string a(arch);
            if (llama_model_meta_val_str(model, (a + ".attention.key_length").c_str(), val, sizeof val) > 0)
                mi.head_dim_k = (int) std::strtol(val, nullptr, 10);
            if (llama_model_meta_val_str(model, (a + ".attention.value_length").c_str(), val, sizeof val) > 0)
                mi.head_dim_v = (int) std::strtol(val, nullptr, 10);
        }
        if (mi.head_dim_k <= 0 || mi.head_dim_v <= 0)
            throw UsageError("model '" + o.model + "': head sizes K " + std::to_string(mi.head_dim_k) + ", V " +
                             std::to_string(mi.head_dim_v));
        mi.head_dim = mi.head_dim_k;  // both, for the modes that require them equal (below)
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    mi.n_vocab = llama_vocab_n_tokens(vocab);
    char desc[256];
    llama_model_desc(model, desc, sizeof desc);
    mi.desc = desc;
    mi.file = base_name(o.model);
    {
        const llama_rope_type rt = llama_model_rope_type(model);
        mi.rope_type = rt == LLAMA_ROPE_TYPE_NONE   ? "none"
                       : rt == LLAMA_ROPE_TYPE_NORM ? "norm"
                       : rt == LLAMA_ROPE_TYPE_NEOX ? "neox"
                                                    : "type-" + std::to_string((int) rt);
        mi.rope_freq_scale = llama_model_rope_freq_scale_train(model);
        char arch[64] = {0}, val[64] = {0};
        if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) > 0) {
            const std::string a(arch);
            if (llama_model_meta_val_str(model, (a + ".rope.freq_base").c_str(), val, sizeof val) > 0)
                mi.rope_freq_base = std::strtod(val, nullptr);
            if (llama_model_meta_val_str(model, (a + ".rope.dimension_count").c_str(), val, sizeof val) > 0)
                mi.rope_n_rot = (int) std::strtol(val, nullptr, 10);
        }
    }
    // every mode but llama.cpp's own rows treats K and V rows alike: refused before any decoding
    // on a model whose K and V head sizes differ
    if (mi.head_dim_k != mi.head_dim_v) {
        for (const auto & m : o.modes) {
            if (m != "full" && m != "streaming" && m != "f16-fa" && m != "q8_0" && m != "q4_0" && m != "q8_0-q4_0")
                mi.require_equal_kv_heads("mode '" + m + "'");
        }
        for (const auto & m : o.speed_modes) mi.require_equal_kv_heads("speed mode '" + m + "'");
        if (!o.share_child.empty()) mi.require_equal_kv_heads("share mode");
    }
    // the modes that read or write the sequence state parse it as one cache holding every layer
    // (llama_state_parse.hpp); a sliding-window model's state holds two (llama.cpp's iSWA cache:
    // the full-attention layers, then the sliding-window layers), so they are refused on it (the
    // dump mode takes such a model's rows from the eval callback alone)
    if (llama_model_n_swa(model) > 0) {
        for (const auto & m : o.modes) {
            if (m == "state" || m == "share" || is_mlp_mode(m) || m.rfind("mlp", 0) == 0)
                throw UsageError("mode '" + m + "' reads the sequence state as one cache of every layer; this model has " +
                                 "sliding-window layers (window " + std::to_string(llama_model_n_swa(model)) +
                                 "), whose state llama.cpp writes as two caches (iSWA)");
        }
    }
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
        // one kvc_h2o row (kvc_h2o_policy.hpp): mode kvc-streaming, h2o or h2o-fa at eviction
        // ratio R (cells), its held cells kvq cells when kvq_mode is given (the "+kvq:" modes)
        auto run_evict = [&](const std::string & mode, double R, const std::string & kvq_mode) {
            rep.rows.push_back(run_kvc_evict(model, mi, o, toks, ref, mode, R, kvq_mode));
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
        if (has_mode(o, "c8") || has_mode(o, "c8-h2o")) run_c8(model, mi, o, toks, ref, rep.rows);
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
            if (is_streaming_native_mode(m)) rep.rows.push_back(run_streaming_native(model, mi, o, toks, ref, m));
        }
        for (const auto & m : o.modes) {
            if (m.rfind("kvq:", 0) != 0 && m.rfind("kvq-plan:", 0) != 0) continue;
            rep.rows.push_back(run_kvq(model, mi, o, toks, ref, m));
        }
        for (const auto & m : o.modes) {
            ChannelMode cm;
            if (!parse_channel_mode(m, &cm)) continue;
            rep.rows.push_back(run_kvq_channel(model, mi, o, toks, ref, cm, m));
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
}  // namespace kvc_llama

int main(int argc, char ** argv) {
    try {
        return kvc_llama::run(argc, argv);
    } catch (const kvc_llama::UsageError & e) {
        std::fprintf(stderr, "kvc_llama_eval: %s\n", e.what());
        return 2;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "kvc_llama_eval: %s\n", e.what());
        return 1;
    }
}
