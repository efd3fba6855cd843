/* Tiny test helpers shared by the C tests (C11; also valid C++). */
#ifndef KVC_FFI_TESTS_CHECK_H
#define KVC_FFI_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvc.h"

/* Fails the test (exit 1) with the location and the expression; never compiled out. */
#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);       \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#define CHECK_STATUS(call, expected)                                                       \
    do {                                                                                   \
        kvc_status check_status_ = (call);                                                 \
        if (check_status_ != (expected)) {                                                 \
            char check_msg_[512] = {0};                                                    \
            size_t check_needed_ = 0;                                                      \
            (void)kvc_last_error_message(check_msg_, sizeof check_msg_, &check_needed_);   \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n", __FILE__,         \
                    __LINE__, #call, kvc_status_name(check_status_),                       \
                    kvc_status_name(expected), check_msg_);                                \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* This thread's last error message, copied into a static-size buffer. */
static inline const char* last_error(char* buf, size_t cap) {
    size_t needed = 0;
    kvc_status st = kvc_last_error_message(buf, cap, &needed);
    CHECK(st == KVC_OK);
    CHECK(needed == strlen(buf) + 1);
    return buf;
}

#endif
