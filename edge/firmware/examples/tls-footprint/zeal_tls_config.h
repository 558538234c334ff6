/*
 * The mbed TLS 2.28 configuration of a Zeal device's TLS client (MBEDTLS_CONFIG_FILE): TLS
 * 1.2, client only, what the stack's broker offers and nothing more.
 *
 *   default            ECDHE-ECDSA with AES-128-GCM and SHA-256 on P-256: the stack's
 *                      certificates (deploy/tls/make-certs) are P-256, and OpenSSL behind
 *                      Mosquitto offers this suite; X.509 certificates in DER (no PEM
 *                      parser on the device); its own certificate and key for the
 *                      certificate listener (8884), or only the CA for the password one.
 *   ZEAL_TLS_PSK       a pre-shared key with AES-128-CCM-8, no public-key code at all (a
 *                      broker listener with psk_hint; the stack does not offer one today).
 *
 * Records are at most ZEAL_TLS_RECORD bytes each way (2048 by default), negotiated with
 * the max_fragment_length extension, which OpenSSL honours as a server. Entropy comes from
 * the device's hardware generator (mbedtls_hardware_poll, client.c); no clock, so a device
 * does not check certificate dates (none of mbed TLS's time code is built).
 */
#ifndef ZEAL_TLS_CONFIG_H
#define ZEAL_TLS_CONFIG_H

#ifndef ZEAL_TLS_RECORD
#define ZEAL_TLS_RECORD 2048
#endif

/* System: calloc and free through the platform layer (so a test can count them). */
#define MBEDTLS_PLATFORM_C
#define MBEDTLS_PLATFORM_MEMORY
#define MBEDTLS_NO_PLATFORM_ENTROPY
#define MBEDTLS_ENTROPY_HARDWARE_ALT
#define MBEDTLS_ENTROPY_FORCE_SHA256

/* TLS 1.2 client. */
#define MBEDTLS_SSL_PROTO_TLS1_2
#define MBEDTLS_SSL_CLI_C
#define MBEDTLS_SSL_TLS_C
#define MBEDTLS_SSL_MAX_FRAGMENT_LENGTH
#define MBEDTLS_SSL_IN_CONTENT_LEN ZEAL_TLS_RECORD
#define MBEDTLS_SSL_OUT_CONTENT_LEN ZEAL_TLS_RECORD

/* Symmetric cryptography and the random generator; AES's tables in flash, and one of each
 * four (computed from it as needed): 2 KB of flash instead of 8 KB of RAM. */
#define MBEDTLS_AES_C
#define MBEDTLS_AES_ROM_TABLES
#define MBEDTLS_AES_FEWER_TABLES
#define MBEDTLS_CIPHER_C
#define MBEDTLS_MD_C
#define MBEDTLS_SHA256_C
#define MBEDTLS_CTR_DRBG_C
#define MBEDTLS_ENTROPY_C

#ifdef ZEAL_TLS_PSK
#define MBEDTLS_KEY_EXCHANGE_PSK_ENABLED
#define MBEDTLS_CCM_C
#define MBEDTLS_SSL_CIPHERSUITES MBEDTLS_TLS_PSK_WITH_AES_128_CCM_8
#else
#define MBEDTLS_KEY_EXCHANGE_ECDHE_ECDSA_ENABLED
#define MBEDTLS_GCM_C
#define MBEDTLS_ECP_DP_SECP256R1_ENABLED
#define MBEDTLS_ECP_NIST_OPTIM
#define MBEDTLS_BIGNUM_C
#define MBEDTLS_ECP_C
#define MBEDTLS_ECDH_C
#define MBEDTLS_ECDSA_C
#define MBEDTLS_ASN1_PARSE_C
#define MBEDTLS_ASN1_WRITE_C
#define MBEDTLS_OID_C
#define MBEDTLS_PK_C
#define MBEDTLS_PK_PARSE_C
#define MBEDTLS_X509_USE_C
#define MBEDTLS_X509_CRT_PARSE_C
#define MBEDTLS_SSL_SERVER_NAME_INDICATION
#define MBEDTLS_SSL_CIPHERSUITES MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
#endif

#include "mbedtls/check_config.h"

#endif /* ZEAL_TLS_CONFIG_H */
