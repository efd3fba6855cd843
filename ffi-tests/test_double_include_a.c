/* The header twice in one translation unit, and in two units linked together
 * (test_double_include_b.c): include guard, no definitions, no duplicate symbols. */
#include "kvc.h"
#include "kvc.h"
#include "kvc.h"

#include <stdio.h>
#include <string.h>

const char* kvc_double_include_b(void);

int main(void) {
    if (strcmp(kvc_double_include_b(), kvc_version()) != 0) return 1;
    puts("test_double_include: ok");
    return 0;
}
