// kvc_infinilm_eval: quality, memory and speed of InfiniLM's KV-cache options, kvc's included,
// on one text, through InfiniLM's C++ engine (csrc) on the CPU. No Python, no torch.
//
// The model is a Hugging Face folder (config.json, model.safetensors in f32, as
// convert-model.py writes it). Every mode starts from an empty static cache and feeds the same
// token ids: the first --prompt ids in one forward (prefill), then the mode's compression, then
// the rest --chunk ids per forward (1: one decode step at a time). The first mode is the
// reference: PPL over the ids after the prompt, KL(reference || mode) of the next-token
// distributions there, the K and V rows the cache holds at the end and their bytes, and decode
// tok/s. Modes (--mode NAME=SPEC, SPEC a comma list of key=value):
//   full                         no compression
//   backend=infinilm,weights=F   InfiniLM's own KVCompressor on the .bin file F
//   backend=kvc,weights=F        kvc's compressor (kvc_mlp_*) on F, through --kvc-library
//   sink=N, recent=N             (kvc) first and last tokens kept as they are
//   positions=true|restart       after compression, the next token's RoPE position is its
//                                true one (default), or the compressed length, as InfiniLM's
//                                Python generate() did ("restart")
//   h2o=R                        kvc's H2O in InfiniLM's attention (StaticKVCacheConfig
//                                kvc_h2o), target ratio R; the plan is applied after every
//                                forward (apply_kvc_h2o_plan); streaming=R keeps sink + recent
//   h2o_sink, h2o_recent, h2o_block, h2o_trigger, h2o_interval   its other settings
//                                (0 or absent: kvc's defaults)
//   library=PATH                 this mode's kvc library (default --kvc-library)
//   kvq=kKvV[-sSwW]              K and V as kvc kvq rows of K and V bits (StaticKVCacheConfig
//                                kvc_kvq), with S f16 sink rows, a window of W 8-bit rows and
//                                K centers (-sSwW absent: no protections)
// Bytes: what the static cache allocates for K and V (kv_bytes_held: the f32 buffers, or the
// packed kvq rows and everything kvc holds beside them) and the rows it holds at the end.
//
//   kvc_infinilm_eval --model DIR --tokens ids.txt [--n-tokens 1024] [--prompt 512]
//                     [--chunk 1] [--threads 1] [--kvc-library libkvc.so.0] [--dtype f32|f16]
//                     --mode full=full --mode kvc4=backend=kvc,weights=f4.bin,sink=32,recent=64
//                     [--json out.json]
//   kvc_infinilm_eval --model DIR --tokens ids.txt --check-equal F.bin [--prompt 512]
//       prefills the prompt, then compresses the same cache with InfiniLM's compressor and with
//       kvc's (whole prompt, no sink or recent) and prints the largest difference of the two
//       results, relative to the largest magnitude; exits 1 above --bound (default 1e-4).
//   --speed-rounds R --speed-steps D   after the quality runs: decode speed with the modes
//       interleaved. Every mode gets its own engine (model and cache), prefilled with the
//       prompt (and compressed), then R rounds in which each mode in turn decodes D tokens;
//       the median of a mode's rounds is its decode_tok_s_interleaved. --speed-only skips the
//       quality runs.

#include "cache/kv_compression.hpp"
#include "cache/kv_cache.hpp"
#include "models/llama/llama_config.hpp"
#include "models/llama/llama_for_causal_lm.hpp"
#include "models/model_factory.hpp"
#include "utils.hpp"

#include "infinicore/context/context.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <omp.h>

namespace {

using infinilm::models::llama::LlamaConfig;
using infinilm::models::llama::LlamaForCausalLM;

[[noreturn]] void fail(const std::string &what) { throw std::runtime_error(what); }

// ---- a small JSON reader (config.json, the safetensors header) ----------------------------
struct Json {
    enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
    bool b = false;
    double num = 0;
    std::string str;
    std::vector<Json> items;
    std::map<std::string, Json> fields;

    const Json *get(const std::string &key) const {
        auto it = fields.find(key);
        return it == fields.end() ? nullptr : &it->second;
    }
};

class JsonParser {
public:
    explicit JsonParser(const std::string &text) : s_(text) {}
    Json parse() {
        Json v = value(0);
        ws();
        if (i_ != s_.size()) fail("json: trailing bytes at " + std::to_string(i_));
        return v;
    }

private:
    const std::string &s_;
    size_t i_ = 0;
    void ws() {
        while (i_ < s_.size() && std::strchr(" \t\r\n", s_[i_]) != nullptr) ++i_;
    }
    char peek() {
        ws();
        if (i_ >= s_.size()) fail("json: unexpected end");
        return s_[i_];
    }
    void expect(char c) {
        if (peek() != c) fail(std::string("json: expected '") + c + "' at " + std::to_string(i_));
        ++i_;
    }
    bool word(const char *w) {
        size_t n = std::strlen(w);
        if (s_.compare(i_, n, w) != 0) return false;
        i_ += n;
        return true;
    }
    std::string string() {
        expect('"');
        std::string out;
        while (true) {
            if (i_ >= s_.size()) fail("json: unterminated string");
            char c = s_[i_++];
            if (c == '"') return out;
            if (c != '\\') {
                out += c;
                continue;
            }
            if (i_ >= s_.size()) fail("json: unterminated escape");
            char e = s_[i_++];
            switch (e) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'u': {
                if (i_ + 4 > s_.size()) fail("json: short \\u escape");
                unsigned cp = std::stoul(s_.substr(i_, 4), nullptr, 16);
                i_ += 4;
                if (cp < 0x80) {
                    out += char(cp);
                } else if (cp < 0x800) {
                    out += char(0xc0 | (cp >> 6));
                    out += char(0x80 | (cp & 0x3f));
                } else {
                    out += char(0xe0 | (cp >> 12));
                    out += char(0x80 | ((cp >> 6) & 0x3f));
                    out += char(0x80 | (cp & 0x3f));
                }
                break;
            }
            default: out += e;
            }
        }
    }
    Json value(int depth) {
        if (depth > 64) fail("json: nested too deeply");
        Json v;
        char c = peek();
        if (c == '{') {
            ++i_;
            v.kind = Json::Object;
            if (peek() == '}') {
                ++i_;
                return v;
            }
            while (true) {
                std::string key = string();
                expect(':');
                v.fields[key] = value(depth + 1);
                if (peek() == ',') {
                    ++i_;
                    continue;
                }
                expect('}');
                return v;
            }
        }
        if (c == '[') {
            ++i_;
            v.kind = Json::Array;
            if (peek() == ']') {
                ++i_;
                return v;
            }
            while (true) {
                v.items.push_back(value(depth + 1));
                if (peek() == ',') {
                    ++i_;
                    continue;
                }
                expect(']');
                return v;
            }
        }
        if (c == '"') {
            v.kind = Json::String;
            v.str = string();
            return v;
        }
        if (word("true")) {
            v.kind = Json::Bool;
            v.b = true;
            return v;
        }
        if (word("false")) {
            v.kind = Json::Bool;
            return v;
        }
        if (word("null")) return v;
        size_t end = i_;
        while (end < s_.size() && std::strchr("+-0123456789.eE", s_[end]) != nullptr) ++end;
        if (end == i_) fail("json: unexpected '" + std::string(1, c) + "' at " + std::to_string(i_));
        v.kind = Json::Number;
        v.num = std::stod(s_.substr(i_, end - i_));
        i_ = end;
        return v;
    }
};

std::string read_file(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// ---- the model ----------------------------------------------------------------------------
double number(const Json &cfg, const char *key, double fallback, bool required) {
    const Json *v = cfg.get(key);
    if (v == nullptr || v->kind == Json::Null) {
        if (required) fail(std::string("config.json has no ") + key);
        return fallback;
    }
    if (v->kind == Json::Bool) return v->b ? 1 : 0;
    if (v->kind != Json::Number) fail(std::string("config.json: ") + key + " is not a number");
    return v->num;
}

std::vector<int64_t> token_ids(const Json &cfg, const char *key) {
    std::vector<int64_t> out;
    const Json *v = cfg.get(key);
    if (v == nullptr) return out;
    if (v->kind == Json::Number) out.push_back(int64_t(v->num));
    for (const Json &item : v->items) out.push_back(int64_t(item.num));
    return out;
}

// Reads the shape from config.json; never assumes one. Only Llama-type models (llama) are
// served by this client; others get a clear refusal.
LlamaConfig read_config(const std::string &dir, infinicore::DataType dtype) {
    Json cfg = JsonParser(read_file(dir + "/config.json")).parse();
    const Json *type = cfg.get("model_type");
    if (type == nullptr || type->str != "llama") {
        fail("config.json: model_type " + (type ? type->str : std::string("(none)")) +
             " is not served by this client (llama)");
    }
    LlamaConfig c;
    c.dtype = dtype;
    c.model_type = "llama";
    c.vocab_size = size_t(number(cfg, "vocab_size", 0, true));
    c.hidden_size = size_t(number(cfg, "hidden_size", 0, true));
    c.intermediate_size = size_t(number(cfg, "intermediate_size", 0, true));
    c.num_hidden_layers = size_t(number(cfg, "num_hidden_layers", 0, true));
    c.num_attention_heads = size_t(number(cfg, "num_attention_heads", 0, true));
    c.num_key_value_heads = size_t(number(cfg, "num_key_value_heads", double(c.num_attention_heads), false));
    c.head_dim = size_t(number(cfg, "head_dim", double(c.hidden_size / c.num_attention_heads), false));
    c.max_position_embeddings = size_t(number(cfg, "max_position_embeddings", 2048, false));
    c.rope_theta = number(cfg, "rope_theta", 10000.0, false);
    c.rms_norm_eps = number(cfg, "rms_norm_eps", 1e-6, false);
    c.attention_bias = number(cfg, "attention_bias", 0, false) != 0;
    c.mlp_bias = number(cfg, "mlp_bias", 0, false) != 0;
    c.tie_word_embeddings = number(cfg, "tie_word_embeddings", 0, false) != 0;
    c.bos_token_id = token_ids(cfg, "bos_token_id");
    c.eos_token_id = token_ids(cfg, "eos_token_id");
    if (!c.validate()) fail("config.json: inconsistent head counts or sizes");
    return c;
}

// model.safetensors, mapped read-only; every f32 tensor loaded into the model by name.
class SafeTensors {
public:
    explicit SafeTensors(const std::string &path) {
        int fd = open(path.c_str(), O_RDONLY);
        if (fd < 0) fail("cannot open " + path);
        struct stat st {};
        fstat(fd, &st);
        size_ = size_t(st.st_size);
        data_ = static_cast<const uint8_t *>(mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0));
        close(fd);
        if (data_ == MAP_FAILED || size_ < 8) fail("cannot map " + path);
        uint64_t n = 0;
        std::memcpy(&n, data_, 8);
        if (n > size_ - 8) fail(path + ": header longer than the file");
        header_ = JsonParser(std::string(reinterpret_cast<const char *>(data_) + 8, n)).parse();
        body_ = 8 + n;
    }
    ~SafeTensors() { munmap(const_cast<uint8_t *>(data_), size_); }

    void load_into(LlamaForCausalLM &model) const {
        auto expected = model.state_dict();
        size_t loaded = 0;
        for (const auto &[name, meta] : header_.fields) {
            if (name == "__metadata__") continue;
            auto it = expected.find(name);
            if (it == expected.end()) fail("model.safetensors: " + name + " is not a parameter of the model");
            const Json *dtype = meta.get("dtype");
            const Json *shape = meta.get("shape");
            const Json *offsets = meta.get("data_offsets");
            if (!dtype || dtype->str != "F32" || !shape || !offsets || offsets->items.size() != 2) {
                fail("model.safetensors: " + name + " is not an f32 tensor (convert-model.py writes f32)");
            }
            infinicore::Shape dims;
            size_t elems = 1;
            for (const Json &d : shape->items) {
                dims.push_back(size_t(d.num));
                elems *= size_t(d.num);
            }
            if (dims != it->second->shape()) fail("model.safetensors: " + name + " has the wrong shape");
            size_t begin = size_t(offsets->items[0].num), end = size_t(offsets->items[1].num);
            if (end - begin != elems * 4 || body_ + end > size_) fail("model.safetensors: " + name + " is out of the file");
            auto blob = infinicore::Tensor::from_blob(const_cast<uint8_t *>(data_ + body_ + begin), dims,
                                                      infinicore::DataType::F32, infinicore::Device::cpu());
            if (it->second->dtype() == infinicore::DataType::F16) {
                // --dtype f16: the model's parameters are f16; round each value once.
                auto half = infinicore::Tensor::empty(dims, infinicore::DataType::F16, infinicore::Device::cpu());
                const float *src = reinterpret_cast<const float *>(blob->data());
                uint16_t *dst = reinterpret_cast<uint16_t *>(half->data());
                for (size_t i = 0; i < elems; ++i) dst[i] = f32_to_f16(src[i]);
                blob = half;
            }
            model.load_parameter(name, blob);
            ++loaded;
        }
        if (loaded != expected.size()) {
            fail("model.safetensors has " + std::to_string(loaded) + " of the model's " +
                 std::to_string(expected.size()) + " parameters");
        }
    }

private:
    const uint8_t *data_ = nullptr;
    size_t size_ = 0;
    size_t body_ = 0;
    Json header_;
};

// ---- one run ------------------------------------------------------------------------------
struct Mode {
    std::string name;
    std::string spec;
    bool compress = false;
    bool true_positions = true;
    infinilm::cache::KVCompressionConfig cfg;
    infinilm::cache::KvcH2OConfig h2o;
    infinilm::cache::KvcKvqConfig kvq;
};

// "k4v4-s4w64" -> K 4 bits, V 4 bits, sink 4, window 64 (8-bit), K centers; "k8v8" -> none.
void parse_kvq(const std::string &name, const std::string &value, infinilm::cache::KvcKvqConfig &kvq) {
    unsigned kb = 0, vb = 0, sink = 0, window = 0;
    char tail = 0;
    int n = std::sscanf(value.c_str(), "k%uv%u-s%uw%u%c", &kb, &vb, &sink, &window, &tail);
    if (!(n == 2 || n == 4)) fail("mode " + name + ": kvq=kKvV[-sSwW], got " + value);
    kvq.enable = true;
    kvq.k_bits = kb;
    kvq.v_bits = vb;
    kvq.sink = n == 4 ? sink : 0;
    kvq.window = n == 4 ? window : 0;
    kvq.window_bits = 8;
    kvq.k_center = n == 4 && sink > 0 && window > 0;
}

Mode parse_mode(const std::string &arg, const std::string &kvc_library) {
    size_t eq = arg.find('=');
    if (eq == std::string::npos) fail("--mode NAME=SPEC, got " + arg);
    Mode m;
    m.name = arg.substr(0, eq);
    m.spec = arg.substr(eq + 1);
    m.cfg.kvc_library = kvc_library;
    m.h2o.library = kvc_library;
    m.kvq.library = kvc_library;
    if (m.spec == "full") return m;
    std::stringstream ss(m.spec);
    std::string item;
    while (std::getline(ss, item, ',')) {
        size_t e = item.find('=');
        if (e == std::string::npos) fail("mode " + m.name + ": expected key=value, got " + item);
        std::string key = item.substr(0, e), value = item.substr(e + 1);
        if (key == "backend") {
            m.cfg.backend = value;
        } else if (key == "weights") {
            m.cfg.weight_path = value;
        } else if (key == "sink") {
            m.cfg.sink_tokens = uint32_t(std::stoul(value));
        } else if (key == "recent") {
            m.cfg.recent_tokens = uint32_t(std::stoul(value));
        } else if (key == "h2o" || key == "streaming") {
            m.h2o.enable = true;
            m.h2o.streaming = key == "streaming";
            m.h2o.target_lossy_ratio = std::stof(value);
        } else if (key == "library") {
            m.cfg.kvc_library = m.h2o.library = m.kvq.library = value;
        } else if (key == "kvq") {
            parse_kvq(m.name, value, m.kvq);
        } else if (key == "h2o_sink") {
            m.h2o.sink_tokens = uint32_t(std::stoul(value));
        } else if (key == "h2o_recent") {
            m.h2o.recent_tokens = uint32_t(std::stoul(value));
        } else if (key == "h2o_block") {
            m.h2o.block_tokens = uint32_t(std::stoul(value));
        } else if (key == "h2o_trigger") {
            m.h2o.trigger_min_tokens = uint32_t(std::stoul(value));
        } else if (key == "h2o_interval") {
            m.h2o.update_interval = uint32_t(std::stoul(value));
        } else if (key == "positions") {
            if (value != "true" && value != "restart") fail("mode " + m.name + ": positions=true|restart");
            m.true_positions = value == "true";
        } else {
            fail("mode " + m.name + ": unknown key " + key);
        }
    }
    if (m.cfg.weight_path.empty()) {
        if (!m.h2o.enable && !m.kvq.enable) fail("mode " + m.name + ": weights=FILE, h2o=R or kvq=... is needed");
        return m;
    }
    m.compress = true;
    m.cfg.enable = true;
    return m;
}

infinicore::Tensor i64_tensor(const std::vector<int64_t> &values, infinicore::Shape shape) {
    auto t = infinicore::Tensor::empty(shape, infinicore::DataType::I64, infinicore::Device::cpu());
    std::memcpy(t->data(), values.data(), values.size() * sizeof(int64_t));
    return t;
}

// The engine: a LlamaForCausalLM with one static cache, driven token by token.
class Engine {
public:
    Engine(const LlamaConfig &config, const SafeTensors &weights, size_t capacity)
        : config_(config), capacity_(capacity) {
        infinilm::engine::distributed::RankInfo rank(infinicore::Device::cpu());
        infinilm::cache::StaticKVCacheConfig cache_cfg(1, capacity);
        model_ = std::dynamic_pointer_cast<LlamaForCausalLM>(
            infinilm::InfinilmModelFactory::createModel(config_, rank, &cache_cfg));
        weights.load_into(*model_);
    }

    void reset(const Mode &mode) {
        const auto &h2o = mode.h2o;
        infinilm::cache::StaticKVCacheConfig cache_cfg(1, capacity_);
        cache_cfg.kvc_h2o = h2o;
        cache_cfg.kvc_kvq = mode.kvq;
        model_->reset_cache(&cache_cfg);
        h2o_ = h2o.enable;
        cache_len_ = 0;
        position_ = 0;
    }

    // Feeds ids; returns the logits of the last `rows` of them (all when 0), row-major.
    std::vector<float> forward(const std::vector<int64_t> &ids, size_t rows = 0) {
        size_t n = ids.size();
        std::vector<int64_t> positions(n);
        for (size_t i = 0; i < n; ++i) positions[i] = int64_t(position_ + i);
        infinilm::InfinilmModel::Input in;
        in.input_ids = i64_tensor(ids, {1, n});
        in.position_ids = i64_tensor(positions, {1, n});
        in.past_sequence_lengths = i64_tensor({int64_t(cache_len_)}, {1});
        in.total_sequence_lengths = i64_tensor({int64_t(cache_len_ + n)}, {1});
        auto logits = model_->forward(in).logits;
        infinicore::context::syncDevice();
        if (rows == 0 || rows > n) rows = n;
        const size_t skip = (n - rows) * config_.vocab_size;
        std::vector<float> out(rows * config_.vocab_size);
        if (logits->dtype() == infinicore::DataType::F16) {
            const uint16_t *p = reinterpret_cast<const uint16_t *>(logits->data()) + skip;
            for (size_t i = 0; i < out.size(); ++i) out[i] = f16_to_f32(p[i]);
        } else {
            const float *p = reinterpret_cast<const float *>(logits->data()) + skip;
            std::copy(p, p + out.size(), out.begin());
        }
        cache_len_ += n;
        position_ += n;
        if (h2o_) cache_len_ = model_->apply_kvc_h2o_plan(uint32_t(cache_len_));
        return out;
    }

    // Compresses the cache; the next position stays the true one unless true_positions is off.
    void compress(const Mode &mode) {
        uint32_t new_len = model_->compress_kv_cache_inplace(uint32_t(cache_len_), 1, mode.cfg);
        cache_len_ = new_len;
        if (!mode.true_positions) position_ = new_len;
    }

    infinilm::cache::StaticKVCache &cache() {
        auto c = std::dynamic_pointer_cast<infinilm::cache::StaticKVCache>(model_->model().kv_cache());
        if (!c) fail("the model has no static cache");
        return *c;
    }

    size_t cache_len() const { return cache_len_; }
    size_t bytes_per_token() const {
        return 2 * config_.num_hidden_layers * config_.num_key_value_heads * config_.head_dim * infinicore::dsize(config_.dtype);
    }
    const LlamaConfig &config() const { return config_; }

private:
    LlamaConfig config_;
    size_t capacity_;
    std::shared_ptr<LlamaForCausalLM> model_;
    size_t cache_len_ = 0;
    size_t position_ = 0;
    bool h2o_ = false;
};

// log-softmax of one row of logits.
void log_softmax(const float *x, size_t n, std::vector<double> &out) {
    out.resize(n);
    double m = *std::max_element(x, x + n), s = 0;
    for (size_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
    double lse = m + std::log(s);
    for (size_t i = 0; i < n; ++i) out[i] = double(x[i]) - lse;
}

struct Result {
    std::string name, spec;
    double ppl = 0, kl = 0;
    size_t tokens_held = 0, bytes_held = 0, logical_tokens = 0, kv_bytes_allocated = 0;
    double mean_tokens_held = 0;
    double prefill_s = 0, compress_s = 0, decode_tok_s = 0;
    std::vector<double> round_tok_s; // the interleaved rounds' decode tok/s
    std::string error;               // the compression's error, when it refused (cache unchanged),
                                     // or the forward's, which ended the mode's run
    size_t error_position = 0;       // the forward's error: the first token it could not process
};

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Runs one mode; `reference` holds the reference's log-probabilities (filled when empty).
Result run(Engine &engine, const Mode &mode, const std::vector<int64_t> &ids, size_t prompt, size_t chunk,
           std::vector<std::vector<float>> &reference) {
    Result r;
    r.name = mode.name;
    r.spec = mode.spec;
    const size_t vocab = engine.config().vocab_size;
    auto t0 = Clock::now();
    std::vector<float> logits;
    try {
        engine.reset(mode);
        logits = engine.forward(std::vector<int64_t>(ids.begin(), ids.begin() + prompt), 1);
    } catch (const std::exception &e) {
        // The engine's error ends this mode's request, as a server would end it.
        r.error = e.what();
        if (reference.empty()) fail("the reference mode " + mode.name + " failed: " + r.error);
        return r;
    }
    auto t1 = Clock::now();
    if (mode.compress) {
        // A refusal (an error from either backend) leaves the cache as it was: the run goes on
        // with the uncompressed cache, and the error is reported.
        try {
            engine.compress(mode);
        } catch (const std::exception &e) {
            r.error = e.what();
        }
    }
    auto t2 = Clock::now();
    r.prefill_s = seconds(t0, t1);
    r.compress_s = seconds(t1, t2);

    const bool fill = reference.empty();
    double nll = 0, kl = 0;
    size_t scored = 0;
    std::vector<double> lp;
    auto score = [&](const float *row, size_t target_index) {
        for (size_t v = 0; v < vocab; ++v) {
            if (!std::isfinite(row[v])) {
                fail("mode " + mode.name + ": the engine's logits are not finite at position " +
                     std::to_string(target_index - 1));
            }
        }
        log_softmax(row, vocab, lp);
        nll -= lp[size_t(ids[target_index])];
        if (fill) {
            reference.emplace_back(lp.begin(), lp.end());
        } else {
            const std::vector<float> &ref = reference[scored];
            double d = 0;
            for (size_t v = 0; v < vocab; ++v) d += std::exp(double(ref[v])) * (double(ref[v]) - lp[v]);
            kl += d;
        }
        ++scored;
    };
    score(logits.data(), prompt);
    double decode_s = 0, held_sum = 0;
    size_t decoded = 0, steps = 0;
    for (size_t at = prompt; at + 1 < ids.size(); at += chunk) {
        size_t n = std::min(chunk, ids.size() - 1 - at);
        auto a = Clock::now();
        try {
            logits = engine.forward(std::vector<int64_t>(ids.begin() + at, ids.begin() + at + n));
        } catch (const std::exception &e) {
            r.error = e.what();
            r.error_position = at;
            if (fill) fail("the reference mode " + mode.name + " failed: " + r.error);
            return r;
        }
        decode_s += seconds(a, Clock::now());
        decoded += n;
        held_sum += double(engine.cache_len());
        ++steps;
        for (size_t i = 0; i < n; ++i) score(logits.data() + i * vocab, at + i + 1);
    }
    r.ppl = std::exp(nll / double(scored));
    r.kl = fill ? 0 : kl / double(scored);
    r.tokens_held = engine.cache_len();
    r.mean_tokens_held = steps > 0 ? held_sum / double(steps) : double(r.tokens_held);
    r.logical_tokens = ids.size() - 1;
    r.bytes_held = r.tokens_held * engine.bytes_per_token();
    r.kv_bytes_allocated = engine.cache().kv_bytes_held();
    r.decode_tok_s = decode_s > 0 ? double(decoded) / decode_s : 0;
    return r;
}

// Copies of the cache's first `len` rows of every layer and head: [layers][heads][len][dim].
std::vector<float> snapshot(infinilm::cache::StaticKVCache &cache, bool v, size_t len) {
    const auto &t = v ? cache.v_caches() : cache.k_caches();
    const auto &s = t->shape(); // [layers, batch, heads, capacity, dim]
    const float *p = reinterpret_cast<const float *>(t->data());
    std::vector<float> out;
    for (size_t l = 0; l < s[0]; ++l)
        for (size_t h = 0; h < s[2]; ++h) {
            const float *row = p + ((l * s[1] + 0) * s[2] + h) * s[3] * s[4];
            out.insert(out.end(), row, row + len * s[4]);
        }
    return out;
}

void restore(infinilm::cache::StaticKVCache &cache, bool v, size_t len, const std::vector<float> &data) {
    const auto &t = v ? cache.v_caches() : cache.k_caches();
    const auto &s = t->shape();
    float *p = reinterpret_cast<float *>(const_cast<std::byte *>(t->data()));
    size_t at = 0;
    for (size_t l = 0; l < s[0]; ++l)
        for (size_t h = 0; h < s[2]; ++h) {
            std::memcpy(p + ((l * s[1] + 0) * s[2] + h) * s[3] * s[4], data.data() + at, len * s[4] * sizeof(float));
            at += len * s[4];
        }
}

int check_equal(Engine &engine, const std::vector<int64_t> &ids, size_t prompt, const std::string &weights,
                const std::string &kvc_library, double bound) {
    engine.reset(Mode{});
    engine.forward(std::vector<int64_t>(ids.begin(), ids.begin() + prompt), 1);
    auto &cache = engine.cache();
    auto k0 = snapshot(cache, false, prompt), v0 = snapshot(cache, true, prompt);
    infinilm::cache::KVCompressionConfig cfg;
    cfg.enable = true;
    cfg.weight_path = weights;
    cfg.kvc_library = kvc_library;
    cfg.backend = "infinilm";
    uint32_t own_len = cache.compress_inplace(uint32_t(prompt), 1, cfg);
    auto k_own = snapshot(cache, false, own_len), v_own = snapshot(cache, true, own_len);
    restore(cache, false, prompt, k0);
    restore(cache, true, prompt, v0);
    cfg.backend = "kvc";
    uint32_t kvc_len = cache.compress_inplace(uint32_t(prompt), 1, cfg);
    auto k_kvc = snapshot(cache, false, kvc_len), v_kvc = snapshot(cache, true, kvc_len);
    if (own_len != kvc_len) {
        std::printf("lengths differ: InfiniLM %u, kvc %u\n", own_len, kvc_len);
        return 1;
    }
    double max_diff = 0, max_mag = 0;
    for (auto pair : {std::make_pair(&k_own, &k_kvc), std::make_pair(&v_own, &v_kvc)}) {
        for (size_t i = 0; i < pair.first->size(); ++i) {
            max_diff = std::max(max_diff, double(std::fabs((*pair.first)[i] - (*pair.second)[i])));
            max_mag = std::max(max_mag, double(std::fabs((*pair.first)[i])));
        }
    }
    double rel = max_mag > 0 ? max_diff / max_mag : max_diff;
    std::printf("{\"prompt\": %zu, \"compressed_len\": %u, \"max_abs_diff\": %.3e, \"max_abs\": %.3e, "
                "\"relative\": %.3e, \"bound\": %.1e, \"equal\": %s}\n",
                prompt, own_len, max_diff, max_mag, rel, bound, rel <= bound ? "true" : "false");
    return rel <= bound ? 0 : 1;
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Decode speed with the modes interleaved (see --speed-rounds).
void speed(const LlamaConfig &config, const SafeTensors &weights, const std::vector<Mode> &modes,
           const std::vector<int64_t> &ids, size_t prompt, size_t rounds, size_t steps, std::vector<Result> &results) {
    std::vector<std::unique_ptr<Engine>> engines;
    for (const Mode &m : modes) {
        engines.push_back(std::make_unique<Engine>(config, weights, ids.size()));
        engines.back()->reset(m);
        engines.back()->forward(std::vector<int64_t>(ids.begin(), ids.begin() + prompt), 1);
        if (m.compress) engines.back()->compress(m);
    }
    for (size_t r = 0; r < rounds; ++r) {
        for (size_t i = 0; i < modes.size(); ++i) {
            size_t at = prompt + r * steps;
            auto a = Clock::now();
            for (size_t d = 0; d < steps; ++d) engines[i]->forward({ids[at + d]});
            results[i].round_tok_s.push_back(double(steps) / seconds(a, Clock::now()));
        }
    }
}

std::vector<int64_t> read_ids(const std::string &path) {
    std::ifstream f(path);
    if (!f) fail("cannot read " + path);
    std::vector<int64_t> ids;
    int64_t id;
    while (f >> id) ids.push_back(id);
    if (!f.eof()) fail(path + ": not a list of integer token ids");
    return ids;
}

std::string json_escape(const std::string &s) {
    std::string out;
    for (char c : s) {
        if (static_cast<unsigned char>(c) < 0x20) {
            char esc[8];
            std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(c));
            out += esc;
            continue;
        }
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out;
}

} // namespace

int main(int argc, char **argv) try {
    std::string model_dir, tokens, json_out, check_weights, kvc_library = "libkvc.so.0", dtype = "f32";
    size_t n_tokens = 1024, prompt = 512, chunk = 1, speed_rounds = 0, speed_steps = 32;
    int threads = 1;
    double bound = 1e-4;
    bool speed_only = false;
    std::vector<std::string> mode_args;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) fail(a + " needs a value");
            return argv[++i];
        };
        if (a == "--model") model_dir = next();
        else if (a == "--tokens") tokens = next();
        else if (a == "--n-tokens") n_tokens = std::stoul(next());
        else if (a == "--prompt") prompt = std::stoul(next());
        else if (a == "--chunk") chunk = std::stoul(next());
        else if (a == "--threads") threads = std::stoi(next());
        else if (a == "--kvc-library") kvc_library = next();
        else if (a == "--mode") mode_args.push_back(next());
        else if (a == "--json") json_out = next();
        else if (a == "--check-equal") check_weights = next();
        else if (a == "--bound") bound = std::stod(next());
        else if (a == "--speed-rounds") speed_rounds = std::stoul(next());
        else if (a == "--speed-steps") speed_steps = std::stoul(next());
        else if (a == "--speed-only") speed_only = true;
        else if (a == "--dtype") dtype = next();
        else fail("unknown argument " + a);
    }
    if (model_dir.empty() || tokens.empty()) fail("--model DIR and --tokens ids.txt are needed");
    omp_set_num_threads(threads);
    infinicore::context::setDevice(infinicore::Device::cpu());

    std::vector<int64_t> ids = read_ids(tokens);
    if (ids.size() < n_tokens) fail(tokens + " has " + std::to_string(ids.size()) + " ids, fewer than --n-tokens");
    ids.resize(n_tokens);
    if (prompt == 0 || prompt >= n_tokens || chunk == 0) fail("need 0 < --prompt < --n-tokens and --chunk > 0");

    if (dtype != "f32" && dtype != "f16") fail("--dtype f32|f16");
    LlamaConfig config = read_config(model_dir, dtype == "f16" ? infinicore::DataType::F16 : infinicore::DataType::F32);
    SafeTensors weights(model_dir + "/model.safetensors");
    Engine engine(config, weights, n_tokens);
    if (!check_weights.empty() && dtype != "f32") fail("--check-equal compares f32 caches (--dtype f32)");
    if (!check_weights.empty()) return check_equal(engine, ids, prompt, check_weights, kvc_library, bound);

    if (mode_args.empty()) fail("at least one --mode NAME=SPEC (the first is the reference)");
    std::vector<Mode> modes;
    for (const auto &a : mode_args) modes.push_back(parse_mode(a, kvc_library));
    std::vector<std::vector<float>> reference;
    std::vector<Result> results;
    for (const Mode &m : modes) {
        if (speed_only) {
            Result r;
            r.name = m.name;
            r.spec = m.spec;
            results.push_back(r);
            continue;
        }
        Result r = run(engine, m, ids, prompt, chunk, reference);
        std::fprintf(stderr, "%-16s PPL %.4f  KL %.5f  held %zu/%zu tokens (mean %.0f)  K+V %.2f MB  prefill %.1f s  compress %.2f s  decode %.2f tok/s\n",
                     r.name.c_str(), r.ppl, r.kl, r.tokens_held, r.logical_tokens, r.mean_tokens_held,
                     r.kv_bytes_allocated / 1e6, r.prefill_s, r.compress_s, r.decode_tok_s);
        if (!r.error.empty()) {
            std::fprintf(stderr, "%-16s %s at position %zu: %s\n", r.name.c_str(),
                         r.error_position > 0 ? "request ended" : "refused", r.error_position, r.error.c_str());
        }
        results.push_back(r);
    }
    if (speed_rounds > 0) {
        if (prompt + speed_rounds * speed_steps > n_tokens) fail("--speed-rounds x --speed-steps past --n-tokens");
        speed(config, weights, modes, ids, prompt, speed_rounds, speed_steps, results);
        for (const Result &r : results) {
            std::fprintf(stderr, "%-16s decode %.2f tok/s (median of %zu interleaved rounds of %zu steps)\n",
                         r.name.c_str(), median(r.round_tok_s), r.round_tok_s.size(), speed_steps);
        }
    }
    std::ostringstream js;
    js << "{\n  \"engine\": \"InfiniLM csrc (CPU)\",\n  \"n_tokens\": " << n_tokens << ",\n  \"prompt\": " << prompt
       << ",\n  \"chunk\": " << chunk << ",\n  \"threads\": " << threads << ",\n  \"tokens\": \"" << json_escape(tokens)
       << "\",\n  \"dtype\": \"" << dtype << "\",\n  \"bytes_per_token\": " << engine.bytes_per_token() << ",\n  \"speed_rounds\": " << speed_rounds
       << ",\n  \"speed_steps\": " << speed_steps << ",\n  \"modes\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
        const Result &r = results[i];
        char buf[16384];
        std::snprintf(buf, sizeof buf,
                      "    {\"name\": \"%s\", \"spec\": \"%s\", \"ppl\": %.6f, \"kl\": %.6f, \"tokens_held\": %zu, "
                      "\"mean_tokens_held\": %.1f, \"logical_tokens\": %zu, \"bytes_held\": %zu, "
                      "\"kv_bytes_allocated\": %zu, \"prefill_s\": %.3f, \"compress_s\": %.4f, \"decode_tok_s\": %.3f, "
                      "\"decode_tok_s_interleaved\": %.3f, \"error\": \"%s\", \"error_position\": %zu}%s\n",
                      json_escape(r.name).c_str(), json_escape(r.spec).c_str(), r.ppl, r.kl, r.tokens_held,
                      r.mean_tokens_held, r.logical_tokens, r.bytes_held, r.kv_bytes_allocated, r.prefill_s,
                      r.compress_s, r.decode_tok_s, median(r.round_tok_s), json_escape(r.error).c_str(), r.error_position,
                      i + 1 < results.size() ? "," : "");
        js << buf;
    }
    js << "  ]\n}\n";
    if (!json_out.empty()) {
        std::ofstream f(json_out);
        f << js.str();
        if (!f) fail("cannot write " + json_out);
    } else {
        std::fputs(js.str().c_str(), stdout);
    }
    return 0;
} catch (const std::exception &e) {
    std::fprintf(stderr, "kvc_infinilm_eval: %s\n", e.what());
    return 2;
}
