/*
 * The firmware library: profile checks, the exact grid sampler and the wire encoder.
 * The sampler follows zeal._core.grid.GridSampler.sample step by step (docs/mechanism.md, "The
 * grid sampler"; paper 001's piecewise mechanism, Eq. (7), realized on the code grid), so
 * a reading's code distribution is the Python one, exactly. No floating point: the band's
 * position is Python's float64 arithmetic done in integers (binary64.c).
 */
#include "zeal.h"

#include <string.h>

#include "binary64.h"

#define FIELD_MAX ((uint64_t)1 << 61)

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p) {
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* CRC-32 (IEEE 802.3, reflected, as zlib.crc32), bit by bit: no table in flash. */
static uint32_t crc32(const uint8_t *data, size_t length) {
    uint32_t crc = 0xFFFFFFFFu;
    size_t i;
    int bit;
    for (i = 0; i < length; i++) {
        crc ^= data[i];
        for (bit = 0; bit < 8; bit++) {
            crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
        }
    }
    return ~crc;
}

/* A finite binary64 (not infinity, not NaN), from its bits. */
static int is_finite(uint64_t bits) {
    return ((bits >> 52) & 0x7FFu) != 0x7FFu;
}

static int check_tables(zeal_profile *p) {
    uint64_t diff, max_start;
    const unsigned k = p->payload_bits, f = p->cell_bits, g = p->frac_bits;
    if (k < 1 || k > 32 || f < 1 || f > 40 || g < 1 || g > 40 || g + f + 1 > 62) {
        return ZEAL_E_PROFILE_TABLES;
    }
    if (p->code_min > p->code_max || (uint64_t)p->code_max >= ((uint64_t)1 << k)) {
        return ZEAL_E_PROFILE_TABLES;
    }
    if (p->w_lo < 1 || p->w_hi <= p->w_lo || p->w_hi >= FIELD_MAX || p->cells < 2 ||
        p->cells >= FIELD_MAX || p->band < 1 || p->band >= p->cells ||
        p->top > ((uint64_t)1 << f)) {
        return ZEAL_E_PROFILE_TABLES;
    }
    /* Z = w_lo * cells + (w_hi - w_lo) * band must stay below 2^63 (no wrap: checked). */
    diff = p->w_hi - p->w_lo;
    if (p->cells > (((uint64_t)1 << 63) - 1) / p->w_lo ||
        p->band > (((uint64_t)1 << 63) - 1 - p->w_lo * p->cells) / diff) {
        return ZEAL_E_PROFILE_TABLES;
    }
    p->total = p->w_lo * p->cells + diff * p->band;
    max_start = p->cells - p->band;
    if (max_start >= ((uint64_t)1 << (61 - g))) {
        return ZEAL_E_PROFILE_TABLES;
    }
    if (!is_finite(p->lower) || !is_finite(p->upper) || !zeal_f64_less(p->lower, p->upper) ||
        !is_finite(p->start_at_upper) || !is_finite(p->slope) || p->slope >> 63) {
        return ZEAL_E_PROFILE_TABLES;
    }
    /* a reading's unit: positive, 2^-64 to 2^64 (so readings times it stay normal) */
    if (p->unit >> 63 || ((p->unit >> 52) & 0x7FFu) < 1023u - 64u ||
        ((p->unit >> 52) & 0x7FFu) > 1023u + 64u) {
        return ZEAL_E_PROFILE_TABLES;
    }
    /* Python clips the scaled start at float(max_start << G), which may round up */
    p->start_cap = zeal_f64_floor_scaled(zeal_f64_from_int((int64_t)(max_start << g)), 0,
                                         UINT64_MAX);
    p->unit_mask = ((uint64_t)1 << zeal_bit_length(p->total)) - 1u;
    return ZEAL_OK;
}

int zeal_profile_load(zeal_profile *profile, const uint8_t *blob, size_t length) {
    zeal_profile p;
    if (profile == NULL || blob == NULL) {
        return ZEAL_E_ARGUMENT;
    }
    if (length != ZEAL_PROFILE_BYTES || blob[3] != ZEAL_PROFILE_BYTES) {
        return ZEAL_E_PROFILE_LENGTH;
    }
    if (blob[0] != 'Z' || blob[1] != 'F') {
        return ZEAL_E_PROFILE_MAGIC;
    }
    if (blob[2] != 1) {
        return ZEAL_E_PROFILE_VERSION;
    }
    if (crc32(blob, 100) != get32(blob + 100)) {
        return ZEAL_E_PROFILE_CHECKSUM;
    }
    if (blob[7] != 0) {
        return ZEAL_E_PROFILE_TABLES;
    }
    memset(&p, 0, sizeof p);
    p.payload_bits = blob[4];
    p.cell_bits = blob[5];
    p.frac_bits = blob[6];
    p.code_min = get32(blob + 8);
    p.code_max = get32(blob + 12);
    p.w_lo = get64(blob + 16);
    p.w_hi = get64(blob + 24);
    p.cells = get64(blob + 32);
    p.band = get64(blob + 40);
    p.top = get64(blob + 48);
    p.lower = get64(blob + 56);
    p.upper = get64(blob + 64);
    p.start_at_upper = get64(blob + 72);
    p.slope = get64(blob + 80);
    p.unit = get64(blob + 88);
    memcpy(p.fingerprint, blob + 96, 4);
    if (check_tables(&p) != ZEAL_OK) {
        return ZEAL_E_PROFILE_TABLES;
    }
    *profile = p;
    return ZEAL_OK;
}

/* The band start in fixed point (G fraction bits): GridSampler.fixed_starts on the
 * reading as Python's float64 would hold it (reading times unit, clipped to the range),
 * each float64 operation done in integers, rounded as IEEE 754 rounds it. */
static uint64_t band_start_of(const zeal_profile *p, uint64_t x) {
    if (zeal_f64_less(x, p->lower)) {
        x = p->lower;
    } else if (zeal_f64_less(p->upper, x)) {
        x = p->upper;
    }
    x = zeal_f64_add(p->upper, x ^ (uint64_t)1 << 63);                 /* upper - x */
    x = zeal_f64_add(p->start_at_upper, zeal_f64_mul(p->slope, x)); /* start + slope * it */
    return zeal_f64_floor_scaled(x, p->frac_bits, p->start_cap);    /* floor(* 2^G), clip */
}

/* A reading's value as Python's float64 holds it: reading times unit. */
static uint64_t value_of(const zeal_profile *p, int32_t reading) {
    return zeal_f64_mul(zeal_f64_from_int(reading), p->unit);
}

uint64_t zeal_band_start(const zeal_profile *p, int32_t reading) {
    return band_start_of(p, value_of(p, reading));
}

/* The grid sampler's draw for a band start `t` (GridSampler.sample). */
static int draw(const zeal_profile *p, uint64_t t, zeal_random_fn random, void *context,
                uint32_t *code) {
    uint64_t word, unit, start, left_end, band_end, cell, round_bits, a;
    uint64_t frac_mask;
    int64_t depth, value;
    if (random(context, &word, 1) != 0) {
        return ZEAL_E_RANDOM;
    }
    word &= ((uint64_t)1 << 63) - 1u;
    frac_mask = ((uint64_t)1 << p->frac_bits) - 1u;
    start = (t >> p->frac_bits) + ((word & frac_mask) < (t & frac_mask) ? 1u : 0u);
    do { /* uniform on [0, Z) by rejection: no modulo bias (zeal._core.randomness.uniform_below) */
        if (random(context, &unit, 1) != 0) {
            return ZEAL_E_RANDOM;
        }
        unit &= p->unit_mask;
    } while (unit >= p->total);
    left_end = start * p->w_lo;
    band_end = left_end + p->w_hi * p->band;
    if (unit < left_end) {
        cell = unit / p->w_lo;
    } else if (unit < band_end) {
        cell = start + (unit - left_end) / p->w_hi;
    } else {
        cell = start + p->band + (unit - band_end) / p->w_lo;
    }
    a = (uint64_t)1 << (p->cell_bits + 1);
    round_bits = (word >> p->frac_bits) & (a - 1u);
    /* Depth of the cell centre, (2 (cell - top) + 1) / a grid steps, rounded up with the
     * probability of its fraction; the sum below is at least 1, so the shift is exact. */
    depth = (int64_t)((2u * cell + 1u + a + round_bits - 2u * p->top) >> (p->cell_bits + 1)) - 1;
    value = ((int64_t)1 << p->payload_bits) - 2 - depth;
    if (value < (int64_t)p->code_min || value > (int64_t)p->code_max) {
        return ZEAL_E_CODE; /* never for a profile made by zeal: its tables keep the range */
    }
    *code = (uint32_t)value;
    return ZEAL_OK;
}

int zeal_perturb(const zeal_profile *p, int32_t reading, zeal_random_fn random, void *context,
                 uint32_t *code) {
    if (p == NULL || random == NULL || code == NULL) {
        return ZEAL_E_ARGUMENT;
    }
    return draw(p, zeal_band_start(p, reading), random, context, code);
}

#define F64_NEGATE(x) ((x) ^ (uint64_t)1 << 63)
#define F64_TWO_TO_MINUS_53 0x3CA0000000000000u

/* Grid value j: lower + j * step, each operation in binary64 (zeal.longitudinal.grid_values). */
static uint64_t grid_value(const zeal_profile *p, const zeal_memo *m, uint32_t j) {
    return zeal_f64_add(p->lower, zeal_f64_mul(zeal_f64_from_int((int64_t)j), m->step));
}

int zeal_memo_init(zeal_memo *memo, const zeal_profile *p, uint16_t points, uint64_t step_bits,
                   uint16_t *table, zeal_random_fn random, void *context) {
    uint64_t word;
    uint16_t j;
    if (memo == NULL || p == NULL || table == NULL || random == NULL) {
        return ZEAL_E_ARGUMENT;
    }
    if (points < 2 || points > ZEAL_MEMO_MAX_POINTS || p->payload_bits > 16 ||
        !is_finite(step_bits) || step_bits >> 63 || step_bits == 0) {
        return ZEAL_E_MEMO;
    }
    if (random(context, &word, 1) != 0) {
        return ZEAL_E_RANDOM;
    }
    memo->step = step_bits;
    memo->points = points;
    memo->table = table;
    /* zeal.longitudinal.draw_offset: the top 53 bits of a word, times 2^-53 (exact) */
    memo->offset = zeal_f64_mul(zeal_f64_from_int((int64_t)(word >> 11)), F64_TWO_TO_MINUS_53);
    for (j = 0; j < points; j++) {
        table[j] = ZEAL_MEMO_EMPTY;
    }
    return ZEAL_OK;
}

int zeal_memo_perturb(const zeal_profile *p, zeal_memo *m, int32_t reading,
                      zeal_random_fn random, void *context, uint32_t *code, int *fresh) {
    uint64_t x, low, high;
    uint32_t lo = 0, hi, j;
    int status;
    if (p == NULL || m == NULL || m->table == NULL || random == NULL || code == NULL ||
        fresh == NULL) {
        return ZEAL_E_ARGUMENT;
    }
    if (m->points < 2 || m->points > ZEAL_MEMO_MAX_POINTS) {
        return ZEAL_E_MEMO;
    }
    x = value_of(p, reading);
    if (zeal_f64_less(x, p->lower)) {
        x = p->lower;
    } else if (zeal_f64_less(p->upper, x)) {
        x = p->upper;
    }
    /* the last j <= points - 2 with grid_value(j) <= x (zeal.longitudinal.grid_indices) */
    hi = (uint32_t)m->points - 2u;
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1u) / 2u;
        if (zeal_f64_less(x, grid_value(p, m, mid))) {
            hi = mid - 1u;
        } else {
            lo = mid;
        }
    }
    low = grid_value(p, m, lo);
    high = grid_value(p, m, lo + 1u);
    /* up when offset * (g[j+1] - g[j]) < x - g[j], in binary64 */
    j = lo + (zeal_f64_less(zeal_f64_mul(m->offset, zeal_f64_add(high, F64_NEGATE(low))),
                            zeal_f64_add(x, F64_NEGATE(low)))
                  ? 1u
                  : 0u);
    if (m->table[j] != ZEAL_MEMO_EMPTY) {
        *code = m->table[j];
        *fresh = 0;
        return ZEAL_OK;
    }
    status = draw(p, band_start_of(p, grid_value(p, m, j)), random, context, code);
    if (status != ZEAL_OK) {
        return status;
    }
    m->table[j] = (uint16_t)*code;
    *fresh = 1;
    return ZEAL_OK;
}

static size_t put_varint(uint8_t *out, uint64_t value) {
    size_t n = 0;
    while (value >= 0x80u) {
        out[n++] = (uint8_t)(value | 0x80u);
        value >>= 7;
    }
    out[n++] = (uint8_t)value;
    return n;
}

/* `count` codes of `k` bits, most significant bit first, back to back, zero padding. */
static size_t put_codes(uint8_t *out, const uint32_t *codes, size_t count, unsigned k) {
    size_t i, bit = 0, code_bytes = (count * k + 7u) / 8u;
    memset(out, 0, code_bytes);
    for (i = 0; i < count; i++) {
        unsigned j;
        for (j = 0; j < k; j++, bit++) {
            if ((codes[i] >> (k - 1u - j)) & 1u) {
                out[bit / 8u] |= (uint8_t)(0x80u >> (bit % 8u));
            }
        }
    }
    return code_bytes;
}

size_t zeal_batch_bound(const zeal_profile *profile, size_t count) {
    /* header, fingerprint, sequence, count, base time, then a varint per delta, codes */
    size_t bits = profile == NULL ? 32u : profile->payload_bits;
    return 1u + 4u + 10u + 3u + 7u + (count ? count - 1u : 0u) * 7u + (count * bits + 7u) / 8u;
}

int zeal_encode_batch(const zeal_profile *p, uint64_t sequence, const uint64_t *timestamps,
                      const uint32_t *codes, size_t count, uint8_t *out, size_t capacity,
                      size_t *length) {
    size_t i, n = 0;
    uint64_t period = 0;
    int periodic = 1;
    if (p == NULL || timestamps == NULL || codes == NULL || out == NULL || length == NULL) {
        return ZEAL_E_ARGUMENT;
    }
    if (count < 1 || count > ZEAL_MAX_BATCH) {
        return ZEAL_E_COUNT;
    }
    for (i = 0; i < count; i++) {
        if (timestamps[i] >= ((uint64_t)1 << 48) || (i > 0 && timestamps[i] < timestamps[i - 1])) {
            return ZEAL_E_TIMESTAMP;
        }
        if (codes[i] < p->code_min || codes[i] > p->code_max) {
            return ZEAL_E_CODE;
        }
    }
    if (count > 1) {
        period = timestamps[1] - timestamps[0];
        for (i = 2; i < count && periodic; i++) {
            periodic = timestamps[i] - timestamps[i - 1] == period;
        }
    }
    if (capacity < zeal_batch_bound(p, count)) {
        return ZEAL_E_BUFFER;
    }
    out[n++] = (uint8_t)(2u << 4 | (periodic ? 0u : 1u)); /* version 2, flags */
    memcpy(out + n, p->fingerprint, 4);
    n += 4;
    n += put_varint(out + n, sequence);
    n += put_varint(out + n, (uint64_t)count);
    n += put_varint(out + n, timestamps[0]);
    if (!periodic) {
        for (i = 1; i < count; i++) {
            n += put_varint(out + n, timestamps[i] - timestamps[i - 1]);
        }
    } else if (count > 1) {
        n += put_varint(out + n, period);
    }
    *length = n + put_codes(out + n, codes, count, p->payload_bits);
    return ZEAL_OK;
}

static size_t varint_size(uint64_t value) {
    size_t n = 1;
    while (value >= 0x80u) {
        value >>= 7;
        n++;
    }
    return n;
}

size_t zeal_lorawan_size(const zeal_profile *profile, size_t count, uint32_t spacing_seconds) {
    size_t bits = profile == NULL ? 32u : profile->payload_bits;
    size_t n = 2u; /* tag and n */
    if (count > 15u) {
        n += varint_size((uint64_t)count);
    }
    if (count > 1u) {
        n += varint_size(spacing_seconds);
    }
    return n + (count * bits + 7u) / 8u;
}

int zeal_encode_lorawan(const zeal_profile *p, uint32_t spacing_seconds, const uint32_t *codes,
                        size_t count, uint8_t *out, size_t capacity, size_t *length) {
    size_t i, n = 0, size;
    if (p == NULL || codes == NULL || out == NULL || length == NULL) {
        return ZEAL_E_ARGUMENT;
    }
    if (count < 1 || count > ZEAL_MAX_BATCH) {
        return ZEAL_E_COUNT;
    }
    for (i = 0; i < count; i++) {
        if (codes[i] < p->code_min || codes[i] > p->code_max) {
            return ZEAL_E_CODE;
        }
    }
    size = zeal_lorawan_size(p, count, spacing_seconds);
    if (size > ZEAL_LORAWAN_MAX_BYTES) {
        return ZEAL_E_TOO_LARGE;
    }
    if (capacity < size) {
        return ZEAL_E_BUFFER;
    }
    /* the wire fingerprint's first 12 bits, then n: count - 1, or 15 and a varint count */
    out[n++] = p->fingerprint[0];
    out[n++] = (uint8_t)((p->fingerprint[1] & 0xF0u) | (count > 15u ? 15u : count - 1u));
    if (count > 15u) {
        n += put_varint(out + n, (uint64_t)count);
    }
    if (count > 1u) {
        n += put_varint(out + n, spacing_seconds);
    }
    *length = n + put_codes(out + n, codes, count, p->payload_bits);
    return ZEAL_OK;
}
