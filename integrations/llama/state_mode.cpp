// kvc_llama_eval, state mode: the sequence state saved, restored and compressed with kvc's
// codec (state_mode.hpp).
#include "state_mode.hpp"

#include "kvc_api.hpp"
#include "llama_state_parse.hpp"

#include "kvc.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace kvc_llama {

namespace {

// ------------------------------------------------------------------------------------------
// the sequence state compressed with kvc's codec

using kvc_llama_state::StateReader;
using kvc_llama_state::StateSegment;

std::vector<StateSegment> state_segments(const std::vector<uint8_t> & blob, const ModelInfo & mi) {
    return kvc_llama_state::state_segments(blob, mi.n_layer, (size_t) mi.n_embd_kv());
}

struct CodecPtr {
    kvc_codec * c = nullptr;
    explicit CodecPtr(kvc_dtype dtype) {
        kvc_codec_config cfg;
        kvc_ok(kvc_codec_config_default(&cfg), "kvc_codec_config_default");
        cfg.dtype = dtype;
        kvc_ok(kvc_codec_new(&cfg, &c), "kvc_codec_new");
    }
    ~CodecPtr() { kvc_codec_free(c); }
    CodecPtr(const CodecPtr &) = delete;
    CodecPtr & operator=(const CodecPtr &) = delete;
};

constexpr uint32_t kPackMagic = 0x5356434bu;  // "KCVS"

void put_u64(std::vector<uint8_t> & out, uint64_t x) {
    for (int i = 0; i < 8; ++i) out.push_back((uint8_t) (x >> (8 * i)));
}

// Container: u32 magic, u32 segment count, then per segment u8 kind (0 bytes, 1 K f16, 2 V
// f16), u64 raw length, u64 blob length, the kvc_codec blob (gear-v1).
std::vector<uint8_t> pack_state(const std::vector<uint8_t> & blob, const std::vector<StateSegment> & segs) {
    CodecPtr c16(KVC_DTYPE_F16), c8(KVC_DTYPE_I8);
    std::vector<uint8_t> out;
    put_u64(out, (uint64_t) kPackMagic | ((uint64_t) segs.size() << 32));
    std::vector<uint8_t> buf;
    for (const auto & sg : segs) {
        kvc_codec * c = sg.f16 ? c16.c : c8.c;
        size_t cap = 0;
        kvc_ok(kvc_codec_max_encoded_size(c, sg.len, &cap), "kvc_codec_max_encoded_size");
        buf.resize(cap);
        size_t n = 0;
        kvc_ok(kvc_codec_encode(c, sg.tensor, blob.data() + sg.off, sg.len, buf.data(), buf.size(), &n), "kvc_codec_encode");
        out.push_back(sg.f16 ? (sg.tensor == KVC_TENSOR_K ? 1 : 2) : 0);
        put_u64(out, sg.len);
        put_u64(out, n);
        out.insert(out.end(), buf.begin(), buf.begin() + (long) n);
    }
    return out;
}

// Decodes a container; every length is checked against what is left before it is used.
std::vector<uint8_t> unpack_state(const std::vector<uint8_t> & pack, size_t max_raw) {
    CodecPtr c16(KVC_DTYPE_F16), c8(KVC_DTYPE_I8);
    StateReader r{pack};
    const uint64_t head = r.get<uint64_t>("container header");
    if ((uint32_t) head != kPackMagic) fail("container: bad magic");
    const uint64_t n_seg = head >> 32;
    std::vector<uint8_t> out;
    for (uint64_t i = 0; i < n_seg; ++i) {
        const uint8_t kind = r.get<uint8_t>("segment kind");
        const uint64_t raw = r.get<uint64_t>("segment raw length");
        const uint64_t len = r.get<uint64_t>("segment blob length");
        if (kind > 2) fail("container: unknown segment kind");
        if (raw > max_raw - out.size()) fail("container: segments larger than the state can be");
        if (len > pack.size() - r.off) fail("container: segment blob truncated");
        const uint8_t * p = r.take((size_t) len, "segment blob");
        const size_t at = out.size();
        out.resize(at + (size_t) raw);
        size_t got = 0;
        kvc_ok(kvc_codec_decode(kind ? c16.c : c8.c, p, (size_t) len, out.data() + at, (size_t) raw, &got), "kvc_codec_decode");
        if (got != raw) fail("container: a segment decoded to the wrong length");
    }
    if (r.off != pack.size()) fail("container: trailing bytes");
    return out;
}

}  // namespace

// ------------------------------------------------------------------------------------------
// state mode: save the sequence, restore it into a fresh context, compare the next logits

RunResult run_state(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks) {
    const int n = o.n_tokens;
    CtxConfig cfg;
    cfg.n_ctx = n;
    cfg.n_batch = 512;
    CtxPtr a = make_context(model, o, cfg);
    for (int s = 0; s < n - 1; s += 512) {
        const int m = std::min(512, n - 1 - s);
        std::vector<bool> want(m, false);
        decode_batch(a.get(), toks, s, m, s, want);
    }
    const double t0 = now_s();
    const auto blob = get_seq_state(a.get());
    const double t_save = now_s() - t0;
    std::vector<bool> one(1, true);
    decode_batch(a.get(), toks, n - 1, 1, n - 1, one);
    std::vector<float> la(llama_get_logits_ith(a.get(), -1), llama_get_logits_ith(a.get(), -1) + mi.n_vocab);

    CtxPtr b = make_context(model, o, cfg);
    // a truncated blob must be refused without touching the process
    const size_t trunc = llama_state_seq_set_data(b.get(), blob.data(), blob.size() / 2, 0);
    const bool trunc_rejected = trunc == 0;
    llama_memory_clear(llama_get_memory(b.get()), true);
    const double t1 = now_s();
    const size_t used = llama_state_seq_set_data(b.get(), blob.data(), blob.size(), 0);
    const double t_restore = now_s() - t1;
    if (used != blob.size()) fail("llama_state_seq_set_data consumed " + std::to_string(used) + " of " +
                                  std::to_string(blob.size()) + " bytes");
    const auto blob2 = get_seq_state(b.get());
    decode_batch(b.get(), toks, n - 1, 1, n - 1, one);
    const long diff = bits_differing(la.data(), llama_get_logits_ith(b.get(), -1), mi.n_vocab);
    // the same state through kvc's codec: pack, unpack, restore into a third context
    const auto segs = state_segments(blob, mi);
    const double t2 = now_s();
    const auto pack = pack_state(blob, segs);
    const double t_enc = now_s() - t2;
    const double t3 = now_s();
    const auto unpacked = unpack_state(pack, blob.size());
    const double t_dec = now_s() - t3;
    const bool codec_exact = unpacked == blob;
    CtxPtr c = make_context(model, o, cfg);
    const size_t used_c = llama_state_seq_set_data(c.get(), unpacked.data(), unpacked.size(), 0);
    if (used_c != unpacked.size()) fail("state: the codec round trip was not accepted by llama_state_seq_set_data");
    decode_batch(c.get(), toks, n - 1, 1, n - 1, one);
    const long diff_codec = bits_differing(la.data(), llama_get_logits_ith(c.get(), -1), mi.n_vocab);
    // a damaged container must be refused: truncated, and one byte of a K blob flipped
    bool trunc_pack_refused = false, flip_refused_or_detected = false;
    try {
        std::vector<uint8_t> t(pack.begin(), pack.begin() + (long) (pack.size() / 2));
        unpack_state(t, blob.size());
    } catch (const std::runtime_error &) {
        trunc_pack_refused = true;
    }
    try {
        std::vector<uint8_t> f = pack;
        f[8 + 17] ^= 0x5a;  // the first byte of the first segment's gear-v1 blob
        unpack_state(f, blob.size());
    } catch (const std::runtime_error &) {
        flip_refused_or_detected = true;
    }
    size_t f16_raw = 0, f16_packed = 0;
    {
        StateReader pr{pack};
        pr.get<uint64_t>("h");
        for (size_t i = 0; i < segs.size(); ++i) {
            const uint8_t kind = pr.get<uint8_t>("k");
            const uint64_t raw = pr.get<uint64_t>("r");
            const uint64_t len = pr.get<uint64_t>("l");
            pr.take((size_t) len, "b");
            if (kind) {
                f16_raw += raw;
                f16_packed += len;
            }
        }
    }

    RunResult r;
    r.mode = "state";
    const bool ok = diff == 0 && blob2 == blob && trunc_rejected && codec_exact && diff_codec == 0 && trunc_pack_refused &&
                    flip_refused_or_detected;
    char cbuf[160];
    std::snprintf(cbuf, sizeof cbuf, "; kvc codec %.3f:1 (%zu B), encode %.0f MB/s, decode %.0f MB/s, restored logits %s",
                  (double) blob.size() / (double) pack.size(), pack.size(), (double) blob.size() / 1e6 / t_enc,
                  (double) blob.size() / 1e6 / t_dec, diff_codec == 0 ? "identical" : "DIFFER");
    r.detail = std::string(ok ? "restore identical" : "MISMATCH") + ", " + std::to_string(blob.size()) + " B state" + cbuf;
    r.cells_end = n - 1;
    r.cells_verified = state_cell_count(blob);
    r.held_bytes_end = (double) blob.size();
    r.extra.push_back({"state_bytes", std::to_string(blob.size())});
    r.extra.push_back({"kv_f16_bytes", std::to_string((size_t) (n - 1) * mi.cell_bytes(GGML_TYPE_F16, GGML_TYPE_F16))});
    r.extra.push_back({"logits_differing", std::to_string(diff)});
    r.extra.push_back({"state_round_trip_identical", blob2 == blob ? "true" : "false"});
    r.extra.push_back({"truncated_state_rejected", trunc_rejected ? "true" : "false"});
    r.extra.push_back({"codec_state_ratio", json_num((double) blob.size() / (double) pack.size())});
    r.extra.push_back({"codec_packed_bytes", std::to_string(pack.size())});
    r.extra.push_back({"codec_kv_ratio", json_num((double) f16_raw / (double) std::max<size_t>(1, f16_packed))});
    r.extra.push_back({"codec_segments", std::to_string(segs.size())});
    r.extra.push_back({"codec_encode_mb_s", json_num((double) blob.size() / 1e6 / t_enc)});
    r.extra.push_back({"codec_decode_mb_s", json_num((double) blob.size() / 1e6 / t_dec)});
    r.extra.push_back({"codec_round_trip_identical", codec_exact ? "true" : "false"});
    r.extra.push_back({"codec_logits_differing", std::to_string(diff_codec)});
    r.extra.push_back({"codec_truncated_refused", trunc_pack_refused ? "true" : "false"});
    r.extra.push_back({"codec_damaged_header_refused", flip_refused_or_detected ? "true" : "false"});
    r.extra.push_back({"save_s", json_num(t_save)});
    r.extra.push_back({"restore_s", json_num(t_restore)});
    if (!ok) fail("state: " + r.detail + " (logits differing " + std::to_string(diff) + ", truncated rejected " +
                  (trunc_rejected ? "yes" : "no") + ")");
    return r;
}

}  // namespace kvc_llama
