/* C11: load libkvc with dlopen by its soname (as an engine's plugin loader does), find
 * it with a single dlsym("kvc_get_api"), and use only the function table. This program
 * is not linked against libkvc; it only includes the header for the types. */
#include <dlfcn.h>
#include <stdint.h>

#include "check.h"

typedef const kvc_api* (*get_api_fn)(uint32_t);

int main(void) {
    void* lib = dlopen(KVC_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "dlopen(%s): %s\n", KVC_SONAME, dlerror());
        return 1;
    }
    get_api_fn get_api;
    void* sym = dlsym(lib, "kvc_get_api");
    CHECK(sym != NULL);
    memcpy(&get_api, &sym, sizeof get_api); /* object pointer -> function pointer, portably */

    const kvc_api* api = get_api(KVC_ABI_VERSION);
    CHECK(api != NULL);
    CHECK(api->struct_size >= sizeof(kvc_api));
    CHECK(api->abi_version == KVC_ABI_VERSION);
    CHECK(strcmp(api->status_name(KVC_CORRUPT_DATA), "KVC_CORRUPT_DATA") == 0);
    CHECK(strlen(api->version()) >= 5);
    CHECK(api->dtype_size(KVC_DTYPE_BF16) == 2);

    const uint16_t h[3] = {0x3c00, 0x4000, 0xbc00};
    float f[3];
    size_t len = 0;
    CHECK(api->convert(KVC_DTYPE_F16, h, 3, KVC_DTYPE_F32, f, 3, &len) == KVC_OK);
    CHECK(len == 3 && f[0] == 1.0f && f[1] == 2.0f && f[2] == -1.0f);

    /* Errors through the table, with the message through the table. */
    CHECK(api->convert(KVC_DTYPE_F16, h, 3, KVC_DTYPE_F32, f, 2, &len) == KVC_BUFFER_TOO_SMALL);
    CHECK(len == 3);
    char msg[512];
    size_t needed = 0;
    CHECK(api->last_error_message(msg, sizeof msg, &needed) == KVC_OK);
    CHECK(strstr(msg, "kvc_convert:") == msg);

    /* The quantizer through the table (ABI 0.3): set parameters, round-trip a row. */
    kvc_quant_config qc;
    CHECK(api->quant_config_default(&qc) == KVC_OK);
    qc.n_layers = 1;
    qc.k_channels = 2;
    qc.v_channels = 2;
    kvc_quant* q = NULL;
    CHECK(api->quant_new(&qc, &q) == KVC_OK && q != NULL);
    float row[2] = {0.3f, -1.0f};
    CHECK(api->quant_roundtrip_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F32, row, 1) == KVC_INVALID_STATE);
    const float scale[2] = {0.25f, 0.5f}, offset[2] = {0.0f, 1.0f};
    CHECK(api->quant_set_params(q, 0, KVC_TENSOR_K, scale, offset, 2) == KVC_OK);
    CHECK(api->quant_roundtrip_rows(q, 0, KVC_TENSOR_K, KVC_DTYPE_F32, row, 1) == KVC_OK);
    CHECK(row[0] == 0.25f && row[1] == -1.0f); /* 1 * 0.25; (round(-1 / 0.5 + 1) - 1) * 0.5 */
    api->quant_free(q);

    /* The channel-group calls through the table (ABI 0.10): size, a 2-bit round trip of
       16 rows (each channel an arithmetic run over 4 levels: exact), scores from the codes. */
    CHECK(api->kvq_channel_block_bytes != NULL && api->kvq_channel_quantize != NULL &&
          api->kvq_channel_dequantize != NULL && api->kvq_channel_dot != NULL);
    {
        size_t cb = 0;
        CHECK(api->kvq_channel_block_bytes(2, 64, 16, &cb) == KVC_OK && cb == 256 + 16 * 16);
        CHECK(api->kvq_channel_block_bytes(2, 64, 33, &cb) == KVC_INVALID_ARGUMENT);
        static float cx[16 * 64], cy[16 * 64], cq[64], cs[16];
        static unsigned char blk[256 + 16 * 16];
        for (int i = 0; i < 16 * 64; ++i) cx[i] = (float) ((i / 64) % 4) * 0.5f - 1.0f;
        for (int i = 0; i < 64; ++i) cq[i] = 1.0f;
        CHECK(api->kvq_channel_quantize(2, 64, 16, cx, blk, sizeof blk) == KVC_OK);
        CHECK(api->kvq_channel_dequantize(2, 64, 16, blk, sizeof blk, cy) == KVC_OK);
        CHECK(memcmp(cx, cy, sizeof cx) == 0);
        CHECK(api->kvq_channel_dot(2, 64, 16, cq, blk, sizeof blk - 1, cs) == KVC_BUFFER_TOO_SMALL);
        CHECK(api->kvq_channel_dot(2, 64, 16, cq, blk, sizeof blk, cs) == KVC_OK);
        for (int t = 0; t < 16; ++t) CHECK(cs[t] == 64.0f * ((float) (t % 4) * 0.5f - 1.0f));
    }

    /* The centered-row calls through the table (ABI 0.11): a center of 2 tokens' mean. */
    CHECK(api->kvq_quantize_rows_centered != NULL && api->kvq_dequantize_rows_centered != NULL &&
          api->kvq_mean_center != NULL);
    {
        static float mx[2 * 64], mc[64];
        for (int i = 0; i < 2 * 64; ++i) mx[i] = (float) (i / 64) + 0.5f;
        CHECK(api->kvq_mean_center(mx, 2 * 64, 1, 64, mc, 64) == KVC_OK);
        for (int i = 0; i < 64; ++i) CHECK(mc[i] == 1.0f);
        CHECK(api->kvq_mean_center(mx, 2 * 64, 1, 64, mc, 63) == KVC_INVALID_ARGUMENT);
    }

    /* Versions: an older minor is served, a newer minor or another major is not. */
    CHECK(get_api((uint32_t)KVC_ABI_VERSION_MAJOR << 16) == api);
    CHECK(get_api(KVC_ABI_VERSION + 1) == NULL);
    CHECK(api->last_error_message(msg, sizeof msg, &needed) == KVC_OK);
    CHECK(strstr(msg, "kvc_get_api: the program needs ABI") == msg);
    CHECK(get_api(((uint32_t)KVC_ABI_VERSION_MAJOR + 1) << 16) == NULL);
    CHECK(get_api(UINT32_MAX) == NULL);

    CHECK(dlclose(lib) == 0);
    puts("test_dlopen: ok");
    return 0;
}
