// kvc — the C++17 wrapper of the C API (header-only, hand-written; kvc.h is the contract).
// SPDX-License-Identifier: Apache-2.0
//
// Errors: every fallible call returns kvc::Result<T>, an expected-style value holding
// either a T or a kvc::Error (status + the message kvc_last_error_message gave). Why not
// exceptions: inference engines are often built with -fno-exceptions (mobile and
// embedded builds of MNN, llama.cpp embedders), errors such as KVC_BUFFER_TOO_SMALL are
// ordinary control flow, and the per-token hot path must not pay for unwinding. With
// exceptions enabled, Result::value() throws kvc::Exception, so code that prefers
// exceptions writes `auto v = kvc::to_f32(...).value();`. Without them, value() on an
// error prints the message and calls std::abort().
//
// Handles: kvc::Handle<T, Free> owns one opaque C handle (move-only, frees on
// destruction, like std::unique_ptr). Each kvc object gets an alias of it as its C
// handle lands (kvc::Codec = Handle<kvc_codec, kvc_codec_free>, kvc::Quant, kvc::Cache,
// ...).
//
// Threads: the wrapper adds no state; the C functions' rules apply.
#ifndef KVC_HPP
#define KVC_HPP

#include "kvc.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#if defined(__cpp_exceptions) || defined(__EXCEPTIONS) || defined(_CPPUNWIND)
#  define KVC_HPP_EXCEPTIONS 1
#  include <stdexcept>
#else
#  define KVC_HPP_EXCEPTIONS 0
#endif

namespace kvc {

/// Name of a status, e.g. "KVC_CORRUPT_DATA" (static; never NULL).
inline const char* status_name(kvc_status status) noexcept { return kvc_status_name(status); }

/// The library's version string, e.g. "0.1.0".
inline std::string_view version() noexcept { return kvc_version(); }

/// The loaded library's ABI version ((major << 16) | minor).
inline std::uint32_t abi_version() noexcept { return kvc_abi_version(); }

/// Whether the loaded library can serve a program built against this header.
inline bool abi_compatible() noexcept {
    const std::uint32_t lib = kvc_abi_version();
    return (lib >> 16) == KVC_ABI_VERSION_MAJOR && (lib & 0xffffu) >= KVC_ABI_VERSION_MINOR;
}

/// This thread's last error message (empty when the last call succeeded).
inline std::string last_error_message() {
    std::size_t needed = 0;
    if (kvc_last_error_message(nullptr, 0, &needed) != KVC_OK || needed == 0) return {};
    std::string message(needed, '\0');
    if (kvc_last_error_message(message.data(), message.size(), nullptr) != KVC_OK) return {};
    message.resize(needed - 1);  // drop the NUL terminator
    return message;
}

/// A failed call: its status and message.
class Error {
public:
    Error(kvc_status status, std::string message) : status_(status), message_(std::move(message)) {}
    /// The status the C function returned (never KVC_OK).
    kvc_status status() const noexcept { return status_; }
    /// The message kvc_last_error_message gave right after the call.
    const std::string& message() const noexcept { return message_; }
    /// "KVC_BUFFER_TOO_SMALL: kvc_convert: ..."
    std::string to_string() const { return std::string(status_name(status_)) + ": " + message_; }

private:
    kvc_status status_;
    std::string message_;
};

#if KVC_HPP_EXCEPTIONS
/// Thrown by Result::value() on an error when exceptions are enabled.
class Exception : public std::runtime_error {
public:
    explicit Exception(Error error) : std::runtime_error(error.to_string()), error_(std::move(error)) {}
    const Error& error() const noexcept { return error_; }
    kvc_status status() const noexcept { return error_.status(); }

private:
    Error error_;
};
#endif

namespace detail {
/// Reports an error accessed as a value: throws, or prints and aborts.
[[noreturn]] inline void bad_access(const Error& error) {
#if KVC_HPP_EXCEPTIONS
    throw Exception(error);
#else
    std::fprintf(stderr, "kvc: value() of a failed Result: %s\n", error.to_string().c_str());
    std::abort();
#endif
}

/// The Error for a failed status, with this thread's message.
inline Error error_from(kvc_status status) { return Error(status, last_error_message()); }
}  // namespace detail

/// Either a T (success) or an Error. [[nodiscard]]: an ignored Result is a warning.
template <class T>
class [[nodiscard]] Result {
public:
    Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit, like expected
    Result(Error error) : error_(std::move(error)) {}  // NOLINT

    bool ok() const noexcept { return value_.has_value(); }
    explicit operator bool() const noexcept { return ok(); }

    /// The value; on an error throws kvc::Exception (or aborts without exceptions).
    T& value() & {
        if (!ok()) detail::bad_access(*error_);
        return *value_;
    }
    const T& value() const& {
        if (!ok()) detail::bad_access(*error_);
        return *value_;
    }
    T&& value() && {
        if (!ok()) detail::bad_access(*error_);
        return std::move(*value_);
    }
    /// The value, or `fallback` on an error.
    T value_or(T fallback) const& { return ok() ? *value_ : std::move(fallback); }
    /// Unchecked access (undefined on an error, as with std::expected).
    T& operator*() & noexcept { return *value_; }
    T* operator->() noexcept { return &*value_; }
    /// The error; only meaningful when !ok().
    const Error& error() const noexcept { return *error_; }
    /// The status: KVC_OK on success.
    kvc_status status() const noexcept { return ok() ? KVC_OK : error_->status(); }

private:
    std::optional<T> value_;
    std::optional<Error> error_;
};

/// Result of a call with no value.
template <>
class [[nodiscard]] Result<void> {
public:
    Result() = default;
    Result(Error error) : error_(std::move(error)) {}  // NOLINT

    bool ok() const noexcept { return !error_.has_value(); }
    explicit operator bool() const noexcept { return ok(); }
    /// Throws kvc::Exception (or aborts without exceptions) on an error.
    void value() const {
        if (!ok()) detail::bad_access(*error_);
    }
    const Error& error() const noexcept { return *error_; }
    kvc_status status() const noexcept { return ok() ? KVC_OK : error_->status(); }

private:
    std::optional<Error> error_;
};

namespace detail {
/// Turns a C status into a Result<void>, capturing the message on failure.
inline Result<void> check(kvc_status status) {
    if (status == KVC_OK) return {};
    return error_from(status);
}
}  // namespace detail

/// Owns one opaque kvc handle; `Free` is its kvc_*_free. Move-only; destruction frees.
template <class T, void (*Free)(T*)>
class Handle {
public:
    Handle() noexcept = default;
    /// Takes ownership of `raw` (which may be NULL).
    explicit Handle(T* raw) noexcept : raw_(raw) {}
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    Handle(Handle&& other) noexcept : raw_(std::exchange(other.raw_, nullptr)) {}
    Handle& operator=(Handle&& other) noexcept {
        if (this != &other) reset(std::exchange(other.raw_, nullptr));
        return *this;
    }
    ~Handle() { Free(raw_); }

    /// The C handle, still owned by this object.
    T* get() const noexcept { return raw_; }
    explicit operator bool() const noexcept { return raw_ != nullptr; }
    /// Gives up ownership: the caller must free the returned handle.
    T* release() noexcept { return std::exchange(raw_, nullptr); }
    /// Frees the current handle (if any) and takes `raw`.
    void reset(T* raw = nullptr) noexcept { Free(std::exchange(raw_, raw)); }

private:
    T* raw_ = nullptr;
};

/// Creates a handle through a `kvc_*_new`-style call `make(args..., &out)`.
template <class H, class Make, class... Args>
Result<H> make_handle(Make make, Args&&... args) {
    decltype(std::declval<H>().get()) raw = nullptr;
    const kvc_status status = make(std::forward<Args>(args)..., &raw);
    if (status != KVC_OK) return detail::error_from(status);
    return H(raw);
}

/// The gear-v1 codec (kvc_codec_*): create with make_handle<Codec>(kvc_codec_new, &config).
using Codec = Handle<kvc_codec, kvc_codec_free>;
/// The H2O policy (kvc_h2o_*): make_handle<H2o>(kvc_h2o_new, &config, n_layers).
using H2o = Handle<kvc_h2o, kvc_h2o_free>;
/// The MLP compressor (kvc_mlp_*): make_handle<Mlp>(kvc_mlp_new, path).
using Mlp = Handle<kvc_mlp, kvc_mlp_free>;
/// The C8 quantizer (kvc_quant_*, ABI 0.3): make_handle<Quant>(kvc_quant_new, &config), or
/// make_handle<Quant>(kvc_quant_new_from_msmodelslim, dir).
using Quant = Handle<kvc_quant, kvc_quant_free>;
/// A view of an engine's cache layout (kvc_cache_*, ABI 0.3):
/// make_handle<Cache>(kvc_cache_new, &config).
using Cache = Handle<kvc_cache, kvc_cache_free>;
/// kvq packed-row codecs (kvc_kvq_*, ABI 0.6): make_handle<Kvq>(kvc_kvq_new, "k4v4",
/// head_dim, n_layer, n_kv_head), or make_handle<Kvq>(kvc_kvq_new_from_plan, json, len).
using Kvq = Handle<kvc_kvq, kvc_kvq_free>;

/// kvc_codec_encode into a new vector sized by the worst-case query, trimmed to the blob.
inline Result<std::vector<std::uint8_t>> encode(kvc_codec* codec, kvc_tensor tensor,
                                                const void* src, std::size_t src_bytes) {
    std::size_t bound = 0;
    kvc_status st = kvc_codec_max_encoded_size(codec, src_bytes, &bound);
    if (st != KVC_OK) return detail::error_from(st);
    std::vector<std::uint8_t> out(bound);
    std::size_t len = 0;
    st = kvc_codec_encode(codec, tensor, src, src_bytes, out.data(), out.size(), &len);
    if (st != KVC_OK) return detail::error_from(st);
    out.resize(len);
    return out;
}

/// kvc_codec_decode into a new vector sized by the blob's decoded size.
inline Result<std::vector<std::uint8_t>> decode(kvc_codec* codec, const void* blob,
                                                std::size_t blob_bytes) {
    std::size_t size = 0;
    kvc_status st = kvc_codec_decoded_size(codec, blob, blob_bytes, &size);
    if (st != KVC_OK) return detail::error_from(st);
    std::vector<std::uint8_t> out(size);
    std::size_t len = 0;
    st = kvc_codec_decode(codec, blob, blob_bytes, out.data(), out.size(), &len);
    if (st != KVC_OK) return detail::error_from(st);
    return out;
}

/// The reserve pairs of the plan pending for `layer` (group `group`), via the size query.
inline Result<std::vector<kvc_reserve_pair>> plan_pairs(const kvc_h2o* h2o, std::size_t layer,
                                                        std::size_t group = 0) {
    std::size_t n = 0;
    kvc_status st = kvc_h2o_plan_pairs(h2o, layer, group, nullptr, 0, &n);
    if (st != KVC_OK) return detail::error_from(st);
    std::vector<kvc_reserve_pair> out(n);
    st = kvc_h2o_plan_pairs(h2o, layer, group, out.data(), out.size(), &n);
    if (st != KVC_OK) return detail::error_from(st);
    return out;
}

/// The C8 parameters of one layer's K or V.
struct QuantParams {
    std::vector<float> scale;
    std::vector<float> offset;
};

/// kvc_quant_get_params into new vectors sized by the size query.
inline Result<QuantParams> quant_params(const kvc_quant* quant, std::size_t layer,
                                        kvc_tensor tensor) {
    std::size_t n = 0;
    kvc_status st = kvc_quant_get_params(quant, layer, tensor, nullptr, nullptr, 0, &n);
    if (st != KVC_OK) return detail::error_from(st);
    QuantParams p{std::vector<float>(n), std::vector<float>(n)};
    st = kvc_quant_get_params(quant, layer, tensor, p.scale.data(), p.offset.data(), n, &n);
    if (st != KVC_OK) return detail::error_from(st);
    return p;
}

/// kvc_quant_quantize_rows into a new vector of n_rows * channels int8 values.
inline Result<std::vector<std::int8_t>> quantize_rows(const kvc_quant* quant, std::size_t layer,
                                                      kvc_tensor tensor, kvc_dtype dtype,
                                                      const void* src, std::size_t n_rows) {
    std::size_t n = 0;
    kvc_status st =
        kvc_quant_quantize_rows(quant, layer, tensor, dtype, src, n_rows, nullptr, 0, &n);
    if (st != KVC_OK) return detail::error_from(st);
    std::vector<std::int8_t> out(n);
    st = kvc_quant_quantize_rows(quant, layer, tensor, dtype, src, n_rows, out.data(), out.size(),
                                 &n);
    if (st != KVC_OK) return detail::error_from(st);
    return out;
}

/// kvc_quant_roundtrip_rows: C8 round trip of `n_rows` rows in place (no allocation).
inline Result<void> roundtrip_rows(const kvc_quant* quant, std::size_t layer, kvc_tensor tensor,
                                   kvc_dtype dtype, void* data, std::size_t n_rows) {
    return detail::check(kvc_quant_roundtrip_rows(quant, layer, tensor, dtype, data, n_rows));
}

/// kvc_kvq_quantize_rows into a new vector of n_rows * row_bytes packed bytes (`src` holds
/// n_rows * head_dim floats).
inline Result<std::vector<std::uint8_t>> kvq_quantize_rows(const kvc_kvq* kvq, std::uint32_t layer,
                                                           kvc_tensor tensor, const float* src,
                                                           std::size_t n_rows) {
    std::size_t row = 0;
    kvc_status st = kvc_kvq_row_bytes(kvq, layer, tensor, &row);
    if (st != KVC_OK) return detail::error_from(st);
    std::vector<std::uint8_t> out(row * n_rows);
    st = kvc_kvq_quantize_rows(kvq, layer, tensor, src, n_rows, out.data(), out.size());
    if (st != KVC_OK) return detail::error_from(st);
    return out;
}

/// kvc_kvq_quantize_rows_centered into a new vector of n_rows * row_bytes packed bytes:
/// each row coded as row - center (`center` a whole number of head_dim rows, row r using
/// center row r % (center.size() / head_dim)).
inline Result<std::vector<std::uint8_t>> kvq_quantize_rows_centered(
    const kvc_kvq* kvq, std::uint32_t layer, kvc_tensor tensor, const float* src,
    std::size_t n_rows, const std::vector<float>& center) {
    std::size_t row = 0;
    kvc_status st = kvc_kvq_row_bytes(kvq, layer, tensor, &row);
    if (st != KVC_OK) return detail::error_from(st);
    std::vector<std::uint8_t> out(row * n_rows);
    st = kvc_kvq_quantize_rows_centered(kvq, layer, tensor, src, n_rows, center.data(),
                                        center.size(), out.data(), out.size());
    if (st != KVC_OK) return detail::error_from(st);
    return out;
}

/// kvc_kvq_row_bytes: bytes of one packed row of `tensor` in `layer`.
inline Result<std::size_t> kvq_row_bytes(const kvc_kvq* kvq, std::uint32_t layer,
                                         kvc_tensor tensor) {
    std::size_t row = 0;
    const kvc_status st = kvc_kvq_row_bytes(kvq, layer, tensor, &row);
    if (st != KVC_OK) return detail::error_from(st);
    return row;
}

/// kvc_kvq_quantize_rows into the caller's buffer (no allocation): `n_rows` rows of
/// head_dim floats at `src` into `dst` (`dst_len` bytes, at least n_rows * row_bytes).
/// All or nothing: on an error `dst` is unchanged.
inline Result<void> kvq_quantize_rows_into(const kvc_kvq* kvq, std::uint32_t layer,
                                           kvc_tensor tensor, const float* src,
                                           std::size_t n_rows, std::uint8_t* dst,
                                           std::size_t dst_len) {
    return detail::check(kvc_kvq_quantize_rows(kvq, layer, tensor, src, n_rows, dst, dst_len));
}

/// kvc_kvq_dequantize_rows_checked into the caller's buffer (no allocation): `n_rows`
/// packed rows at `src` (`src_len` bytes) into `dst` (`dst_len` floats, at least n_rows *
/// head_dim). All or nothing.
inline Result<void> kvq_dequantize_rows_into(const kvc_kvq* kvq, std::uint32_t layer,
                                             kvc_tensor tensor, const std::uint8_t* src,
                                             std::size_t src_len, std::size_t n_rows,
                                             float* dst, std::size_t dst_len) {
    return detail::check(kvc_kvq_dequantize_rows_checked(kvq, layer, tensor, src, src_len,
                                                         n_rows, dst, dst_len));
}

/// kvc_kvq_attend into the caller's buffers (no allocation): one decode step of `n_head`
/// query heads on a token-major packed cache of `n_tokens` tokens. `scores` is scratch of
/// `scores_len >= n_head * n_tokens` floats (on success: each head's unnormalized softmax
/// weights); `out` receives n_head * head_dim floats. All or nothing for `out`.
inline Result<void> kvq_attend(const kvc_kvq* kvq, std::uint32_t layer, const float* q,
                               std::uint32_t n_head, const std::uint8_t* k, std::size_t k_len,
                               const std::uint8_t* v, std::size_t v_len, std::size_t n_tokens,
                               float scale, float* scores, std::size_t scores_len, float* out) {
    return detail::check(kvc_kvq_attend(kvq, layer, q, n_head, k, k_len, v, v_len, n_tokens,
                                        scale, scores, scores_len, out));
}

/// kvc_kvq_mean_center into a new vector of n_kv_head * head_dim floats.
inline Result<std::vector<float>> kvq_mean_center(const float* rows, std::size_t n_values,
                                                  std::uint32_t n_kv_head,
                                                  std::uint32_t head_dim) {
    std::vector<float> out(std::size_t(n_kv_head) * head_dim);
    const kvc_status st = kvc_kvq_mean_center(rows, n_values, n_kv_head, head_dim, out.data(),
                                              out.size());
    if (st != KVC_OK) return detail::error_from(st);
    return out;
}

/// kvc_cache_get_info.
inline Result<kvc_cache_info> cache_info(const kvc_cache* cache) {
    kvc_cache_info info{};
    const kvc_status st = kvc_cache_get_info(cache, &info);
    if (st != KVC_OK) return detail::error_from(st);
    return info;
}

/// kvc_cache_compact_layer with the pairs in a vector (e.g. from kvc::plan_pairs, for a
/// plan made at kv_len `len`); returns the new length.
inline Result<std::size_t> compact_layer(const kvc_cache* cache, void* k, void* v,
                                         const std::vector<kvc_reserve_pair>& pairs,
                                         std::size_t len) {
    std::size_t new_len = 0;
    const kvc_status st =
        kvc_cache_compact_layer(cache, k, v, pairs.data(), pairs.size(), len, &new_len);
    if (st != KVC_OK) return detail::error_from(st);
    return new_len;
}

/// Size in bytes of one element of `dtype` (0 when unknown).
inline std::size_t dtype_size(kvc_dtype dtype) noexcept { return kvc_dtype_size(dtype); }

/// kvc_convert: `count` elements of `src_dtype` at `src` into `dst` (capacity in
/// elements of `dst_dtype`). Returns the number of elements written.
inline Result<std::size_t> convert(kvc_dtype src_dtype, const void* src, std::size_t count,
                                   kvc_dtype dst_dtype, void* dst, std::size_t dst_capacity) {
    std::size_t written = 0;
    const kvc_status status =
        kvc_convert(src_dtype, src, count, dst_dtype, dst, dst_capacity, &written);
    if (status != KVC_OK) return detail::error_from(status);
    return written;
}

/// Widens a row of fp16 or bf16 bits (`src_dtype`) to floats.
inline Result<std::vector<float>> to_f32(kvc_dtype src_dtype, const std::uint16_t* src,
                                         std::size_t count) {
    std::vector<float> out(count);
    auto written = convert(src_dtype, src, count, KVC_DTYPE_F32, out.data(), out.size());
    if (!written) return written.error();
    return out;
}

/// Narrows floats to a row of fp16 or bf16 bits (`dst_dtype`), rounding to nearest even.
inline Result<std::vector<std::uint16_t>> from_f32(kvc_dtype dst_dtype, const float* src,
                                                   std::size_t count) {
    std::vector<std::uint16_t> out(count);
    auto written = convert(KVC_DTYPE_F32, src, count, dst_dtype, out.data(), out.size());
    if (!written) return written.error();
    return out;
}

// --- kvc_store (ABI 0.4) ---

/// The compressed KV store (kvc_store_*): make_handle<Store>(kvc_store_new, &config,
/// layers, n_layers). Every call but free may run concurrently on one handle.
using Store = Handle<kvc_store, kvc_store_free>;

/// K and V bytes of some tokens, token-major rows.
struct StoreTokens {
    std::vector<std::uint8_t> k;
    std::vector<std::uint8_t> v;
};

/// kvc_store_read_tokens of tokens [start, end) of `layer` into new vectors sized by the
/// size query (restored bit-exactly).
inline Result<StoreTokens> read_tokens(const kvc_store* store, std::size_t layer,
                                       std::size_t start, std::size_t end) {
    std::size_t kl = 0, vl = 0;
    kvc_status st =
        kvc_store_read_tokens(store, layer, start, end, nullptr, 0, nullptr, 0, &kl, &vl);
    if (st != KVC_OK && st != KVC_BUFFER_TOO_SMALL) return detail::error_from(st);
    StoreTokens out{std::vector<std::uint8_t>(kl), std::vector<std::uint8_t>(vl)};
    st = kvc_store_read_tokens(store, layer, start, end, out.k.data(), out.k.size(),
                               out.v.data(), out.v.size(), &kl, &vl);
    if (st != KVC_OK) return detail::error_from(st);
    return out;
}

// --- kvc_tiers (ABI 0.7) ---

/// Shared KV tiers (kvc_tiers_*): make_handle<Tiers>(kvc_tiers_new, &config), or for the
/// transform coder make_handle<Tiers>(kvc_tiers_new_tc, &config, "tc-<bound>", calibration_path). Every call
/// but free may run concurrently on one handle.
using Tiers = Handle<kvc_tiers, kvc_tiers_free>;

/// A restored prefix: `tokens` tokens of K and V, each [n_layer][tokens][n_kv_head][head_dim].
struct TiersPrefix {
    std::size_t tokens = 0;
    std::vector<std::uint8_t> k;
    std::vector<std::uint8_t> v;
};

/// Whether a `kvc_tiers_config.codec` restores the stored bytes exactly (raw, gear-v1,
/// gear-v2) or approximately (the kvq codecs: compare logits by KL, not for identity).
inline bool tiers_codec_lossless(std::uint32_t codec) noexcept {
    return codec == KVC_TIERS_CODEC_RAW || codec == KVC_TIERS_CODEC_GEAR_V1 ||
           codec == KVC_TIERS_CODEC_GEAR_V2;  // kvq (3-5) and tc (6) are lossy
}

/// kvc_tiers_lookup: tokens of the longest cached prefix of `tokens`.
inline Result<std::size_t> tiers_lookup(const kvc_tiers* tiers,
                                        const std::vector<std::uint32_t>& tokens) {
    std::size_t n = 0;
    kvc_status st = kvc_tiers_lookup(tiers, tokens.data(), tokens.size(), &n);
    if (st != KVC_OK) return detail::error_from(st);
    return n;
}

/// kvc_tiers_restore into new vectors with layer stride = the restored token count
/// (`row_bytes` = n_kv_head * head_dim * dtype size, `n_layer` as configured).
inline Result<TiersPrefix> tiers_restore(const kvc_tiers* tiers,
                                         const std::vector<std::uint32_t>& tokens,
                                         std::size_t n_layer, std::size_t row_bytes) {
    auto found = tiers_lookup(tiers, tokens);
    if (!found) return found.error();
    std::size_t cap = *found;
    std::vector<std::uint8_t> k(n_layer * cap * row_bytes), v(n_layer * cap * row_bytes);
    std::size_t got = 0;
    kvc_status st = kvc_tiers_restore(tiers, tokens.data(), tokens.size(), cap, k.data(),
                                      k.size(), v.data(), v.size(), &got);
    if (st != KVC_OK) return detail::error_from(st);
    TiersPrefix out;
    out.tokens = got;
    // Compact the layer stride from `cap` to `got` tokens (fewer when a chunk failed).
    for (std::size_t l = 0; l < n_layer; l++) {
        out.k.insert(out.k.end(), k.begin() + l * cap * row_bytes,
                     k.begin() + (l * cap + got) * row_bytes);
        out.v.insert(out.v.end(), v.begin() + l * cap * row_bytes,
                     v.begin() + (l * cap + got) * row_bytes);
    }
    return out;
}

/// kvc_tiers_store of `kv_tokens` tokens of K and V ([n_layer][kv_tokens][row]).
inline Result<kvc_tiers_store_report> tiers_store(const kvc_tiers* tiers,
                                                  const std::vector<std::uint32_t>& tokens,
                                                  std::size_t kv_tokens,
                                                  const std::vector<std::uint8_t>& k,
                                                  const std::vector<std::uint8_t>& v) {
    kvc_tiers_store_report r{};
    kvc_status st = kvc_tiers_store(tiers, tokens.data(), tokens.size(), kv_tokens, k.data(),
                                    k.size(), v.data(), v.size(), &r);
    if (st != KVC_OK) return detail::error_from(st);
    return r;
}

/// kvc_tiers_get_metrics.
inline Result<kvc_tiers_metrics> tiers_metrics(const kvc_tiers* tiers) {
    kvc_tiers_metrics m{};
    kvc_status st = kvc_tiers_get_metrics(tiers, &m);
    if (st != KVC_OK) return detail::error_from(st);
    return m;
}

// --- kv-prefix files (ABI 0.20) ---

/// kvc_tiers_export_prefix: writes the kv-prefix file of `tokens` at `path` (atomically);
/// the tokens its whole chunks cover.
inline Result<std::size_t> tiers_export_prefix(const kvc_tiers* tiers,
                                               const std::vector<std::uint32_t>& tokens,
                                               const std::string& path) {
    std::size_t n = 0;
    kvc_status st = kvc_tiers_export_prefix(tiers, tokens.data(), tokens.size(), path.c_str(), &n);
    if (st != KVC_OK) return detail::error_from(st);
    return n;
}

/// What kvc_tiers_import_prefix read and imported.
struct TiersImport {
    /// Every token id of the file (restore these with tiers_restore / kvc_tiers_restore).
    std::vector<std::uint32_t> tokens;
    /// Tokens of the leading chunks the first tier holds after the import.
    std::size_t chunk_tokens_imported = 0;
};

/// kvc_tiers_import_prefix of the file at `path`, its token ids sized by the size query.
/// A damaged file is KVC_CORRUPT_DATA, a foreign one KVC_INVALID_ARGUMENT.
inline Result<TiersImport> tiers_import_prefix(const kvc_tiers* tiers, const std::string& path) {
    std::size_t n = 0, imported = 0;
    kvc_status st = kvc_tiers_import_prefix(tiers, path.c_str(), nullptr, 0, &n, &imported);
    // A file replaced between the two calls may need a larger buffer: ask again.
    for (int attempt = 0; st == KVC_OK && attempt < 3; attempt++) {
        TiersImport out;
        out.tokens.resize(n);
        st = kvc_tiers_import_prefix(tiers, path.c_str(), out.tokens.data(), out.tokens.size(), &n,
                                     &imported);
        if (st == KVC_BUFFER_TOO_SMALL) {
            st = KVC_OK;
            continue;
        }
        if (st != KVC_OK) break;
        out.tokens.resize(n);
        out.chunk_tokens_imported = imported;
        return out;
    }
    return detail::error_from(st == KVC_OK ? KVC_BUFFER_TOO_SMALL : st);
}

}  // namespace kvc

#endif  // KVC_HPP
