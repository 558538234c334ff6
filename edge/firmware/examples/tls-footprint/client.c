/*
 * A Zeal device's TLS session with its broker through mbed TLS 2.28: what a
 * microcontroller's firmware needs to reach the stack's broker over TLS (docs/firmware.md,
 * "TLS on a microcontroller"). Built with zeal_tls_config.h; host.c runs it against a real
 * Mosquitto, m0.c links it for a Cortex-M0 to measure its flash.
 */
#include <string.h>

#include "client.h"
#include "mbedtls/ctr_drbg.h"
#include "mbedtls/entropy.h"
#include "mbedtls/pk.h"
#include "mbedtls/x509_crt.h"

static size_t put_string(unsigned char *at, const char *text) {
    size_t n = strlen(text);
    at[0] = (unsigned char)(n >> 8);
    at[1] = (unsigned char)n;
    memcpy(at + 2, text, n);
    return n + 2;
}

/* An MQTT 3.1.1 CONNECT (clean session, keep-alive 60 s) into `out` (at least 256 bytes
 * with the fields under 80 bytes each); its length. */
static size_t mqtt_connect(unsigned char *out, const struct zeal_tls_login *login) {
    unsigned char body[250];
    size_t n = 0;
    unsigned char flags = 0x02;
    n += put_string(body + n, "MQTT");
    body[n++] = 4;
    if (login->username) {
        flags |= 0x80;
    }
    if (login->password) {
        flags |= 0x40;
    }
    body[n++] = flags;
    body[n++] = 0;
    body[n++] = 60;
    n += put_string(body + n, login->client_id);
    if (login->username) {
        n += put_string(body + n, login->username);
    }
    if (login->password) {
        n += put_string(body + n, login->password);
    }
    out[0] = 0x10;
    out[1] = (unsigned char)((n & 0x7f) | (n > 127 ? 0x80 : 0));
    size_t head = 2;
    if (n > 127) {
        out[2] = (unsigned char)(n >> 7);
        head = 3;
    }
    memcpy(out + head, body, n);
    return head + n;
}

static int write_all(mbedtls_ssl_context *ssl, const unsigned char *data, size_t n) {
    while (n > 0) {
        int sent = mbedtls_ssl_write(ssl, data, n);
        if (sent < 0) {
            return sent;
        }
        data += sent;
        n -= (size_t)sent;
    }
    return 0;
}

static int read_all(mbedtls_ssl_context *ssl, unsigned char *into, size_t n) {
    while (n > 0) {
        int got = mbedtls_ssl_read(ssl, into, n);
        if (got <= 0) {
            return got == 0 ? MBEDTLS_ERR_SSL_CONN_EOF : got;
        }
        into += got;
        n -= (size_t)got;
    }
    return 0;
}

int zeal_tls_connect(const struct zeal_tls_login *login, void *io, mbedtls_ssl_send_t *send,
                     mbedtls_ssl_recv_t *recv, const char **suite) {
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
    mbedtls_ssl_config conf;
    mbedtls_ssl_context ssl;
#ifndef ZEAL_TLS_PSK
    mbedtls_x509_crt ca, own;
    mbedtls_pk_context key;
    mbedtls_x509_crt_init(&ca);
    mbedtls_x509_crt_init(&own);
    mbedtls_pk_init(&key);
#endif
    unsigned char packet[256];
    int ret;
    mbedtls_entropy_init(&entropy);
    mbedtls_ctr_drbg_init(&drbg);
    mbedtls_ssl_config_init(&conf);
    mbedtls_ssl_init(&ssl);
    if ((ret = mbedtls_ctr_drbg_seed(&drbg, mbedtls_entropy_func, &entropy,
                                     (const unsigned char *)"zeal", 4)) != 0 ||
        (ret = mbedtls_ssl_config_defaults(&conf, MBEDTLS_SSL_IS_CLIENT,
                                           MBEDTLS_SSL_TRANSPORT_STREAM,
                                           MBEDTLS_SSL_PRESET_DEFAULT)) != 0) {
        goto done;
    }
    mbedtls_ssl_conf_rng(&conf, mbedtls_ctr_drbg_random, &drbg);
    /* Records of at most MBEDTLS_SSL_OUT_CONTENT_LEN each way (2048: code 2). */
    if ((ret = mbedtls_ssl_conf_max_frag_len(&conf, MBEDTLS_SSL_MAX_FRAG_LEN_2048)) != 0) {
        goto done;
    }
#ifdef ZEAL_TLS_PSK
    if ((ret = mbedtls_ssl_conf_psk(&conf, login->psk, login->psk_len,
                                    (const unsigned char *)login->psk_identity,
                                    strlen(login->psk_identity))) != 0) {
        goto done;
    }
#else
    if ((ret = mbedtls_x509_crt_parse_der(&ca, login->ca, login->ca_len)) != 0) {
        goto done;
    }
    mbedtls_ssl_conf_ca_chain(&conf, &ca, NULL);
    mbedtls_ssl_conf_authmode(&conf, MBEDTLS_SSL_VERIFY_REQUIRED);
    if (login->cert) {
        if ((ret = mbedtls_x509_crt_parse_der(&own, login->cert, login->cert_len)) != 0 ||
            (ret = mbedtls_pk_parse_key(&key, login->key, login->key_len, NULL, 0)) != 0 ||
            (ret = mbedtls_ssl_conf_own_cert(&conf, &own, &key)) != 0) {
            goto done;
        }
    }
#endif
    if ((ret = mbedtls_ssl_setup(&ssl, &conf)) != 0) {
        goto done;
    }
#ifndef ZEAL_TLS_PSK
    if ((ret = mbedtls_ssl_set_hostname(&ssl, login->host)) != 0) { /* checked, and SNI */
        goto done;
    }
#endif
    mbedtls_ssl_set_bio(&ssl, io, send, recv, NULL);
    while ((ret = mbedtls_ssl_handshake(&ssl)) != 0) {
        if (ret != MBEDTLS_ERR_SSL_WANT_READ && ret != MBEDTLS_ERR_SSL_WANT_WRITE) {
            goto done;
        }
    }
    *suite = mbedtls_ssl_get_ciphersuite(&ssl);
    if ((ret = write_all(&ssl, packet, mqtt_connect(packet, login))) != 0 ||
        (ret = read_all(&ssl, packet, 4)) != 0) {
        goto done;
    }
    ret = (packet[0] == 0x20 && packet[1] == 2) ? packet[3] : MBEDTLS_ERR_SSL_BAD_INPUT_DATA;
    mbedtls_ssl_close_notify(&ssl);
done:
    mbedtls_ssl_free(&ssl);
    mbedtls_ssl_config_free(&conf);
    mbedtls_ctr_drbg_free(&drbg);
    mbedtls_entropy_free(&entropy);
#ifndef ZEAL_TLS_PSK
    mbedtls_x509_crt_free(&ca);
    mbedtls_x509_crt_free(&own);
    mbedtls_pk_free(&key);
#endif
    return ret;
}
