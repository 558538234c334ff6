/*
 * Zeal on the sensor: privatize and encode readings on the device (docs/firmware.md).
 *
 * C99, no dynamic allocation, nothing from libc beyond <stdint.h>, <stddef.h> and
 * <string.h>, and no floating point. A device loads its profile (104 bytes made by
 * `python -m zeal firmware-profile`), perturbs each integer reading (in the profile's
 * unit) into a code with the exact grid sampler, and encodes batches in the wire format,
 * byte for byte as zeal.encode_batch.
 */
#ifndef ZEAL_H
#define ZEAL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZEAL_PROFILE_BYTES 104u
#define ZEAL_MAX_BATCH 65535u
#define ZEAL_LORAWAN_MAX_BYTES 242u /* the largest FRMPayload of any LoRaWAN data rate */

/* Error codes: 0 is success; every failure is negative and leaves outputs unwritten. */
enum zeal_status {
    ZEAL_OK = 0,
    ZEAL_E_PROFILE_LENGTH = -1,   /* not ZEAL_PROFILE_BYTES long, or its length byte disagrees */
    ZEAL_E_PROFILE_MAGIC = -2,    /* does not start with "ZF" */
    ZEAL_E_PROFILE_VERSION = -3,  /* a profile version this library does not know */
    ZEAL_E_PROFILE_CHECKSUM = -4, /* CRC-32 mismatch: corrupted in storage or transit */
    ZEAL_E_PROFILE_TABLES = -5,   /* tables out of their valid ranges */
    ZEAL_E_ARGUMENT = -6,         /* a NULL pointer where one is needed */
    ZEAL_E_COUNT = -7,            /* a batch holds 1 to 65535 readings */
    ZEAL_E_TIMESTAMP = -8,        /* timestamps must be below 2^48 and never decrease */
    ZEAL_E_CODE = -9,             /* a code outside the stream's range */
    ZEAL_E_BUFFER = -10,          /* the output buffer is too small */
    ZEAL_E_RANDOM = -11,          /* the randomness source failed */
    ZEAL_E_TOO_LARGE = -12,       /* more than a LoRaWAN FRMPayload can hold (242 bytes) */
    ZEAL_E_MEMO = -13             /* a memo's grid: 2 to 1024 values, a positive step, codes
                                   * of at most 16 bits */
};

/* A loaded, checked profile (120 bytes of RAM). The five binary64 values are kept as
 * their IEEE 754 bits: the library computes with them in integers. */
typedef struct zeal_profile {
    uint64_t w_lo, w_hi, cells, band, top, total, unit_mask, start_cap;
    uint64_t lower, upper, start_at_upper, slope, unit;
    uint32_t code_min, code_max;
    uint8_t payload_bits, cell_bits, frac_bits;
    uint8_t fingerprint[4];
} zeal_profile;

/*
 * Fills `n` 64-bit words with uniform random bits from a cryptographically secure source
 * (a hardware TRNG, getrandom(2)); returns 0, or nonzero if it could not.
 */
typedef int (*zeal_random_fn)(void *context, uint64_t *words, size_t n);

/* Check and load a profile. */
int zeal_profile_load(zeal_profile *profile, const uint8_t *blob, size_t length);

/*
 * One reading in, one code out. The reading is an integer in the profile's unit (its value
 * is reading * unit, as a float64 holds it); values outside [lower, upper] are clipped to
 * it first.
 */
int zeal_perturb(const zeal_profile *profile, int32_t reading, zeal_random_fn random,
                 void *context, uint32_t *code);

/*
 * Where the band starts for a reading, in fixed point (frac_bits fraction bits): Python's
 * float64 computation (zeal._core.grid.GridSampler.fixed_starts) done in integers, bit for bit.
 * Exposed for tests and diagnostics.
 */
uint64_t zeal_band_start(const zeal_profile *profile, int32_t reading);

/*
 * A longitudinal stream's memo (docs/firmware.md, "Longitudinal streams"; zeal.longitudinal):
 * the device's secret offset and, in `table` (memory the caller keeps, `points` entries of 2
 * bytes, persisted across restarts with the 16 bytes of the offset and step), the code drawn
 * for each grid value met, ZEAL_MEMO_EMPTY until then. Never send or log it.
 */
#define ZEAL_MEMO_EMPTY 0xFFFFu
#define ZEAL_MEMO_MAX_POINTS 1024u
typedef struct zeal_memo {
    uint64_t step;   /* binary64 bits of the grid's step, (upper - lower) / (points - 1) */
    uint64_t offset; /* binary64 bits of the secret offset, 53 random bits in [0, 1) */
    uint16_t points;
    uint16_t *table;
} zeal_memo;

/*
 * Start a memo: `points` grid values `step_bits` apart (both from the stream's
 * configuration: `python -m zeal firmware-profile` prints them), `table` cleared, a new
 * offset drawn. A lost table is started anew; its values are drawn, and booked, again.
 */
int zeal_memo_init(zeal_memo *memo, const zeal_profile *profile, uint16_t points,
                   uint64_t step_bits, uint16_t *table, zeal_random_fn random, void *context);

/*
 * One reading of a longitudinal stream in, its code out: the reading (clipped) rounded to
 * the grid with the memo's offset, and the code memoized for that value, drawn now if it
 * is the first time (`*fresh` 1: book the stream's epsilon; 0: a repeat, free).
 */
int zeal_memo_perturb(const zeal_profile *profile, zeal_memo *memo, int32_t reading,
                      zeal_random_fn random, void *context, uint32_t *code, int *fresh);

/* Bytes the payload of `count` readings can take at most (irregular timestamps). */
size_t zeal_batch_bound(const zeal_profile *profile, size_t count);

/*
 * One batch in the wire format (docs/wire-format.md): `count` codes with their
 * timestamps (milliseconds since the Unix epoch, never decreasing). Writes the payload to
 * `out` (capacity `capacity`) and its length to `*length`.
 */
int zeal_encode_batch(const zeal_profile *profile, uint64_t sequence,
                      const uint64_t *timestamps, const uint32_t *codes, size_t count,
                      uint8_t *out, size_t capacity, size_t *length);

/*
 * Bytes of FRMPayload that `count` readings `spacing_seconds` apart take in the LoRaWAN
 * profile (docs/wire-format.md, "LoRaWAN profile"): 3 for one reading of up to 8 bits.
 */
size_t zeal_lorawan_size(const zeal_profile *profile, size_t count, uint32_t spacing_seconds);

/*
 * One uplink's FRMPayload in the LoRaWAN profile, byte for byte as zeal.lorawan's
 * encode_lorawan: `count` codes of readings `spacing_seconds` apart, the last one read just
 * before the uplink (the network's reception time stamps it). The DevEUI, FPort, frame
 * counter and time are the network's: none is in the payload. ZEAL_E_TOO_LARGE when it
 * would exceed ZEAL_LORAWAN_MAX_BYTES; send fewer readings (zeal_lorawan_size says how many
 * fit the data rate's limit).
 */
int zeal_encode_lorawan(const zeal_profile *profile, uint32_t spacing_seconds,
                        const uint32_t *codes, size_t count, uint8_t *out, size_t capacity,
                        size_t *length);

#ifdef __cplusplus
}
#endif

#endif /* ZEAL_H */
