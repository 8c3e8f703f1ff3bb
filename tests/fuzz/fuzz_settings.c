/* Fuzz target for the daemons' config-file reader (runtime/settings.h) with the store node's,
 * the master's and the proxy's tables. Built with libFuzzer (KVEDGE_FUZZ=ON, clang) it fuzzes;
 * built normally it replays the committed corpus. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/settings.h"
#include "proxy/settings.h"
#include "access/codec/error.h"
#include "store/master/settings.h"
#include "store/node/node.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One table: a refused text leaves a reason and the settings untouched (all or nothing); an
 * accepted one prints (--check-config) to a text that loads back to the same settings. */
static void s_one(const kvedge_settings_table_t *t, const uint8_t *data, size_t size)
{
    size_t n = t->struct_size;
    uint8_t *s = malloc(n), *before = malloc(n), *again = malloc(n);
    if (!s || !before || !again)
        abort();
    kvedge_settings_defaults(t, s);
    memcpy(before, s, n);
    char why[512] = "";
    int rc =
        kvedge_settings_load_text(t, s, "fuzz.conf", (const char *)data, size, why, sizeof why);
    if (rc != KVEDGE_OK) {
        if (why[0] == '\0' || strncmp(why, "fuzz.conf", 9) != 0 || memcmp(s, before, n) != 0)
            abort();
    } else {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (!f)
            abort();
        kvedge_settings_print(t, s, f);
        fclose(f);
        kvedge_settings_defaults(t, again);
        if (kvedge_settings_load_text(t, again, "printed", text, len, why, sizeof why) !=
                KVEDGE_OK ||
            memcmp(s, again, n) != 0)
            abort();
        free(text);
    }
    free(again);
    free(before);
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    s_one(&kvedge_node_settings_table, data, size);
    s_one(&kvedge_master_settings_table, data, size);
    s_one(&kvedge_proxy_settings_table, data, size);
    return 0;
}
