/*
 * zeal-host: the firmware library on Linux, for tests, benchmarks and provisioning checks.
 *
 *   zeal-host perturb PROFILE_HEX [SEED]    one integer reading (in the profile's unit) per
 *                                           line in, one code per line out
 *                                           (with SEED, SplitMix64 words: tests only)
 *   zeal-host starts PROFILE_HEX            one integer reading per line in, its band start
 *   zeal-host f64                           "add|mul A B" lines in (binary64 bits, hex), the
 *                                           result's bits out: the arithmetic, for tests
 *   zeal-host encode PROFILE_HEX SEQUENCE   "timestamp_ms code" lines in, the payload as hex
 *   zeal-host batches PROFILE_HEX           "sequence count t1..tn c1..cn" lines in, one
 *                                           payload (hex) or "error N" per line out
 *   zeal-host lorawan PROFILE_HEX           "spacing count c1..cn" lines in, one LoRaWAN
 *                                           FRMPayload (hex) or "error N" per line out
 *   zeal-host memo PROFILE_HEX POINTS STEP  a longitudinal stream's memo (STEP: the grid
 *                                           step's binary64 bits, hex): "new" lines start
 *                                           a device's memo anew, integer reading lines
 *                                           give "code fresh" lines out
 *   zeal-host profiles                      profile hex per line in, "N" per line out: the
 *                                           load status, and on success a few readings
 *                                           perturbed (seeded words) and encoded: the
 *                                           mutation test
 *
 * Randomness comes from getrandom(2), or for reproducible tests from a seeded SplitMix64.
 * Exit status: 0, 1 on a library error, 2 on usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "../src/binary64.h"
#include "zeal.h"

#define WORDS 512
#define USAGE                                                                              \
    "usage: zeal-host perturb PROFILE_HEX [SEED] | starts PROFILE_HEX | "                  \
    "encode PROFILE_HEX SEQUENCE | "                                                       \
    "batches PROFILE_HEX | lorawan PROFILE_HEX | memo PROFILE_HEX POINTS STEP_HEX | "      \
    "profiles | f64\n"

struct pool {
    uint64_t words[WORDS];
    size_t next;
};

static int os_random(void *context, uint64_t *words, size_t n) {
    struct pool *pool = context;
    size_t i;
    for (i = 0; i < n; i++) {
        if (pool->next == WORDS) {
            size_t got = 0;
            while (got < sizeof pool->words) {
                ssize_t r = getrandom((char *)pool->words + got, sizeof pool->words - got, 0);
                if (r < 0) {
                    if (errno == EINTR) {
                        continue;
                    }
                    return 1;
                }
                got += (size_t)r;
            }
            pool->next = 0;
        }
        words[i] = pool->words[pool->next++];
    }
    return 0;
}

static int seeded_random(void *context, uint64_t *words, size_t n) {
    uint64_t *state = context;
    size_t i;
    for (i = 0; i < n; i++) { /* SplitMix64 (Steele, Lea and Flood 2014) */
        uint64_t z = (*state += 0x9E3779B97F4A7C15u);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
        words[i] = z ^ (z >> 31);
    }
    return 0;
}

static int unhex(const char *text, uint8_t *out, size_t capacity, size_t *length) {
    size_t n = strlen(text), i;
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r')) {
        n--;
    }
    if (n % 2 || n / 2 > capacity) {
        return -1;
    }
    for (i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(text + 2 * i, "%2x", &v) != 1) {
            return -1;
        }
        out[i] = (uint8_t)v;
    }
    *length = n / 2;
    return 0;
}

static void print_hex(const uint8_t *data, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        printf("%02x", data[i]);
    }
    putchar('\n');
}

static int load(const char *hex, zeal_profile *profile) {
    uint8_t blob[256];
    size_t n;
    int status;
    if (unhex(hex, blob, sizeof blob, &n) != 0) {
        fprintf(stderr, "zeal-host: the profile is not hex\n");
        return 2;
    }
    status = zeal_profile_load(profile, blob, n);
    if (status != ZEAL_OK) {
        fprintf(stderr, "zeal-host: profile refused (error %d)\n", status);
        return 1;
    }
    return 0;
}

static int perturb(const zeal_profile *profile, const char *seed) {
    static struct pool pool = {{0}, WORDS};
    uint64_t state = seed == NULL ? 0 : strtoull(seed, NULL, 10);
    zeal_random_fn random = seed == NULL ? os_random : seeded_random;
    void *context = seed == NULL ? (void *)&pool : (void *)&state;
    char line[128];
    while (fgets(line, sizeof line, stdin) != NULL) {
        uint32_t code;
        int status = zeal_perturb(profile, (int32_t)strtol(line, NULL, 10), random, context,
                                  &code);
        if (status != ZEAL_OK) {
            fprintf(stderr, "zeal-host: perturb failed (error %d)\n", status);
            return 1;
        }
        printf("%lu\n", (unsigned long)code);
    }
    return 0;
}

static int starts(const zeal_profile *profile) {
    char line[128];
    while (fgets(line, sizeof line, stdin) != NULL) {
        unsigned long long t = zeal_band_start(profile, (int32_t)strtol(line, NULL, 10));
        printf("%llu\n", t);
    }
    return 0;
}

static uint64_t stamps[ZEAL_MAX_BATCH];
static uint32_t codes[ZEAL_MAX_BATCH];
static uint8_t payload[ZEAL_MAX_BATCH * 12 + 64];

static int encode(const zeal_profile *profile, uint64_t sequence) {
    size_t count = 0, length;
    unsigned long long t;
    unsigned long c;
    int status;
    while (count < ZEAL_MAX_BATCH + 1 && scanf("%llu %lu", &t, &c) == 2) {
        if (count == ZEAL_MAX_BATCH) {
            fprintf(stderr, "zeal-host: more than %u readings\n", ZEAL_MAX_BATCH);
            return 1;
        }
        stamps[count] = t;
        codes[count++] = (uint32_t)c;
    }
    status = zeal_encode_batch(profile, sequence, stamps, codes, count, payload,
                               sizeof payload, &length);
    if (status != ZEAL_OK) {
        fprintf(stderr, "zeal-host: encode failed (error %d)\n", status);
        return 1;
    }
    print_hex(payload, length);
    return 0;
}

static int lorawan(const zeal_profile *profile) {
    unsigned long long spacing, count, i, v;
    size_t length;
    while (scanf("%llu %llu", &spacing, &count) == 2) {
        int status;
        if (count > ZEAL_MAX_BATCH || spacing > 0xFFFFFFFFull) {
            fprintf(stderr, "zeal-host: bad line\n");
            return 2;
        }
        for (i = 0; i < count; i++) {
            if (scanf("%llu", &v) != 1) {
                fprintf(stderr, "zeal-host: short line\n");
                return 2;
            }
            codes[i] = (uint32_t)v;
        }
        status = zeal_encode_lorawan(profile, (uint32_t)spacing, codes, (size_t)count, payload,
                                     sizeof payload, &length);
        if (status != ZEAL_OK) {
            printf("error %d\n", status);
        } else {
            print_hex(payload, length);
        }
    }
    return 0;
}

static int batches(const zeal_profile *profile) {
    unsigned long long sequence, count, i, v;
    size_t length;
    while (scanf("%llu %llu", &sequence, &count) == 2) {
        int status;
        if (count > ZEAL_MAX_BATCH) {
            return 2;
        }
        for (i = 0; i < count; i++) {
            if (scanf("%llu", &v) != 1) {
                return 2;
            }
            stamps[i] = v;
        }
        for (i = 0; i < count; i++) {
            if (scanf("%llu", &v) != 1) {
                return 2;
            }
            codes[i] = (uint32_t)v;
        }
        status = zeal_encode_batch(profile, sequence, stamps, codes, (size_t)count, payload,
                                   sizeof payload, &length);
        if (status == ZEAL_OK) {
            print_hex(payload, length);
        } else {
            printf("error %d\n", status);
        }
    }
    return 0;
}

static int profiles(void) {
    uint64_t state = 19; /* reproducible outcomes: the words only pick codes */
    static char line[1024];
    const int32_t readings[] = {INT32_MIN, -1000000, -1, 0, 1, 1000000, INT32_MAX};
    while (fgets(line, sizeof line, stdin) != NULL) {
        uint8_t blob[512];
        size_t n, i, length;
        zeal_profile profile;
        int status = unhex(line, blob, sizeof blob, &n) == 0 ? zeal_profile_load(&profile, blob, n)
                                                             : ZEAL_E_PROFILE_LENGTH;
        if (status == ZEAL_OK) {
            for (i = 0; i < sizeof readings / sizeof readings[0] && status == ZEAL_OK; i++) {
                status = zeal_perturb(&profile, readings[i], seeded_random, &state, &codes[i]);
                stamps[i] = 1000u * i;
            }
            if (status == ZEAL_OK) {
                status = zeal_encode_batch(&profile, 7, stamps, codes, i, payload,
                                           sizeof payload, &length);
            }
        }
        printf("%d\n", status);
    }
    return 0;
}

static int f64(void) {
    char op[8];
    unsigned long long a, b;
    while (scanf("%7s %llx %llx", op, &a, &b) == 3) {
        uint64_t r = strcmp(op, "add") == 0 ? zeal_f64_add(a, b) : zeal_f64_mul(a, b);
        printf("%016llx\n", (unsigned long long)r);
    }
    return 0;
}

static int memo(const zeal_profile *profile, const char *points, const char *step) {
    static struct pool pool = {{0}, WORDS};
    static uint16_t table[ZEAL_MEMO_MAX_POINTS];
    zeal_memo m;
    char line[128];
    int status = zeal_memo_init(&m, profile, (uint16_t)strtoul(points, NULL, 10),
                                strtoull(step, NULL, 16), table, os_random, &pool);
    if (status != ZEAL_OK) {
        fprintf(stderr, "zeal-host: memo refused (error %d)\n", status);
        return 1;
    }
    while (fgets(line, sizeof line, stdin) != NULL) {
        uint32_t code;
        int fresh;
        if (strncmp(line, "new", 3) == 0) {
            status = zeal_memo_init(&m, profile, m.points, m.step, table, os_random, &pool);
            if (status != ZEAL_OK) {
                return 1;
            }
            continue;
        }
        status = zeal_memo_perturb(profile, &m, (int32_t)strtol(line, NULL, 10), os_random, &pool,
                                   &code, &fresh);
        if (status != ZEAL_OK) {
            fprintf(stderr, "zeal-host: error %d\n", status);
            return 1;
        }
        printf("%u %d\n", code, fresh);
    }
    return 0;
}

int main(int argc, char **argv) {
    zeal_profile profile;
    int status;
    if (argc == 2 && strcmp(argv[1], "profiles") == 0) {
        return profiles();
    }
    if (argc == 2 && strcmp(argv[1], "f64") == 0) {
        return f64();
    }
    if (argc < 3) {
        fprintf(stderr, USAGE);
        return 2;
    }
    status = load(argv[2], &profile);
    if (status != 0) {
        return status;
    }
    if (strcmp(argv[1], "perturb") == 0 && (argc == 3 || argc == 4)) {
        return perturb(&profile, argc == 4 ? argv[3] : NULL);
    }
    if (strcmp(argv[1], "encode") == 0 && argc == 4) {
        return encode(&profile, strtoull(argv[3], NULL, 10));
    }
    if (strcmp(argv[1], "starts") == 0 && argc == 3) {
        return starts(&profile);
    }
    if (strcmp(argv[1], "lorawan") == 0 && argc == 3) {
        return lorawan(&profile);
    }
    if (strcmp(argv[1], "memo") == 0 && argc == 5) {
        return memo(&profile, argv[3], argv[4]);
    }
    if (strcmp(argv[1], "batches") == 0 && argc == 3) {
        return batches(&profile);
    }
    fprintf(stderr, USAGE);
    return 2;
}
