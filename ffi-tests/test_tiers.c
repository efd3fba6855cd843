/* kvc_tiers from C: store a prefix through memory + disk (+ a Redis that is down: its
 * failures are counted fallbacks, never errors), then a second handle over the same disk
 * directory looks the prefix up and restores it bit-exactly; a damaged file is a counted
 * miss; every error path (NULL, bad config, no tier, wrong sizes, small buffers). A kvq
 * handle (lossy) restores an approximation under f16/3.5 bytes and refuses a chunk with a
 * NaN. A prefix exported to a kv-prefix file and imported by a fresh handle restores
 * bit-exactly; a damaged or foreign file imports nothing (ABI 0.20). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"

enum { LAYERS = 2, HEADS = 3, DIM = 64, ROW = HEADS * DIM * 2, CHUNK = 64, TOKENS = 300 };

static void remove_dir(const char* dir) {
    DIR* d = opendir(dir);
    if (!d) return;
    struct dirent* e;
    char path[1024];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static kvc_tiers_config config(const char* dir) {
    kvc_tiers_config c;
    memset(&c, 0x5a, sizeof c);
    CHECK_STATUS(kvc_tiers_config_default(&c), KVC_OK);
    CHECK(c.codec == KVC_TIERS_CODEC_GEAR_V2 && c.chunk_tokens == 256 && c.disk_dir == NULL &&
          c.redis_url == NULL && c.memory_budget_bytes > 0);
    c.n_layer = LAYERS;
    c.n_kv_head = HEADS;
    c.head_dim = DIM;
    c.chunk_tokens = CHUNK;
    c.codec = KVC_TIERS_CODEC_GEAR_V1;
    memset(c.model_hash, 7, sizeof c.model_hash);
    c.disk_dir = dir;
    /* Nothing listens on port 1: every Redis operation fails fast. */
    c.redis_url = "redis://127.0.0.1:1";
    c.redis_timeout_ms = 200;
    return c;
}

int main(void) {
    char dir[] = "/tmp/kvc-ffi-tiers-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    uint32_t tokens[TOKENS];
    for (int i = 0; i < TOKENS; i++) tokens[i] = (uint32_t)(i * 2654435761u);
    size_t bytes = (size_t)LAYERS * TOKENS * ROW;
    uint8_t* k = malloc(bytes);
    uint8_t* v = malloc(bytes);
    CHECK(k && v);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < bytes; i += 2) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        uint16_t h = (uint16_t)(0x2c00 + ((x * 0x2545f4914f6cdd1dull) >> 52));
        memcpy(k + i, &h, 2);
        h ^= 0x8000;
        memcpy(v + i, &h, 2);
    }

    kvc_tiers_config c = config(dir);
    kvc_tiers* a = NULL;
    CHECK_STATUS(kvc_tiers_new(&c, &a), KVC_OK);
    size_t n = 99;
    CHECK_STATUS(kvc_tiers_lookup(a, tokens, TOKENS, &n), KVC_OK);
    CHECK(n == 0);
    kvc_tiers_store_report rep;
    CHECK_STATUS(kvc_tiers_store(a, tokens, TOKENS, TOKENS, k, bytes, v, bytes, &rep), KVC_OK);
    CHECK(rep.chunks == 4 && rep.chunks_encoded == 4 && rep.failures == 1);
    CHECK(rep.bytes_raw == 4ull * 2 * LAYERS * CHUNK * ROW && rep.bytes_stored > 0);
    CHECK_STATUS(kvc_tiers_store(a, tokens, TOKENS, TOKENS, k, bytes, v, bytes, NULL), KVC_OK);
    kvc_tiers_metrics m;
    CHECK_STATUS(kvc_tiers_get_metrics(a, &m), KVC_OK);
    CHECK(m.tiers[KVC_TIERS_MEMORY].present && m.tiers[KVC_TIERS_DISK].present &&
          m.tiers[KVC_TIERS_REDIS].present);
    CHECK(m.tiers[KVC_TIERS_DISK].entries == 4 && m.tiers[KVC_TIERS_REDIS].errors >= 1);
    CHECK(m.fallbacks >= 1);
    kvc_tiers_free(a);

    /* A second instance: fresh memory, the same disk directory. */
    kvc_tiers* b = NULL;
    CHECK_STATUS(kvc_tiers_new(&c, &b), KVC_OK);
    CHECK_STATUS(kvc_tiers_lookup(b, tokens, TOKENS, &n), KVC_OK);
    CHECK(n == 4 * CHUNK);
    uint8_t* rk = calloc(1, bytes);
    uint8_t* rv = calloc(1, bytes);
    CHECK(rk && rv);
    CHECK_STATUS(kvc_tiers_restore(b, tokens, TOKENS, TOKENS, rk, bytes, rv, bytes, &n), KVC_OK);
    CHECK(n == 4 * CHUNK);
    for (int l = 0; l < LAYERS; l++) {
        size_t off = (size_t)l * TOKENS * ROW;
        CHECK(memcmp(rk + off, k + off, n * ROW) == 0);
        CHECK(memcmp(rv + off, v + off, n * ROW) == 0);
        /* Past the restored tokens: untouched. */
        CHECK(rk[off + n * ROW] == 0);
    }
    CHECK_STATUS(kvc_tiers_get_metrics(b, &m), KVC_OK);
    CHECK(m.tiers[KVC_TIERS_DISK].hits == 4 && m.promotions == 4 && m.chunks_restored == 4);

    /* Errors. */
    CHECK_STATUS(kvc_tiers_restore(b, tokens, TOKENS, TOKENS, rk, bytes - 1, rv, bytes, &n),
                 KVC_BUFFER_TOO_SMALL);
    CHECK_STATUS(kvc_tiers_restore(b, tokens, TOKENS, TOKENS, rk, bytes, rk, bytes, &n),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_tiers_store(b, tokens, TOKENS, TOKENS, k, bytes - 2, v, bytes, NULL),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_tiers_lookup(NULL, tokens, TOKENS, &n), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_tiers_lookup(b, NULL, TOKENS, &n), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_tiers_lookup(b, tokens, TOKENS, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_tiers_get_metrics(b, NULL), KVC_NULL_ARGUMENT);
    kvc_tiers_free(b);
    kvc_tiers_free(NULL);

    kvc_tiers* bad = NULL;
    kvc_tiers_config c2 = c;
    c2.codec = 9;
    CHECK_STATUS(kvc_tiers_new(&c2, &bad), KVC_INVALID_ARGUMENT);
    c2 = c;
    c2.n_layer = 0;
    CHECK_STATUS(kvc_tiers_new(&c2, &bad), KVC_INVALID_ARGUMENT);
    c2 = c;
    c2.dtype = KVC_DTYPE_I8;
    CHECK_STATUS(kvc_tiers_new(&c2, &bad), KVC_INVALID_ARGUMENT);
    c2 = c;
    c2.memory_budget_bytes = 0;
    c2.disk_dir = NULL;
    c2.redis_url = NULL;
    CHECK_STATUS(kvc_tiers_new(&c2, &bad), KVC_INVALID_ARGUMENT);
    c2 = c;
    c2.redis_url = "http://nope";
    CHECK_STATUS(kvc_tiers_new(&c2, &bad), KVC_INVALID_ARGUMENT);
    CHECK(bad == NULL);
    CHECK_STATUS(kvc_tiers_new(NULL, &bad), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_tiers_new(&c, NULL), KVC_NULL_ARGUMENT);
    c2 = c;
    c2.codec = KVC_TIERS_CODEC_KVQ_K4V4;
    c2.head_dim = 80; /* kvq codes head_dim 64, 128, 256 */
    CHECK_STATUS(kvc_tiers_new(&c2, &bad), KVC_INVALID_ARGUMENT);
    CHECK(bad == NULL);

    /* kvq k4v4 (memory only): lossy restore within a relative RMS error bound, every
     * blob byte under f16/3.5, and a chunk with a NaN refused (not stored). */
    c2 = c;
    c2.codec = KVC_TIERS_CODEC_KVQ_K4V4;
    c2.disk_dir = NULL;
    c2.redis_url = NULL;
    kvc_tiers* q = NULL;
    CHECK_STATUS(kvc_tiers_new(&c2, &q), KVC_OK);
    CHECK_STATUS(kvc_tiers_store(q, tokens, TOKENS, TOKENS, k, bytes, v, bytes, &rep), KVC_OK);
    CHECK(rep.chunks == 4 && rep.chunks_encoded == 4 && rep.failures == 0);
    CHECK(rep.bytes_stored * 35 < rep.bytes_raw * 10);
    memset(rk, 0, bytes), memset(rv, 0, bytes);
    CHECK_STATUS(kvc_tiers_restore(q, tokens, TOKENS, TOKENS, rk, bytes, rv, bytes, &n), KVC_OK);
    CHECK(n == 4 * CHUNK);
    size_t vals = n * ROW / 2;
    float* want = malloc(vals * sizeof(float));
    float* got = malloc(vals * sizeof(float));
    CHECK(want && got);
    for (int t = 0; t < 2; t++) {
        const uint8_t* src = t ? v : k;
        const uint8_t* dst = t ? rv : rk;
        for (int l = 0; l < LAYERS; l++) {
            size_t off = (size_t)l * TOKENS * ROW, len = 0;
            CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, src + off, vals, KVC_DTYPE_F32, want,
                                     vals * sizeof(float), &len), KVC_OK);
            CHECK_STATUS(kvc_convert(KVC_DTYPE_F16, dst + off, vals, KVC_DTYPE_F32, got,
                                     vals * sizeof(float), &len), KVC_OK);
            double err = 0, ref = 0;
            for (size_t i = 0; i < vals; i++) {
                err += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
                ref += (double)want[i] * want[i];
            }
            CHECK(err > 0 && sqrt(err / ref) < 0.1);
        }
    }
    free(want), free(got);
    kvc_tiers_free(q);
    q = NULL;
    CHECK_STATUS(kvc_tiers_new(&c2, &q), KVC_OK);
    uint16_t nan16 = 0x7e00;
    memcpy(k + (size_t)TOKENS * ROW + (CHUNK + 5) * ROW, &nan16, 2); /* layer 1, chunk 1 */
    CHECK_STATUS(kvc_tiers_store(q, tokens, TOKENS, TOKENS, k, bytes, v, bytes, &rep), KVC_OK);
    CHECK(rep.chunks == 4 && rep.chunks_encoded == 3);
    CHECK_STATUS(kvc_tiers_lookup(q, tokens, TOKENS, &n), KVC_OK);
    CHECK(n == CHUNK);
    kvc_tiers_free(q);

    /* ABI 0.20: a kv-prefix file. The prefix stored into a memory-tier handle, exported to
     * a file, imported into a fresh handle, restored bit-exactly; a damaged copy is
     * KVC_CORRUPT_DATA, another model's file KVC_INVALID_ARGUMENT ("foreign"); both import
     * nothing and the handle stays usable. (gear-v1 is lossless: the NaN planted above is
     * stored and restored as it is.) */
    {
        kvc_tiers_config cm = c;
        cm.disk_dir = NULL;
        cm.redis_url = NULL;
        kvc_tiers* src = NULL;
        CHECK_STATUS(kvc_tiers_new(&cm, &src), KVC_OK);
        CHECK_STATUS(kvc_tiers_store(src, tokens, TOKENS, TOKENS, k, bytes, v, bytes, NULL), KVC_OK);
        char path[1100];
        snprintf(path, sizeof path, "%s/slot.kvcprfix", dir);
        size_t covered = 0;
        CHECK_STATUS(kvc_tiers_export_prefix(src, tokens, TOKENS, path, &covered), KVC_OK);
        CHECK(covered == 4 * CHUNK);

        kvc_tiers* dst = NULL;
        CHECK_STATUS(kvc_tiers_new(&cm, &dst), KVC_OK);
        uint32_t got_tokens[TOKENS + 1];
        size_t n_file = 0, imported = 12345;
        /* size query, then a buffer one token short: the count, nothing imported */
        CHECK_STATUS(kvc_tiers_import_prefix(dst, path, NULL, 0, &n_file, &imported), KVC_OK);
        CHECK(n_file == TOKENS && imported == 12345);
        n_file = 0;
        CHECK_STATUS(kvc_tiers_import_prefix(dst, path, got_tokens, TOKENS - 1, &n_file, &imported),
                     KVC_BUFFER_TOO_SMALL);
        CHECK(n_file == TOKENS && imported == 12345);
        CHECK_STATUS(kvc_tiers_lookup(dst, tokens, TOKENS, &n), KVC_OK);
        CHECK(n == 0);

        /* a damaged copy: one byte flipped in the middle */
        FILE* f = fopen(path, "rb");
        CHECK(f != NULL);
        CHECK(fseek(f, 0, SEEK_END) == 0);
        long flen = ftell(f);
        CHECK(flen > 0);
        uint8_t* file = malloc((size_t)flen);
        CHECK(file != NULL);
        rewind(f);
        CHECK(fread(file, 1, (size_t)flen, f) == (size_t)flen);
        fclose(f);
        char bad_path[1100];
        snprintf(bad_path, sizeof bad_path, "%s/damaged.kvcprfix", dir);
        file[flen / 2] ^= 0x01;
        f = fopen(bad_path, "wb");
        CHECK(f != NULL);
        CHECK(fwrite(file, 1, (size_t)flen, f) == (size_t)flen);
        fclose(f);
        free(file);
        n_file = 777;
        CHECK_STATUS(kvc_tiers_import_prefix(dst, bad_path, got_tokens, TOKENS, &n_file, &imported),
                     KVC_CORRUPT_DATA);
        CHECK(n_file == 777 && imported == 12345);
        CHECK_STATUS(kvc_tiers_lookup(dst, tokens, TOKENS, &n), KVC_OK);
        CHECK(n == 0);
        char msg[512];
        CHECK_STATUS(kvc_tiers_import_prefix(dst, "/nonexistent/slot.kvcprfix", got_tokens, TOKENS,
                                             &n_file, &imported),
                     KVC_IO);

        /* another model's tiers: foreign */
        kvc_tiers_config co = cm;
        co.model_hash[0] ^= 1;
        kvc_tiers* other = NULL;
        CHECK_STATUS(kvc_tiers_new(&co, &other), KVC_OK);
        CHECK_STATUS(kvc_tiers_import_prefix(other, path, got_tokens, TOKENS, &n_file, &imported),
                     KVC_INVALID_ARGUMENT);
        CHECK(strstr(last_error(msg, sizeof msg), "foreign") != NULL);
        kvc_tiers_free(other);

        /* the good file into the same handle: imported, restored bit-exactly */
        got_tokens[TOKENS] = 0xabcdefu;
        CHECK_STATUS(kvc_tiers_import_prefix(dst, path, got_tokens, TOKENS + 1, &n_file, &imported),
                     KVC_OK);
        CHECK(n_file == TOKENS && imported == 4 * CHUNK && got_tokens[TOKENS] == 0xabcdefu);
        CHECK(memcmp(got_tokens, tokens, sizeof tokens) == 0);
        memset(rk, 0, bytes), memset(rv, 0, bytes);
        CHECK_STATUS(kvc_tiers_restore(dst, got_tokens, TOKENS, TOKENS, rk, bytes, rv, bytes, &n),
                     KVC_OK);
        CHECK(n == 4 * CHUNK);
        for (int l = 0; l < LAYERS; l++) {
            size_t off = (size_t)l * TOKENS * ROW;
            CHECK(memcmp(rk + off, k + off, n * ROW) == 0);
            CHECK(memcmp(rv + off, v + off, n * ROW) == 0);
        }
        CHECK_STATUS(kvc_tiers_get_metrics(dst, &m), KVC_OK);
        CHECK(m.tiers[KVC_TIERS_MEMORY].entries == 4 && m.chunks_restored == 4 && m.fallbacks == 0);
        CHECK_STATUS(kvc_tiers_export_prefix(NULL, tokens, TOKENS, path, &covered), KVC_NULL_ARGUMENT);
        CHECK_STATUS(kvc_tiers_export_prefix(src, tokens, TOKENS, NULL, &covered), KVC_NULL_ARGUMENT);
        CHECK_STATUS(kvc_tiers_import_prefix(dst, path, NULL, 3, &n_file, &imported),
                     KVC_NULL_ARGUMENT);
        kvc_tiers_free(dst);
        kvc_tiers_free(src);
    }

    uint8_t hash[32];
    CHECK_STATUS(kvc_tiers_hash_model_file("/nonexistent/model.gguf", hash), KVC_IO);
    CHECK_STATUS(kvc_tiers_hash_model_file(NULL, hash), KVC_NULL_ARGUMENT);

    free(k), free(v), free(rk), free(rv);
    remove_dir(dir);
    puts("test_tiers: ok");
    return 0;
}
