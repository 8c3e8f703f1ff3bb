/* A program built the way a user builds one: against the installed <kvedge/kvedge.h> and
 * libkvedge.so found through pkg-config. Pings a store node once and prints the round trip.
 * usage: ping ENDPOINT (plaintext). Exit 0 on success, 1 on any failure. */
#include <stdio.h>
#include <string.h>

#include <kvedge/kvedge.h>

#define S_STR2(x) #x
#define S_STR(x)  S_STR2(x)
#define S_HEADER_VERSION                                                                           \
    S_STR(KVEDGE_VERSION_MAJOR) "." S_STR(KVEDGE_VERSION_MINOR) "." S_STR(KVEDGE_VERSION_PATCH)

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s ENDPOINT\n", argv[0]);
        return 1;
    }
    /* The library linked at run time is the one these headers describe. */
    if (strcmp(kvedge_version(), S_HEADER_VERSION) != 0) {
        fprintf(stderr, "ping: library %s, headers %s\n", kvedge_version(), S_HEADER_VERSION);
        return 1;
    }
    if (kvedge_version_number() != KVEDGE_VERSION_NUMBER ||
        KVEDGE_VERSION_NUMBER !=
            KVEDGE_VERSION_MAJOR * 10000 + KVEDGE_VERSION_MINOR * 100 + KVEDGE_VERSION_PATCH) {
        fprintf(stderr, "ping: library version number %d, headers %d\n", kvedge_version_number(),
                KVEDGE_VERSION_NUMBER);
        return 1;
    }

    kvedge_client_opts_t opts;
    kvedge_client_opts_default(&opts);
    opts.endpoint = argv[1];
    opts.server_key = NULL; /* plaintext: the node runs with --insecure */
    opts.name = "install-test";
    kvedge_client_t *client = NULL;
    int rc = kvedge_client_connect(&opts, &client);
    if (rc != 0) {
        fprintf(stderr, "ping: connect %s: %s (%s)\n", argv[1], kvedge_strerror(rc),
                kvedge_errname(rc));
        return 1;
    }
    double rtt_us = 0;
    rc = kvedge_client_ping(client, 0, &rtt_us, NULL);
    if (rc != 0) {
        fprintf(stderr, "ping: %s (%s)\n", kvedge_strerror(rc), kvedge_errname(rc));
        kvedge_client_destroy(&client);
        return 1;
    }
    const kvedge_node_info_t *node = kvedge_client_node(client);
    printf("libkvedge %s: node \"%s\" role %d rtt_us %.1f\n", kvedge_version(), node->name,
           (int)node->role, rtt_us);
    kvedge_client_destroy(&client);
    return client == NULL ? 0 : 1;
}
