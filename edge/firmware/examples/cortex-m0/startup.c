/*
 * A bare-metal start for the Cortex-M0 examples: the vector table, the reset handler
 * (copies .data, clears .bss, runs main), memcpy and memset for the library, and ARM
 * semihosting (write a string, exit) for output under QEMU or a debugger.
 */
#include <stddef.h>
#include <stdint.h>

#include "startup.h"

extern uint32_t _data_start, _data_end, _data_load, _bss_start, _bss_end, _stack_top;
int main(void);
void reset_handler(void);

typedef void (*vector)(void);

__attribute__((section(".vectors"), used)) static const vector vectors[] = {
    (vector)(uintptr_t)&_stack_top, /* the initial stack pointer */
    reset_handler,
};

void *memcpy(void *to, const void *from, size_t n) {
    uint8_t *d = to;
    const uint8_t *s = from;
    while (n--) {
        *d++ = *s++;
    }
    return to;
}

void *memset(void *to, int value, size_t n) {
    uint8_t *d = to;
    while (n--) {
        *d++ = (uint8_t)value;
    }
    return to;
}

static uint32_t semihost(uint32_t operation, const void *argument) {
    register uint32_t r0 __asm__("r0") = operation;
    register const void *r1 __asm__("r1") = argument;
    __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

void host_write(const char *text) {
    semihost(0x04u, text); /* SYS_WRITE0 */
}

void host_exit(int ok) {
    /* SYS_EXIT: ApplicationExit (QEMU exits 0), or RunTimeErrorUnknown (QEMU exits 1) */
    semihost(0x18u, (const void *)(uintptr_t)(ok ? 0x20026u : 0x20023u));
    for (;;) {
    }
}

void reset_handler(void) {
    uint32_t *from = &_data_load, *to = &_data_start;
    while (to < &_data_end) {
        *to++ = *from++;
    }
    for (to = &_bss_start; to < &_bss_end; to++) {
        *to = 0;
    }
    host_exit(main() == 0);
}
