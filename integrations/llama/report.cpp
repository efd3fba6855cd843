// kvc_llama_eval, the table on stdout and the JSON report (report.hpp).
#include "report.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace kvc_llama {

// ------------------------------------------------------------------------------------------
// reporting

void print_table(const TextReport & t, const Options & o) {
    std::printf("\n%s: %ld tokens in the file, first %d decoded one at a time, PPL over positions %d..%d\n",
                t.path.c_str(), t.tokens_total, o.n_tokens, o.ppl_from, o.n_tokens - 1);
    std::printf("%-10s %9s %9s %8s %9s %9s %8s %10s  %s\n", "mode", "PPL", "KL", "tok/s", "KV ratio", "mean ratio",
                "cells", "KV bytes", "notes");
    for (const auto & r : t.rows) {
        auto f = [](double x, const char * fmt) {
            char buf[32];
            if (std::isfinite(x)) std::snprintf(buf, sizeof buf, fmt, x);
            else std::snprintf(buf, sizeof buf, "-");
            return std::string(buf);
        };
        std::printf("%-10s %9s %9s %8s %9s %9s %8ld %10.0f  %s\n", r.mode.c_str(), f(r.ppl, "%.4f").c_str(),
                    f(r.kl, "%.5f").c_str(), f(r.tok_s, "%.1f").c_str(), f(r.held_ratio_end, "%.3f").c_str(),
                    f(r.held_ratio_mean, "%.3f").c_str(), r.cells_end, r.held_bytes_end, r.detail.c_str());
    }
}

namespace {

std::string result_json(const RunResult & r) {
    std::ostringstream j;
    j << "{\"mode\": \"" << json_escape(r.mode) << "\", \"detail\": \"" << json_escape(r.detail) << "\""
      << ", \"ppl\": " << json_num(r.ppl) << ", \"kl\": " << json_num(r.kl) << ", \"n_scored\": " << r.n_scored
      << ", \"tokens_per_s\": " << json_num(r.tok_s) << ", \"kv_held_bytes_end\": " << json_num(r.held_bytes_end)
      << ", \"kv_ratio_end\": " << json_num(r.held_ratio_end) << ", \"kv_ratio_mean\": " << json_num(r.held_ratio_mean)
      << ", \"kv_alloc_bytes\": " << json_num(r.alloc_bytes) << ", \"cells_end\": " << r.cells_end
      << ", \"cells_verified\": " << r.cells_verified << ", \"cells_peak\": " << r.cells_peak;
    for (const auto & kv : r.extra) j << ", \"" << json_escape(kv.first) << "\": " << kv.second;
    j << "}";
    return j.str();
}

}  // namespace

void write_json(const std::string & path, const Options & o, const ModelInfo & mi, const std::vector<TextReport> & reps,
                const TapStats * probe_stats, const std::vector<SpeedRow> & speed) {
    std::ostringstream j;
    j << "{\n  \"model\": \"" << json_escape(mi.file) << "\", \"model_desc\": \"" << json_escape(mi.desc) << "\",\n";
    j << "  \"n_layer\": " << mi.n_layer << ", \"n_head\": " << mi.n_head << ", \"n_head_kv\": " << mi.n_head_kv
      << ", \"head_dim\": " << mi.head_dim << ", \"head_dim_k\": " << mi.head_dim_k << ", \"head_dim_v\": " << mi.head_dim_v
      << ",\n";
    j << "  \"n_tokens\": " << o.n_tokens << ", \"ppl_from\": " << o.ppl_from << ", \"prompt\": " << o.prompt
      << ", \"threads\": " << o.threads << ",\n";
    j << "  \"budget\": {\"ratio\": " << json_num(o.ratio) << ", \"sink\": " << o.sink << ", \"recent\": " << o.recent
      << ", \"trigger\": " << o.trigger << ", \"interval\": " << o.interval << ", \"mode\": \"" << o.budget
      << "\", \"positions\": \"" << o.positions << "\"},\n";
    if (probe_stats) {
        j << "  \"probe\": {\"kq_calls\": " << probe_stats->kq_calls << ", \"rows_calls\": " << probe_stats->rows_calls
          << ", \"set_rows_calls\": " << probe_stats->set_rows_calls
          << ", \"kq_rowsum_max_rel_err\": " << json_num(probe_stats->kq_rowsum_max_err)
          << ", \"set_rows_reads_hooked_tensor\": " << (probe_stats->set_rows_reads_hooked_tensor ? "true" : "false")
          << ", \"shapes\": [";
        for (size_t i = 0; i < probe_stats->shapes.size(); ++i) {
            j << (i ? ", " : "") << "\"" << json_escape(probe_stats->shapes[i]) << "\"";
        }
        j << "]},\n";
    }
    if (!speed.empty()) {
        j << "  \"speed\": [\n";
        for (size_t i = 0; i < speed.size(); ++i) {
            const auto & s = speed[i];
            j << "    {\"mode\": \"" << json_escape(s.mode) << "\", \"n_ctx\": " << s.n_ctx << ", \"threads\": " << s.threads
              << ", \"tok_s\": " << json_num(s.tok_s) << ", \"tok_s_runs\": [";
            for (size_t k = 0; k < s.tok_s_runs.size(); ++k) j << (k ? ", " : "") << json_num(s.tok_s_runs[k]);
            j << "], \"kv_alloc_bytes\": " << json_num(s.alloc_bytes) << "}"
              << (i + 1 < speed.size() ? ",\n" : "\n");
        }
        j << "  ],\n";
    }
    j << "  \"texts\": [\n";
    for (size_t t = 0; t < reps.size(); ++t) {
        j << "    {\"text\": \"" << json_escape(reps[t].path) << "\", \"tokens_total\": " << reps[t].tokens_total
          << ", \"results\": [\n";
        for (size_t i = 0; i < reps[t].rows.size(); ++i) {
            j << "      " << result_json(reps[t].rows[i]) << (i + 1 < reps[t].rows.size() ? ",\n" : "\n");
        }
        j << "    ]}" << (t + 1 < reps.size() ? ",\n" : "\n");
    }
    j << "  ]\n}\n";
    const std::string s = j.str();
    write_bytes(path, s.data(), s.size());
}

}  // namespace kvc_llama
