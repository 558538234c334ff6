/* Binary64 arithmetic in integers (see binary64.h). */
#include "binary64.h"

#define MAN_BITS 52
#define HIDDEN ((uint64_t)1 << MAN_BITS)
#define MIN_EXP (-1074) /* exponent of the least significant bit of a subnormal */

int zeal_bit_length(uint64_t x) {
    int n = 0;
    while (x) {
        n++;
        x >>= 1;
    }
    return n;
}

zeal_f64 zeal_f64_unpack(uint64_t bits) {
    zeal_f64 v;
    uint32_t biased = (uint32_t)(bits >> MAN_BITS) & 0x7FFu;
    v.neg = (uint8_t)(bits >> 63);
    v.man = bits & (HIDDEN - 1u);
    if (biased) {
        v.man |= HIDDEN;
        v.exp = (int32_t)biased - 1075;
    } else {
        v.exp = MIN_EXP;
    }
    return v;
}

/* The binary64 nearest to (-1)^neg * (man + a fraction) * 2^exp, ties to even; `sticky`
 * says the fraction below man's last bit is nonzero (man must then have >= 55 bits). */
static uint64_t round_pack(uint8_t neg, uint64_t man, int32_t exp, int sticky) {
    int32_t drop;
    uint64_t sign = (uint64_t)neg << 63;
    if (man == 0) {
        return sign;
    }
    drop = zeal_bit_length(man) - 53;
    if (exp + drop < MIN_EXP) {
        drop = MIN_EXP - exp;
    }
    if (drop > 0) {
        uint64_t rest, half, q;
        if (drop > 64) {
            return sign; /* below half of the least subnormal */
        }
        if (drop == 64) {
            q = 0;
            rest = man;
            half = (uint64_t)1 << 63;
        } else {
            q = man >> drop;
            rest = man & (((uint64_t)1 << drop) - 1u);
            half = (uint64_t)1 << (drop - 1);
        }
        if (rest > half || (rest == half && (sticky || (q & 1u)))) {
            q++;
        }
        man = q;
        exp += drop;
        if (man >> 53) { /* rounding carried into a new bit */
            man >>= 1;
            exp++;
        }
    } else if (drop < 0) { /* fewer than 53 bits: exact, move up to the normal position */
        int32_t up = -drop;
        if (exp - up < MIN_EXP) {
            up = exp - MIN_EXP;
        }
        man <<= up;
        exp -= up;
    }
    if (man < HIDDEN) { /* subnormal (exp == MIN_EXP) */
        return sign | man;
    }
    if (exp + 1075 >= 0x7FF) {
        return sign | ((uint64_t)0x7FF << MAN_BITS); /* overflow: infinity */
    }
    return sign | (uint64_t)(exp + 1075) << MAN_BITS | (man & (HIDDEN - 1u));
}

uint64_t zeal_f64_from_int(int64_t value) {
    uint8_t neg = value < 0;
    uint64_t man = neg ? 0u - (uint64_t)value : (uint64_t)value;
    return round_pack(neg, man, 0, 0);
}

uint64_t zeal_f64_mul(uint64_t a_bits, uint64_t b_bits) {
    zeal_f64 a = zeal_f64_unpack(a_bits), b = zeal_f64_unpack(b_bits);
    uint64_t a0 = a.man & 0xFFFFFFFFu, a1 = a.man >> 32, b0 = b.man & 0xFFFFFFFFu;
    uint64_t b1 = b.man >> 32, p00, p01, p10, mid, lo, hi;
    uint8_t neg = a.neg ^ b.neg;
    int s;
    if (a.man == 0 || b.man == 0) {
        return (uint64_t)neg << 63;
    }
    p00 = a0 * b0;
    p01 = a0 * b1;
    p10 = a1 * b0;
    mid = (p00 >> 32) + (p01 & 0xFFFFFFFFu) + (p10 & 0xFFFFFFFFu);
    lo = (p00 & 0xFFFFFFFFu) | mid << 32;
    hi = a1 * b1 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
    if (hi == 0) {
        return round_pack(neg, lo, a.exp + b.exp, 0);
    }
    s = zeal_bit_length(hi); /* keep the top 64 of the product's bits, the rest as sticky */
    return round_pack(neg, hi << (64 - s) | lo >> s, a.exp + b.exp + s,
                      (lo & (((uint64_t)1 << s) - 1u)) != 0);
}

uint64_t zeal_f64_add(uint64_t a_bits, uint64_t b_bits) {
    zeal_f64 a = zeal_f64_unpack(a_bits), b = zeal_f64_unpack(b_bits), t;
    uint64_t big, small;
    int32_t d;
    int sticky = 0;
    if (b.man == 0) {
        return a.man == 0 ? (uint64_t)(a.neg & b.neg) << 63 : a_bits;
    }
    if (a.man == 0) {
        return b_bits;
    }
    if (a.exp < b.exp || (a.exp == b.exp && a.man < b.man)) {
        t = a;
        a = b;
        b = t;
    }
    /* 10 guard bits: aligned magnitudes keep 53 + 10 bits, and a sticky bit below. */
    big = a.man << 10;
    small = b.man << 10;
    d = a.exp - b.exp;
    if (d > 63) {
        sticky = 1;
        small = 0;
    } else if (d > 0) {
        sticky = (small & (((uint64_t)1 << d) - 1u)) != 0;
        small >>= d;
    }
    if (a.neg == b.neg) {
        return round_pack(a.neg, big + small, a.exp - 10, sticky);
    }
    /* |a| >= |b|: a fraction lost below `small` is taken from one more unit, kept sticky */
    big -= small + (uint64_t)sticky;
    if (big == 0 && !sticky) {
        return 0; /* x + (-x) is +0 */
    }
    return round_pack(a.neg, big, a.exp - 10, sticky);
}

int zeal_f64_less(uint64_t a, uint64_t b) {
    uint64_t ka, kb;
    if (((a | b) << 1) == 0) {
        return 0; /* both zero */
    }
    ka = a >> 63 ? ~a : a | (uint64_t)1 << 63; /* sign-magnitude to an ordered key */
    kb = b >> 63 ? ~b : b | (uint64_t)1 << 63;
    return ka < kb;
}

uint64_t zeal_f64_floor_scaled(uint64_t x_bits, int32_t shift, uint64_t cap) {
    zeal_f64 x = zeal_f64_unpack(x_bits);
    int32_t e = x.exp + shift;
    uint64_t value;
    if (x.neg || x.man == 0) {
        return 0;
    }
    if (e >= 0) {
        if (e >= 64 || (x.man << e) >> e != x.man) {
            return cap;
        }
        value = x.man << e;
    } else {
        value = -e >= 64 ? 0 : x.man >> -e;
    }
    return value < cap ? value : cap;
}
