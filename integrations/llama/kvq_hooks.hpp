// kvc_llama_eval, kvq through kvc_kvq: rotated 2-8-bit packed rows at the SET_ROWS write path
// (kvq_hooks.cpp). The kvq: and kvq-plan: rows, and what the combined modes (BASE+kvq:CONFIG,
// in kvc_h2o_policy.cpp and mlp_mode.cpp) and the channel modes (kvq_channel_hooks.cpp) take
// from them: the handle, the row round trip and its hook, and KvqSetup, which sets a decode up.
#pragma once

#include "decode.hpp"
#include "eval_common.hpp"
#include "eval_tap.hpp"

#include "kvc.h"
#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvc_llama {

// ------------------------------------------------------------------------------------------
// kvq through kvc_kvq: every K/V row the model writes (one token of one KV head, head_dim
// values) is packed by kvc exactly as a kvq cache would store it and unpacked again before
// llama.cpp writes it, so the cache holds kvq's values with the packed format's numerics,
// rotation included; memory is counted from kvc_kvq_row_bytes. Tokens at positions below
// --kvq-sink are kept as the f16 cache holds them (protected attention sinks) and counted at
// f16 bytes.

struct KvqPtr {
    kvc_kvq * q = nullptr;
    // from a config string ("k4v4", ...) or, with plan_json, from a kvq plan's JSON; a plan
    // for another model is refused (UsageError), never run
    KvqPtr(const std::string & config, const ModelInfo & mi, const std::string * plan_json = nullptr);
    ~KvqPtr();
    KvqPtr(const KvqPtr &) = delete;
    KvqPtr & operator=(const KvqPtr &) = delete;
};

// Bytes of one cell (one token, every layer, K and V, every KV head) in kvq's packed rows.
double kvq_cell_bytes(const kvc_kvq * q, const ModelInfo & mi, double * k_bits = nullptr, double * v_bits = nullptr);

// Packs n_rows rows of layer il's K or V with `q` into `packed` (resized to their bytes) and
// unpacks them into `rows` in place: the values a kvq cache of those rows holds. With a
// center (n_kv_head * head_dim values), coded as row - center and unpacked as decoded + center.
void kvq_round_trip_rows(const kvc_kvq * q, int il, kvc_tensor which, float * rows, size_t n_rows,
                         std::vector<uint8_t> & packed, const std::vector<float> & center = {});

class KvqRoundTripHook : public RowHook {
public:
    // recent > 0: a token's rows stay as the f16 cache holds them (or, with `window`, as that
    // kvq handle's rows: 8-bit rows) until `recent` newer tokens have been written, then they
    // are coded and written back into their cells (on_set_rows)
    //
    // center (needs recent > 0): when the first tokens leave the window, the mean of the window's
    // K rows per KV head and channel (kvc_kvq_mean_center: rounded to f16) becomes that layer's K
    // center; every K row coded from then on is coded as row - center
    // (kvc_kvq_quantize_rows_centered) and written back as decoded + center. An engine never
    // adds the center back (q . center is the same for every cached token, so the softmax does
    // not change): these cells give exactly its scores. The sink tokens must stay f16 (the
    // options refuse --kvq-center without --kvq-sink): the attention sink's rows are unlike the
    // window's mean, and coded against it they lose what makes them the sink (200 tokens, no
    // f16 sink: KL 0.016 plain, 0.070 with K centered, 0.12 with K and V). V is not centered:
    // with an f16 sink it measured no better.
    KvqRoundTripHook(const kvc_kvq * q, const ModelInfo & mi, int sink, int recent = 0, const kvc_kvq * window = nullptr,
                     bool center = false);
    void on_rows(int il, bool is_v, ggml_tensor * t) override;
    void on_set_rows(int il, bool is_v, ggml_tensor * node) override;
    // Packs and unpacks n_rows rows in place; the error is against `reference` (the rows as
    // an f16 cache holds them), or, when null, against the f16 of the rows given
    void round_trip(int il, bool is_v, float * first, size_t n_rows, const float * reference = nullptr);
    struct Err {
        double sq = 0, ref = 0, max = 0, bytes = 0;
        long n = 0, rows = 0;
    };
    const Err & err(bool v) const { return err_[v ? 1 : 0]; }

private:
    const kvc_kvq * q_;
    const kvc_kvq * window_;
    const ModelInfo & mi_;
    int sink_, recent_;
    bool center_;
    std::vector<std::vector<float>> centers_[2];      // per layer: [head][dim] once set, else empty
    std::vector<long> written_[2];
    std::vector<int64_t> first_coded_[2];             // of the last call's tokens, the first past the sink
    std::vector<std::vector<float>> pending_[2];      // per layer: the window's rows, [token][head][dim]
    std::vector<std::vector<float>> pending_ref_[2];  // the same rows as an f16 cache holds them
    std::vector<std::vector<int64_t>> cells_[2];      // their cells
    std::vector<uint8_t> packed_;
    std::vector<float> ref_;
    Err err_[2];
};

// ------------------------------------------------------------------------------------------
// kvq combined with a mode that changes which cells the cache holds: "BASE+kvq:CONFIG" or
// "BASE+kvq-plan:FILE", BASE one of mlp@F, mlp-meanpool@F, mlp, h2o, kvc-streaming (at every
// --kv-ratios), h2o@R, kvc-streaming@R. Every cell the cache holds is a kvq cell: new rows go
// through the same SET_ROWS round trip as the kvq: modes, and cells the mode writes itself (the
// mlp modes' compressed groups) through kvq_requantize_f16 (KvqSetup sets a decode up). Memory:
// kvq's packed row bytes per held cell, the --kvq-sink cells at f16, so the mean ratio is what a
// kvq engine running the mode would get.

// Splits a combined mode; false (base and kvq untouched) when m has no kvq suffix.
bool split_kvq_suffix(const std::string & m, std::string * base, std::string * kvq_mode);

// Puts n_rows f16 rows of head_dim values (a cell's rows of one layer, K or V) through kvq's
// quantizer and back, in place: what a kvq cache would hold for rows the mode wrote itself.
// Returns the squared error and the squared reference summed into sq / ref.
void kvq_requantize_f16(const kvc_kvq * q, const ModelInfo & mi, int layer, bool is_v, uint16_t * rows, size_t n_rows,
                        double * sq, double * ref);

// One kvq row's quantizer, hook and memory accounting, from a "kvq:CONFIG" / "kvq-plan:FILE"
// mode string; attach() sets a decode up with it, finish() checks and reports what it did.
struct KvqSetup {
    std::string config;
    bool from_plan;
    std::string plan_json;
    KvqPtr kvq;
    std::unique_ptr<KvqPtr> window;  // --kvq-recent-bits B <= 8: the window as kvq k<B>v<B> rows
    double k_bits = 0, v_bits = 0, cell = 0, f16_cell = 0, window_cell = 0;
    int sink, recent, window_bits;
    bool center;
    KvqRoundTripHook hook;

    KvqSetup(const std::string & kvq_mode, const ModelInfo & mi, const Options & o);

    // Hooks the decode: the tap sees every row, the spec counts kvq's bytes.
    void attach(EvalTap & tap, DecodeSpec & s);

    // Checks the hook saw every row SET_ROWS wrote, adds kvq's numbers to the row and returns
    // the detail text.
    std::string finish(const EvalTap & tap, RunResult & r) const;
};

// One kvq:CONFIG / kvq-plan:FILE row (flash attention as --kvq-fa says).
RunResult run_kvq(llama_model * model, const ModelInfo & mi, const Options & o, const std::vector<llama_token> & toks,
                  RefStore & ref, const std::string & m);

}  // namespace kvc_llama
