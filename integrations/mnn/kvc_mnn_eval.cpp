// kvc_mnn_eval: quality, memory and speed of MNN's KV cache options, kvc's included, on one
// text decoded one token at a time through MNN's LLM engine (libllm).
//
// Every mode loads the model afresh with its llm_config keys merged over the model's config,
// then feeds the same token ids as a generation would: the first ppl_from tokens as one prompt
// (prefill; MNN's int8 KV calibrates its key scales there), the rest one at a time (decode
// steps, where H2O acts). The first mode is the reference: PPL over positions ppl_from.. and KL(reference
// || mode) of the next-token distributions there; KV tokens and bytes held (the attention
// layers' buffer capacity, as MNN's own manager reports it) at the end; decode tok/s over the
// decode steps. A mode whose forward fails stops the run with MNN's error.
//
//   kvc_mnn_eval --config model/config.json (--tokens ids.txt | --text text.txt)
//                --n-tokens 2048 --ppl-from 513 --threads 1
//                --mode full='{}' --mode h2o='{"kvc_h2o_enable":true}' ... [--json out.json]
//                [--write-tokens ids.txt]  (the n-tokens ids it fed, to compare tokenizers)
//                [--speed-rounds R --speed-steps D]  (decode speed with the modes interleaved:
//                 every mode's model loaded, R rounds of D steps each in turn; medians)

#include <llm/llm.hpp>

#include <algorithm>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using MNN::Transformer::Llm;

namespace {

struct Mode {
    std::string name;
    std::string json;  // llm_config keys merged over the model's
};

struct Options {
    std::string config;
    std::string tokens;
    std::string text;
    int n_tokens = 2048;
    int ppl_from = 513;
    int threads = 1;
    std::vector<Mode> modes;
    std::string json_out;
    std::string write_tokens;
    int speed_rounds = 0;   // interleaved decode-speed rounds after the quality runs (0: none)
    int speed_steps = 64;   // decode steps per mode and round
};

struct Result {
    std::string name;
    std::string json;
    std::string compression;
    double ppl = 0;
    double kl = 0;
    size_t tokens_held = 0;
    size_t bytes_held = 0;
    size_t logical_tokens = 0;
    double tok_s = 0;
    std::vector<double> round_tok_s;  // the interleaved rounds' decode tok/s
};

[[noreturn]] void fail(const std::string& what) {
    throw std::runtime_error(what);
}

std::string readFile(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Token ids as llama-tokenize --ids prints them ("[1, 2, 3]") or whitespace separated.
std::vector<int> parseIds(const std::string& s) {
    std::vector<int> ids;
    std::string cur;
    auto flush = [&]() {
        if (cur.empty()) return;
        char* end = nullptr;
        long v = std::strtol(cur.c_str(), &end, 10);
        if (*end != 0 || v < 0 || v > 100000000) fail("bad token id '" + cur + "'");
        ids.push_back((int)v);
        cur.clear();
    };
    for (char c : s) {
        if (c >= '0' && c <= '9') {
            cur.push_back(c);
        } else if (c == '[' || c == ']' || c == ',' || c == ' ' || c == '\n' || c == '\r' || c == '\t') {
            flush();
        } else {
            fail(std::string("unexpected character '") + c + "' in the token id file");
        }
    }
    flush();
    return ids;
}

Options parseArgs(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) fail(a + " needs a value");
            return argv[++i];
        };
        auto nextInt = [&]() -> int {
            std::string v = next();
            char* end = nullptr;
            long x = std::strtol(v.c_str(), &end, 10);
            if (*end != 0 || x < 0 || x > 1000000) fail(a + ": bad number '" + v + "'");
            return (int)x;
        };
        if (a == "--config") o.config = next();
        else if (a == "--tokens") o.tokens = next();
        else if (a == "--text") o.text = next();
        else if (a == "--n-tokens") o.n_tokens = nextInt();
        else if (a == "--ppl-from") o.ppl_from = nextInt();
        else if (a == "--threads") o.threads = nextInt();
        else if (a == "--json") o.json_out = next();
        else if (a == "--write-tokens") o.write_tokens = next();
        else if (a == "--speed-rounds") o.speed_rounds = nextInt();
        else if (a == "--speed-steps") o.speed_steps = nextInt();
        else if (a == "--mode") {
            std::string v = next();
            auto eq = v.find('=');
            if (eq == std::string::npos || eq == 0) fail("--mode wants NAME=JSON, got '" + v + "'");
            o.modes.push_back({v.substr(0, eq), v.substr(eq + 1)});
        } else fail("unknown argument " + a);
    }
    if (o.config.empty()) fail("--config is required");
    if (o.tokens.empty() == o.text.empty()) fail("give exactly one of --tokens and --text");
    if (o.modes.empty()) fail("give at least one --mode (the first is the reference)");
    if (o.ppl_from < 1 || o.ppl_from >= o.n_tokens) fail("--ppl-from must be in 1..n-tokens-1");
    if (o.threads < 1) fail("--threads must be at least 1");
    if (o.speed_rounds > 0 && (o.speed_steps < 1 || o.ppl_from + (long)o.speed_rounds * o.speed_steps > o.n_tokens)) {
        fail("--speed-rounds x --speed-steps must fit after the prompt, within --n-tokens");
    }
    return o;
}

// log-softmax of one row, in double.
void logSoftmax(const float* x, size_t n, std::vector<double>& out) {
    out.resize(n);
    double m = x[0];
    for (size_t i = 1; i < n; ++i) m = std::max(m, (double)x[i]);
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += std::exp((double)x[i] - m);
    double lse = m + std::log(s);
    for (size_t i = 0; i < n; ++i) out[i] = (double)x[i] - lse;
}

std::string jsonEscape(const std::string& s) {
    std::string r;
    for (char c : s) {
        if (c == '"' || c == '\\') { r.push_back('\\'); r.push_back(c); }
        else if ((unsigned char)c < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); r += b; }
        else r.push_back(c);
    }
    return r;
}

struct Reference {
    size_t vocab = 0;
    std::vector<float> logp;  // [scored positions][vocab]
};

std::unique_ptr<Llm> loadMode(const Options& o, const Mode& mode) {
    std::unique_ptr<Llm> llm(Llm::createLLM(o.config));
    if (!llm) fail("cannot create the LLM from " + o.config);
    std::string base = "{\"thread_num\":" + std::to_string(o.threads) +
                       ",\"use_template\":false,\"all_logits\":false,\"max_all_tokens\":" +
                       std::to_string(o.n_tokens + 16) + "}";
    if (!llm->set_config(base)) fail("set_config refused " + base);
    if (!llm->set_config(mode.json)) fail(mode.name + ": set_config refused " + mode.json);
    if (!llm->load()) fail(mode.name + ": the model did not load");
    return llm;
}
// Decode speed with the modes interleaved: every mode's model is loaded and given the prompt,
// then each round runs --speed-steps teacher-forced decode steps of every mode in turn (the
// order rotating by round), so machine drift reaches every mode alike; each mode's rounds see
// the same context lengths. Writes each round's tok/s into the results.
void speedRounds(const Options& o, const std::vector<int>& ids, std::vector<Result>& results) {
    std::vector<std::unique_ptr<Llm>> llms;
    const int first = o.ppl_from - 1;
    for (auto& mode : o.modes) {
        llms.push_back(loadMode(o, mode));
        auto logits = llms.back()->forward(std::vector<int>(ids.begin(), ids.begin() + first + 1));
        if (logits.get() == nullptr) fail(mode.name + ": the speed run's prompt failed");
    }
    const size_t m = llms.size();
    for (int round = 0; round < o.speed_rounds; ++round) {
        const int pos = first + 1 + round * o.speed_steps;
        for (size_t k = 0; k < m; ++k) {
            size_t i = (k + (size_t)round) % m;
            auto t0 = std::chrono::steady_clock::now();
            for (int s = 0; s < o.speed_steps; ++s) {
                auto logits = llms[i]->forward(std::vector<int>{ids[pos + s]});
                if (logits.get() == nullptr || logits->readMap<float>() == nullptr) {
                    fail(o.modes[i].name + ": the speed run failed at position " + std::to_string(pos + s));
                }
            }
            double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            results[i].round_tok_s.push_back(o.speed_steps / sec);
        }
        std::fprintf(stderr, "kvc_mnn_eval: speed round %d of %d (positions %d..%d)\n", round + 1, o.speed_rounds,
                     pos, pos + o.speed_steps - 1);
    }
}
double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}
Result runMode(const Options& o, const Mode& mode, const std::vector<int>& ids, Reference& ref, bool isRef) {
    Result r;
    r.name = mode.name;
    r.json = mode.json;
    auto llm = loadMode(o, mode);
    r.compression = llm->getContext()->kv_compression;
    std::fprintf(stderr, "kvc_mnn_eval: %s: %s\n", mode.name.c_str(), r.compression.c_str());

    const int n = o.n_tokens;
    const int first = o.ppl_from - 1;  // logits at position p predict token p + 1
    std::vector<double> lp;
    double nll = 0, kl = 0;
    int scored = 0;
    double seconds = 0;
    for (int p = 0; p + 1 < n; ++p) {
        const bool prompt = p == 0;
        std::vector<int> step = prompt ? std::vector<int>(ids.begin(), ids.begin() + first + 1)
                                       : std::vector<int>{ids[p]};
        if (prompt) p = first;
        auto t0 = std::chrono::steady_clock::now();
        auto logits = llm->forward(step);
        if (logits.get() == nullptr) fail(mode.name + ": forward failed at position " + std::to_string(p));
        auto info = logits->getInfo();
        const float* x = logits->readMap<float>();
        if (info == nullptr || x == nullptr) fail(mode.name + ": no logits at position " + std::to_string(p));
        auto t1 = std::chrono::steady_clock::now();
        size_t vocab = (size_t)info->dim.back();
        x += (size_t)info->size - vocab;  // the last position's row
        if (!prompt) seconds += std::chrono::duration<double>(t1 - t0).count();
        logSoftmax(x, vocab, lp);
        nll -= lp[(size_t)ids[p + 1]];
        size_t k = (size_t)(p - first);
        if (isRef) {
            if (ref.vocab == 0) {
                ref.vocab = vocab;
                ref.logp.resize((size_t)(n - 1 - first) * vocab);
            }
            for (size_t v = 0; v < vocab; ++v) ref.logp[k * vocab + v] = (float)lp[v];
        } else {
            if (vocab != ref.vocab) fail(mode.name + ": vocabulary differs from the reference");
            const float* q = &ref.logp[k * vocab];
            double d = 0;
            for (size_t v = 0; v < vocab; ++v) d += std::exp((double)q[v]) * ((double)q[v] - lp[v]);
            kl += d;
        }
        ++scored;
    }
    auto ctx = llm->getContext();
    r.compression = ctx->kv_compression;  // after the run (the fork puts its own ratios there)
    r.ppl = std::exp(nll / scored);
    r.kl = isRef ? 0.0 : kl / scored;
    r.tokens_held = ctx->kv_tokens_held;
    r.bytes_held = ctx->kv_bytes_held;
    r.logical_tokens = (size_t)ctx->all_seq_len;
    r.tok_s = (scored - 1) / seconds;
    std::fprintf(stderr, "kvc_mnn_eval: %s: PPL %.4f KL %.5f tokens held %zu bytes held %zu, %.1f tok/s\n",
                 mode.name.c_str(), r.ppl, r.kl, r.tokens_held, r.bytes_held, r.tok_s);
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        Options o = parseArgs(argc, argv);
        std::vector<int> ids;
        if (!o.tokens.empty()) {
            ids = parseIds(readFile(o.tokens));
        } else {
            std::unique_ptr<Llm> tok(Llm::createLLM(o.config));
            if (!tok || !tok->load()) fail("cannot load " + o.config + " to tokenize");
            ids = tok->tokenizer_encode(readFile(o.text));
        }
        if ((int)ids.size() < o.n_tokens) {
            fail("the text has " + std::to_string(ids.size()) + " tokens, fewer than --n-tokens " +
                 std::to_string(o.n_tokens));
        }
        ids.resize((size_t)o.n_tokens);
        if (!o.write_tokens.empty()) {
            std::ofstream f(o.write_tokens);
            for (size_t i = 0; i < ids.size(); ++i) f << (i ? " " : "") << ids[i];
            f << "\n";
            if (!f) fail("cannot write " + o.write_tokens);
        }
        Reference ref;
        std::vector<Result> results;
        for (size_t m = 0; m < o.modes.size(); ++m) {
            results.push_back(runMode(o, o.modes[m], ids, ref, m == 0));
        }
        if (o.speed_rounds > 0) {
            speedRounds(o, ids, results);
        }
        std::printf("%-16s %10s %9s %12s %14s %9s %12s\n", "mode", "PPL", "KL", "tokens held", "bytes held", "tok/s",
                    "median tok/s");
        for (auto& r : results) {
            std::printf("%-16s %10.4f %9.5f %12zu %14zu %9.1f %12.1f\n", r.name.c_str(), r.ppl, r.kl, r.tokens_held,
                        r.bytes_held, r.tok_s, median(r.round_tok_s));
        }
        if (!o.json_out.empty()) {
            std::ofstream f(o.json_out);
            if (!f) fail("cannot write " + o.json_out);
            f << "{\"n_tokens\":" << o.n_tokens << ",\"ppl_from\":" << o.ppl_from << ",\"threads\":" << o.threads
              << ",\"modes\":[";
            for (size_t i = 0; i < results.size(); ++i) {
                auto& r = results[i];
                char num[256];
                std::snprintf(num, sizeof num,
                              "\"ppl\":%.6f,\"kl\":%.8f,\"tokens_held\":%zu,\"bytes_held\":%zu,"
                              "\"logical_tokens\":%zu,\"tok_s\":%.3f",
                              r.ppl, r.kl, r.tokens_held, r.bytes_held, r.logical_tokens, r.tok_s);
                f << (i ? "," : "") << "{\"name\":\"" << jsonEscape(r.name) << "\",\"config\":\""
                  << jsonEscape(r.json) << "\",\"compression\":\"" << jsonEscape(r.compression) << "\"," << num
                  << ",\"round_tok_s\":[";
                for (size_t k = 0; k < r.round_tok_s.size(); ++k) {
                    std::snprintf(num, sizeof num, "%s%.3f", k ? "," : "", r.round_tok_s[k]);
                    f << num;
                }
                f << "]}";
            }
            f << "]}\n";
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kvc_mnn_eval: %s\n", e.what());
        return 1;
    }
}
