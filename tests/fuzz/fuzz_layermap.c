/* Fuzz target for the layer-map reader (clients/e2e/layermap.h): map files come from disk and, once
 * registered, from the master. A refused file leaves a "PATH:LINE: reason" and a zeroed map;
 * an accepted one passes the checker, and written back it reads back the same. Built with
 * libFuzzer (KVEDGE_FUZZ=ON, clang) it fuzzes; built normally it replays the committed
 * corpus. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "clients/e2e/layermap.h"
#include "access/codec/error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An in-memory file holding len bytes; its /proc path in path. */
static int s_memfile(const void *bytes, size_t len, char *path, size_t cap)
{
    int fd = memfd_create("layermap", 0);
    if (fd < 0 || (len && write(fd, bytes, len) != (ssize_t)len))
        abort();
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

static int s_all_zero(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], why[512] = "";
    int fd = s_memfile(data, size, path, sizeof path);
    kvedge_layermap_t map;
    int rc = kvedge_layermap_read(path, &map, why, sizeof why);
    close(fd);
    if (rc != KVEDGE_OK) {
        if (why[0] == '\0' || !s_all_zero(&map, sizeof map))
            abort();
        return 0;
    }
    char cwhy[256];
    if (kvedge_layermap_check(&map, cwhy, sizeof cwhy) != KVEDGE_OK)
        abort();
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f || kvedge_layermap_write(f, &map) != KVEDGE_OK)
        abort();
    fclose(f);
    fd = s_memfile(text, len, path, sizeof path);
    kvedge_layermap_t again;
    if (kvedge_layermap_read(path, &again, why, sizeof why) != KVEDGE_OK)
        abort();
    close(fd);
    if (again.cloud_layers != map.cloud_layers || again.edge_layers != map.edge_layers ||
        strcmp(again.cloud_id, map.cloud_id) != 0 || strcmp(again.edge_id, map.edge_id) != 0)
        abort();
    free(text);
    kvedge_layermap_clear(&again);
    kvedge_layermap_clear(&map);
    return 0;
}
