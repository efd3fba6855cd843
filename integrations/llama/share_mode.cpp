// kvc_llama_eval, share mode: a prefix's KV shared between processes through kvc's tiers
// (share_mode.hpp says how).
#include "share_mode.hpp"

#include "kvc_api.hpp"
#include "llama_state_parse.hpp"

#include "kvc.h"
#include "kvc.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <system_error>
#include <utility>

extern char ** environ;

namespace kvc_llama {

namespace {

// ------------------------------------------------------------------------------------------
// tiers

uint32_t share_codec_id(const std::string & c) {
    if (c == "raw") return KVC_TIERS_CODEC_RAW;
    if (c == "gear-v1") return KVC_TIERS_CODEC_GEAR_V1;
    if (c == "kvq" || c == "kvq-k4v4") return KVC_TIERS_CODEC_KVQ_K4V4;
    if (c == "kvq-k8v4") return KVC_TIERS_CODEC_KVQ_K8V4;
    if (c == "kvq-k4v2") return KVC_TIERS_CODEC_KVQ_K4V2;
    if (c.rfind("tc-", 0) == 0) return KVC_TIERS_CODEC_TC;
    return KVC_TIERS_CODEC_GEAR_V2;
}

// sqrt(sum (a-b)^2 / sum b^2) over f16 values: the relative RMS error of a lossy restore
double rel_rms_f16(const uint16_t * a, const uint16_t * b, size_t n) {
    double err = 0.0, ref = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double x = ggml_fp16_to_fp32(a[i]), y = ggml_fp16_to_fp32(b[i]);
        err += (x - y) * (x - y);
        ref += y * y;
    }
    return ref > 0.0 ? std::sqrt(err / ref) : 0.0;
}

// The tiers config of the model: f16 cache rows, the chosen codec and chunk size, the model
// file's BLAKE3 in the fingerprint; Redis when --redis is given, else the disk tier in `dir`.
kvc_tiers_config share_config(const ModelInfo & mi, const Options & o, const std::string & dir, double * hash_s) {
    kvc_tiers_config c;
    kvc_ok(kvc_tiers_config_default(&c), "kvc_tiers_config_default");
    c.dtype = KVC_DTYPE_F16;
    c.codec = share_codec_id(o.share_codec);
    c.n_layer = (size_t) mi.n_layer;
    c.n_kv_head = (size_t) mi.n_head_kv;
    c.head_dim = (size_t) mi.head_dim;
    c.chunk_tokens = (size_t) o.share_chunk;
    c.memory_budget_bytes = 0;
    const double t0 = now_s();
    kvc_ok(kvc_tiers_hash_model_file(o.model.c_str(), c.model_hash), "kvc_tiers_hash_model_file");
    if (hash_s) *hash_s = now_s() - t0;
    if (!o.redis.empty()) {
        c.redis_url = o.redis.c_str();
    } else {
        c.disk_dir = dir.c_str();
        c.disk_budget_bytes = 8ull << 30;
    }
    return c;
}

// The transform coder (tc-<bound>) opens with its target and calibration file.
kvc::Tiers open_tiers(const kvc_tiers_config & c, const Options & o) {
    const bool tc = c.codec == KVC_TIERS_CODEC_TC;
    auto t = tc ? kvc::make_handle<kvc::Tiers>(kvc_tiers_new_tc, &c, o.share_codec.c_str(),
                                               o.share_calibration.c_str())
                : kvc::make_handle<kvc::Tiers>(kvc_tiers_new, &c);
    if (!t) {
        // kvc's message already names the call (kvc_tiers_new: ..., kvc_tiers_new_tc: ...)
        if (t.error().status() == KVC_INVALID_ARGUMENT || t.error().status() == KVC_IO)
            throw UsageError(t.error().message());
        fail(t.error().to_string());
    }
    return std::move(*t);
}

kvc_tiers_metrics tiers_metrics(const kvc::Tiers & t) {
    auto m = kvc::tiers_metrics(t.get());
    if (!m) fail("kvc_tiers_get_metrics: " + m.error().to_string());
    return *m;
}

int share_tier_index(const Options & o) { return o.redis.empty() ? KVC_TIERS_DISK : KVC_TIERS_REDIS; }

// ------------------------------------------------------------------------------------------
// the decoding both processes do the same way

CtxPtr make_share_context(llama_model * model, const Options & o) {
    CtxConfig cfg;
    cfg.n_ctx = o.share_prefix + o.share_rest;
    cfg.n_batch = o.share_chunk;
    return make_context(model, o, cfg);
}

// Prefills tokens [from, to) in batches that end on chunk boundaries, so a process that
// restored the first chunks and prefills the rest runs the very batches process 1 ran.
void share_prefill(llama_context * ctx, const std::vector<llama_token> & toks, int from, int to, int chunk) {
    for (int s = from; s < to;) {
        const int e = std::min(to, (s / chunk + 1) * chunk);
        std::vector<bool> none(e - s, false);
        decode_batch(ctx, toks, s, e - s, s, none);
        s = e;
    }
}

// Decodes tokens [first, first + n) one at a time; the logits after each, row after row.
std::vector<float> share_decode_rest(llama_context * ctx, const std::vector<llama_token> & toks, int first, int n,
                                     int n_vocab) {
    std::vector<float> out;
    out.reserve((size_t) n * n_vocab);
    std::vector<bool> one(1, true);
    for (int i = first; i < first + n; ++i) {
        decode_batch(ctx, toks, i, 1, i, one);
        const float * l = llama_get_logits_ith(ctx, -1);
        if (!l) fail("share: no logits after token " + std::to_string(i));
        out.insert(out.end(), l, l + n_vocab);
    }
    return out;
}

// ------------------------------------------------------------------------------------------
// process 2

// CPU seconds (user + system) of this process so far, all threads
double cpu_s() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return (double) u.ru_utime.tv_sec + 1e-6 * (double) u.ru_utime.tv_usec + (double) u.ru_stime.tv_sec +
           1e-6 * (double) u.ru_stime.tv_usec;
}

void write_all(int fd, const void * p, size_t n, const std::string & what) {
    const char * b = (const char *) p;
    while (n > 0) {
        const ssize_t w = ::write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) fail("share: writing " + what + ": " + std::strerror(errno));
        b += w;
        n -= (size_t) w;
    }
}

void write_binary_file(const std::string & path, const void * p, size_t n) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) fail("share: cannot create '" + path + "'");
    try {
        write_all(fd, p, n, path);
    } catch (...) {
        ::close(fd);
        throw;
    }
    if (::close(fd) != 0) fail("share: closing '" + path + "' failed");
}

}  // namespace

// A process 2: restore (or recompute) the prefix, decode the rest, write <prefix>.logits and
// <prefix>.txt ("key value" lines). Exits 0 whenever the tiers failed: that is a fallback.
int run_share_child(llama_model * model, const ModelInfo & mi, const Options & o) {
    if (o.share_text < 0 || o.share_text >= (int) o.texts.size()) throw UsageError("--share-text out of range");
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const auto toks = tokenize(vocab, read_file(o.texts[(size_t) o.share_text]), o.bos);
    const int P = o.share_prefix, R = o.share_rest, C = o.share_chunk;
    if ((int) toks.size() < P + R) throw UsageError("share: the text is shorter than --share-prefix + --share-rest");
    const kvc_tiers_config cfg = share_config(mi, o, o.share_dir, nullptr);
    kvc::Tiers tiers = open_tiers(cfg, o);
    CtxPtr ctx = make_share_context(model, o);
    const std::vector<uint32_t> ids(toks.begin(), toks.begin() + P);
    const size_t ne = (size_t) mi.n_embd_kv();

    // start barrier: tell process 1 we are ready, wait until every process 2 is
    if (o.share_sync_w >= 0) {
        write_all(o.share_sync_w, "r", 1, "the ready byte");
        ::close(o.share_sync_w);
    }
    if (o.share_sync_r >= 0) {
        char c = 0;
        ssize_t n;
        do n = ::read(o.share_sync_r, &c, 1); while (n < 0 && errno == EINTR);
        if (n != 1) fail("share: process 1 went away before the start");
        ::close(o.share_sync_r);
    }

    // restore: lookup + fetch, check and decode + the state blob + llama_state_seq_set_data
    const double c0 = cpu_s();
    const double t0 = now_s();
    size_t found = 0;
    kvc_ok(kvc_tiers_lookup(tiers.get(), ids.data(), ids.size(), &found), "kvc_tiers_lookup");
    const double t1 = now_s();
    size_t got = 0;
    // not value-initialized: kvc writes every byte of the tokens it restores, and only those are read
    const size_t kv_len = (size_t) mi.n_layer * found * ne;
    std::unique_ptr<uint16_t[]> k(found ? new uint16_t[kv_len] : nullptr), v(found ? new uint16_t[kv_len] : nullptr);
    if (found > 0) {
        kvc_ok(kvc_tiers_restore(tiers.get(), ids.data(), ids.size(), found, k.get(), kv_len * 2, v.get(), kv_len * 2,
                                 &got),
               "kvc_tiers_restore");
    }
    const double t2 = now_s();
    std::vector<uint8_t> blob;
    if (got > 0) {
        std::vector<int32_t> pos(got);
        for (size_t c = 0; c < got; ++c) pos[c] = (int32_t) c;
        // flash attention is off in make_context: llama.cpp holds V transposed
        blob = kvc_llama_state::build_f16_state(pos, k.get(), v.get(), found, mi.n_layer, ne, 1, 0, 0);
    }
    if (o.share_control && got > 0) {
        // the control: flip the top exponent bit of layer 0's first K value of the last
        // restored cell (header 16 B + 12 B per cell + v_trans, n_layer (, rotations) + type and
        // row size 12 B)
        blob[16 + 12 * got + kvc_llama_state::kDataHeaderBytes + 12 + (got - 1) * ne * 2 + 1] ^= 0x40;
    }
    const double t3 = now_s();
    bool set_ok = true;
    if (got > 0) {
        const size_t used = llama_state_seq_set_data(ctx.get(), blob.data(), blob.size(), 0);
        set_ok = used == blob.size();
    }
    const double t4 = now_s();
    const double restore_cpu_s = cpu_s() - c0;
    if (!set_ok) {
        // llama.cpp refused the blob (it cleared the sequence): recompute all of it
        std::fprintf(stderr, "kvc_llama_eval: share: llama_state_seq_set_data refused the restored blob; prefilling\n");
        llama_memory_clear(llama_get_memory(ctx.get()), true);
        got = 0;
    }
    // the blob went in as built: llama.cpp gives the same bytes back
    const bool round_trip = got == 0 || get_seq_state(ctx.get()) == blob;
    blob.clear();
    k.reset();
    v.reset();
    const double t5 = now_s();
    share_prefill(ctx.get(), toks, (int) got, P, C);
    const double recompute_s = now_s() - t5;
    const auto logits = share_decode_rest(ctx.get(), toks, P, R, mi.n_vocab);
    const kvc_tiers_metrics m = tiers_metrics(tiers);
    const kvc_tier_metrics & tm = m.tiers[share_tier_index(o)];

    write_binary_file(o.share_child + ".logits", logits.data(), logits.size() * sizeof(float));
    std::ostringstream rep;
    rep.precision(10);
    rep << "restore_s " << (t4 - t0) << "\nlookup_s " << (t1 - t0) << "\nfetch_decode_s " << (t2 - t1)
        << "\nbuild_s " << (t3 - t2) << "\nrestore_cpu_s " << restore_cpu_s << "\nset_data_s " << (t4 - t3) << "\nrecompute_s " << recompute_s
        << "\nlookup_tokens " << found << "\nrestored_tokens " << got << "\nset_data_refused " << (set_ok ? 0 : 1)
        << "\nstate_round_trip " << (round_trip ? 1 : 0) << "\nfallbacks " << m.fallbacks << "\nbytes_read "
        << tm.bytes_read << "\nhits " << tm.hits << "\nmisses " << tm.misses << "\nerrors " << tm.errors
        << "\ncorrupt " << tm.corrupt << "\nforeign " << tm.foreign << "\ncontrol_damaged "
        << (o.share_control && got > 0 ? 1 : 0) << "\n";
    const std::string s = rep.str();
    write_binary_file(o.share_child + ".txt", s.data(), s.size());
    return 0;
}

namespace {

// ------------------------------------------------------------------------------------------
// process 1

// A temporary work directory (the children's outputs, and the disk tier unless --share-dir
// names one), removed with everything in it at the end.
struct ShareWork {
    std::string dir;
    ShareWork() {
        const char * tmp = std::getenv("TMPDIR");
        std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/kvc-share-XXXXXX";
        std::vector<char> buf(tmpl.begin(), tmpl.end());
        buf.push_back('\0');
        if (!::mkdtemp(buf.data())) fail("share: cannot create a temporary directory from '" + tmpl + "'");
        dir = buf.data();
    }
    ~ShareWork() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
    ShareWork(const ShareWork &) = delete;
    ShareWork & operator=(const ShareWork &) = delete;
};

// Process 2s started by this process; killed and reaped if process 1 fails before they end.
struct ShareChildren {
    std::vector<pid_t> pids;
    ~ShareChildren() {
        for (pid_t p : pids) {
            if (p <= 0) continue;
            ::kill(p, SIGKILL);
            ::waitpid(p, nullptr, 0);
        }
    }
    // waits for child i; its exit status (or 128 + signal)
    int wait(size_t i) {
        int st = 0;
        pid_t r;
        do r = ::waitpid(pids[i], &st, 0); while (r < 0 && errno == EINTR);
        pids[i] = -1;
        if (r < 0) return -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    }
    // the first child that has already exited, or -1
    int exited() {
        for (size_t i = 0; i < pids.size(); ++i) {
            if (pids[i] <= 0) continue;
            int st = 0;
            if (::waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                pids[i] = -1;
                return (int) i;
            }
        }
        return -1;
    }
};

struct Fd {
    int fd = -1;
    ~Fd() { close(); }
    void close() {
        if (fd >= 0) ::close(fd);
        fd = -1;
    }
};

std::map<std::string, double> read_child_report(const std::string & path) {
    std::istringstream in(read_file(path));
    std::map<std::string, double> m;
    std::string k;
    double x;
    while (in >> k >> x) m[k] = x;
    for (const char * need : {"restore_s", "restored_tokens", "fallbacks", "bytes_read", "recompute_s"}) {
        if (!m.count(need)) fail("share: process 2 report '" + path + "' lacks " + need);
    }
    return m;
}

double percentile(std::vector<double> x, double q) {
    if (x.empty()) return NAN;
    std::sort(x.begin(), x.end());
    // nearest rank
    const size_t i = (size_t) std::ceil(q * (double) x.size());
    return x[std::min(x.size() - 1, i == 0 ? 0 : i - 1)];
}

}  // namespace

RunResult run_share(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks,
                    int text_no, const std::vector<std::string> & args) {
    const int P = o.share_prefix, R = o.share_rest, C = o.share_chunk, K = o.share_clients;
    if ((int) toks.size() < P + R) {
        throw UsageError("share: the text has " + std::to_string(toks.size()) + " tokens, fewer than --share-prefix " +
                         std::to_string(P) + " + --share-rest " + std::to_string(R));
    }
    const size_t ne = (size_t) mi.n_embd_kv();
    const double f16_per_token = (double) mi.cell_bytes(GGML_TYPE_F16, GGML_TYPE_F16);
    ShareWork work;
    const bool redis = !o.redis.empty();
    std::string tier_dir = o.share_dir;
    if (!redis && tier_dir.empty()) tier_dir = work.dir + "/tier";
    double hash_s = 0;
    const kvc_tiers_config cfg = share_config(mi, o, tier_dir, &hash_s);
    kvc::Tiers tiers = open_tiers(cfg, o);
    const int ti = share_tier_index(o);

    // process 1: prefill, store, then the reference continuation
    CtxPtr ctx = make_share_context(model, o);
    const double c0 = cpu_s();
    const double t0 = now_s();
    share_prefill(ctx.get(), toks, 0, P, C);
    const double prefill_s = now_s() - t0;
    const double prefill_cpu_s = cpu_s() - c0;
    const double t1 = now_s();
    const auto state = get_seq_state(ctx.get());
    const auto d = kvc_llama_state::parse_f16_state(state, mi.n_layer, ne);
    if (d.n_cells != P) fail("share: the cache holds " + std::to_string(d.n_cells) + " cells after a prefix of " + std::to_string(P));
    for (int c = 0; c < P; ++c) {
        if (d.pos[(size_t) c] != c) fail("share: cell " + std::to_string(c) + " holds position " + std::to_string(d.pos[(size_t) c]));
    }
    const double t_state = now_s() - t1;
    const std::vector<uint32_t> ids(toks.begin(), toks.begin() + P);
    kvc_tiers_store_report sr{};
    const double t2 = now_s();
    kvc_ok(kvc_tiers_store(tiers.get(), ids.data(), ids.size(), (size_t) P, d.k.data(), d.k.size() * 2, d.v.data(),
                           d.v.size() * 2, &sr),
           "kvc_tiers_store");
    const double store_s = now_s() - t2;
    const kvc_tiers_metrics m1 = tiers_metrics(tiers);
    const std::vector<float> ref = share_decode_rest(ctx.get(), toks, P, R, mi.n_vocab);
    const long cells_end = state_cell_count(get_seq_state(ctx.get()));
    ctx.reset();

    // the codec alone, in this process: the same chunks through a memory-only tiers handle
    // (encode, then a restore that is checksum + decode + copy, no I/O)
    const int full = P / C * C;
    const bool lossless = kvc::tiers_codec_lossless(cfg.codec);
    // the worst layer's relative RMS error of the memory tier's restore (0: lossless)
    double rel_err_k = 0.0, rel_err_v = 0.0;
    double mem_encode_s = NAN, mem_restore_s = NAN;
    if (full > 0) {
        kvc_tiers_config mc = cfg;
        mc.disk_dir = nullptr;
        mc.redis_url = nullptr;
        mc.memory_budget_bytes = 16ull << 30;
        kvc::Tiers mem = open_tiers(mc, o);
        const double a = now_s();
        kvc_ok(kvc_tiers_store(mem.get(), ids.data(), ids.size(), (size_t) P, d.k.data(), d.k.size() * 2, d.v.data(),
                               d.v.size() * 2, nullptr),
               "kvc_tiers_store (memory)");
        mem_encode_s = now_s() - a;
        std::vector<uint16_t> k((size_t) mi.n_layer * full * ne), v(k.size());
        size_t got = 0;
        const double b = now_s();
        kvc_ok(kvc_tiers_restore(mem.get(), ids.data(), ids.size(), (size_t) full, k.data(), k.size() * 2, v.data(),
                                 v.size() * 2, &got),
               "kvc_tiers_restore (memory)");
        mem_restore_s = now_s() - b;
        if (got != (size_t) full) fail("share: the memory tier restored " + std::to_string(got) + " of " + std::to_string(full) + " tokens");
        for (int l = 0; l < mi.n_layer; ++l) {
            const size_t n = (size_t) full * ne, src = (size_t) l * P * ne, dst = (size_t) l * full * ne;
            if (lossless) {
                if (std::memcmp(&k[dst], &d.k[src], n * 2) != 0 || std::memcmp(&v[dst], &d.v[src], n * 2) != 0) {
                    fail("share: the memory tier restored different K/V bytes (layer " + std::to_string(l) + ")");
                }
            } else {
                // lossy: close, not equal; the worst layer's error is reported
                rel_err_k = std::max(rel_err_k, rel_rms_f16(&k[dst], &d.k[src], n));
                rel_err_v = std::max(rel_err_v, rel_rms_f16(&v[dst], &d.v[src], n));
            }
        }
        // A sanity bound against a broken restore, not a quality bound: kvq's rows stay within
        // 0.5 relative RMS at any preset; the transform coder's worst layer may exceed that at a
        // loose target (its bound is on attention outputs), but a restore no better than zeros
        // (1.0) is broken.
        const double sane = cfg.codec == KVC_TIERS_CODEC_TC ? 1.0 : 0.5;
        if (!lossless && !(rel_err_k < sane && rel_err_v < sane)) {
            fail("share: the memory tier's " + o.share_codec + " restore is too far from the stored K/V (relative RMS K " +
                 std::to_string(rel_err_k) + ", V " + std::to_string(rel_err_v) + ")");
        }
    }

    // fault injection between the store and the restores (--share-between)
    if (!o.share_between.empty()) {
        std::fflush(nullptr);
        const int rc = std::system(o.share_between.c_str());
        if (rc != 0) fail("share: --share-between '" + o.share_between + "' ended with status " + std::to_string(rc));
    }

    // process 2s: --share-rounds rounds, one after the other, of --share-clients processes
    // started at once, with a barrier so that their restores overlap
    Fd ready_r, ready_w, go_r, go_w;
    ShareChildren kids;
    std::vector<std::string> bases;
    // starts a process 2 writing to `base`: this binary with the user's arguments and the
    // internal ones; `sync`: take part in the start barrier
    auto spawn = [&](const std::string & base, bool sync, bool control) {
        std::vector<std::string> a(args);
        a.insert(a.end(), {"--share-child", base, "--share-text", std::to_string(text_no)});
        if (sync) a.insert(a.end(), {"--share-sync", std::to_string(go_r.fd) + "," + std::to_string(ready_w.fd)});
        if (control) a.push_back("--share-control");
        if (!redis) a.insert(a.end(), {"--share-dir", tier_dir});
        std::vector<char *> argv;
        for (auto & s2 : a) argv.push_back(&s2[0]);
        argv.push_back(nullptr);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        // a process 2 keeps only its own ends of the barrier pipes
        for (int fd : {ready_r.fd, go_w.fd, sync ? -1 : go_r.fd, sync ? -1 : ready_w.fd}) {
            if (fd >= 0) posix_spawn_file_actions_addclose(&fa, fd);
        }
        pid_t pid = -1;
        const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        if (rc != 0) fail(std::string("share: posix_spawn failed: ") + std::strerror(rc));
        kids.pids.push_back(pid);
    };
    double clients_wall_s = 0;
    for (int round = 0; round < o.share_rounds; ++round) {
        int ready[2], go[2];
        if (::pipe(ready) != 0) fail("share: pipe failed");
        ready_r.fd = ready[0];
        ready_w.fd = ready[1];
        if (::pipe(go) != 0) fail("share: pipe failed");
        go_r.fd = go[0];
        go_w.fd = go[1];
        const size_t first = kids.pids.size();
        for (int i = 0; i < K; ++i) {
            bases.push_back(work.dir + "/client" + std::to_string(round) + "_" + std::to_string(i));
            spawn(bases.back(), true, false);
        }
        ready_w.close();
        go_r.close();
        for (int n = 0; n < K;) {
            pollfd p{ready_r.fd, POLLIN, 0};
            const int pr = ::poll(&p, 1, 200);
            if (pr > 0) {
                char buf[64];
                const ssize_t got = ::read(ready_r.fd, buf, std::min<size_t>(sizeof buf, (size_t) (K - n)));
                if (got > 0) n += (int) got;
                else if (got == 0) fail("share: every process 2 ended before the start");
            }
            const int dead = kids.exited();
            if (dead >= 0) fail("share: process 2 #" + std::to_string(dead) + " ended before the start");
        }
        const double t_go = now_s();
        const std::string go_bytes((size_t) K, 'g');
        write_all(go_w.fd, go_bytes.data(), go_bytes.size(), "the start bytes");
        go_w.close();
        for (int i = 0; i < K; ++i) {
            const int st = kids.wait(first + (size_t) i);
            if (st != 0) fail("share: process 2 #" + std::to_string(i) + " ended with status " + std::to_string(st));
        }
        ready_r.close();
        clients_wall_s = std::max(clients_wall_s, now_s() - t_go);
    }
    // the control: one more process 2, alone, that damages one restored K value (an exponent
    // bit) before loading it; its logits must differ, or the comparison could not fail
    const std::string control_base = work.dir + "/control";
    spawn(control_base, false, true);
    {
        const int st = kids.wait(kids.pids.size() - 1);
        if (st != 0) fail("share: the control process 2 ended with status " + std::to_string(st));
    }

    // compare: every process 2's logits of the rest, bit for bit, with process 1's
    std::vector<double> restore_each, recompute_each, restore_cpu_each, ready_each;
    long differing = 0;
    double kl_max = 0.0;
    double fallbacks = (double) m1.fallbacks;
    double restored_min = 1e300, bytes_read0 = 0, restored0 = 0;
    bool round_trip = true;
    std::ostringstream each;
    std::vector<float> lp_ref, lp;
    // bits differing and mean KL of a process 2's logits against process 1's
    auto read_logits = [&](const std::string & base) {
        const std::string lg = read_file(base + ".logits");
        if (lg.size() != ref.size() * sizeof(float)) fail("share: " + base + ".logits holds the wrong number of logits");
        std::vector<float> l2(ref.size());
        std::memcpy(l2.data(), lg.data(), lg.size());
        return l2;
    };
    // against process 1's logits, or against `against` where given
    auto compare = [&](const std::string & base, long * diff, double * kl, const std::vector<float> * against = nullptr) {
        const std::vector<float> & r0 = against ? *against : ref;
        const std::vector<float> l2 = read_logits(base);
        *diff = 0;
        *kl = 0.0;
        for (int r2 = 0; r2 < R; ++r2) {
            const float * a = r0.data() + (size_t) r2 * mi.n_vocab;
            const float * b = l2.data() + (size_t) r2 * mi.n_vocab;
            *diff += bits_differing(a, b, mi.n_vocab);
            log_softmax(a, mi.n_vocab, lp_ref);
            log_softmax(b, mi.n_vocab, lp);
            *kl += kl_div(lp_ref, lp);
        }
        *kl /= R;
    };
    // perplexity of the text's next tokens over the rest's logits (row i follows token P+i and
    // predicts token P+i+1; a row past the text's end is not scored)
    long ppl_rows = 0;
    auto ppl_of = [&](const std::vector<float> & lg) {
        double nll = 0.0;
        long n = 0;
        for (int r2 = 0; r2 < R && (size_t) (P + r2 + 1) < toks.size(); ++r2) {
            log_softmax(lg.data() + (size_t) r2 * mi.n_vocab, mi.n_vocab, lp);
            nll -= lp[(size_t) toks[(size_t) (P + r2 + 1)]];
            ++n;
        }
        ppl_rows = n;
        return n > 0 ? std::exp(nll / (double) n) : NAN;
    };
    const double ppl_prefilled = ppl_of(ref);
    double ppl_restored_max = NAN;
    for (size_t i = 0; i < bases.size(); ++i) {
        const auto rep = read_child_report(bases[i] + ".txt");
        long diff = 0;
        double kl = 0.0;
        compare(bases[i], &diff, &kl);
        {
            const double p2 = ppl_of(read_logits(bases[i]));
            ppl_restored_max = std::isnan(ppl_restored_max) ? p2 : std::max(ppl_restored_max, p2);
        }
        differing += diff;
        kl_max = std::max(kl_max, kl);
        restore_each.push_back(rep.at("restore_s"));
        if (rep.count("restore_cpu_s")) restore_cpu_each.push_back(rep.at("restore_cpu_s"));
        recompute_each.push_back(rep.at("recompute_s"));
        ready_each.push_back(rep.at("restore_s") + rep.at("recompute_s"));
        // a tier failure, or llama.cpp refusing the restored blob: both end in a prefill
        fallbacks += rep.at("fallbacks") + (rep.count("set_data_refused") ? rep.at("set_data_refused") : 0.0);
        restored_min = std::min(restored_min, rep.at("restored_tokens"));
        if (rep.count("state_round_trip") && rep.at("state_round_trip") != 1) round_trip = false;
        if (i == 0) {
            bytes_read0 = rep.at("bytes_read");
            restored0 = rep.at("restored_tokens");
        }
        each << (i ? ", " : "") << "{";
        bool first = true;
        for (const auto & kv : rep) {
            each << (first ? "" : ", ") << "\"" << kv.first << "\": " << json_num(kv.second);
            first = false;
        }
        each << "}";
    }
    const bool identical = differing == 0;
    const auto control = read_child_report(control_base + ".txt");
    long control_diff = 0;
    double control_kl = 0.0;
    // lossy: the control differs from process 1 anyway; compare it with the first process 2,
    // which restored the same approximate KV without the damaged value
    std::vector<float> first_client;
    if (!lossless) first_client = read_logits(bases[0]);
    compare(control_base, &control_diff, &control_kl, lossless ? nullptr : &first_client);
    const bool control_damaged = control.count("control_damaged") && control.at("control_damaged") == 1;
    const double restore_p50 = percentile(restore_each, 0.5), restore_max = percentile(restore_each, 1.0);
    const kvc_tier_metrics & tm = m1.tiers[ti];
    const double stored_tokens = (double) tm.chunks_written * C;
    // bytes per token on the wire: what process 2 read, else what process 1 wrote
    const double wire = restored0 > 0 ? bytes_read0 / restored0 : stored_tokens > 0 ? (double) tm.bytes_written / stored_tokens : NAN;

    RunResult r;
    r.mode = "share";
    r.kl = kl_max;  // the row's PPL stays empty (rows of a few tokens are bounded on KL alone);
                    // ppl_prefilled / ppl_restored_max below carry it
    r.cells_end = cells_end;
    r.cells_verified = cells_end;
    r.held_bytes_end = (double) tm.bytes_written;
    auto q = [](const std::string & s) { return "\"" + json_escape(s) + "\""; };
    auto x = [&](const char * k, const std::string & v) { r.extra.push_back({k, v}); };
    x("tier", q(redis ? "redis" : "disk"));
    x("tier_location", q(redis ? o.redis : (o.share_dir.empty() ? "temporary directory" : o.share_dir)));
    x("codec", q(o.share_codec));
    x("lossless", lossless ? "true" : "false");
    x("chunk_tokens", std::to_string(C));
    x("prefix_tokens", std::to_string(P));
    x("rest_tokens", std::to_string(R));
    x("clients", std::to_string(K));
    x("rounds", std::to_string(o.share_rounds));
    x("chunks_in_prefix", std::to_string(P / C));
    x("chunks_stored", std::to_string(tm.chunks_written));
    x("chunks_already_present", std::to_string(sr.chunks - sr.chunks_encoded));
    x("store_failures", std::to_string(sr.failures));
    x("bytes_stored", std::to_string(tm.bytes_written));
    x("bytes_f16", json_num((double) full * f16_per_token));
    x("f16_bytes_per_token", json_num(f16_per_token));
    x("wire_bytes_per_token", json_num(wire));
    x("wire_ratio_vs_f16", json_num(f16_per_token / wire));
    x("prefill_s", json_num(prefill_s));
    // CPU seconds (user + system, all threads): on a loaded machine the wall times include
    // waiting for a core, these do not
    x("prefill_cpu_s", json_num(prefill_cpu_s));
    x("restore_cpu_s", json_num(percentile(restore_cpu_each, 0.5)));
    x("restore_cpu_s_max", json_num(percentile(restore_cpu_each, 1.0)));
    x("state_read_s", json_num(t_state));
    x("store_s", json_num(store_s));
    x("model_hash_s", json_num(hash_s));
    x("restore_s", json_num(restore_p50));
    x("restore_s_max", json_num(restore_max));
    // the speed-up only where every process 2 restored all the full chunks (else it recomputed)
    const bool all_restored = full > 0 && restored_min >= (double) full;
    x("prefill_over_restore", all_restored ? json_num(prefill_s / restore_p50) : "null");
    x("restored_tokens_min", json_num(restored_min));
    // the whole prefix in the cache: restore + prefill of what was not restored (p50)
    x("ready_s", json_num(percentile(ready_each, 0.5)));
    x("prefill_over_ready", json_num(prefill_s / percentile(ready_each, 0.5)));
    x("recompute_s_max", json_num(percentile(recompute_each, 1.0)));
    x("clients_wall_s", json_num(clients_wall_s));
    x("memory_tier_encode_s", json_num(mem_encode_s));
    x("memory_tier_restore_s", json_num(mem_restore_s));
    x("memory_tier_restore_mb_s", json_num((double) full * f16_per_token / 1e6 / mem_restore_s));
    x("logits_compared", std::to_string((long) bases.size() * R * mi.n_vocab));
    x("logits_differing", std::to_string(differing));
    // false is expected with a lossy codec: `kl` (mean over the rest, max over process 2s) is
    // the measure then
    x("logits_identical", identical ? "true" : "false");
    x("kl_mean_max", json_num(kl_max));
    x("ppl_prefilled", json_num(ppl_prefilled));
    x("ppl_restored_max", json_num(ppl_restored_max));
    x("ppl_rows", json_num((double) ppl_rows));
    x("restore_rel_rms_k", json_num(rel_err_k));
    x("restore_rel_rms_v", json_num(rel_err_v));
    x("state_round_trip", round_trip ? "true" : "false");
    // null where the control restored nothing to damage (a tier down: it recomputed)
    x("control_logits_differing", std::to_string(control_diff));
    x("control_caught", control_damaged ? (control_diff > 0 ? "true" : "false") : "null");
    x("fallbacks", json_num(fallbacks));
    x("threads", std::to_string(o.threads));
    x("between", o.share_between.empty() ? "null" : q(o.share_between));
    x("client_detail", "[" + each.str() + "]");
    char speed[64];
    if (all_restored) std::snprintf(speed, sizeof speed, "%.1fx faster than prefill", prefill_s / restore_p50);
    else std::snprintf(speed, sizeof speed, "not all restored: recomputed");
    char logits_word[192];
    if (lossless) std::snprintf(logits_word, sizeof logits_word, "%s", identical ? "identical" : "DIFFER");
    else
        std::snprintf(logits_word, sizeof logits_word, "lossy, KL %.3g, PPL %.4f against %.4f prefilled (%+.2f%%) (K/V rel RMS %.3f/%.3f)",
                      kl_max, ppl_restored_max, ppl_prefilled, 100.0 * (ppl_restored_max / ppl_prefilled - 1.0), rel_err_k,
                      rel_err_v);
    char buf[480];
    std::snprintf(buf, sizeof buf,
                  "%s %s, %d-token prefix in %d-token chunks: %zu stored, %.4g B/token (f16 %.0f, %.3f:1); prefill %.3f s, "
                  "restore p50 %.4f s max %.4f s (%d clients, %s); logits %s; fallbacks %.0f",
                  redis ? "redis" : "disk", o.share_codec.c_str(), P, C, (size_t) tm.chunks_written, wire, f16_per_token,
                  f16_per_token / wire, prefill_s, restore_p50, restore_max, K, speed, logits_word, fallbacks);
    r.detail = buf;
    if (!lossless && !std::isfinite(kl_max)) fail("share: " + r.detail + " (KL is not finite)");
    if (lossless && !identical) fail("share: " + r.detail + " (" + std::to_string(differing) + " logits differ)");
    if (!round_trip) fail("share: llama.cpp gave back a different state than the restored blob");
    if (control_damaged && control_diff == 0) fail("share: a damaged K value gave the same logits: the comparison cannot fail");
    return r;
}

}  // namespace kvc_llama
