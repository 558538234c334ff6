/* A Zeal device's TLS session with its broker through mbed TLS (client.c). */
#ifndef ZEAL_TLS_CLIENT_H
#define ZEAL_TLS_CLIENT_H

#include <stddef.h>

#include "mbedtls/ssl.h"

struct zeal_tls_login {
    const unsigned char *ca; /* the stack's CA certificate, DER (certificate suites) */
    size_t ca_len;
    const unsigned char *cert; /* the device's certificate and key, DER; NULL: none */
    size_t cert_len;
    const unsigned char *key;
    size_t key_len;
    const unsigned char *psk; /* the pre-shared key and its identity (ZEAL_TLS_PSK) */
    size_t psk_len;
    const char *psk_identity;
    const char *host;      /* the name the broker's certificate must carry */
    const char *client_id; /* MQTT: the client id, and the login (NULL: none) */
    const char *username;
    const char *password;
};

/* The handshake, an MQTT 3.1.1 CONNECT over it and the broker's CONNACK. Returns the
 * CONNACK's return code (0: accepted) or a negative mbed TLS error; `suite` gets the
 * negotiated suite's name. */
int zeal_tls_connect(const struct zeal_tls_login *login, void *io, mbedtls_ssl_send_t *send,
                     mbedtls_ssl_recv_t *recv, const char **suite);

#endif /* ZEAL_TLS_CLIENT_H */
