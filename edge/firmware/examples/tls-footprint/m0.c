/*
 * client.c linked for a Cortex-M0 (the micro:bit's nRF51822, as the library's size
 * example): what its flash holds. The certificates and key are the stack's, in DER
 * (m0_login.h, made from a run's files); the network and the random generator are the
 * nRF51's UART and RNG registers standing for the device's own. Not run: linked only, so
 * that the linker keeps exactly the code a session needs.
 */
#include <stdint.h>

#include "client.h"
#include "m0_login.h"
#include "mbedtls/entropy_poll.h"

#define REG(address) (*(volatile uint32_t *)(address))

int mbedtls_hardware_poll(void *data, unsigned char *output, size_t len, size_t *olen) {
    (void)data;
    REG(0x4000D000u) = 1; /* RNG: TASKS_START */
    for (size_t i = 0; i < len; i++) {
        while (REG(0x4000D100u) == 0) { /* EVENTS_VALRDY */
        }
        REG(0x4000D100u) = 0;
        output[i] = (unsigned char)REG(0x4000D508u); /* VALUE */
    }
    *olen = len;
    return 0;
}

static int net_send(void *io, const unsigned char *data, size_t n) {
    (void)io;
    for (size_t i = 0; i < n; i++) {
        REG(0x4000251Cu) = data[i]; /* UART: TXD */
    }
    return (int)n;
}

static int net_recv(void *io, unsigned char *data, size_t n) {
    (void)io;
    for (size_t i = 0; i < n; i++) {
        data[i] = (unsigned char)REG(0x40002518u); /* UART: RXD */
    }
    return (int)n;
}

int main(void) {
    struct zeal_tls_login login = {
#ifdef ZEAL_TLS_PSK
        .psk = psk, .psk_len = sizeof psk, .psk_identity = "kitchen-1",
#else
        .ca = ca_der, .ca_len = sizeof ca_der,
        .cert = cert_der, .cert_len = sizeof cert_der,
        .key = key_der, .key_len = sizeof key_der,
#endif
        .host = "broker.example", .client_id = "kitchen-1",
    };
    const char *suite;
    return zeal_tls_connect(&login, 0, net_send, net_recv, &suite);
}
