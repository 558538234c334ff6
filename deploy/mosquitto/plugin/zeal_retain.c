/*
 * zeal_retain: what a client may leave retained on a Zeal broker, and who published a batch
 * (Mosquitto 2.0 plugin).
 *
 * Mosquitto 2.0 can refuse the retain flag only for the whole broker, and configurations
 * and presence must be retained. So one device login could leave a retained 100 KB message
 * on its own data topic, or its presence topic under any stream name it invents, again and
 * again: 2,000 of them held 195 MB of the broker's memory and of mosquitto.db. The ACL's
 * patterns (zeal/v1/+/%u/presence) cannot stop it: `+` matches any level, an empty one or
 * one of a thousand characters. So under zeal/ this plugin places every retained message
 * (publishes and Last Wills alike, in the broker's access check) and lets through only:
 *
 *   - a stream's configuration, zeal/v1/{stream}/config, of at most MAX_CONFIG bytes;
 *   - a device's presence, zeal/v1/{stream}/{device}/presence, of at most MAX_PRESENCE
 *     bytes, under a stream that has a configuration on the broker (once one has been
 *     seen since the broker started: the collector retains every stream's configuration
 *     again when it connects);
 *
 * where {stream} and {device} are Zeal names (1 to 64 of A-Z a-z 0-9 _ . -, starting with a
 * letter or digit: zeal.protocol.NAME_PATTERN). Every other retained message under zeal/ is
 * refused: on a data topic, on a notice topic, and on any topic it cannot place (an empty
 * level, an over-long one, a name with other characters, more or fewer levels, another
 * version). An empty retained message (it clears one and stores nothing) is refused only
 * on a data topic. What passes, and retained messages outside zeal/, are left to the
 * other access checks (the password file's ACL, the dynamic security plugin): the plugin
 * answers "defer". It must come first in mosquitto.conf, before the dynamic security
 * plugin, so that its refusals are heard. The streams with a configuration are learnt from
 * the messages the broker accepts on zeal/v1/{stream}/config (an empty one withdraws it).
 *
 * It also binds client ids to logins (in the broker's password check, before the other
 * plugins and the password file): a client id belongs to its login, the login itself or
 * the login, a colon and anything (`kitchen-1`, `kitchen-1:temps:3f2a`, `zeal-collector:
 * host-7c1d`); a connection asking for another login's id is refused ("not authorized").
 * So no device can take over the collector's persistent session (or another device's),
 * and the collector keeps its own id, which another connection under its login does not
 * land on by accident (Mosquitto's use_username_as_clientid, which this replaces, made
 * every connection of a login share the one session named after it, and a clean start by
 * any of them wiped the collector's queue). Neither a login nor a Zeal name holds a colon.
 *
 * And it names who published each device's batch: every message the broker accepts on a
 * data topic, zeal/v1/{stream}/{device}/up, gets the MQTT v5 user property zeal-login with
 * the publisher's login, which the collector reads (ZEAL_MQTT_LOGIN_PROPERTY=zeal-login) so
 * that a device's privacy cap is spent only by that device's own login, not by another
 * login that may publish under its name (the fleet simulator's). A publish that carries a
 * zeal-login property of its own is refused ("not authorized"): no client can pass for
 * another.
 *
 * And it keeps the logins named by `plugin_opt_certificate_only` (space-separated: the
 * collectors') off every password listener: the broker checks a password only on listeners
 * that do not take the login from a client certificate, and there this plugin refuses those
 * logins, with any password. So whoever holds the collector's password and client id (both
 * in deploy/.env) cannot connect as the collector, nor take its session: only the holder of
 * its certificate can, on the certificate listener.
 *
 * Build: make -C deploy/mosquitto/plugin (needs the mosquitto-dev headers, 2.0.x).
 */
#define _POSIX_C_SOURCE 200809L /* strdup, strtok_r under -std=c11 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>
#include <mqtt_protocol.h>

#define MAX_PRESENCE 1024
#define MAX_CONFIG 4096
#define MAX_NAME 64
#define LOGIN_PROPERTY "zeal-login"

static mosquitto_plugin_id_t *plugin_id = NULL;
static char (*streams)[MAX_NAME + 1] = NULL;
static size_t stream_count = 0, stream_room = 0;
static bool configured = false;
/* Logins that may connect only with a client certificate (plugin_opt_certificate_only). */
#define MAX_CERTIFICATE_ONLY 16
static char *certificate_only[MAX_CERTIFICATE_ONLY];
static size_t certificate_only_count = 0;

/* Where a topic stands: outside zeal/, or under it a configuration, a presence, a data
 * topic, or somewhere no Zeal client writes. */
enum place { OUTSIDE, CONFIG, PRESENCE, DATA, UNPLACED };

/* A Zeal name: 1 to MAX_NAME of A-Z a-z 0-9 _ . -, the first a letter or digit. */
static bool is_name(const char *start, size_t length)
{
    if (length == 0 || length > MAX_NAME) {
        return false;
    }
    for (size_t i = 0; i < length; i++) {
        char c = start[i];
        bool alnum = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (!alnum && (i == 0 || (c != '_' && c != '.' && c != '-'))) {
            return false;
        }
    }
    return true;
}

/* Place `topic`; for a configuration or a presence, its stream name goes to `stream`. */
static enum place place(const char *topic, char stream[MAX_NAME + 1])
{
    if (strncmp(topic, "zeal/", 5) != 0) {
        return OUTSIDE;
    }
    if (strncmp(topic, "zeal/v1/", 8) != 0) {
        return UNPLACED;
    }
    const char *level[3];
    size_t length[3], levels = 0;
    const char *start = topic + 8;
    for (;;) {
        const char *slash = strchr(start, '/');
        size_t n = slash ? (size_t)(slash - start) : strlen(start);
        if (levels == 3) {
            return UNPLACED; /* a fourth level below zeal/v1/ */
        }
        level[levels] = start;
        length[levels++] = n;
        if (slash == NULL) {
            break;
        }
        start = slash + 1;
    }
    if (levels < 2 || !is_name(level[0], length[0])) {
        return UNPLACED;
    }
    const char *kind = level[levels - 1];
    size_t kind_length = length[levels - 1];
    enum place found = UNPLACED;
    if (levels == 2 && kind_length == 6 && strncmp(kind, "config", 6) == 0) {
        found = CONFIG;
    } else if (levels == 3 && is_name(level[1], length[1])) {
        if (kind_length == 8 && strncmp(kind, "presence", 8) == 0) {
            found = PRESENCE;
        } else if (kind_length == 2 && strncmp(kind, "up", 2) == 0) {
            found = DATA;
        }
    }
    memcpy(stream, level[0], length[0]);
    stream[length[0]] = '\0';
    return found;
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

static int refuse(const char *what, const struct mosquitto_evt_acl_check *ed)
{
    mosquitto_log_printf(MOSQ_LOG_NOTICE, "zeal_retain: refused a retained %s of %u bytes on %.80s",
                         what, (unsigned)ed->payloadlen, ed->topic);
    return MOSQ_ERR_ACL_DENIED;
}

static int on_acl_check(int event, void *event_data, void *userdata)
{
    (void)event;
    (void)userdata;
    struct mosquitto_evt_acl_check *ed = event_data;
    char stream[MAX_NAME + 1];
    if (ed->access != MOSQ_ACL_WRITE || !ed->retain || ed->topic == NULL) {
        return MOSQ_ERR_PLUGIN_DEFER;
    }
    enum place where = place(ed->topic, stream);
    if (where == OUTSIDE) {
        return MOSQ_ERR_PLUGIN_DEFER;
    }
    if (where == DATA) {
        return refuse("message on a data topic", ed);
    }
    if (ed->payloadlen == 0) {
        return MOSQ_ERR_PLUGIN_DEFER; /* clears a retained message: stores nothing */
    }
    switch (where) {
    case CONFIG:
        return ed->payloadlen > MAX_CONFIG ? refuse("configuration", ed) : MOSQ_ERR_PLUGIN_DEFER;
    case PRESENCE:
        if (ed->payloadlen > MAX_PRESENCE || (configured && !known(stream))) {
            return refuse("presence", ed);
        }
        return MOSQ_ERR_PLUGIN_DEFER;
    default:
        return refuse("message on a topic no Zeal client retains", ed);
    }
}

/* Whether the properties hold a user property named LOGIN_PROPERTY. */
static bool names_a_login(const mosquitto_property *properties)
{
    const mosquitto_property *at = properties;
    bool skip = false;
    for (;;) {
        char *name = NULL, *value = NULL;
        at = mosquitto_property_read_string_pair(at, MQTT_PROP_USER_PROPERTY, &name, &value, skip);
        if (at == NULL) {
            return false;
        }
        bool found = name != NULL && strcmp(name, LOGIN_PROPERTY) == 0;
        mosquitto_free(name);
        mosquitto_free(value);
        if (found) {
            return true;
        }
        skip = true;
    }
}

static int on_message(int event, void *event_data, void *userdata)
{
    (void)event;
    (void)userdata;
    struct mosquitto_evt_message *ed = event_data;
    char stream[MAX_NAME + 1];
    if (ed->topic == NULL) {
        return MOSQ_ERR_SUCCESS;
    }
    enum place where = place(ed->topic, stream);
    if (where == CONFIG) {
        configured = true;
        remember(stream, ed->payloadlen > 0);
    } else if (where == DATA) {
        if (names_a_login(ed->properties)) {
            mosquitto_log_printf(MOSQ_LOG_NOTICE,
                                 "zeal_retain: refused a batch on %.80s naming a login of its own",
                                 ed->topic);
            return MOSQ_ERR_ACL_DENIED;
        }
        const char *login = mosquitto_client_username(ed->client);
        if (login != NULL &&
            mosquitto_property_add_string_pair(&ed->properties, MQTT_PROP_USER_PROPERTY,
                                               LOGIN_PROPERTY, login) != MOSQ_ERR_SUCCESS) {
            return MOSQ_ERR_NOMEM;
        }
    }
    return MOSQ_ERR_SUCCESS;
}

/* A client id belongs to its login: the login itself, or the login, ':' and more. */
static int on_basic_auth(int event, void *event_data, void *userdata)
{
    (void)event;
    (void)userdata;
    struct mosquitto_evt_basic_auth *ed = event_data;
    const char *id = mosquitto_client_id(ed->client);
    if (ed->username == NULL) {
        return MOSQ_ERR_PLUGIN_DEFER; /* anonymous: the broker's own rules decide */
    }
    /* The broker asks for a password check only on listeners that do not take the login
     * from a certificate: a certificate-only login is refused here, password or not. */
    for (size_t i = 0; i < certificate_only_count; i++) {
        if (strcmp(ed->username, certificate_only[i]) == 0) {
            mosquitto_log_printf(MOSQ_LOG_NOTICE,
                                 "zeal_retain: refused login %.64s with a password (it may "
                                 "connect only with its client certificate)",
                                 ed->username);
            return MOSQ_ERR_AUTH;
        }
    }
    size_t n = strlen(ed->username);
    if (id != NULL && strncmp(id, ed->username, n) == 0 && (id[n] == '\0' || id[n] == ':')) {
        return MOSQ_ERR_PLUGIN_DEFER; /* the password is checked by the next in line */
    }
    mosquitto_log_printf(MOSQ_LOG_NOTICE,
                         "zeal_retain: refused login %.64s asking for client id %.80s (a client "
                         "id must be its login, or its login, ':' and more)",
                         ed->username, id ? id : "");
    return MOSQ_ERR_AUTH;
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
    plugin_id = identifier;
    for (int i = 0; i < option_count; i++) {
        if (strcmp(options[i].key, "certificate_only") != 0) {
            continue;
        }
        /* Space-separated logins. */
        char *copy = strdup(options[i].value), *save = NULL;
        if (copy == NULL) {
            return MOSQ_ERR_NOMEM;
        }
        for (char *login = strtok_r(copy, " ", &save); login != NULL;
             login = strtok_r(NULL, " ", &save)) {
            if (certificate_only_count == MAX_CERTIFICATE_ONLY) {
                mosquitto_log_printf(MOSQ_LOG_ERR, "zeal_retain: at most %d certificate_only logins",
                                     MAX_CERTIFICATE_ONLY);
                free(copy);
                return MOSQ_ERR_INVAL;
            }
            certificate_only[certificate_only_count] = strdup(login);
            if (certificate_only[certificate_only_count++] == NULL) {
                free(copy);
                return MOSQ_ERR_NOMEM;
            }
        }
        free(copy);
    }
    int rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL, NULL);
    if (rc == MOSQ_ERR_SUCCESS) {
        rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_MESSAGE, on_message, NULL, NULL);
    }
    if (rc == MOSQ_ERR_SUCCESS) {
        rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL,
                                         NULL);
    }
    return rc;
}

int mosquitto_plugin_cleanup(void *userdata, struct mosquitto_opt *options, int option_count)
{
    (void)userdata;
    (void)options;
    (void)option_count;
    for (size_t i = 0; i < certificate_only_count; i++) {
        free(certificate_only[i]);
    }
    certificate_only_count = 0;
    mosquitto_callback_unregister(plugin_id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL);
    mosquitto_callback_unregister(plugin_id, MOSQ_EVT_MESSAGE, on_message, NULL);
    mosquitto_callback_unregister(plugin_id, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL);
    free(streams);
    streams = NULL;
    stream_count = stream_room = 0;
    return MOSQ_ERR_SUCCESS;
}
