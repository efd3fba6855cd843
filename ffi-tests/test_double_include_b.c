/* Second translation unit of test_double_include. */
#include "kvc.h"
#include "kvc.h"

const char* kvc_double_include_b(void);

const char* kvc_double_include_b(void) { return kvc_version(); }
