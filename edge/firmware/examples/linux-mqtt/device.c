/*
 * zeal-device: a Linux sensor built on the firmware library and libmosquitto. It reads a
 * CSV of `timestamp_ms,value` lines, turns each value into an integer reading in the
 * profile's unit, privatizes it on the device, and publishes batches like the Python agent:
 * MQTT QoS 1 on zeal/v1/STREAM/DEVICE/up, one batch in flight, kept (and resent with the
 * same bytes after a reconnect) until its PUBACK.
 *
 *   zeal-device --profile HEX --stream NAME --device NAME --csv FILE
 *               [--broker mqtt://127.0.0.1:1883] [--username U --password P]
 *               [--ca FILE [--cert FILE --key FILE]]
 *               [--batch 10] [--log FILE] [--sequence-file FILE] [--linger 5]
 *
 * TLS: --broker mqtts://HOST[:8883] with --ca, the CA the broker's certificate and host
 * name are checked with (the stack's deploy/tls/ca.crt), and either a password login or a
 * client certificate (--cert and --key: the certificate's name is the login; the Compose
 * stack's certificate listener, 8884). libmosquitto does the TLS (OpenSSL).
 *
 * The log gets one `timestamp_ms code` line per reading sent: only codes, never a value.
 * The sequence file keeps the next batch number across runs (written after each PUBACK);
 * without it every run starts at sequence 0. The device listens on its notice topic: a
 * batch the server refuses ends the run with the server's reason, and after the last
 * batch it waits up to --linger seconds for such a notice.
 * --host H and --port P, the old spelling of --broker mqtt://H:P, work for one release.
 * Randomness: getrandom(2). Exit status: 0 when every batch was acknowledged and none
 * refused, 1 on an error, 2 on bad usage, 3 when the server refused a batch.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <mosquitto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "zeal.h"

#define MAX_BATCH 1000

struct options {
    const char *profile, *stream, *device, *csv, *host, *username, *password, *log, *sequence_file;
    const char *ca, *cert, *key;
    int port, batch, linger, tls;
    char broker_host[256];
};

/* --broker mqtt://HOST[:PORT] (1883) or mqtts://HOST[:PORT] (TLS, 8883). */
static int broker_url(const char *url, struct options *o) {
    const char *rest, *colon;
    size_t length;
    o->tls = strncmp(url, "mqtts://", 8) == 0;
    if (!o->tls && strncmp(url, "mqtt://", 7) != 0) {
        fprintf(stderr, "zeal-device: --broker %s: mqtt://host:port or mqtts://host:port\n", url);
        return 0;
    }
    rest = url + (o->tls ? 8 : 7);
    colon = strrchr(rest, ':');
    length = colon ? (size_t)(colon - rest) : strlen(rest);
    if (length == 0 || length >= sizeof o->broker_host) {
        return 0;
    }
    memcpy(o->broker_host, rest, length);
    o->broker_host[length] = '\0';
    o->host = o->broker_host;
    o->port = colon ? atoi(colon + 1) : o->tls ? 8883 : 1883;
    return 1;
}

struct link {
    struct mosquitto *client;
    int acked, connected, mid;
    const char *notice_topic;
    char refused[512]; /* the server's reason and message, once a batch was refused */
};

/* The string value of "key" in a flat JSON object (no escapes needed for reasons). */
static void json_string(const char *json, const char *key, char *out, size_t size) {
    char pattern[64];
    const char *at, *end;
    out[0] = '\0';
    snprintf(pattern, sizeof pattern, "\"%s\": \"", key);
    at = strstr(json, pattern);
    if (at == NULL) {
        return;
    }
    at += strlen(pattern);
    end = strchr(at, '"');
    if (end != NULL && (size_t)(end - at) < size) {
        memcpy(out, at, (size_t)(end - at));
        out[end - at] = '\0';
    }
}

static void on_message(struct mosquitto *client, void *context,
                       const struct mosquitto_message *message) {
    struct link *link = context;
    char json[2048], reason[64], text[400];
    (void)client;
    if (strcmp(message->topic, link->notice_topic) != 0 || message->payloadlen <= 0 ||
        (size_t)message->payloadlen >= sizeof json) {
        return;
    }
    memcpy(json, message->payload, (size_t)message->payloadlen);
    json[message->payloadlen] = '\0';
    json_string(json, "reason", reason, sizeof reason);
    json_string(json, "message", text, sizeof text);
    /* stored: the server says so, no refusal */
    if (strcmp(reason, "sequence_reset") == 0 || strcmp(reason, "sequence_jump") == 0) {
        fprintf(stderr, "zeal-device: server notice: %s\n", text);
    } else if (reason[0] != '\0' && link->refused[0] == '\0') {
        snprintf(link->refused, sizeof link->refused, "%s: %s", reason, text);
    }
}

static unsigned long long read_sequence(const char *path) {
    unsigned long long next = 0;
    FILE *file = path == NULL ? NULL : fopen(path, "r");
    if (file != NULL) {
        if (fscanf(file, "%llu", &next) != 1) {
            next = 0;
        }
        fclose(file);
    }
    return next;
}

/* Write the next sequence number: to a temporary file renamed over the old one. */
static int write_sequence(const char *path, unsigned long long next) {
    char temporary[1024];
    FILE *file;
    if (path == NULL) {
        return 1;
    }
    snprintf(temporary, sizeof temporary, "%s.tmp", path);
    file = fopen(temporary, "w");
    if (file == NULL || fprintf(file, "%llu\n", next) < 0 || fclose(file) != 0) {
        return 0;
    }
    return rename(temporary, path) == 0;
}

static int os_random(void *context, uint64_t *words, size_t n) {
    size_t got = 0;
    (void)context;
    while (got < n * sizeof *words) {
        ssize_t r = getrandom((char *)words + got, n * sizeof *words - got, 0);
        if (r < 0) {
            if (errno == EINTR) {
                continue;
            }
            return 1;
        }
        got += (size_t)r;
    }
    return 0;
}

static void on_connect(struct mosquitto *client, void *context, int code) {
    struct link *link = context;
    link->connected = code == 0;
    if (code == 0) {
        mosquitto_subscribe(client, NULL, link->notice_topic, 1);
    }
    if (code != 0) {
        fprintf(stderr, "zeal-device: the broker refused the connection: %s\n",
                mosquitto_connack_string(code));
    }
}

static void on_disconnect(struct mosquitto *client, void *context, int code) {
    struct link *link = context;
    (void)client;
    (void)code;
    link->connected = 0;
}

static void on_publish(struct mosquitto *client, void *context, int mid) {
    struct link *link = context;
    (void)client;
    if (mid == link->mid) {
        link->acked = 1;
    }
}

static int parse(int argc, char **argv, struct options *o) {
    int i;
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 1883;
    o->batch = 10;
    o->linger = 5;
    for (i = 1; i + 1 < argc; i += 2) {
        const char *key = argv[i], *value = argv[i + 1];
        if (strcmp(key, "--profile") == 0) {
            o->profile = value;
        } else if (strcmp(key, "--stream") == 0) {
            o->stream = value;
        } else if (strcmp(key, "--device") == 0) {
            o->device = value;
        } else if (strcmp(key, "--csv") == 0) {
            o->csv = value;
        } else if (strcmp(key, "--broker") == 0) {
            if (!broker_url(value, o)) {
                return 0;
            }
        } else if (strcmp(key, "--host") == 0) {
            fprintf(stderr, "zeal-device: --host is now --broker mqtt://HOST:PORT; the old name "
                            "goes in the next release\n");
            o->host = value;
        } else if (strcmp(key, "--port") == 0) {
            fprintf(stderr, "zeal-device: --port is now --broker mqtt://HOST:PORT; the old name "
                            "goes in the next release\n");
            o->port = atoi(value);
        } else if (strcmp(key, "--username") == 0) {
            o->username = value;
        } else if (strcmp(key, "--password") == 0) {
            o->password = value;
        } else if (strcmp(key, "--ca") == 0) {
            o->ca = value;
        } else if (strcmp(key, "--cert") == 0) {
            o->cert = value;
        } else if (strcmp(key, "--key") == 0) {
            o->key = value;
        } else if (strcmp(key, "--batch") == 0) {
            o->batch = atoi(value);
        } else if (strcmp(key, "--log") == 0) {
            o->log = value;
        } else if (strcmp(key, "--sequence-file") == 0) {
            o->sequence_file = value;
        } else if (strcmp(key, "--linger") == 0) {
            o->linger = atoi(value);
        } else {
            return 0;
        }
    }
    if (i == argc && (o->ca || o->cert || o->key) && !o->tls) {
        fprintf(stderr, "zeal-device: --ca, --cert and --key need --broker mqtts://\n");
        return 0;
    }
    if (i == argc && o->tls && (!o->ca || !o->cert != !o->key)) {
        fprintf(stderr, "zeal-device: mqtts:// needs --ca, and --cert with --key or neither\n");
        return 0;
    }
    return i == argc && o->profile && o->stream && o->device && o->csv && o->batch >= 1 &&
           o->batch <= MAX_BATCH && o->port > 0 && o->linger >= 0;
}

static int load_profile(const char *hex, zeal_profile *profile, double *unit) {
    uint8_t blob[ZEAL_PROFILE_BYTES];
    uint64_t bits = 0;
    size_t i;
    int status;
    if (strlen(hex) != 2 * ZEAL_PROFILE_BYTES) {
        return ZEAL_E_PROFILE_LENGTH;
    }
    for (i = 0; i < ZEAL_PROFILE_BYTES; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) {
            return ZEAL_E_PROFILE_LENGTH;
        }
        blob[i] = (uint8_t)v;
    }
    status = zeal_profile_load(profile, blob, sizeof blob);
    for (i = 0; i < 8; i++) { /* the reading unit, bytes 88..95 (little-endian binary64) */
        bits |= (uint64_t)blob[88 + i] << (8 * i);
    }
    memcpy(unit, &bits, sizeof *unit);
    return status;
}

/* Publish one batch and wait for its PUBACK, reconnecting and resending the same bytes. */
static int deliver(struct link *link, const char *topic, const uint8_t *payload, size_t n) {
    time_t deadline = time(NULL) + 60;
    link->acked = 0;
    link->mid = -1;
    while (!link->acked && time(NULL) < deadline) {
        if (!link->connected) {
            if (mosquitto_reconnect(link->client) != MOSQ_ERR_SUCCESS) {
                struct timespec pause = {0, 200000000};
                nanosleep(&pause, NULL);
                continue;
            }
            while (!link->connected && time(NULL) < deadline) {
                if (mosquitto_loop(link->client, 100, 1) != MOSQ_ERR_SUCCESS) {
                    break;
                }
            }
            link->mid = -1;
        }
        if (link->connected && link->mid < 0 &&
            mosquitto_publish(link->client, &link->mid, topic, (int)n, payload, 1, false) !=
                MOSQ_ERR_SUCCESS) {
            link->mid = -1;
        }
        if (mosquitto_loop(link->client, 100, 1) != MOSQ_ERR_SUCCESS) {
            link->connected = 0;
        }
    }
    return link->acked;
}

int main(int argc, char **argv) {
    static uint64_t stamps[MAX_BATCH];
    static uint32_t codes[MAX_BATCH];
    static uint8_t payload[MAX_BATCH * 12 + 64];
    struct options o;
    struct link link = {NULL, 0, 0, -1, NULL, ""};
    zeal_profile profile;
    double unit;
    char topic[512], notice[512], line[256];
    FILE *csv, *log = NULL;
    uint64_t sequence;
    size_t held = 0, length;
    int status, ok = 1, eof = 0;
    if (!parse(argc, argv, &o)) {
        fprintf(stderr, "usage: zeal-device --profile HEX --stream NAME --device NAME --csv FILE "
                        "[--broker mqtt://HOST:PORT] [--username U --password P] [--batch N] "
                        "[--log FILE] [--sequence-file FILE] [--linger SECONDS]\n");
        return 2;
    }
    status = load_profile(o.profile, &profile, &unit);
    if (status != ZEAL_OK) {
        fprintf(stderr, "zeal-device: profile refused (error %d)\n", status);
        return 2;
    }
    snprintf(topic, sizeof topic, "zeal/v1/%s/%s/up", o.stream, o.device);
    snprintf(notice, sizeof notice, "zeal/v1/%s/%s/notice", o.stream, o.device);
    link.notice_topic = notice;
    sequence = read_sequence(o.sequence_file);
    csv = fopen(o.csv, "r");
    if (csv == NULL || (o.log != NULL && (log = fopen(o.log, "w")) == NULL)) {
        fprintf(stderr, "zeal-device: cannot open %s\n", csv == NULL ? o.csv : o.log);
        return 1;
    }
    mosquitto_lib_init();
    /* A client id belongs to its login on a Zeal broker (deploy/mosquitto's plugin). */
    link.client = mosquitto_new(o.username != NULL ? o.username : o.device, true, &link);
    mosquitto_connect_callback_set(link.client, on_connect);
    mosquitto_disconnect_callback_set(link.client, on_disconnect);
    mosquitto_publish_callback_set(link.client, on_publish);
    mosquitto_message_callback_set(link.client, on_message);
    if (o.username != NULL) {
        mosquitto_username_pw_set(link.client, o.username, o.password);
    }
    /* The broker's certificate and host name checked against --ca; a client certificate
     * when given (its key stays in the file: it never leaves the device). */
    if (o.tls && mosquitto_tls_set(link.client, o.ca, NULL, o.cert, o.key, NULL) != MOSQ_ERR_SUCCESS) {
        fprintf(stderr, "zeal-device: cannot use the TLS files (--ca, --cert, --key)\n");
        return 2;
    }
    if (mosquitto_connect(link.client, o.host, o.port, 30) != MOSQ_ERR_SUCCESS) {
        fprintf(stderr, "zeal-device: cannot reach the broker at %s:%d\n", o.host, o.port);
        return 1;
    }
    while (ok && !eof && link.refused[0] == '\0') {
        unsigned long long stamp;
        double value;
        eof = fgets(line, sizeof line, csv) == NULL;
        if (!eof && sscanf(line, "%llu,%lf", &stamp, &value) == 2) {
            double units = value / unit;
            int32_t reading = units > 2147483647.0    ? INT32_MAX
                              : units < -2147483648.0 ? INT32_MIN
                                                      : (int32_t)lround(units);
            stamps[held] = stamp;
            if (zeal_perturb(&profile, reading, os_random, NULL, &codes[held]) != ZEAL_OK) {
                fprintf(stderr, "zeal-device: the random source failed\n");
                ok = 0;
                break;
            }
            held++;
        }
        if (held == (size_t)o.batch || (eof && held > 0)) {
            size_t i;
            status = zeal_encode_batch(&profile, sequence, stamps, codes, held, payload,
                                       sizeof payload, &length);
            if (status != ZEAL_OK) {
                fprintf(stderr, "zeal-device: batch %llu not encoded (error %d)\n",
                        (unsigned long long)sequence, status);
                ok = 0;
                break;
            }
            if (!deliver(&link, topic, payload, length)) {
                fprintf(stderr, "zeal-device: batch %llu not acknowledged within 60 s\n",
                        (unsigned long long)sequence);
                ok = 0;
                break;
            }
            for (i = 0; log != NULL && i < held; i++) {
                fprintf(log, "%llu %lu\n", (unsigned long long)stamps[i], (unsigned long)codes[i]);
            }
            printf("batch %llu: %zu readings, %zu bytes, acknowledged\n",
                   (unsigned long long)sequence, held, length);
            sequence++;
            held = 0;
            if (!write_sequence(o.sequence_file, sequence)) {
                fprintf(stderr, "zeal-device: cannot write %s\n", o.sequence_file);
                ok = 0;
            }
        }
    }
    if (ok) { /* a refusal of the last batches arrives after their PUBACK */
        time_t deadline = time(NULL) + o.linger;
        while (link.refused[0] == '\0' && time(NULL) < deadline &&
               mosquitto_loop(link.client, 100, 1) == MOSQ_ERR_SUCCESS) {
        }
    }
    mosquitto_disconnect(link.client);
    mosquitto_destroy(link.client);
    mosquitto_lib_cleanup();
    fclose(csv);
    if (log != NULL) {
        fclose(log);
    }
    if (link.refused[0] != '\0') {
        fprintf(stderr, "zeal-device: the server refused a batch: %s\n", link.refused);
        return 3;
    }
    return ok ? 0 : 1;
}
