// C++17: include/kvc.hpp, compiled twice (with exceptions and with -fno-exceptions).
// Also checks kvc.h and kvc.hpp include twice cleanly from C++.
#include "kvc.hpp"
#include "kvc.hpp"
#include "kvc.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            std::exit(1);                                                                \
        }                                                                                \
    } while (0)

static void test_basics() {
    CHECK(kvc::version() == kvc_version());
    CHECK(kvc::abi_compatible());
    CHECK(std::string(kvc::status_name(KVC_IO)) == "KVC_IO");
    CHECK(kvc::dtype_size(KVC_DTYPE_F32) == 4);
}

static void test_results() {
    const std::uint16_t h[3] = {0x3c00, 0xc000, 0x3800};
    auto f = kvc::to_f32(KVC_DTYPE_F16, h, 3);
    CHECK(f.ok() && f.status() == KVC_OK);
    CHECK((*f == std::vector<float>{1.0f, -2.0f, 0.5f}));
    auto b = kvc::from_f32(KVC_DTYPE_BF16, f->data(), f->size());
    CHECK(b && b.value() == (std::vector<std::uint16_t>{0x3f80, 0xc000, 0x3f00}));

    auto bad = kvc::to_f32(7, h, 3);
    CHECK(!bad);
    CHECK(bad.status() == KVC_INVALID_ARGUMENT);
    CHECK(bad.error().message().find("kvc_convert: invalid `src_dtype`: 7") == 0);
    CHECK(bad.error().to_string().find("KVC_INVALID_ARGUMENT: kvc_convert:") == 0);
    CHECK(bad.value_or({42.0f}) == std::vector<float>{42.0f});

    float small[2];
    auto r = kvc::convert(KVC_DTYPE_F16, h, 3, KVC_DTYPE_F32, small, 2);
    CHECK(r.status() == KVC_BUFFER_TOO_SMALL);
    CHECK(r.error().message().find("`dst` holds 2 but 3") != std::string::npos);
    auto n = kvc::convert(KVC_DTYPE_F16, h, 2, KVC_DTYPE_F32, small, 2);
    CHECK(n && *n == 2 && small[1] == -2.0f);
    CHECK(kvc::last_error_message().empty());

#if KVC_HPP_EXCEPTIONS
    bool thrown = false;
    try {
        (void)kvc::to_f32(7, h, 3).value();
    } catch (const kvc::Exception& e) {
        thrown = true;
        CHECK(e.status() == KVC_INVALID_ARGUMENT);
        CHECK(std::string(e.what()).find("KVC_INVALID_ARGUMENT: kvc_convert:") == 0);
    }
    CHECK(thrown);
#endif
}

// A handle wrapper written the way every kvc handle's is: an alias of kvc::Handle and
// a factory through kvc::make_handle.
#ifdef KVC_TEST_HOOKS
using TestCounter = kvc::Handle<kvc_test_counter, kvc_test_counter_free>;
static_assert(!std::is_copy_constructible_v<TestCounter>);
static_assert(std::is_nothrow_move_constructible_v<TestCounter>);

static void test_handles() {
    const std::size_t live0 = kvc_test_live_counters();
    {
        auto made = kvc::make_handle<TestCounter>(kvc_test_counter_new, std::int64_t{5});
        CHECK(made.ok());
        TestCounter c = std::move(made.value());
        CHECK(c && kvc_test_live_counters() == live0 + 1);
        std::int64_t v = 0;
        CHECK(kvc::detail::check(kvc_test_counter_add(c.get(), 10, &v)).ok() && v == 15);
        TestCounter moved = std::move(c);
        CHECK(!c && moved);
        CHECK(kvc_test_live_counters() == live0 + 1);
        auto second = kvc::make_handle<TestCounter>(kvc_test_counter_new, std::int64_t{1});
        moved = std::move(second.value());  // frees the first
        CHECK(kvc_test_live_counters() == live0 + 1);
        kvc_test_counter* raw = moved.release();
        CHECK(!moved && kvc_test_live_counters() == live0 + 1);
        moved.reset(raw);
        auto err = kvc::detail::check(kvc_test_counter_add(moved.get(), INT64_MAX, &v));
        CHECK(err.status() == KVC_INVALID_ARGUMENT);
        CHECK(err.error().message().find("overflows") != std::string::npos);
        auto panicked = kvc::detail::check(kvc_test_panic(0));
        CHECK(panicked.status() == KVC_PANIC);
    }
    CHECK(kvc_test_live_counters() == live0);
}
#endif

static void test_library_handles() {
    kvc_codec_config cfg;
    CHECK(kvc::detail::check(kvc_codec_config_default(&cfg)).ok());
    auto codec = kvc::make_handle<kvc::Codec>(kvc_codec_new, &cfg);
    CHECK(codec.ok() && codec->get() != nullptr);
    std::vector<std::uint16_t> src(1024);
    for (std::size_t i = 0; i < src.size(); i++) src[i] = static_cast<std::uint16_t>(0x3c00 + (i % 7));
    auto blob = kvc::encode(codec->get(), KVC_TENSOR_V, src.data(), src.size() * 2);
    CHECK(blob.ok() && !blob->empty() && blob->size() < src.size() * 2);
    auto back = kvc::decode(codec->get(), blob->data(), blob->size());
    CHECK(back.ok() && back->size() == src.size() * 2 &&
          std::memcmp(back->data(), src.data(), back->size()) == 0);
    auto bad = kvc::decode(codec->get(), blob->data(), blob->size() - 1);
    CHECK(bad.status() == KVC_CORRUPT_DATA);
    cfg.zstd_level = 999;
    auto bad_codec = kvc::make_handle<kvc::Codec>(kvc_codec_new, &cfg);
    CHECK(bad_codec.status() == KVC_INVALID_ARGUMENT);

    kvc_h2o_config hc;
    CHECK(kvc::detail::check(kvc_h2o_config_default(&hc)).ok());
    auto h2o = kvc::make_handle<kvc::H2o>(kvc_h2o_new, &hc, std::size_t{1});
    CHECK(h2o.ok());
    kvc_h2o_call_shape shape = {2048, 1, 2, 2};
    std::vector<float> probs(2 * 2048, 1.0f / 2048);
    CHECK(kvc::detail::check(kvc_h2o_begin_call(h2o->get(), 0, &shape, nullptr)).ok());
    CHECK(kvc::detail::check(kvc_h2o_ingest_probabilities(h2o->get(), 0, probs.data(), probs.size())).ok());
    kvc_h2o_decision d{};
    CHECK(kvc::detail::check(kvc_h2o_end_call(h2o->get(), 0, &d)).ok() && d.triggered == 1);
    auto pairs = kvc::plan_pairs(h2o->get(), 0);
    CHECK(pairs.ok() && !pairs->empty());
    std::size_t kept = 0;
    for (const auto& p : *pairs) kept += p.length;
    CHECK(kept == d.kept_tokens);
    CHECK(kvc::plan_pairs(h2o->get(), 0, 1).status() == KVC_INVALID_ARGUMENT);

    // The plan compacts a llama.cpp layer (f16 rows) through kvc::Cache.
    kvc_cache_config cc;
    CHECK(kvc::detail::check(kvc_cache_config_default(&cc)).ok());
    cc.n_kv_heads = 2;
    cc.head_dim_k = 4;
    cc.capacity = 2048;
    auto cache = kvc::make_handle<kvc::Cache>(kvc_cache_new, &cc);
    CHECK(cache.ok());
    auto info = kvc::cache_info(cache->get());
    CHECK(info && info->k_bytes == 2048 * 8 * 2 && info->layer_bytes == 2 * info->k_bytes);
    std::vector<std::uint16_t> k(2048 * 8), v(2048 * 8);
    for (std::size_t i = 0; i < k.size(); i++) {
        k[i] = static_cast<std::uint16_t>(i / 8);  // each row holds its token index
        v[i] = static_cast<std::uint16_t>(i / 8 + 1);
    }
    auto new_len = kvc::compact_layer(cache->get(), k.data(), v.data(), *pairs, 2048);
    CHECK(new_len && *new_len == d.kept_tokens);
    std::size_t row = 0;
    for (const auto& p : *pairs)
        for (std::uint32_t j = 0; j < p.length; j++, row++)
            CHECK(std::uint32_t{k[row * 8 + 5]} == p.offset + j && std::uint32_t{v[row * 8]} == p.offset + j + 1);
    CHECK(kvc::compact_layer(cache->get(), k.data(), v.data(), *pairs, 4096).status() ==
          KVC_INVALID_ARGUMENT);
    cc.capacity = 0;
    CHECK(kvc::make_handle<kvc::Cache>(kvc_cache_new, &cc).status() == KVC_INVALID_ARGUMENT);

    // The quantizer through kvc::Quant: calibrate on f32 rows, read the parameters,
    // quantize, round-trip in place.
    kvc_quant_config qc;
    CHECK(kvc::detail::check(kvc_quant_config_default(&qc)).ok());
    qc.n_layers = 1;
    qc.k_channels = 3;
    qc.v_channels = 3;
    qc.symmetric = 1;
    auto quant = kvc::make_handle<kvc::Quant>(kvc_quant_new, &qc);
    CHECK(quant.ok());
    const float rows[6] = {1.0f, -2.0f, 0.5f, -1.0f, 1.5f, 0.25f};
    CHECK(kvc::quant_params(quant->get(), 0, KVC_TENSOR_K).status() == KVC_INVALID_STATE);
    CHECK(kvc::detail::check(kvc_quant_observe_rows(quant->get(), 0, KVC_TENSOR_K, KVC_DTYPE_F32,
                                                    rows, 2))
              .ok());
    CHECK(kvc::detail::check(kvc_quant_finish(quant->get())).ok());
    auto params = kvc::quant_params(quant->get(), 0, KVC_TENSOR_K);
    CHECK(params && params->scale.size() == 3 && params->scale[1] == 2.0f / 127.0f &&
          params->offset == std::vector<float>(3, 0.0f));
    auto q8 = kvc::quantize_rows(quant->get(), 0, KVC_TENSOR_K, KVC_DTYPE_F32, rows, 2);
    CHECK(q8 && q8->size() == 6 && (*q8)[0] == 127 && (*q8)[1] == -127 && (*q8)[4] == 95);
    float data[6];
    std::memcpy(data, rows, sizeof data);
    CHECK(kvc::roundtrip_rows(quant->get(), 0, KVC_TENSOR_K, KVC_DTYPE_F32, data, 2).ok());
    CHECK(std::fabs(data[0] - 1.0f) < 1e-6f && std::fabs(data[4] - 1.5f) < 0.01f);
    CHECK(kvc::roundtrip_rows(quant->get(), 1, KVC_TENSOR_K, KVC_DTYPE_F32, data, 2).status() ==
          KVC_INVALID_ARGUMENT);
    auto loaded = kvc::make_handle<kvc::Quant>(kvc_quant_new_from_msmodelslim, "/nonexistent/c8");
    CHECK(loaded.status() == KVC_IO);
    auto mlp = kvc::make_handle<kvc::Mlp>(kvc_mlp_new, "/nonexistent.bin");
    CHECK(mlp.status() == KVC_IO);

    // kvq (ABI 0.6) through kvc::Kvq: quantize two rows, read them back.
    auto kvq = kvc::make_handle<kvc::Kvq>(kvc_kvq_new, "k4v2", 64u, 2u, 3u);
    CHECK(kvq.ok());
    std::vector<float> kv_rows(2 * 64);
    for (std::size_t i = 0; i < kv_rows.size(); i++) kv_rows[i] = float(i % 7) - 3.0f;
    auto packed = kvc::kvq_quantize_rows(kvq->get(), 1, KVC_TENSOR_K, kv_rows.data(), 2);
    CHECK(packed.ok() && packed->size() == 2 * 34);
    std::vector<float> kv_back(kv_rows.size());
    CHECK(kvc_kvq_dequantize_rows(kvq->get(), 1, KVC_TENSOR_K, packed->data(), packed->size(),
                                  kv_back.data(), 2) == KVC_OK);
    double err = 0, sig = 0;
    for (std::size_t i = 0; i < kv_rows.size(); i++) {
        err += double(kv_back[i] - kv_rows[i]) * double(kv_back[i] - kv_rows[i]);
        sig += double(kv_rows[i]) * double(kv_rows[i]);
    }
    CHECK(err < 0.05 * sig);
    CHECK(kvc::kvq_quantize_rows(kvq->get(), 2, KVC_TENSOR_K, kv_rows.data(), 2).status() ==
          KVC_INVALID_ARGUMENT);
    CHECK(kvc::make_handle<kvc::Kvq>(kvc_kvq_new, "k4v4:bad", 64u, 2u, 3u).status() ==
          KVC_INVALID_ARGUMENT);
    // Centered rows (ABI 0.11): the center of the two rows, then the same bytes as coding the
    // differences by hand.
    auto center = kvc::kvq_mean_center(kv_rows.data(), kv_rows.size(), 1u, 64u);
    CHECK(center.ok() && center->size() == 64);
    auto centered = kvc::kvq_quantize_rows_centered(kvq->get(), 1, KVC_TENSOR_K, kv_rows.data(), 2, *center);
    std::vector<float> diff(kv_rows.size());
    for (std::size_t i = 0; i < diff.size(); i++) diff[i] = kv_rows[i] - (*center)[i % 64];
    auto by_hand = kvc::kvq_quantize_rows(kvq->get(), 1, KVC_TENSOR_K, diff.data(), 2);
    CHECK(centered.ok() && by_hand.ok() && *centered == *by_hand);
    CHECK(kvc::kvq_quantize_rows_centered(kvq->get(), 1, KVC_TENSOR_K, kv_rows.data(), 2,
                                          std::vector<float>(63)).status() == KVC_INVALID_ARGUMENT);
    CHECK(kvc::kvq_mean_center(kv_rows.data(), 65, 1u, 64u).status() == KVC_INVALID_ARGUMENT);

    // Caller-buffer wrappers (ABI 0.12): row sizes, quantize / dequantize into the caller's
    // buffers, attend with caller scratch; the same bytes and values as the C calls.
    auto krow = kvc::kvq_row_bytes(kvq->get(), 1, KVC_TENSOR_K);
    CHECK(krow.ok() && *krow == 34);
    std::vector<std::uint8_t> into(2 * 34, 0xee);
    CHECK(kvc::kvq_quantize_rows_into(kvq->get(), 1, KVC_TENSOR_K, kv_rows.data(), 2, into.data(),
                                      into.size()).ok());
    CHECK(into == *packed);
    std::vector<float> back2(kv_rows.size(), -1.0f);
    CHECK(kvc::kvq_dequantize_rows_into(kvq->get(), 1, KVC_TENSOR_K, into.data(), into.size(), 2,
                                        back2.data(), back2.size()).ok());
    CHECK(back2 == kv_back);
    std::vector<float> keep(back2);
    CHECK(kvc::kvq_dequantize_rows_into(kvq->get(), 1, KVC_TENSOR_K, into.data(), into.size(), 2,
                                        back2.data(), back2.size() - 1).status() ==
          KVC_BUFFER_TOO_SMALL);
    CHECK(back2 == keep);
    // attend: 3 KV heads, 3 query heads, 2 tokens -> 6 K and 6 V rows (K 4-bit, V 2-bit).
    auto vrow = kvc::kvq_row_bytes(kvq->get(), 1, KVC_TENSOR_V);
    CHECK(vrow.ok());
    std::vector<float> rows6(6 * 64), q(3 * 64, 0.1f), scores(3 * 2), out(3 * 64);
    for (std::size_t i = 0; i < rows6.size(); i++) rows6[i] = float(i % 11) - 5.0f;
    std::vector<std::uint8_t> k6(6 * *krow), v6(6 * *vrow);
    CHECK(kvc::kvq_quantize_rows_into(kvq->get(), 1, KVC_TENSOR_K, rows6.data(), 6, k6.data(),
                                      k6.size()).ok());
    CHECK(kvc::kvq_quantize_rows_into(kvq->get(), 1, KVC_TENSOR_V, rows6.data(), 6, v6.data(),
                                      v6.size()).ok());
    CHECK(kvc::kvq_attend(kvq->get(), 1, q.data(), 3, k6.data(), k6.size(), v6.data(), v6.size(),
                          2, 0.125f, scores.data(), scores.size(), out.data()).ok());
    std::vector<float> out_c(out.size());
    CHECK(kvc_kvq_attend(kvq->get(), 1, q.data(), 3, k6.data(), k6.size(), v6.data(), v6.size(), 2,
                         0.125f, scores.data(), scores.size(), out_c.data()) == KVC_OK);
    CHECK(out == out_c);
    CHECK(kvc::kvq_attend(kvq->get(), 1, q.data(), 3, k6.data(), k6.size(), v6.data(), v6.size(),
                          2, std::nanf(""), scores.data(), scores.size(), out.data()).status() ==
          KVC_INVALID_ARGUMENT);
}

// kvc::Tiers (ABI 0.7): RAII handle, store then restore through the helpers.
static void test_tiers() {
    kvc_tiers_config c{};
    CHECK(kvc_tiers_config_default(&c) == KVC_OK);
    c.n_layer = 2;
    c.n_kv_head = 1;
    c.head_dim = 8;
    c.chunk_tokens = 4;
    c.codec = KVC_TIERS_CODEC_GEAR_V2;
    auto tiers = kvc::make_handle<kvc::Tiers>(kvc_tiers_new, &c);
    CHECK(tiers.ok());
    std::vector<std::uint32_t> tokens{5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    const std::size_t row = 8 * 2;
    std::vector<std::uint8_t> k(2 * tokens.size() * row), v(k.size());
    for (std::size_t i = 0; i < k.size(); i++) {
        k[i] = static_cast<std::uint8_t>(i * 7);
        v[i] = static_cast<std::uint8_t>(i * 13);
    }
    auto rep = kvc::tiers_store(tiers->get(), tokens, tokens.size(), k, v);
    CHECK(rep && rep->chunks == 2 && rep->chunks_encoded == 2);
    auto found = kvc::tiers_lookup(tiers->get(), tokens);
    CHECK(found && *found == 8);
    auto p = kvc::tiers_restore(tiers->get(), tokens, 2, row);
    CHECK(p && p->tokens == 8 && p->k.size() == 2 * 8 * row);
    for (std::size_t l = 0; l < 2; l++)
        CHECK(std::equal(p->k.begin() + l * 8 * row, p->k.begin() + (l + 1) * 8 * row,
                         k.begin() + l * tokens.size() * row));
    auto m = kvc::tiers_metrics(tiers->get());
    CHECK(m && m->chunks_restored == 2 && m->fallbacks == 0 && m->tiers[KVC_TIERS_MEMORY].present);
    auto bad = kvc::tiers_store(tiers->get(), tokens, tokens.size(), k, std::vector<std::uint8_t>(3));
    CHECK(bad.status() == KVC_INVALID_ARGUMENT);

    // ABI 0.20: the prefix in a kv-prefix file, imported by a fresh handle.
    const std::string path = "/tmp/kvc-test-cpp-" + std::to_string(getpid()) + "-" +
                             std::to_string(KVC_HPP_EXCEPTIONS) + ".kvcprfix";
    auto written = kvc::tiers_export_prefix(tiers->get(), tokens, path);
    CHECK(written && *written == 8);
    auto fresh = kvc::make_handle<kvc::Tiers>(kvc_tiers_new, &c);
    CHECK(fresh.ok());
    auto imported = kvc::tiers_import_prefix(fresh->get(), path);
    CHECK(imported && imported->tokens == tokens && imported->chunk_tokens_imported == 8);
    auto q = kvc::tiers_restore(fresh->get(), imported->tokens, 2, row);
    CHECK(q && q->tokens == 8 && q->k == p->k && q->v == p->v);
    c.model_hash[0] ^= 1;
    auto other = kvc::make_handle<kvc::Tiers>(kvc_tiers_new, &c);
    CHECK(other.ok());
    auto foreign = kvc::tiers_import_prefix(other->get(), path);
    CHECK(foreign.status() == KVC_INVALID_ARGUMENT &&
          foreign.error().message().find("foreign") != std::string::npos);
    CHECK(kvc::tiers_import_prefix(fresh->get(), path + ".missing").status() == KVC_IO);
    std::remove(path.c_str());
}

int main() {
    test_basics();
    test_results();
    test_library_handles();
    test_tiers();
#ifdef KVC_TEST_HOOKS
    test_handles();
#endif
#if KVC_HPP_EXCEPTIONS
    std::puts("test_cpp (exceptions): ok");
#else
    std::puts("test_cpp (no exceptions): ok");
#endif
    return 0;
}
