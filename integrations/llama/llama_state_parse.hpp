// The llama.cpp sequence-state container, parsed: no llama or ggml call, only bytes, so that
// it can be fuzzed alone (fuzz/cpp/llama_state_fuzz.cpp). kvc_llama_eval's dump, state, share
// and mlp modes include it (dump_mode.cpp, state_mode.cpp, share_mode.cpp, mlp_mode.cpp).
// Self-contained: the two llama/ggml constants it needs are restated here, and decode.cpp
// checks them against ggml's.
// Every field is checked; a malformed blob throws std::runtime_error, as the harness's
// fail() does.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kvc.h"

namespace kvc_llama_state {

// The magic of llama_state_seq_get_data's blob (decode.cpp's kStateMagic).
constexpr uint32_t kMagic = 0xaf143cd8u;
// ggml's GGML_TYPE_F16.
constexpr int32_t kGgmlTypeF16 = 1;
// llama.h's LLAMA_STATE_SEQ_VERSION of the llama.cpp the patch series targets (0c1e57098: 3).
// Version 4 (newer llama.cpp) adds the attention rotations n_rot_k, n_rot_v after n_layer.
constexpr uint32_t kStateSeqVersion = 3;
constexpr bool kHasRotations = kStateSeqVersion >= 4;
// the bytes between the cells and the first layer's K type: v_trans, n_layer (and the rotations)
constexpr size_t kDataHeaderBytes = kHasRotations ? 16 : 8;

[[noreturn]] inline void fail(const std::string & msg) { throw std::runtime_error(msg); }

// Reads the K and V rows of an f16 cache out of a llama_state_seq_get_data blob (single
// stream, single sequence). Layout: magic, seq_id, then llama_kv_cache::state_write: n_stream, then per
// stream cell_count, per cell (pos, n_seq_id, seq ids), then v_trans, n_layer (n_rot_k, n_rot_v
// from state version 4),
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
    // the data header's fields as the blob has them (build_f16_state writes them back):
    // v_trans (0: V as rows, else transposed), the layer count, the attention rotations (0 for
    // an f16 cache)
    uint32_t v_trans = 1, n_layer = 0, n_rot_k = 0, n_rot_v = 0;
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
    if (kHasRotations) {
        d.n_rot_k = r.get<uint32_t>("n_rot_k");
        d.n_rot_v = r.get<uint32_t>("n_rot_v");
    }
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

// The inverse of parse_f16_state: a llama_state_seq_get_data blob of sequence 0 (one stream,
// every cell in sequence 0 only, no per-cell extension: a model without M-RoPE or PLE) holding
// `pos.size()` cells whose K and V rows are `k` and `v`, each [layer][cell][n_embd_kv] f16 bits
// with `layer_stride` cells per layer (>= the cell count; a restore buffer may be larger than
// what was restored). V is written transposed (per layer, per channel, every cell) when
// `v_trans` is nonzero, as llama.cpp's cache holds it with flash attention off. For every blob
// parse_f16_state accepts, building its CacheDump gives the same bytes back
// (fuzz/cpp/llama_state_fuzz.cpp checks it). llama_state_seq_set_data checks v_trans and the
// rotations against its own cache and refuses a blob that does not fit.
inline std::vector<uint8_t> build_f16_state(const std::vector<int32_t> & pos, const uint16_t * k, const uint16_t * v,
                                            size_t layer_stride, int n_layer, size_t n_embd_kv, uint32_t v_trans,
                                            uint32_t n_rot_k, uint32_t n_rot_v) {
    const size_t cells = pos.size();
    const size_t ne = n_embd_kv;
    if (cells == 0 || cells > (1u << 24)) fail("build state: implausible cell count");
    if (n_layer <= 0 || ne == 0 || layer_stride < cells) fail("build state: bad layout");
    const size_t rows = (size_t) n_layer * cells * ne * 2;  // bytes of K (and of V)
    std::vector<uint8_t> out;
    out.reserve(16 + cells * 12 + 16 + 2 * rows + (size_t) n_layer * 32);
    auto put = [&](const void * p, size_t n) {
        const uint8_t * b = (const uint8_t *) p;
        out.insert(out.end(), b, b + n);
    };
    auto put32 = [&](uint32_t x) { put(&x, 4); };
    auto put64 = [&](uint64_t x) { put(&x, 8); };
    put32(kMagic);
    put32(0);  // seq_id
    put32(1);  // n_stream
    put32((uint32_t) cells);
    for (size_t c = 0; c < cells; ++c) {
        put32((uint32_t) pos[c]);
        put32(1);  // n_seq_id
        put32(0);  // seq_id
    }
    put32(v_trans);
    put32((uint32_t) n_layer);
    if (kHasRotations) {
        put32(n_rot_k);
        put32(n_rot_v);
    } else if (n_rot_k != 0 || n_rot_v != 0) {
        fail("build state: this state version holds no attention rotations");
    }
    for (int l = 0; l < n_layer; ++l) {
        put32((uint32_t) kGgmlTypeF16);
        put64(ne * 2);
        put(k + (size_t) l * layer_stride * ne, cells * ne * 2);
    }
    for (int l = 0; l < n_layer; ++l) {
        put32((uint32_t) kGgmlTypeF16);
        const uint16_t * src = v + (size_t) l * layer_stride * ne;
        if (!v_trans) {
            put64(ne * 2);
            put(src, cells * ne * 2);
            continue;
        }
        put32(2);  // element size
        put32((uint32_t) ne);
        // transposed: channel j's values of every cell; tiles of 64 cells keep the reads in cache
        const size_t at = out.size();
        out.resize(at + cells * ne * 2);
        uint8_t * dst = out.data() + at;
        for (size_t c0 = 0; c0 < cells; c0 += 64) {
            const size_t c1 = std::min(cells, c0 + 64);
            for (size_t j = 0; j < ne; ++j) {
                for (size_t c = c0; c < c1; ++c) std::memcpy(dst + (j * cells + c) * 2, src + c * ne + j, 2);
            }
        }
    }
    return out;
}

inline std::vector<uint8_t> build_f16_state(const CacheDump & d, int n_layer, size_t n_embd_kv) {
    if (d.pos.size() != (size_t) d.n_cells || d.k.size() != (size_t) n_layer * d.pos.size() * n_embd_kv ||
        d.v.size() != d.k.size()) {
        fail("build state: sizes do not match the cell count");
    }
    return build_f16_state(d.pos, d.k.data(), d.v.data(), d.pos.size(), n_layer, n_embd_kv, d.v_trans, d.n_rot_k,
                           d.n_rot_v);
}

// The inverse of parse_f16_state for a dump as parsed (its own layer count and layout fields):
// write_f16_state(parse_f16_state(blob)) == blob; the mlp modes write a dump with fewer cells
// (mlp_mode.cpp).
inline std::vector<uint8_t> write_f16_state(const CacheDump & d, size_t n_embd_kv) {
    return build_f16_state(d, (int) d.n_layer, n_embd_kv);
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
    if (kHasRotations) {
        r.get<uint32_t>("n_rot_k");
        r.get<uint32_t>("n_rot_v");
    }
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
