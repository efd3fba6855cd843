/* C11: the gear-v1 codec handle: happy path, size queries, every error path, outputs
 * untouched on failure, corrupt blobs. */
#include <math.h>
#include <stdint.h>

#include "check.h"

static char msg[1024];

#define N_ELEMS 2048 /* 4 KiB of fp16 */

static uint16_t f16_bits(float x) {
    uint16_t out = 0;
    size_t n = 0;
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F32, &x, 1, KVC_DTYPE_F16, &out, 1, &n), KVC_OK);
    return out;
}

static void test_config(void) {
    kvc_codec_config c;
    memset(&c, 0xff, sizeof c);
    CHECK_STATUS(kvc_codec_config_default(&c), KVC_OK);
    CHECK(c.dtype == KVC_DTYPE_F16 && c.k_predictors == KVC_PREDICTOR_ALL &&
          c.v_predictors == KVC_PREDICTOR_ALL && c.zstd_level == 3);
    CHECK_STATUS(kvc_codec_config_default(NULL), KVC_NULL_ARGUMENT);

    kvc_codec* sentinel = (kvc_codec*)&c;
    kvc_codec* out = sentinel;
    kvc_codec_config bad = c;
    bad.dtype = 9;
    CHECK_STATUS(kvc_codec_new(&bad, &out), KVC_INVALID_ARGUMENT);
    CHECK(out == sentinel);
    CHECK(strstr(last_error(msg, sizeof msg), "kvc_codec_new: invalid `config.dtype`: 9") == msg);
    bad = c;
    bad.k_predictors = 0;
    CHECK_STATUS(kvc_codec_new(&bad, &out), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "config.k_predictors") != NULL);
    bad = c;
    bad.v_predictors = 8;
    CHECK_STATUS(kvc_codec_new(&bad, &out), KVC_INVALID_ARGUMENT);
    bad = c;
    bad.zstd_level = 1000;
    CHECK_STATUS(kvc_codec_new(&bad, &out), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "zstd level 1000") != NULL);
    CHECK(out == sentinel);
    CHECK_STATUS(kvc_codec_new(NULL, &out), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_codec_new(&c, NULL), KVC_NULL_ARGUMENT);
    kvc_codec_free(NULL);
}

static void test_roundtrip(kvc_dtype dtype, uint32_t k_pred, uint32_t v_pred) {
    kvc_codec_config c;
    CHECK_STATUS(kvc_codec_config_default(&c), KVC_OK);
    c.dtype = dtype;
    c.k_predictors = k_pred;
    c.v_predictors = v_pred;
    kvc_codec* codec = NULL;
    CHECK_STATUS(kvc_codec_new(&c, &codec), KVC_OK);
    CHECK(codec != NULL);

    static uint16_t src[N_ELEMS];
    for (int i = 0; i < N_ELEMS; i++) src[i] = f16_bits(sinf((float)i * 0.37f) * 0.5f);
    const size_t src_bytes = sizeof src;

    size_t bound = 0, q = 0;
    CHECK_STATUS(kvc_codec_max_encoded_size(codec, src_bytes, &bound), KVC_OK);
    CHECK(bound > src_bytes);
    CHECK_STATUS(kvc_codec_encode(codec, KVC_TENSOR_K, src, src_bytes, NULL, 0, &q), KVC_OK);
    CHECK(q == bound);

    uint8_t* blob = (uint8_t*)malloc(bound);
    uint8_t* blob2 = (uint8_t*)malloc(bound);
    CHECK(blob && blob2);
    size_t len = 0;
    CHECK_STATUS(kvc_codec_encode(codec, KVC_TENSOR_K, src, src_bytes, blob, bound, &len), KVC_OK);
    CHECK(len > 0 && len <= bound);
    CHECK(strlen(last_error(msg, sizeof msg)) == 0);

    /* Exactly the blob's size works (encoded aside, copied); one byte less does not. */
    size_t len2 = 0;
    CHECK_STATUS(kvc_codec_encode(codec, KVC_TENSOR_K, src, src_bytes, blob2, len, &len2), KVC_OK);
    CHECK(len2 == len && memcmp(blob, blob2, len) == 0);
    memset(blob2, 0xab, bound);
    len2 = 7;
    CHECK_STATUS(kvc_codec_encode(codec, KVC_TENSOR_K, src, src_bytes, blob2, len - 1, &len2),
                 KVC_BUFFER_TOO_SMALL);
    CHECK(len2 == len);
    for (size_t i = 0; i < bound; i++) CHECK(blob2[i] == 0xab);
    CHECK(strstr(last_error(msg, sizeof msg), "kvc_codec_encode: `dst` holds") == msg);

    /* V tensors use their own predictor set. */
    size_t vlen = 0;
    CHECK_STATUS(kvc_codec_encode(codec, KVC_TENSOR_V, src, src_bytes, blob2, bound, &vlen), KVC_OK);
    if (k_pred == v_pred) CHECK(vlen == len && memcmp(blob, blob2, len) == 0);

    /* Decode: size query, exact buffer, too small, round trip. */
    size_t dsize = 0;
    CHECK_STATUS(kvc_codec_decoded_size(codec, blob, len, &dsize), KVC_OK);
    CHECK(dsize == src_bytes);
    q = 0;
    CHECK_STATUS(kvc_codec_decode(codec, blob, len, NULL, 0, &q), KVC_OK);
    CHECK(q == src_bytes);
    static uint16_t back[N_ELEMS];
    memset(back, 0xcd, sizeof back);
    size_t dlen = 0;
    CHECK_STATUS(kvc_codec_decode(codec, blob, len, back, N_ELEMS - 1, &dlen),
                 KVC_BUFFER_TOO_SMALL);
    CHECK(dlen == src_bytes);
    for (int i = 0; i < N_ELEMS; i++) CHECK(back[i] == 0xcdcd);
    CHECK_STATUS(kvc_codec_decode(codec, blob, len, back, sizeof back, &dlen), KVC_OK);
    CHECK(dlen == src_bytes && memcmp(back, src, src_bytes) == 0);
    size_t vd = 0;
    CHECK_STATUS(kvc_codec_decode(codec, blob2, vlen, back, sizeof back, &vd), KVC_OK);
    CHECK(vd == src_bytes && memcmp(back, src, src_bytes) == 0);

    /* Corrupt blobs: KVC_CORRUPT_DATA, dst untouched, from every truncation. */
    memset(back, 0xcd, sizeof back);
    for (size_t cut = 0; cut < len; cut += (cut < 64 ? 1 : 97)) {
        size_t keep = 12345;
        CHECK_STATUS(kvc_codec_decode(codec, blob, cut, back, sizeof back, &keep),
                     KVC_CORRUPT_DATA);
        CHECK(keep == 12345);
        CHECK_STATUS(kvc_codec_decoded_size(codec, blob, cut, &keep), KVC_CORRUPT_DATA);
        CHECK(keep == 12345);
    }
    for (int i = 0; i < N_ELEMS; i++) CHECK(back[i] == 0xcdcd);
    memcpy(blob2, blob, len);
    blob2[4] = 0x7f; /* first frame header: an unknown predictor mode */
    CHECK_STATUS(kvc_codec_decode(codec, blob2, len, back, sizeof back, &dlen), KVC_CORRUPT_DATA);
    CHECK(strstr(last_error(msg, sizeof msg), "kvc_codec_decode: gear-v1") == msg);
    /* trailing garbage */
    memcpy(blob2, blob, len);
    blob2[len] = 0;
    CHECK_STATUS(kvc_codec_decode(codec, blob2, len + 1, back, sizeof back, &dlen),
                 KVC_CORRUPT_DATA);
    for (int i = 0; i < N_ELEMS; i++) CHECK(back[i] == 0xcdcd);

    /* Argument errors. */
    CHECK_STATUS(kvc_codec_encode(codec, 2, src, src_bytes, blob2, bound, &len2),
                 KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "invalid `tensor`: 2") != NULL);
    if (dtype != KVC_DTYPE_I8) {
        CHECK_STATUS(kvc_codec_encode(codec, KVC_TENSOR_K, src, 3, blob2, bound, &len2),
                     KVC_INVALID_ARGUMENT);
        CHECK_STATUS(kvc_codec_max_encoded_size(codec, 3, &len2), KVC_INVALID_ARGUMENT);
    }
    CHECK_STATUS(kvc_codec_encode(codec, KVC_TENSOR_K, NULL, src_bytes, blob2, bound, &len2),
                 KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_codec_encode(codec, KVC_TENSOR_K, src, src_bytes, NULL, bound, &len2),
                 KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_codec_encode(codec, KVC_TENSOR_K, src, src_bytes, blob2, bound, NULL),
                 KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_codec_encode(NULL, KVC_TENSOR_K, src, src_bytes, blob2, bound, &len2),
                 KVC_NULL_ARGUMENT);
    /* the output overlapping the input */
    CHECK_STATUS(kvc_codec_encode(codec, KVC_TENSOR_K, src, src_bytes, (uint8_t*)src + 16,
                                  src_bytes - 16, &len2),
                 KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_codec_decode(codec, blob, len, blob + 1, len, &len2), KVC_INVALID_ARGUMENT);
    CHECK_STATUS(kvc_codec_decoded_size(codec, NULL, 4, &len2), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_codec_decoded_size(codec, blob, len, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_codec_max_encoded_size(NULL, 4, &len2), KVC_NULL_ARGUMENT);

    /* Empty input: a valid blob of zero elements. */
    size_t elen = 0;
    CHECK_STATUS(kvc_codec_encode(codec, KVC_TENSOR_K, NULL, 0, blob, bound, &elen), KVC_OK);
    CHECK_STATUS(kvc_codec_decoded_size(codec, blob, elen, &dsize), KVC_OK);
    CHECK(dsize == 0);

    free(blob);
    free(blob2);
    kvc_codec_free(codec);
}

int main(void) {
    test_config();
    test_roundtrip(KVC_DTYPE_F16, KVC_PREDICTOR_ALL, KVC_PREDICTOR_ALL);
    test_roundtrip(KVC_DTYPE_BF16, KVC_PREDICTOR_RAW, KVC_PREDICTOR_XOR_SEQ | KVC_PREDICTOR_DELTA_SEQ);
    test_roundtrip(KVC_DTYPE_F32, KVC_PREDICTOR_DELTA_SEQ, KVC_PREDICTOR_ALL);
    test_roundtrip(KVC_DTYPE_I8, KVC_PREDICTOR_ALL, KVC_PREDICTOR_RAW);
    puts("test_codec: ok");
    return 0;
}
