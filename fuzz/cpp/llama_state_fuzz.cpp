// libFuzzer target: the llama.cpp sequence-state container parser of kvc_llama_eval
// (integrations/llama/llama_state_parse.hpp: parse_f16_state for the dump mode,
// state_segments for the state mode), built alone with clang++ -fsanitize=fuzzer,address,
// undefined by scripts/fuzz-all.sh. Any bytes give a result or a std::runtime_error, never
// an out-of-bounds access, undefined behaviour or an allocation the blob does not justify.
//
// Input: one selector byte (the model's layer count 1..4 and n_embd_kv 2, 8, 64 or 192),
// then the blob. What is checked on success: parse_f16_state's sizes match the cell and
// layer counts; build_f16_state of what it parsed gives the blob back byte for byte (the share
// mode builds the blobs it restores with it, the mlp modes through write_f16_state);
// state_segments tiles the blob exactly, with
// every f16 segment of even length, and accepts whatever parse_f16_state accepts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "../../integrations/llama/llama_state_parse.hpp"

#define CHECK(c)                                                                   \
    do {                                                                           \
        if (!(c)) {                                                                \
            std::fprintf(stderr, "llama_state_fuzz: check failed: %s (line %d)\n", \
                         #c, __LINE__);                                            \
            std::abort();                                                          \
        }                                                                          \
    } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size < 1) return 0;
    static const size_t kEmbd[4] = {2, 8, 64, 192};
    const int n_layer = 1 + (data[0] & 3);
    const size_t ne = kEmbd[(data[0] >> 2) & 3];
    const std::vector<uint8_t> blob(data + 1, data + size);

    bool parsed = false;
    try {
        const kvc_llama_state::CacheDump d = kvc_llama_state::parse_f16_state(blob, n_layer, ne);
        parsed = true;
        CHECK(d.n_cells > 0);
        const size_t cells = (size_t) d.n_cells;
        CHECK(d.pos.size() == cells);
        CHECK(d.k.size() == (size_t) n_layer * cells * ne);
        CHECK(d.v.size() == d.k.size());
        // Each K and V value came from two bytes of the blob.
        CHECK(4 * d.k.size() <= blob.size());
        CHECK(kvc_llama_state::build_f16_state(d, n_layer, ne) == blob);
        CHECK(kvc_llama_state::write_f16_state(d, ne) == blob);
    } catch (const std::runtime_error &) {
    }

    try {
        const auto segs = kvc_llama_state::state_segments(blob, n_layer, ne);
        size_t at = 0;
        size_t n_f16 = 0;
        for (const auto & s : segs) {
            CHECK(s.off == at);
            CHECK(s.f16 || s.len > 0);  // an f16 segment is empty when the cache is
            if (s.f16) {
                CHECK(s.len % 2 == 0);
                CHECK(s.tensor == KVC_TENSOR_K || s.tensor == KVC_TENSOR_V);
                ++n_f16;
            }
            at += s.len;
        }
        CHECK(at == blob.size());
        (void) n_f16;
    } catch (const std::runtime_error &) {
        CHECK(!parsed);  // the dump mode's parser is the stricter one
    }
    return 0;
}
