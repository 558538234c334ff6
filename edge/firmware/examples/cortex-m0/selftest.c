/*
 * The firmware library's self-test on a Cortex-M0 (QEMU's microbit machine, semihosting):
 * load a profile, encode a documented wire vector and compare the bytes, then perturb one
 * reading SELFTEST_DRAWS times and check the codes' frequencies against the exact
 * distribution with a chi-square test in integer arithmetic. Everything the test needs
 * (profile, vector, bins, expected probabilities, critical value) is in the header
 * tests/firmware makes from Python. The words come from a seeded SplitMix64 so the run is
 * reproducible; a device uses its TRNG.
 */
#include <stdint.h>

#include "selftest_profile.h"
#include "startup.h"
#include "zeal.h"

static uint32_t counts[1u << SELFTEST_BITS];

static int splitmix(void *context, uint64_t *words, size_t n) {
    uint64_t *state = context;
    while (n--) {
        uint64_t z = (*state += 0x9E3779B97F4A7C15u);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
        *words++ = z ^ (z >> 31);
    }
    return 0;
}

static void write_number(const char *label, uint64_t value, const char *end) {
    char digits[24];
    int i = 23;
    digits[i] = '\0';
    do {
        digits[--i] = (char)('0' + value % 10u);
        value /= 10u;
    } while (value && i > 0);
    host_write(label);
    host_write(digits + i);
    host_write(end);
}

int main(void) {
    zeal_profile profile;
    uint8_t payload[64];
    size_t length;
    uint64_t state = SELFTEST_SEED, chi = 0;
    uint32_t i, code, b;
    int status = zeal_profile_load(&profile, profile_blob, sizeof profile_blob);
    if (status != ZEAL_OK) {
        host_write("profile refused\n");
        return 1;
    }
    status = zeal_encode_batch(&profile, VECTOR_SEQUENCE, vector_stamps, vector_codes,
                               sizeof vector_codes / sizeof vector_codes[0], payload,
                               sizeof payload, &length);
    if (status != ZEAL_OK || length != sizeof vector_payload) {
        host_write("wire vector: refused or of another length\n");
        return 1;
    }
    for (i = 0; i < length; i++) {
        if (payload[i] != vector_payload[i]) {
            host_write("wire vector: bytes differ\n");
            return 1;
        }
    }
    host_write("wire vector: same bytes\n");
    for (i = 0; i < SELFTEST_DRAWS; i++) {
        if (zeal_perturb(&profile, SELFTEST_READING, splitmix, &state, &code) != ZEAL_OK ||
            code >= (1u << SELFTEST_BITS) || bin_of_code[code] == 0xFFu) {
            host_write("perturb failed or gave an impossible code\n");
            return 1;
        }
        counts[code]++;
    }
    for (b = 0; b < SELFTEST_BINS; b++) { /* chi-square x 256, in integers */
        uint64_t observed = 0, expected;
        int64_t diff;
        for (code = 0; code < (1u << SELFTEST_BITS); code++) {
            observed += bin_of_code[code] == b ? counts[code] : 0u;
        }
        expected = ((uint64_t)SELFTEST_DRAWS * bin_probability[b]) >> 24; /* count x 256 */
        diff = (int64_t)(observed << 8) - (int64_t)expected;
        chi += (uint64_t)(diff * diff) / expected;
    }
    for (code = 0; code < (1u << SELFTEST_BITS); code++) {
        if (counts[code]) {
            write_number("code ", code, "");
            write_number(" ", counts[code], "\n");
        }
    }
    write_number("chi-square x 256: ", chi, "");
    write_number(" (critical x 256: ", SELFTEST_CRITICAL_X256, ")\n");
    if (chi > SELFTEST_CRITICAL_X256) {
        host_write("distribution check FAILED\n");
        return 1;
    }
    host_write("distribution check passed\n");
    return 0;
}
