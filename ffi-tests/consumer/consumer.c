/* Uses an installed kvc: widens an fp16 row, handles a too-small buffer. */
#include <stdio.h>
#include <string.h>

#include <kvc.h>

int main(void) {
    const uint16_t row[4] = {0x3c00, 0x4000, 0x4200, 0x4400}; /* 1 2 3 4 */
    float out[4];
    size_t n = 0;
    if (kvc_abi_version() >> 16 != KVC_ABI_VERSION_MAJOR) return 1;
    kvc_status st = kvc_convert(KVC_DTYPE_F16, row, 4, KVC_DTYPE_F32, out, 4, &n);
    if (st != KVC_OK || n != 4 || out[3] != 4.0f) return 2;
    st = kvc_convert(KVC_DTYPE_F16, row, 4, KVC_DTYPE_F32, out, 3, &n);
    char msg[256];
    if (st != KVC_BUFFER_TOO_SMALL || kvc_last_error_message(msg, sizeof msg, NULL) != KVC_OK)
        return 3;
    printf("consumer: kvc %s, %s: %s\n", kvc_version(), kvc_status_name(st), msg);
    return 0;
}
