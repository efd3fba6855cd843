// Uses an installed kvc through kvc.hpp.
#include <kvc.hpp>

#include <cstdio>

int main() {
    const std::uint16_t row[2] = {0x3f80, 0x4000};  // bf16 1 2
    auto f = kvc::to_f32(KVC_DTYPE_BF16, row, 2);
    if (!f || f.value()[1] != 2.0f) return 1;
    std::printf("consumer_cpp: kvc %s ok\n", std::string(kvc::version()).c_str());
    return 0;
}
