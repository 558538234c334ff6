/*
 * zeal_retain: what a client may leave retained on a Zeal broker (Mosquitto 2.0 plugin).
 *
 * Mosquitto 2.0 can refuse the retain flag only for the whole broker, and configurations
 * and presence must be retained. So one device login could leave a retained 100 KB message
 * on its own data topic, or its presence topic under any stream name it invents, again and
 * again: 2,000 of them held 195 MB of the broker's memory and of mosquitto.db. This
 * plugin refuses, in the broker's access check (publishes and Last Wills alike):
 *
 *   - a retained message on a data topic, zeal/v1/{stream}/{device}/up;
 *   - a retained presence, zeal/v1/{stream}/{device}/presence, larger than MAX_PRESENCE
 *     bytes, or under a stream that has no configuration on the broker (once one has
 *     been seen since the broker started: the collector retains every stream's
 *     configuration again when it connects).
 *
 * Everything else is left to the other access checks (the password file's ACL, the
 * dynamic security plugin): the plugin answers "defer". It must come first in
 * mosquitto.conf, before the dynamic security plugin, so that its refusals are heard.
 * The streams with a configuration are learnt from the messages the broker accepts on
 * zeal/v1/{stream}/config (an empty one withdraws it).
 *
 * Build: make -C deploy/mosquitto/plugin (needs the mosquitto-dev headers, 2.0.x).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>

#define MAX_PRESENCE 1024
#define MAX_NAME 64

static mosquitto_plugin_id_t *plugin_id = NULL;
static char (*streams)[MAX_NAME + 1] = NULL;
static size_t stream_count = 0, stream_room = 0;
static bool configured = false;

/* The stream level and the last level of zeal/v1/{stream}/.../{kind}, or false. */
static bool split(const char *topic, char stream[MAX_NAME + 1], const char **kind, int *levels)
{
    if (strncmp(topic, "zeal/v1/", 8) != 0) {
        return false;
    }
    const char *start = topic + 8;
    const char *slash = strchr(start, '/');
    if (slash == NULL || slash == start || (size_t)(slash - start) > MAX_NAME) {
        return false;
    }
    memcpy(stream, start, (size_t)(slash - start));
    stream[slash - start] = '\0';
    *levels = 3;
    const char *last = slash + 1;
    for (const char *p = slash; *p != '\0'; p++) {
        if (*p == '/') {
            (*levels)++;
            last = p + 1;
        }
    }
    *kind = last;
    return true;
}

static bool known(const char *stream)
{
    for (size_t i = 0; i < stream_count; i++) {
        if (strcmp(streams[i], stream) == 0) {
            return true;
        }
    }
    return false;
}

static void remember(const char *stream, bool present)
{
    for (size_t i = 0; i < stream_count; i++) {
        if (strcmp(streams[i], stream) == 0) {
            if (!present) {
                memcpy(streams[i], streams[stream_count - 1], MAX_NAME + 1);
                stream_count--;
            }
            return;
        }
    }
    if (!present) {
        return;
    }
    if (stream_count == stream_room) {
        size_t room = stream_room ? 2 * stream_room : 64;
        void *grown = realloc(streams, room * sizeof(*streams));
        if (grown == NULL) {
            return;
        }
        streams = grown;
        stream_room = room;
    }
    strcpy(streams[stream_count++], stream);
}

static int on_acl_check(int event, void *event_data, void *userdata)
{
    (void)event;
    (void)userdata;
    struct mosquitto_evt_acl_check *ed = event_data;
    char stream[MAX_NAME + 1];
    const char *kind;
    int levels;
    if (ed->access != MOSQ_ACL_WRITE || !ed->retain || ed->topic == NULL
        || !split(ed->topic, stream, &kind, &levels) || levels != 5) {
        return MOSQ_ERR_PLUGIN_DEFER;
    }
    if (strcmp(kind, "up") == 0) {
        mosquitto_log_printf(MOSQ_LOG_NOTICE, "zeal_retain: refused a retained message on %s",
                             ed->topic);
        return MOSQ_ERR_ACL_DENIED;
    }
    if (strcmp(kind, "presence") == 0 && ed->payloadlen > 0
        && (ed->payloadlen > MAX_PRESENCE || (configured && !known(stream)))) {
        mosquitto_log_printf(MOSQ_LOG_NOTICE,
                             "zeal_retain: refused a retained presence of %u bytes on %s",
                             (unsigned)ed->payloadlen, ed->topic);
        return MOSQ_ERR_ACL_DENIED;
    }
    return MOSQ_ERR_PLUGIN_DEFER;
}

static int on_message(int event, void *event_data, void *userdata)
{
    (void)event;
    (void)userdata;
    struct mosquitto_evt_message *ed = event_data;
    char stream[MAX_NAME + 1];
    const char *kind;
    int levels;
    if (ed->topic != NULL && split(ed->topic, stream, &kind, &levels) && levels == 4
        && strcmp(kind, "config") == 0) {
        configured = true;
        remember(stream, ed->payloadlen > 0);
    }
    return MOSQ_ERR_SUCCESS;
}

int mosquitto_plugin_version(int supported_version_count, const int *supported_versions)
{
    for (int i = 0; i < supported_version_count; i++) {
        if (supported_versions[i] == 5) {
            return 5;
        }
    }
    return -1;
}

int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **userdata,
                          struct mosquitto_opt *options, int option_count)
{
    (void)userdata;
    (void)options;
    (void)option_count;
    plugin_id = identifier;
    int rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL, NULL);
    if (rc == MOSQ_ERR_SUCCESS) {
        rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_MESSAGE, on_message, NULL, NULL);
    }
    return rc;
}

int mosquitto_plugin_cleanup(void *userdata, struct mosquitto_opt *options, int option_count)
{
    (void)userdata;
    (void)options;
    (void)option_count;
    mosquitto_callback_unregister(plugin_id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL);
    mosquitto_callback_unregister(plugin_id, MOSQ_EVT_MESSAGE, on_message, NULL);
    free(streams);
    streams = NULL;
    stream_count = stream_room = 0;
    return MOSQ_ERR_SUCCESS;
}
