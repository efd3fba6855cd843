// kvc_llama_eval, what every mode shares: errors, options, small helpers (eval_common.hpp).
#include "eval_common.hpp"

#include "kvc.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

namespace kvc_llama {

void fail(const std::string & msg) { throw std::runtime_error(msg); }

namespace {

const char * kUsage =
    "usage: kvc_llama_eval --model GGUF --text FILE [--text FILE ...] [options]\n"
    "  --modes LIST        comma list of full,streaming,kvc-streaming,h2o,h2o-fa,c8,c8-h2o,\n"
    "                      f16-fa,q8_0,q4_0,q8_0-q4_0,kvq:CONFIG,probe,state,dump,share\n"
    "                      (default: all, kvq as kvq:k4v4,kvq:k4v2,kvq-kc32:k4v4; full always runs first as\n"
    "                      the reference). kvq:CONFIG is a kvc_kvq config string, e.g.\n"
    "                      kvq:k4v4, kvq:k3v3:lm, kvq:k8v4:u32 (docs/formats/kvq.md);\n"
    "                      kvq-plan:FILE takes per-layer bits from a kvq plan (kvc quant plan)\n"
    "                      kvq-kc<G>:CONFIG codes K per channel over groups of G tokens (16..256,\n"
    "                      KIVI; CONFIG's K bits, the unfilled group in f16) and V as CONFIG's\n"
    "                      kvq rows, e.g. kvq-kc32:k4v4; kvq-kc<G>w8:CONFIG holds the unfilled\n"
    "                      group as kvq 8-bit K rows instead of f16\n"
    "                      mlp@F compresses the cells outside --sink and --recent in groups of F\n"
    "                      with kvc-mlp (the --mlp-weights file of factor F; plain mlp: the one\n"
    "                      file's factor), every --interval steps from --trigger, as far as\n"
    "                      --ratio and --budget ask; mlp-meanpool@F the same with generated\n"
    "                      weights computing each group's mean (a baseline, not trained)\n"
    "                      h2o@R / kvc-streaming@R: that mode at eviction ratio R alone (not\n"
    "                      every --kv-ratios)\n"
    "                      BASE+kvq:CONFIG / BASE+kvq-plan:FILE, BASE one of mlp@F,\n"
    "                      mlp-meanpool@F, mlp, h2o@R, kvc-streaming@R, h2o, kvc-streaming\n"
    "                      (the last two at every --kv-ratios): the base mode with every held\n"
    "                      cell a kvq cell (compressed mlp cells re-quantized), memory in kvq's\n"
    "                      packed bytes, e.g. mlp@4+kvq:k8v4, h2o@4.75+kvq:k4v4; --kvq-sink <= --sink\n"
    "  --mlp-weights FILE  a .bin v1 compressor for the model (repeatable, one per factor)\n"
    "  --kvq-sink N        kvq modes: the first N tokens stay f16 (counted at f16 bytes) [0]\n"
    "  --kvq-recent N      kvq: and kvq-plan: modes: the newest N tokens stay f16 (counted at f16\n"
    "                      bytes) and are coded as they leave the window; needs --kvq-fa [0]\n"
    "  --kvq-recent-bits B the --kvq-recent window in f16 (16) or as kvq B-bit rows (2..8) [16]\n"
    "  --kvq-center        with --kvq-recent: code each K row minus its layer's and KV head's center,\n"
    "                      the window's mean when the first tokens leave it (f16, counted);\n"
    "                      needs --kvq-sink >= 1\n"
    "                      kvq-native:CONFIG / kvq-native-plan:FILE: llama.cpp's cache itself in\n"
    "                      kvc's kvq ggml types (patched build), memory as llama.cpp allocated it\n"
    "  --kvq-fa            kvq:, kvq-plan: and kvq-kc modes with flash attention on (off by default)\n"
    "  --kvq-native-no-fa  kvq-native modes with flash attention off (llama.cpp refuses a\n"
    "                      quantized V cache without it: a check of that refusal)\n"
    "  --speed-modes LIST  decode-speed table: cache types among f16,q8_0,q4_0,q8_0-q4_0,\n"
    "                      kvq-native:CONFIG,kvq-native-plan:FILE (default: no table)\n"
    "  --speed-ctx LIST    cache fill of the speed table [2048,8192]\n"
    "  --speed-decode N    tokens decoded per speed measurement [32]\n"
    "  --speed-repeats R   timed rounds per mode and fill, the modes interleaved; the median\n"
    "                      is reported [1]\n"
    "  --n-tokens N        tokens of each text to decode [2048]\n"
    "  --ppl-from P        first target position scored [513]\n"
    "  --prompt N          tokens decoded as one batch first [0]\n"
    "  --threads N         decode threads [1]\n"
    "  --ratio R --sink S --recent W --trigger T --interval I   budget [3.5 32 256 512 16]\n"
    "  --kv-ratios LIST    KV ratios (whole model, vs the full f16 cache of n-tokens) the kvc\n"
    "                      modes kvc-streaming, h2o, h2o-fa, c8-h2o run at [3.5]\n"
    "  --c8-calib N        tokens whose K/V rows calibrate kvc's C8 scales [ppl-from - 1:\n"
    "                      the unscored warm-up]\n"
    "  --c8-rule channel|rope  C8 K scales: channel = per-channel min/max (asymmetric);\n"
    "                      rope = per rotated channel pair, max radius / 127, for the model's\n"
    "                      rope type (NORM or NEOX), never clipping later positions [rope]\n"
    "  --block B           kvc_h2o block_tokens for the kvc modes [16]\n"
    "  --budget adaptive|fixed   adaptive: keep ceil(seen/R) (MNN); fixed: ceil(n_tokens/R) [adaptive]\n"
    "  --positions shift|keep    after eviction shift positions down or keep them [shift]\n"
    "  --bos               prepend BOS (default: no BOS, as the realkv data)\n"
    "  --dump-dir DIR      where the dump mode writes (default: no files, compare only)\n"
    "  --dump-tokens N     tokens the dump mode runs [n-tokens]\n"
    "  --realkv-dir DIR    reference dumps to compare with (textA.{K,V}.{f16,bf16}.bin)\n"
    "  --json FILE         write the results as JSON\n"
    "  share mode (not in the default list; --modes share alone skips the full row):\n"
    "  --redis URL         share through Redis (redis://host:port or redis+cluster://h:p,...)\n"
    "                      [none: a disk tier in --share-dir]\n"
    "  --share-dir DIR     the disk tier's directory [a temporary one, removed at the end]\n"
    "  --share-prefix N    prefix tokens process 1 prefills and stores [2048]\n"
    "  --share-rest N      tokens after the prefix decoded one at a time and compared [64]\n"
    "  --share-clients K   process-2 instances restoring the prefix at once [1]\n"
    "  --share-rounds N    rounds of --share-clients processes, one after the other; restore\n"
    "                      times are reported over all of them [1]\n"
    "  --share-chunk N     tokens per stored chunk [256]\n"
    "  --share-codec C     gear-v2, gear-v1, raw (lossless: logits must be identical), or\n"
    "                      kvq (= kvq-k4v4), kvq-k8v4, kvq-k4v2, tc-<bound> (lossy: KL is\n"
    "                      reported; tc, the transform coder, needs --share-calibration) [gear-v2]\n"
    "  --share-calibration FILE  the transform coder's calibration (kvc tc calibrate), loaded by\n"
    "                      process 1 and every process 2; it lists its targets tc-<bound>\n"
    "  --share-between CMD a shell command process 1 runs after storing, before it starts the\n"
    "                      process 2s (fault injection: kill Redis, damage a value); must exit 0\n"
    "  --verbose           llama.cpp's log on stderr\n"
    "  --progress          one line on stderr per finished decode: mode, PPL, KL, mean ratio\n";

}  // namespace

int parse_int(const std::string & flag, const std::string & v, int lo, int hi) {
    char * end = nullptr;
    errno = 0;
    long x = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno != 0 || x < lo || x > hi) {
        throw UsageError(flag + ": expected an integer in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "], got '" + v + "'");
    }
    return (int) x;
}

double parse_double(const std::string & flag, const std::string & v, double lo, double hi) {
    char * end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(x) || x < lo || x > hi) {
        throw UsageError(flag + ": expected a number in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "], got '" + v + "'");
    }
    return x;
}

std::vector<std::string> split_commas(const std::string & s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (!item.empty()) out.push_back(item);
    }
    return out;
}

Options parse_options(int argc, char ** argv) {
    Options o;
    bool modes_given = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) throw UsageError(a + ": missing value");
            return argv[++i];
        };
        if (a == "--model") o.model = val();
        else if (a == "--text") o.texts.push_back(val());
        else if (a == "--modes") { o.modes = split_commas(val()); modes_given = true; }
        else if (a == "--n-tokens") o.n_tokens = parse_int(a, val(), 2, 1 << 20);
        else if (a == "--ppl-from") o.ppl_from = parse_int(a, val(), 1, 1 << 20);
        else if (a == "--prompt") o.prompt = parse_int(a, val(), 0, 1 << 20);
        else if (a == "--threads") o.threads = parse_int(a, val(), 1, 1024);
        else if (a == "--ratio") o.ratio = parse_double(a, val(), 1.0, 1e6);
        else if (a == "--sink") o.sink = parse_int(a, val(), 0, 1 << 20);
        else if (a == "--recent") o.recent = parse_int(a, val(), 1, 1 << 20);
        else if (a == "--trigger") o.trigger = parse_int(a, val(), 0, 1 << 20);
        else if (a == "--interval") o.interval = parse_int(a, val(), 1, 1 << 20);
        else if (a == "--budget") o.budget = val();
        else if (a == "--block") o.block = parse_int(a, val(), 1, 1 << 16);
        else if (a == "--c8-calib") o.c8_calib = parse_int(a, val(), 1, 1 << 20);
        else if (a == "--c8-rule") o.c8_rule = val();
        else if (a == "--kvq-sink") o.kvq_sink = parse_int(a, val(), 0, 1 << 20);
        else if (a == "--kvq-recent") o.kvq_recent = parse_int(a, val(), 0, 1 << 20);
        else if (a == "--kvq-recent-bits") {
            o.kvq_recent_bits = parse_int(a, val(), 2, 16);
            if (o.kvq_recent_bits > 8 && o.kvq_recent_bits != 16) throw UsageError("--kvq-recent-bits: 2..8 or 16");
        }
        else if (a == "--kvq-fa") o.kvq_fa = true;
        else if (a == "--kvq-center") o.kvq_center = true;
        else if (a == "--kvq-native-no-fa") o.kvq_native_fa = false;
        else if (a == "--speed-modes") o.speed_modes = split_commas(val());
        else if (a == "--speed-ctx") {
            o.speed_ctx.clear();
            for (const auto & c : split_commas(val())) o.speed_ctx.push_back(parse_int(a, c, 16, 1 << 20));
            if (o.speed_ctx.empty()) throw UsageError("--speed-ctx: at least one context size");
        }
        else if (a == "--speed-decode") o.speed_decode = parse_int(a, val(), 2, 1 << 16);
        else if (a == "--speed-repeats") o.speed_repeats = parse_int(a, val(), 1, 1000);
        else if (a == "--kv-ratios") {
            o.kv_ratios.clear();
            for (const auto & r : split_commas(val())) o.kv_ratios.push_back(parse_double(a, r, 1.0, 1e6));
            if (o.kv_ratios.empty()) throw UsageError("--kv-ratios: at least one ratio");
        }
        else if (a == "--positions") o.positions = val();
        else if (a == "--bos") o.bos = true;
        else if (a == "--json") o.json = val();
        else if (a == "--dump-dir") o.dump_dir = val();
        else if (a == "--dump-tokens") o.dump_tokens = parse_int(a, val(), 1, 1 << 20);
        else if (a == "--realkv-dir") o.realkv_dir = val();
        else if (a == "--mlp-weights") o.mlp_weights.push_back(val());
        else if (a == "--verbose") o.verbose = true;
        else if (a == "--progress") o.progress = true;
        else if (a == "--redis") o.redis = val();
        else if (a == "--share-dir") o.share_dir = val();
        else if (a == "--share-prefix") o.share_prefix = parse_int(a, val(), 1, 1 << 20);
        else if (a == "--share-rest") o.share_rest = parse_int(a, val(), 1, 1 << 16);
        else if (a == "--share-clients") o.share_clients = parse_int(a, val(), 1, 64);
        else if (a == "--share-rounds") o.share_rounds = parse_int(a, val(), 1, 100);
        else if (a == "--share-chunk") o.share_chunk = parse_int(a, val(), 1, 1 << 16);
        else if (a == "--share-codec") o.share_codec = val();
        else if (a == "--share-calibration") o.share_calibration = val();
        else if (a == "--share-between") o.share_between = val();
        else if (a == "--share-child") o.share_child = val();
        else if (a == "--share-control") o.share_control = true;
        else if (a == "--share-text") o.share_text = parse_int(a, val(), 0, 1 << 16);
        else if (a == "--share-sync") {
            const auto fds = split_commas(val());
            if (fds.size() != 2) throw UsageError("--share-sync: two file descriptors");
            o.share_sync_r = parse_int(a, fds[0], 0, 1 << 20);
            o.share_sync_w = parse_int(a, fds[1], 0, 1 << 20);
        }
        else if (a == "-h" || a == "--help") { std::fputs(kUsage, stdout); std::exit(0); }
        else throw UsageError("unknown option '" + a + "' (see --help)");
    }
    if (o.model.empty()) throw UsageError("--model is required");
    if (o.texts.empty()) throw UsageError("at least one --text is required");
    if (o.budget != "fixed" && o.budget != "adaptive") throw UsageError("--budget: fixed or adaptive");
    if (o.c8_rule != "channel" && o.c8_rule != "rope") throw UsageError("--c8-rule: channel or rope");
    if (o.positions != "shift" && o.positions != "keep") throw UsageError("--positions: shift or keep");
    const bool tc = o.share_codec.rfind("tc-", 0) == 0;
    if (o.share_codec != "gear-v2" && o.share_codec != "gear-v1" && o.share_codec != "raw" && o.share_codec != "kvq" &&
        o.share_codec != "kvq-k4v4" && o.share_codec != "kvq-k8v4" && o.share_codec != "kvq-k4v2" && !tc) {
        throw UsageError("--share-codec: gear-v2, gear-v1, raw (lossless), kvq (= kvq-k4v4), kvq-k8v4, kvq-k4v2 or "
                         "tc-<bound> (lossy)");
    }
    if (tc && o.share_calibration.empty()) {
        throw UsageError("--share-codec " + o.share_codec +
                         " needs --share-calibration FILE (made by kvc tc calibrate from a dump of this model)");
    }
    if (!tc && !o.share_calibration.empty()) {
        throw UsageError("--share-calibration is for --share-codec tc-<bound>, not " + o.share_codec);
    }
    if (!o.redis.empty() && o.redis.rfind("redis://", 0) != 0 && o.redis.rfind("redis+cluster://", 0) != 0) {
        throw UsageError("--redis: expected redis://host:port or redis+cluster://host:port,...");
    }
    if (o.ppl_from >= o.n_tokens) throw UsageError("--ppl-from must be below --n-tokens");
    if (o.prompt >= o.n_tokens) throw UsageError("--prompt must be below --n-tokens");
    static const char * known[] = {"full", "streaming", "kvc-streaming", "h2o",       "h2o-fa", "c8",  "c8-h2o",
                                   "f16-fa", "q8_0", "q4_0",      "q8_0-q4_0",     "probe",     "state",  "dump",
                                   "share"};
    for (const auto & mode : o.modes) {
        // a combined mode BASE+kvq:CONFIG / BASE+kvq-plan:FILE: the kvq part is checked as the
        // kvq modes are, the base must be an mlp mode or a kvc_h2o eviction
        std::string m = mode;
        for (const char * tag : {"+kvq:", "+kvq-plan:"}) {
            const auto at = mode.find(tag);
            if (at == std::string::npos) continue;
            m = mode.substr(0, at);
            const std::string kvq_mode = mode.substr(at + 1);
            if (kvq_mode == "kvq:" || kvq_mode == "kvq-plan:") throw UsageError("--modes " + mode + ": needs a config or a plan file");
            if (kvq_mode.rfind("kvq-plan:", 0) == 0) {
                const std::string json = read_file(kvq_mode.substr(9));
                kvc_kvq * probe = nullptr;
                if (kvc_kvq_new_from_plan(json.data(), json.size(), &probe) != KVC_OK) {
                    throw UsageError("--modes " + mode + ": " + kvq_mode.substr(9) + " is not a kvq plan kvc can read");
                }
                kvc_kvq_free(probe);
            }
            const bool evict = m == "h2o" || m == "kvc-streaming" || m.rfind("h2o@", 0) == 0 || m.rfind("kvc-streaming@", 0) == 0;
            const bool mlp = m == "mlp" || m.rfind("mlp@", 0) == 0 || m.rfind("mlp-meanpool@", 0) == 0;
            if (!evict && !mlp) {
                throw UsageError("--modes " + mode + ": kvq combines with mlp, mlp@F, mlp-meanpool@F, h2o, kvc-streaming, "
                                 "h2o@R and kvc-streaming@R only");
            }
            // the --kvq-sink cells are counted at f16 for the whole run: the base mode must hold them
            if (o.kvq_sink > o.sink) {
                throw UsageError("--modes " + mode + ": --kvq-sink " + std::to_string(o.kvq_sink) + " exceeds --sink " +
                                 std::to_string(o.sink) + " (the base mode could evict or compress a protected cell)");
            }
            break;
        }
        if (m.rfind("h2o@", 0) == 0 || m.rfind("kvc-streaming@", 0) == 0) {
            parse_double("--modes " + mode, m.substr(m.find('@') + 1), 1.0, 1e6);
            continue;
        }
        if (m.rfind("streaming+kvq-native:", 0) == 0 || m.rfind("streaming+kvq-native-plan:", 0) == 0) {
            if (m.back() == ':') throw UsageError("--modes: " + m + " needs a config or a plan file");
            continue;  // the streaming eviction on llama.cpp's kvq cache (kvq_native_mode.hpp)
        }
        if (m.rfind("kvq-native:", 0) == 0 || m.rfind("kvq-native-plan:", 0) == 0) {
            if (m.back() == ':') throw UsageError("--modes: " + m + " needs a config or a plan file");
            continue;  // checked against the model before anything runs (resolve_native)
        }
        if (m.rfind("kvq-kc", 0) == 0) {
            // kvq-kc<G>:CONFIG; G and the config are checked by kvc_kvq_channel_block_bytes / kvc_kvq_new
            const auto colon = m.find(':');
            if (colon == std::string::npos || colon + 1 >= m.size()) {
                throw UsageError("--modes " + m + ": kvq-kc<G>:CONFIG needs a group and a config, e.g. kvq-kc32:k4v4");
            }
            std::string g = m.substr(6, colon - 6);
            if (g.size() > 2 && g.compare(g.size() - 2, 2, "w8") == 0) g.resize(g.size() - 2);
            parse_int("--modes " + m, g, 16, 256);
            continue;
        }
        if (m.rfind("kvq:", 0) == 0) {
            if (m.size() == 4) throw UsageError("--modes: kvq: needs a config, e.g. kvq:k4v4");
            continue;  // the config itself is checked by kvc_kvq_new
        }
        if (m == "mlp" || m.rfind("mlp@", 0) == 0 || m.rfind("mlp-meanpool@", 0) == 0) {
            // the factor (2..64) after '@'; the weights themselves are checked against the
            // model once it is loaded (mlp_mode.hpp)
            const auto at = m.find('@');
            if (at != std::string::npos) parse_int("--modes " + m, m.substr(at + 1), 2, 64);
            if (m.rfind("mlp-meanpool@", 0) != 0 && o.mlp_weights.empty()) {
                throw UsageError("--modes " + m + ": needs --mlp-weights FILE");
            }
            continue;
        }
        if (m.rfind("kvq-plan:", 0) == 0) {
            if (m.size() == 9) throw UsageError("--modes: kvq-plan: needs a plan file");
            // a missing or malformed plan is a usage error before anything runs
            const std::string json = read_file(m.substr(9));
            kvc_kvq * probe = nullptr;
            if (kvc_kvq_new_from_plan(json.data(), json.size(), &probe) != KVC_OK) {
                throw UsageError("--modes: " + m.substr(9) + " is not a kvq plan kvc can read");
            }
            kvc_kvq_free(probe);
            continue;
        }
        if (std::find_if(std::begin(known), std::end(known), [&](const char * k) { return m == k; }) ==
            std::end(known)) {
            throw UsageError("--modes: unknown mode '" + m + "'");
        }
    }
    (void) modes_given;
    if (o.kvq_center && o.kvq_recent == 0) throw UsageError("--kvq-center needs --kvq-recent (the center is the window's mean)");
    // measured: coded against the window's mean, the attention sink's K loses what makes it
    // the sink (200 tokens: KL 0.016 plain, 0.070 centered; with one f16 sink token 0.012)
    if (o.kvq_center && o.kvq_sink == 0) throw UsageError("--kvq-center needs --kvq-sink >= 1 (the attention sink must stay f16)");
    if (o.kvq_recent > 0) {
        // the window's rows are written back into their cells as they leave it: llama.cpp must
        // hold V as rows (flash attention), and the cells must not move (no eviction, no rewrite)
        if (!o.kvq_fa) throw UsageError("--kvq-recent needs --kvq-fa (without flash attention llama.cpp stores V transposed)");
        for (const auto & m : o.modes) {
            if (m.find("+kvq") != std::string::npos || m.rfind("kvq-kc", 0) == 0) {
                throw UsageError("--kvq-recent applies to kvq: and kvq-plan: modes alone, not to " + m);
            }
        }
    }
    return o;
}

bool has_mode(const Options & o, const char * m) {
    return std::find(o.modes.begin(), o.modes.end(), m) != o.modes.end();
}

// ------------------------------------------------------------------------------------------
// small helpers

std::string read_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw UsageError("cannot read '" + path + "'");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::string base_name(const std::string & path) {
    auto p = path.find_last_of('/');
    return p == std::string::npos ? path : path.substr(p + 1);
}

std::string json_escape(const std::string & s) {
    std::string out;
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            case '\r': out += "\\r"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += (char) c;
                }
        }
    }
    return out;
}

std::string json_num(double x) {
    if (!std::isfinite(x)) return "null";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.10g", x);
    return buf;
}

double now_s() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// llama.cpp's last error line (why a context was refused, for instance)
std::string g_llama_last_error;

void quiet_log(ggml_log_level level, const char * text, void * ud) {
    const bool verbose = ud != nullptr;
    if (verbose || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
    if (level == GGML_LOG_LEVEL_ERROR) g_llama_last_error = text;
}

// log-softmax of one row of logits, in double for the sums
void log_softmax(const float * logits, int n, std::vector<float> & out) {
    out.resize(n);
    float mx = logits[0];
    for (int i = 1; i < n; ++i) mx = std::max(mx, logits[i]);
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += std::exp((double) logits[i] - mx);
    const double lse = mx + std::log(sum);
    for (int i = 0; i < n; ++i) out[i] = (float) ((double) logits[i] - lse);
}

// KL(P_ref || P) from two log-softmax rows
double kl_div(const std::vector<float> & ref, const std::vector<float> & cur) {
    double kl = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double p = std::exp((double) ref[i]);
        if (p > 0.0) kl += p * ((double) ref[i] - (double) cur[i]);
    }
    return kl;
}

void write_bytes(const std::string & path, const void * data, size_t n) {
    std::FILE * f = std::fopen(path.c_str(), "wb");
    if (!f) fail("cannot write '" + path + "'");
    const size_t w = std::fwrite(data, 1, n, f);
    const int c = std::fclose(f);
    if (w != n || c != 0) fail("short write to '" + path + "'");
}

// how many of the n floats at a and b differ in any bit (logits compared bit for bit)
long bits_differing(const float * a, const float * b, int n) {
    long d = 0;
    for (int i = 0; i < n; ++i) {
        uint32_t x, y;
        std::memcpy(&x, &a[i], 4);
        std::memcpy(&y, &b[i], 4);
        if (x != y) d++;
    }
    return d;
}

}  // namespace kvc_llama
