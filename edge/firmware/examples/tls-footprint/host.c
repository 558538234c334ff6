/*
 * client.c on a Linux host against a real broker, with every allocation mbed TLS makes
 * counted: the peak of its heap through the handshake, the MQTT CONNECT and the CONNACK.
 *
 *   zeal-tls-host HOST PORT CLIENT_ID [--ca CA.der] [--cert C.der --key K.der]
 *                 [--username U --password P] [--psk HEX --identity ID]
 *
 * Prints `connack N suite S peak_heap BYTES allocations N`; exit status 0 when accepted.
 */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client.h"
#include "mbedtls/entropy.h"
#include "mbedtls/entropy_poll.h"
#include "mbedtls/platform.h"

/* Each block carries its size in front of it (16 bytes, keeping the alignment). */
static size_t in_use, peak, allocations;

static void *counting_calloc(size_t n, size_t size) {
    if (size != 0 && n > (SIZE_MAX - 16) / size) {
        return NULL;
    }
    size_t bytes = n * size;
    unsigned char *block = calloc(1, bytes + 16);
    if (!block) {
        return NULL;
    }
    memcpy(block, &bytes, sizeof bytes);
    in_use += bytes;
    allocations++;
    if (in_use > peak) {
        peak = in_use;
    }
    return block + 16;
}

static void counting_free(void *pointer) {
    if (!pointer) {
        return;
    }
    unsigned char *block = (unsigned char *)pointer - 16;
    size_t bytes;
    memcpy(&bytes, block, sizeof bytes);
    in_use -= bytes;
    free(block);
}

int mbedtls_hardware_poll(void *data, unsigned char *output, size_t len, size_t *olen) {
    (void)data;
    ssize_t got = getrandom(output, len, 0);
    if (got < 0) {
        return MBEDTLS_ERR_ENTROPY_SOURCE_FAILED;
    }
    *olen = (size_t)got;
    return 0;
}

static int net_send(void *io, const unsigned char *data, size_t n) {
    ssize_t sent = send(*(int *)io, data, n, MSG_NOSIGNAL);
    return sent < 0 ? MBEDTLS_ERR_SSL_INTERNAL_ERROR : (int)sent;
}

static int net_recv(void *io, unsigned char *data, size_t n) {
    ssize_t got = recv(*(int *)io, data, n, 0);
    return got < 0 ? MBEDTLS_ERR_SSL_INTERNAL_ERROR : (int)got;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *file = fopen(path, "rb");
    if (!file) {
        perror(path);
        exit(2);
    }
    unsigned char *data = malloc(65536);
    *n = fread(data, 1, 65536, file);
    fclose(file);
    return data;
}

static unsigned char *unhex(const char *text, size_t *n) {
    *n = strlen(text) / 2;
    unsigned char *out = malloc(*n + 1);
    for (size_t i = 0; i < *n; i++) {
        unsigned int byte;
        if (sscanf(text + 2 * i, "%2x", &byte) != 1) {
            fprintf(stderr, "--psk: not hex\n");
            exit(2);
        }
        out[i] = (unsigned char)byte;
    }
    return out;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s HOST PORT CLIENT_ID [options]\n", argv[0]);
        return 2;
    }
    struct zeal_tls_login login = {.host = argv[1], .client_id = argv[3]};
    for (int i = 4; i + 1 < argc; i += 2) {
        const char *option = argv[i], *value = argv[i + 1];
        if (!strcmp(option, "--ca")) {
            login.ca = slurp(value, &login.ca_len);
        } else if (!strcmp(option, "--cert")) {
            login.cert = slurp(value, &login.cert_len);
        } else if (!strcmp(option, "--key")) {
            login.key = slurp(value, &login.key_len);
        } else if (!strcmp(option, "--username")) {
            login.username = value;
        } else if (!strcmp(option, "--password")) {
            login.password = value;
        } else if (!strcmp(option, "--psk")) {
            login.psk = unhex(value, &login.psk_len);
        } else if (!strcmp(option, "--identity")) {
            login.psk_identity = value;
        } else {
            fprintf(stderr, "unknown option %s\n", option);
            return 2;
        }
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *found;
    if (getaddrinfo(argv[1], argv[2], &hints, &found) != 0) {
        fprintf(stderr, "cannot resolve %s\n", argv[1]);
        return 2;
    }
    int fd = socket(found->ai_family, found->ai_socktype, found->ai_protocol);
    if (fd < 0 || connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
        perror("connect");
        return 2;
    }
    freeaddrinfo(found);
    mbedtls_platform_set_calloc_free(counting_calloc, counting_free);
    const char *suite = "none";
    int answer = zeal_tls_connect(&login, &fd, net_send, net_recv, &suite);
    close(fd);
    printf("connack %d suite %s peak_heap %zu allocations %zu left %zu\n", answer, suite, peak,
           allocations, in_use);
    return answer == 0 ? 0 : 1;
}
