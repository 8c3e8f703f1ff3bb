/* Replays every file of a corpus directory through a fuzz target: the ctest form of a
 * fuzzer, so the corpus is a regression suite on machines without libFuzzer. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    DIR *d = opendir(argv[1]);
    if (!d) {
        perror(argv[1]);
        return 1;
    }
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        uint8_t *buf = NULL;
        size_t len = 0, cap = 0, got;
        uint8_t chunk[65536];
        while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
            if (len + got > cap) {
                cap = (len + got) * 2;
                uint8_t *nb = realloc(buf, cap);
                if (!nb) {
                    free(buf);
                    fclose(f);
                    closedir(d);
                    return 1;
                }
                buf = nb;
            }
            memcpy(buf + len, chunk, got);
            len += got;
        }
        fclose(f);
        LLVMFuzzerTestOneInput(buf ? buf : (const uint8_t *)"", len);
        free(buf);
        n++;
    }
    closedir(d);
    if (n == 0) {
        fprintf(stderr, "no corpus files in %s\n", argv[1]);
        return 1;
    }
    printf("replayed %d inputs\n%d passed, 0 failed\n", n, n);
    return 0;
}
