// The llama.cpp sequence-state container, parsed: no llama or ggml call, only bytes, so that
// it can be fuzzed alone (fuzz/cpp/llama_state_fuzz.cpp). kvc_llama_eval's dump and state
// modes include it (dump_mode.hpp, state_mode.hpp). Self-contained: the two llama/ggml
// constants it needs are restated here, and dump_mode.hpp checks them against ggml's.
// Every field is checked; a malformed blob throws std::runtime_error, as the harness's
// fail() does.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kvc.h"

namespace kvc_llama_state {

// The magic of llama_state_seq_get_data's blob (decode.hpp's kStateMagic).
constexpr uint32_t kMagic = 0xaf143cd8u;
// ggml's GGML_TYPE_F16.
constexpr int32_t kGgmlTypeF16 = 1;

[[noreturn]] inline void fail(const std::string & msg) { throw std::runtime_error(msg); }

// Reads the K and V rows of an f16 cache out of a llama_state_seq_get_data blob (single
// stream, single sequence). Layout: magic, seq_id, then llama_kv_cache::state_write: n_stream, then per
// stream cell_count, per cell (pos, n_seq_id, seq ids), then v_trans, n_layer, n_rot_k, n_rot_v,
// per layer K (type, row size, rows), per layer V (rows, or when transposed type, element
// size, n_embd_v_gqa and the cells of each channel). Every field is checked.
struct StateReader {
    const std::vector<uint8_t> & s;
    size_t off = 0;
    template <class T> T get(const char * what) {
        if (s.size() - off < sizeof(T)) fail(std::string("state blob truncated at ") + what);
        T v;
        std::memcpy(&v, s.data() + off, sizeof(T));
        off += sizeof(T);
        return v;
    }
    const uint8_t * take(size_t n, const char * what) {
        if (s.size() - off < n) fail(std::string("state blob truncated at ") + what);
        const uint8_t * p = s.data() + off;
        off += n;
        return p;
    }
};

struct CacheDump {
    int n_cells = 0;
    std::vector<int32_t> pos;  // llama_pos
    // [layer][cell][n_embd_kv] f16 bits
    std::vector<uint16_t> k, v;
    // the blob's layout fields, kept so that write_f16_state gives back the same container
    uint32_t v_trans = 0, n_layer = 0, n_rot_k = 0, n_rot_v = 0;
};

// `n_layer_model` and `n_embd_kv` are the model's (ModelInfo::n_layer, ModelInfo::n_embd_kv()).
inline CacheDump parse_f16_state(const std::vector<uint8_t> & blob, int n_layer_model, size_t n_embd_kv) {
    StateReader r{blob};
    CacheDump d;
    if (r.get<uint32_t>("magic") != kMagic) fail("state: bad magic");
    if (r.get<int32_t>("seq_id") != 0) fail("state: not sequence 0");
    if (r.get<uint32_t>("n_stream") != 1) fail("state: expected one stream");
    const uint32_t cells = r.get<uint32_t>("cell_count");
    if (cells == 0 || cells > (1u << 24)) fail("state: implausible cell count");
    d.n_cells = (int) cells;
    for (uint32_t c = 0; c < cells; ++c) {
        d.pos.push_back(r.get<int32_t>("pos"));
        const uint32_t n_seq = r.get<uint32_t>("n_seq_id");
        if (n_seq != 1) fail("state: a cell with " + std::to_string(n_seq) + " sequences");
        if (r.get<int32_t>("seq_id") != 0) fail("state: unexpected sequence id");
    }
    const uint32_t v_trans = r.get<uint32_t>("v_trans");
    const uint32_t n_layer = r.get<uint32_t>("n_layer");
    d.v_trans = v_trans;
    d.n_layer = n_layer;
    d.n_rot_k = r.get<uint32_t>("n_rot_k");
    d.n_rot_v = r.get<uint32_t>("n_rot_v");
    if ((int) n_layer != n_layer_model) fail("state: layer count differs from the model");
    const size_t ne = n_embd_kv;
    // K and V hold 2 bytes per value: a blob too short for them is refused before they are
    // allocated (else a 12-byte cell would size 4 * n_layer * n_embd_kv bytes of output).
    if (ne == 0 || (size_t) n_layer * cells > (blob.size() - r.off) / ne / 4) fail("state: blob too short for its K and V");
    d.k.resize((size_t) n_layer * cells * ne);
    d.v.resize((size_t) n_layer * cells * ne);
    for (uint32_t l = 0; l < n_layer; ++l) {
        if (r.get<int32_t>("k type") != kGgmlTypeF16) fail("state: K cache is not f16");
        if (r.get<uint64_t>("k row size") != ne * 2) fail("state: K row size");
        std::memcpy(&d.k[(size_t) l * cells * ne], r.take((size_t) cells * ne * 2, "K rows"), (size_t) cells * ne * 2);
    }
    for (uint32_t l = 0; l < n_layer; ++l) {
        if (r.get<int32_t>("v type") != kGgmlTypeF16) fail("state: V cache is not f16");
        if (!v_trans) {
            if (r.get<uint64_t>("v row size") != ne * 2) fail("state: V row size");
            std::memcpy(&d.v[(size_t) l * cells * ne], r.take((size_t) cells * ne * 2, "V rows"), (size_t) cells * ne * 2);
        } else {
            if (r.get<uint32_t>("v element size") != 2) fail("state: V element size");
            if (r.get<uint32_t>("n_embd_v_gqa") != ne) fail("state: n_embd_v_gqa");
            for (size_t j = 0; j < ne; ++j) {
                const uint8_t * p = r.take((size_t) cells * 2, "V channel");
                for (uint32_t c = 0; c < cells; ++c) {
                    uint16_t x;
                    std::memcpy(&x, p + (size_t) c * 2, 2);
                    d.v[((size_t) l * cells + c) * ne + j] = x;
                }
            }
        }
    }
    if (r.off != blob.size()) fail("state: trailing bytes after the V data");
    return d;
}

// The inverse of parse_f16_state: a llama_state_seq_set_data blob of sequence 0 holding `d`'s
// cells (positions, K and V rows) in the layout its fields name. For every blob
// parse_f16_state accepts, write_f16_state(parse_f16_state(blob)) == blob; the mlp modes
// write a dump with fewer cells (mlp_mode.hpp).
inline std::vector<uint8_t> write_f16_state(const CacheDump & d, size_t n_embd_kv) {
    const size_t cells = (size_t) d.n_cells, ne = n_embd_kv, nl = d.n_layer;
    if (d.n_cells <= 0 || d.pos.size() != cells) fail("state writer: cell count and positions disagree");
    if (ne == 0 || d.k.size() != nl * cells * ne || d.v.size() != nl * cells * ne) {
        fail("state writer: K or V size differs from layers x cells x n_embd_kv");
    }
    std::vector<uint8_t> out;
    out.reserve(32 + cells * 12 + nl * (32 + 4 * cells * ne));
    auto put = [&](const void * p, size_t n) {
        const uint8_t * b = static_cast<const uint8_t *>(p);
        out.insert(out.end(), b, b + n);
    };
    auto u32 = [&](uint32_t x) { put(&x, 4); };
    auto i32 = [&](int32_t x) { put(&x, 4); };
    auto u64 = [&](uint64_t x) { put(&x, 8); };
    u32(kMagic);
    i32(0);  // sequence 0
    u32(1);  // one stream
    u32((uint32_t) cells);
    for (size_t c = 0; c < cells; ++c) {
        i32(d.pos[c]);
        u32(1);  // one sequence per cell
        i32(0);
    }
    u32(d.v_trans);
    u32(d.n_layer);
    u32(d.n_rot_k);
    u32(d.n_rot_v);
    for (size_t l = 0; l < nl; ++l) {
        i32(kGgmlTypeF16);
        u64(ne * 2);
        put(&d.k[l * cells * ne], cells * ne * 2);
    }
    for (size_t l = 0; l < nl; ++l) {
        i32(kGgmlTypeF16);
        if (!d.v_trans) {
            u64(ne * 2);
            put(&d.v[l * cells * ne], cells * ne * 2);
        } else {
            u32(2);
            u32((uint32_t) ne);
            const size_t at = out.size();
            out.resize(at + ne * cells * 2);
            uint8_t * p = out.data() + at;
            for (size_t j = 0; j < ne; ++j) {
                for (size_t c = 0; c < cells; ++c, p += 2) std::memcpy(p, &d.v[(l * cells + c) * ne + j], 2);
            }
        }
    }
    return out;
}

// A state blob cut into what kvc's codec should see: the K rows and the V data of every layer
// as f16 streams, everything else (header, per-cell positions and sequence ids, per-layer
// type and size fields) as bytes.
struct StateSegment {
    size_t off, len;
    bool f16;
    kvc_tensor tensor;
};

inline std::vector<StateSegment> state_segments(const std::vector<uint8_t> & blob, int n_layer_model, size_t n_embd_kv) {
    StateReader r{blob};
    std::vector<StateSegment> segs;
    size_t mark = 0;
    auto data = [&](size_t n, kvc_tensor tensor, const char * what) {
        const size_t at = r.off;
        r.take(n, what);
        if (at > mark) segs.push_back({mark, at - mark, false, KVC_TENSOR_K});
        segs.push_back({at, n, true, tensor});
        mark = r.off;
    };
    if (r.get<uint32_t>("magic") != kMagic) fail("state: bad magic");
    r.get<int32_t>("seq_id");
    if (r.get<uint32_t>("n_stream") != 1) fail("state: expected one stream");
    const uint32_t cells = r.get<uint32_t>("cell_count");
    for (uint32_t c = 0; c < cells; ++c) {
        r.get<int32_t>("pos");
        const uint32_t n_seq = r.get<uint32_t>("n_seq_id");
        for (uint32_t k = 0; k < n_seq; ++k) r.get<int32_t>("seq_id");
    }
    const uint32_t v_trans = r.get<uint32_t>("v_trans");
    const uint32_t n_layer = r.get<uint32_t>("n_layer");
    r.get<uint32_t>("n_rot_k");
    r.get<uint32_t>("n_rot_v");
    if ((int) n_layer != n_layer_model) fail("state: layer count differs from the model");
    const size_t ne = n_embd_kv;
    for (uint32_t l = 0; l < n_layer; ++l) {
        if (r.get<int32_t>("k type") != kGgmlTypeF16) fail("state: K cache is not f16");
        if (r.get<uint64_t>("k row size") != ne * 2) fail("state: K row size");
        data((size_t) cells * ne * 2, KVC_TENSOR_K, "K rows");
    }
    for (uint32_t l = 0; l < n_layer; ++l) {
        if (r.get<int32_t>("v type") != kGgmlTypeF16) fail("state: V cache is not f16");
        if (!v_trans) {
            if (r.get<uint64_t>("v row size") != ne * 2) fail("state: V row size");
        } else {
            if (r.get<uint32_t>("v element size") != 2) fail("state: V element size");
            if (r.get<uint32_t>("n_embd_v_gqa") != ne) fail("state: n_embd_v_gqa");
        }
        data((size_t) cells * ne * 2, KVC_TENSOR_V, "V data");
    }
    if (r.off != blob.size()) fail("state: trailing bytes after the V data");
    if (mark < blob.size()) segs.push_back({mark, blob.size() - mark, false, KVC_TENSOR_K});
    return segs;
}

}  // namespace kvc_llama_state
