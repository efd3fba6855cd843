// kvc_llama_eval, the report: the table on stdout and the JSON file (report.cpp).
#pragma once

#include "decode.hpp"
#include "eval_common.hpp"
#include "eval_tap.hpp"
#include "kvq_native_mode.hpp"

#include <string>
#include <vector>

namespace kvc_llama {

struct TextReport {
    std::string path;
    long tokens_total = 0;
    std::vector<RunResult> rows;
};

// One text's rows as a table on stdout.
void print_table(const TextReport & t, const Options & o);

// The --json file: the run's settings, the probe's findings (when it ran), the speed table
// (when asked for) and every text's rows.
void write_json(const std::string & path, const Options & o, const ModelInfo & mi, const std::vector<TextReport> & reps,
                const TapStats * probe_stats, const std::vector<SpeedRow> & speed);

}  // namespace kvc_llama
