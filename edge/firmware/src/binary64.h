/*
 * IEEE 754 binary64 arithmetic in integers, round to nearest even: just the operations the
 * band's position needs (zeal._core.grid.GridSampler.fixed_starts), so a chip without an FPU
 * gets Python's float64 results bit for bit without a soft-float library. Finite values
 * only (profiles are checked); subnormals are handled.
 */
#ifndef ZEAL_BINARY64_H
#define ZEAL_BINARY64_H

#include <stdint.h>

/* A finite binary64 value: (-1)^neg * man * 2^exp, man < 2^53. */
typedef struct {
    uint64_t man;
    int32_t exp;
    uint8_t neg;
} zeal_f64;

/* The number of significant bits of x (0 for 0). */
int zeal_bit_length(uint64_t x);
zeal_f64 zeal_f64_unpack(uint64_t bits);
uint64_t zeal_f64_from_int(int64_t value);
uint64_t zeal_f64_add(uint64_t a, uint64_t b);
uint64_t zeal_f64_mul(uint64_t a, uint64_t b);
/* a < b, for finite values (-0 equals +0). */
int zeal_f64_less(uint64_t a, uint64_t b);
/* floor(x * 2^shift) for x >= 0, capped at `cap`; 0 for x <= 0. */
uint64_t zeal_f64_floor_scaled(uint64_t x, int32_t shift, uint64_t cap);

#endif /* ZEAL_BINARY64_H */
