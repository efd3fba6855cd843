/* C11: the MLP compressor handle: load from a path and from memory, header info,
 * in-place compression of an InfiniLM [H, S_max, D] f32 cache checked against the
 * reference fixture of kvc-mlp, and every error path. KVC_MLP_FIXTURES is the fixture
 * directory (set by CMake). */
#include <math.h>
#include <stdint.h>

#include "check.h"

static char msg[1024];

#define H 2
#define S 23
#define D 8
#define CAP 30
#define S_NEW 9

static void* read_file(const char* name, size_t* len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", KVC_MLP_FIXTURES, name);
    FILE* f = fopen(path, "rb");
    CHECK(f != NULL);
    CHECK(fseek(f, 0, SEEK_END) == 0);
    long n = ftell(f);
    CHECK(n > 0);
    rewind(f);
    void* buf = malloc((size_t)n);
    CHECK(buf && fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void test_load(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/f32_text_bias.bin", KVC_MLP_FIXTURES);
    kvc_mlp* m = NULL;
    CHECK_STATUS(kvc_mlp_new(path, &m), KVC_OK);
    kvc_mlp_info info;
    CHECK_STATUS(kvc_mlp_get_info(m, &info), KVC_OK);
    CHECK(info.weight_dtype == KVC_DTYPE_F32 && info.num_layers == 2 && info.head_dim == D &&
          info.compression_factor == 3 && info.min_seq_len == 2);
    CHECK_STATUS(kvc_mlp_get_info(m, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_mlp_get_info(NULL, &info), KVC_NULL_ARGUMENT);
    kvc_mlp_free(m);

    kvc_mlp* sentinel = (kvc_mlp*)&info;
    m = sentinel;
    CHECK_STATUS(kvc_mlp_new("/nonexistent/kvc/compressor.bin", &m), KVC_IO);
    CHECK(strstr(last_error(msg, sizeof msg), "kvc_mlp_new: ") == msg);
    CHECK_STATUS(kvc_mlp_new(NULL, &m), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_mlp_new(path, NULL), KVC_NULL_ARGUMENT);
    CHECK(m == sentinel);

    size_t len = 0;
    uint8_t* bytes = (uint8_t*)read_file("f32_text_bias.bin", &len);
    CHECK_STATUS(kvc_mlp_new_from_memory(bytes, len, &m), KVC_OK);
    kvc_mlp_info info2;
    CHECK_STATUS(kvc_mlp_get_info(m, &info2), KVC_OK);
    CHECK(memcmp(&info, &info2, sizeof info) == 0);
    kvc_mlp_free(m);
    m = sentinel;
    for (size_t cut = 0; cut < len; cut += 61)
        CHECK_STATUS(kvc_mlp_new_from_memory(bytes, cut, &m), KVC_CORRUPT_DATA);
    bytes[0] ^= 0xff; /* magic */
    CHECK_STATUS(kvc_mlp_new_from_memory(bytes, len, &m), KVC_CORRUPT_DATA);
    CHECK(strstr(last_error(msg, sizeof msg), "kvc_mlp_new_from_memory: ") == msg);
    CHECK_STATUS(kvc_mlp_new_from_memory(NULL, len, &m), KVC_NULL_ARGUMENT);
    CHECK(m == sentinel);
    free(bytes);
    kvc_mlp_free(NULL);
}

static void test_compress(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/f32_text_bias.bin", KVC_MLP_FIXTURES);
    kvc_mlp* m = NULL;
    CHECK_STATUS(kvc_mlp_new(path, &m), KVC_OK);

    size_t klen = 0, vlen = 0, wklen = 0, wvlen = 0;
    float* kraw = (float*)read_file("f32_text_bias.k.raw", &klen);
    float* vraw = (float*)read_file("f32_text_bias.v.raw", &vlen);
    double* want_k = (double*)read_file("f32_text_bias.L0.k.f64", &wklen);
    double* want_v = (double*)read_file("f32_text_bias.L0.v.f64", &wvlen);
    CHECK(klen == sizeof(float) * H * S * D && vlen == klen);
    CHECK(wklen == sizeof(double) * H * S_NEW * D && wvlen == wklen);

    /* [H, CAP, D] with the first S tokens of each head filled. */
    static float k[H * CAP * D], v[H * CAP * D];
    memset(k, 0, sizeof k);
    memset(v, 0, sizeof v);
    for (int h = 0; h < H; h++) {
        memcpy(k + h * CAP * D, kraw + h * S * D, sizeof(float) * S * D);
        memcpy(v + h * CAP * D, vraw + h * S * D, sizeof(float) * S * D);
    }
    static float k0[H * CAP * D];
    memcpy(k0, k, sizeof k);

    size_t new_len = 1234, rope = 5678;
    /* Errors first: nothing changes. */
    CHECK_STATUS(kvc_mlp_compress_inplace(m, 2, KVC_DTYPE_F32, k, v, H, CAP, S, D, 0, &new_len, &rope),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_mlp_compress_inplace(m, 0, KVC_DTYPE_F32, k, v, H, CAP, S, 4, 0, &new_len, &rope),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_mlp_compress_inplace(m, 0, KVC_DTYPE_F32, k, v, H, CAP, CAP + 1, D, 0, &new_len, &rope),
                 KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "seq_len") != NULL);
    CHECK_STATUS(kvc_mlp_compress_inplace(m, 0, KVC_DTYPE_I8, k, v, H, CAP, S, D, 0, &new_len, &rope),
                 KVC_UNSUPPORTED);
    CHECK_STATUS(kvc_mlp_compress_inplace(m, 0, 7, k, v, H, CAP, S, D, 0, &new_len, &rope),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_mlp_compress_inplace(m, 0, KVC_DTYPE_F32, k, k + 8, H, CAP, S, D, 0, &new_len, &rope),
                 KVC_INVALID_ARGUMENT); /* K and V overlap */
    CHECK_STATUS(kvc_mlp_compress_inplace(m, 0, KVC_DTYPE_F32, (char*)k + 1, v, H, CAP, S, D, 0, &new_len,
                                          &rope),
                 KVC_INVALID_ARGUMENT); /* misaligned */
    CHECK_STATUS(kvc_mlp_compress_inplace(m, 0, KVC_DTYPE_F32, k, v, SIZE_MAX, CAP, S, D, 0, &new_len, &rope),
                 KVC_INVALID_ARGUMENT); /* size overflow */
    CHECK_STATUS(kvc_mlp_compress_inplace(m, 0, KVC_DTYPE_F32, NULL, v, H, CAP, S, D, 0, &new_len, &rope),
                 KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_mlp_compress_inplace(m, 0, KVC_DTYPE_F32, k, v, H, CAP, S, D, 0, NULL, &rope),
                 KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_mlp_compress_inplace(NULL, 0, KVC_DTYPE_F32, k, v, H, CAP, S, D, 0, &new_len, &rope),
                 KVC_NULL_ARGUMENT);
    CHECK(new_len == 1234 && rope == 5678 && memcmp(k, k0, sizeof k) == 0);

    CHECK_STATUS(kvc_mlp_compress_inplace(m, 0, KVC_DTYPE_F32, k, v, H, CAP, S, D, 0, &new_len, &rope),
                 KVC_OK);
    CHECK(new_len == S_NEW && rope == S);
    for (int h = 0; h < H; h++)
        for (int i = 0; i < S_NEW * D; i++) {
            double wk = want_k[h * S_NEW * D + i], wv = want_v[h * S_NEW * D + i];
            double gk = k[h * CAP * D + i], gv = v[h * CAP * D + i];
            CHECK(fabs(gk - wk) <= 1e-4 * fmax(fabs(wk), 1e-3) + 1e-6);
            CHECK(fabs(gv - wv) <= 1e-4 * fmax(fabs(wv), 1e-3) + 1e-6);
        }
    free(kraw);
    free(vraw);
    free(want_k);
    free(want_v);
    kvc_mlp_free(m);
}

int main(void) {
    test_load();
    test_compress();
    puts("test_mlp: ok");
    return 0;
}
