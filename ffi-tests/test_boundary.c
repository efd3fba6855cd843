/* C11: the panic boundary and the opaque-handle pattern, through the test hooks
 * (libkvc built with the cargo feature `test-hooks`, KVC_TEST_HOOKS defined). */
#include <stdint.h>

#include "check.h"

#ifndef KVC_TEST_HOOKS
#error "build with -DKVC_TEST_HOOKS against a libkvc built with --features test-hooks"
#endif

static char msg[1024];

static void test_panics_are_caught(void) {
    CHECK_STATUS(kvc_test_panic(0), KVC_PANIC);
    last_error(msg, sizeof msg);
    CHECK(strstr(msg, "kvc_test_panic: internal error: kvc panicked (deliberate test panic)") == msg);
    CHECK_STATUS(kvc_test_panic(1), KVC_PANIC);
    CHECK(strstr(last_error(msg, sizeof msg), "deliberate test panic 1") != NULL);
    CHECK_STATUS(kvc_test_panic(2), KVC_PANIC);
    CHECK(strstr(last_error(msg, sizeof msg), "non-string panic payload") != NULL);
    /* The library stays usable after a caught panic. */
    CHECK_STATUS(kvc_test_panic(3), KVC_OK);
    CHECK(strcmp(last_error(msg, sizeof msg), "") == 0);
    for (int i = 0; i < 100; i++) CHECK_STATUS(kvc_test_panic(i % 3), KVC_PANIC);
    size_t len = 0;
    CHECK_STATUS(kvc_convert(KVC_DTYPE_F32, NULL, 0, KVC_DTYPE_F16, NULL, 0, &len), KVC_OK);
}

static void test_handles(void) {
    const size_t live0 = kvc_test_live_counters();
    kvc_test_counter* c = NULL;
    CHECK_STATUS(kvc_test_counter_new(40, &c), KVC_OK);
    CHECK(c != NULL);
    CHECK(kvc_test_live_counters() == live0 + 1);

    int64_t v = 0;
    CHECK_STATUS(kvc_test_counter_add(c, 2, &v), KVC_OK);
    CHECK(v == 42);
    v = 0;
    CHECK_STATUS(kvc_test_counter_get(c, &v), KVC_OK);
    CHECK(v == 42);

    /* Errors: outputs and the handle's state untouched. */
    v = -7;
    CHECK_STATUS(kvc_test_counter_add(c, INT64_MAX, &v), KVC_INVALID_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "overflows int64_t") != NULL);
    CHECK(v == -7);
    CHECK_STATUS(kvc_test_counter_get(c, &v), KVC_OK);
    CHECK(v == 42);
    CHECK_STATUS(kvc_test_counter_add(NULL, 1, &v), KVC_NULL_ARGUMENT);
    CHECK(strstr(last_error(msg, sizeof msg), "`counter` is NULL") != NULL);
    CHECK_STATUS(kvc_test_counter_add(c, 1, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_test_counter_get(NULL, &v), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_test_counter_get(c, NULL), KVC_NULL_ARGUMENT);
    CHECK_STATUS(kvc_test_counter_get(c, &v), KVC_OK);
    CHECK(v == 42);

    /* _new with a NULL out pointer allocates nothing. */
    CHECK_STATUS(kvc_test_counter_new(1, NULL), KVC_NULL_ARGUMENT);
    CHECK(kvc_test_live_counters() == live0 + 1);

    kvc_test_counter_free(c);
    CHECK(kvc_test_live_counters() == live0);
    kvc_test_counter_free(NULL); /* a no-op */
    CHECK(kvc_test_live_counters() == live0);

    /* Many handles, freed in another order. */
    kvc_test_counter* many[64];
    for (int i = 0; i < 64; i++) CHECK_STATUS(kvc_test_counter_new(i, &many[i]), KVC_OK);
    CHECK(kvc_test_live_counters() == live0 + 64);
    for (int i = 63; i >= 0; i -= 2) kvc_test_counter_free(many[i]);
    for (int i = 0; i < 64; i += 2) {
        CHECK_STATUS(kvc_test_counter_get(many[i], &v), KVC_OK);
        CHECK(v == i);
        kvc_test_counter_free(many[i]);
    }
    CHECK(kvc_test_live_counters() == live0);
}

int main(void) {
    test_panics_are_caught();
    test_handles();
    puts("test_boundary: ok");
    return 0;
}
