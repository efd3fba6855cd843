/* C11: the same calls linked against the static library (kvc::kvc_static), proving its
 * link interface (the system libraries Rust's std needs) is complete. */
#include <stdint.h>

#include "check.h"

int main(void) {
    const float x[2] = {0.5f, -4.0f};
    uint16_t h[2];
    size_t len = 0;
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F32, x, 2, KVC_DTYPE_F16, h, 2, &len), KVC_OK);
    CHECK(len == 2 && h[0] == 0x3800 && h[1] == 0xc400);
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F32, x, 2, KVC_DTYPE_F16, h, 1, &len), KVC_BUFFER_TOO_SMALL);
    char msg[256];
    CHECK(strstr(last_error(msg, sizeof msg), "kvc_convert:") == msg);
    CHECK(kvc_abi_version() == KVC_ABI_VERSION);
    puts("test_static: ok");
    return 0;
}
