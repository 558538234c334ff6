/*
 * What the library costs in flash on a Cortex-M0 (`make m0-size`), measured, not run. One
 * program, five ways: USE=0 uses none of the library (the start-up code alone), USE=1
 * only loads a profile, USE=2 perturbs and encodes (with a profile already in RAM), USE=3
 * does all three, USE=4 reports and encodes on a longitudinal stream (a memo of 16 grid
 * values). Each image minus the first is that part's cost, with the libgcc helpers
 * it pulls in.
 */
#include <stddef.h>
#include <stdint.h>

#include "zeal.h"

volatile uint32_t sink;
#if USE & 1
static const uint8_t blob[ZEAL_PROFILE_BYTES] = {0};
#endif
#if USE & 6
static int words(void *context, uint64_t *out, size_t n) {
    (void)context;
    while (n--) {
        *out++ = sink;
    }
    return 0;
}
#endif

int main(void) {
    int status = (int)sink;
#if USE
    static zeal_profile profile;
#endif
#if USE & 1
    status |= zeal_profile_load(&profile, blob, sizeof blob);
#endif
#if USE & 2
    {
        uint32_t code = 0;
        uint64_t stamp = sink;
        uint8_t out[32];
        size_t length = 0;
        status |= zeal_perturb(&profile, (int32_t)sink, words, NULL, &code);
        status |= zeal_encode_batch(&profile, 0, &stamp, &code, 1, out, sizeof out, &length);
        sink = out[0] + (uint32_t)length;
    }
#endif
#if USE & 4
    {
        static uint16_t table[16];
        static zeal_memo memo;
        uint32_t code = 0;
        int fresh = 0;
        uint64_t stamp = sink;
        uint8_t out[32];
        size_t length = 0;
        status |= zeal_memo_init(&memo, &profile, 16, sink, table, words, NULL);
        status |= zeal_memo_perturb(&profile, &memo, (int32_t)sink, words, NULL, &code, &fresh);
        status |= zeal_encode_batch(&profile, 0, &stamp, &code, 1, out, sizeof out, &length);
        sink = out[0] + (uint32_t)length + (uint32_t)fresh;
    }
#endif
    return status;
}
