/* Disk space: every write admitted against the free space of the store's file system before
 * RocksDB sees it, a reserve file given back when the disk fills, and write-buffer bounds that
 * keep the WAL and the memtables (what a flush must write out again) small beside the disk.
 *
 * Why: a RocksDB write that fails for want of space stops every later write (its background
 * error), and Debian's librocksdb, built with assertions, aborts when a writer that failed is
 * used again (a flush on close). So the engine refuses a write that might not fit, with
 * KVEDGE_ENOSPC, and RocksDB never meets a full disk of the engine's making. */
#include "store/engine/engine_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* A batch this small (deletes, index and metadata records) is never refused: it is how space
 * is freed. */
#define S_SMALL_BATCH_BYTES (64u * 1024)
/* Free space kept beyond what a flush of the memtables writes (MANIFEST, OPTIONS, info log,
 * the small families' tables). */
#define S_SLACK_BYTES (2u * 1024 * 1024)
/* The memtables' size is re-read at most this often. */
#define S_MEMTABLE_REFRESH_MS 50
/* Bounds of the blocks family's write buffer. */
#define S_WRITE_BUFFER_MIN_BYTES (1u << 20)
#define S_WRITE_BUFFER_MAX_BYTES (KVEDGE_ENGINE_MEMTABLE_BYTES / 2)
/* The small families' write buffer. */
#define S_SMALL_WRITE_BUFFER_BYTES (1u << 20)
/* Bounds of the reserve file's default size. */
#define S_RESERVE_MIN_BYTES (1u << 20)
#define S_RESERVE_MAX_BYTES (192u << 20)

static uint64_t s_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t s_clamp(uint64_t v, uint64_t lo, uint64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Free bytes for an unprivileged writer, and the file system's size; false when unknown. */
static bool s_statvfs(const char *dir, uint64_t *avail, uint64_t *total)
{
    struct statvfs v;
    if (statvfs(dir, &v) != 0)
        return false;
    *avail = (uint64_t)v.f_bavail * v.f_frsize;
    *total = (uint64_t)v.f_blocks * v.f_frsize;
    return true;
}

void kvedge_engine_disk_bounds(const char *dir, uint64_t capacity, uint64_t *write_buffer,
                               uint64_t *small_write_buffer, uint64_t *wal)
{
    uint64_t avail = 0, total = 0;
    uint64_t basis = capacity;
    bool known = s_statvfs(dir, &avail, &total);
    if (!known) {
        /* A store about to be made: the file system of the directory it goes in. */
        char *parent = strdup(dir);
        char *slash = parent ? strrchr(parent, '/') : NULL;
        if (slash && slash != parent)
            *slash = '\0';
        known = parent && s_statvfs(slash ? parent : ".", &avail, &total);
        free(parent);
    }
    if (known && total && (basis == 0 || total < basis))
        basis = total;
    /* A flush writes the blocks family's memtable out again: a 32nd of what the store may
     * hold, so that even a store filling its disk has room to flush. */
    *write_buffer = basis ? s_clamp(basis / 32, S_WRITE_BUFFER_MIN_BYTES, S_WRITE_BUFFER_MAX_BYTES)
                          : S_WRITE_BUFFER_MAX_BYTES;
    *small_write_buffer = S_SMALL_WRITE_BUFFER_BYTES;
    /* Past this the oldest memtables are flushed, so the WAL cannot outgrow two write buffers
     * (the small families, which rarely fill theirs, no longer hold it back). */
    *wal = 2 * *write_buffer;
}

/* ---------------------------------------------------------------- the reserve file */

static int s_reserve_path(const char *dir, char *out, size_t len)
{
    int n = snprintf(out, len, "%s/" KVEDGE_ENGINE_RESERVE_FILE, dir);
    return n > 0 && (size_t)n < len ? KVEDGE_OK : KVEDGE_EINVAL;
}

/* Makes the reserve file when there is room for it and for a full put besides. */
static void s_reserve_make(kvedge_engine_t *e, uint64_t avail)
{
    if (e->reserve_bytes == 0 || atomic_load(&e->reserve_held) ||
        avail < 2 * e->reserve_bytes + S_SLACK_BYTES)
        return;
    char path[4096];
    if (s_reserve_path(e->dir, path, sizeof path) != KVEDGE_OK)
        return;
    int fd = open(path, O_WRONLY | O_CREAT, 0600);
    if (fd < 0)
        return;
    struct stat st;
    int rc = fstat(fd, &st) == 0 && (uint64_t)st.st_blocks * 512 >= e->reserve_bytes
                 ? 0
                 : posix_fallocate(fd, 0, (off_t)e->reserve_bytes);
    if (rc == 0)
        rc = fsync(fd);
    close(fd);
    if (rc == 0)
        atomic_store(&e->reserve_held, true);
    else
        (void)unlink(path);
}

/* Gives the reserve back to the file system: room for the deletes and flushes that free more. */
void kvedge_engine_disk_release(kvedge_engine_t *e)
{
    bool held = true;
    if (!atomic_compare_exchange_strong(&e->reserve_held, &held, false))
        return;
    char path[4096];
    if (s_reserve_path(e->dir, path, sizeof path) == KVEDGE_OK)
        (void)unlink(path);
    atomic_fetch_add(&e->reserve_releases, 1);
}

/* ---------------------------------------------------------------- admission */

/* Bytes in the memtables (what their flush writes out), re-read at most every 50 ms. */
static uint64_t s_memtables(kvedge_engine_t *e)
{
    uint64_t now = s_mono_ms();
    if (now - atomic_load(&e->memtables_at_ms) < S_MEMTABLE_REFRESH_MS)
        return atomic_load(&e->memtables_bytes);
    uint64_t sum = 0;
    for (size_t i = 0; i < S_CF_COUNT; i++) {
        if (!e->cf[i])
            continue;
        char *v = rocksdb_property_value_cf(e->db, e->cf[i], "rocksdb.cur-size-all-mem-tables");
        if (v) {
            sum += strtoull(v, NULL, 10);
            rocksdb_free(v);
        }
    }
    atomic_store(&e->memtables_bytes, sum);
    atomic_store(&e->memtables_at_ms, now);
    atomic_store(&e->admitted, 0); /* in sum now, or about to be */
    return sum;
}

int kvedge_engine_disk_open(kvedge_engine_t *e, const char *dir)
{
    e->dir = strdup(dir);
    if (!e->dir)
        return KVEDGE_ENOMEM;
    if (e->opts.read_only || e->salvage)
        return KVEDGE_OK;
    uint64_t avail = 0, total = 0;
    bool known = s_statvfs(dir, &avail, &total);
    /* Room for a flush of both the memtables a family may hold, and slack. */
    e->reserve_bytes = e->opts.reserve_bytes == KVEDGE_ENGINE_RESERVE_NONE ? 0
                       : e->opts.reserve_bytes                             ? e->opts.reserve_bytes
                       : known ? s_clamp(2 * e->write_buffer_bytes + S_SLACK_BYTES,
                                         S_RESERVE_MIN_BYTES, S_RESERVE_MAX_BYTES)
                               : 0;
    char path[4096];
    struct stat st;
    if (s_reserve_path(e->dir, path, sizeof path) == KVEDGE_OK && stat(path, &st) == 0)
        atomic_store(&e->reserve_held, true);
    if (known)
        s_reserve_make(e, avail);
    return KVEDGE_OK;
}

void kvedge_engine_disk_before_open(const char *dir)
{
    /* Opening replays the WAL and flushes it: with the disk nearly full (less free than the
     * reserve holds), the reserve makes the room. */
    uint64_t avail = 0, total = 0;
    char path[4096];
    struct stat st;
    if (s_reserve_path(dir, path, sizeof path) == KVEDGE_OK && stat(path, &st) == 0 &&
        s_statvfs(dir, &avail, &total) && avail < (uint64_t)st.st_size + S_SLACK_BYTES)
        (void)unlink(path);
}

bool kvedge_engine_disk_compact(kvedge_engine_t *e, uint64_t min_bytes)
{
    uint64_t pending = atomic_load(&e->uncompacted);
    if (e->opts.read_only || pending == 0 || pending < min_bytes ||
        !atomic_compare_exchange_strong(&e->uncompacted, &pending, 0))
        return false;
    rocksdb_compact_range_cf(e->db, e->cf[S_CF_BLOCKS], NULL, 0, NULL, 0);
    atomic_fetch_add(&e->disk_compactions, 1);
    return true;
}

int kvedge_engine_disk_admit(kvedge_engine_t *e, size_t n)
{
    if (e->opts.read_only || !e->dir)
        return KVEDGE_OK;
    uint64_t avail = 0, total = 0;
    if (!s_statvfs(e->dir, &avail, &total))
        return KVEDGE_OK; /* unknown: RocksDB's own error will say */
    uint64_t mem = s_memtables(e);
    /* When the next flush might not fit (another writer took the space), the reserve makes
     * room for it and for the deletes that free more. */
    if (avail < mem + n + S_SLACK_BYTES)
        kvedge_engine_disk_release(e);
    if (n <= S_SMALL_BATCH_BYTES)
        return KVEDGE_OK; /* deletes and records always go */
    /* The batch in the WAL, then in the memtable's flush beside what is there already and what
     * other writers were let in since the memtables were last read (this one included). */
    uint64_t pending = atomic_fetch_add(&e->admitted, n) + n;
    uint64_t need = (uint64_t)n + mem + pending + S_SLACK_BYTES;
    if (avail >= need) {
        atomic_store(&e->disk_full, false);
        s_reserve_make(e, avail); /* again, once the disk has room for it */
        return KVEDGE_OK;
    }
    /* Deletes and evictions leave their blocks in blob files until a compaction drops the
     * references: compact the blocks' index (small: blob references only) and look again, when
     * anything was deleted since the last. */
    if (kvedge_engine_disk_compact(e, 1) && s_statvfs(e->dir, &avail, &total) && avail >= need) {
        atomic_store(&e->disk_full, false);
        return KVEDGE_OK;
    }
    atomic_fetch_sub(&e->admitted, n);
    atomic_store(&e->disk_full, true);
    atomic_fetch_add(&e->disk_refused, 1);
    return KVEDGE_ENOSPC;
}

bool kvedge_engine_disk_write_stopped(kvedge_engine_t *e)
{
    if (atomic_load(&e->write_failed))
        return true;
    if (!e->db)
        return false;
    char *v = rocksdb_property_value(e->db, "rocksdb.background-errors");
    bool bg = v && strtoull(v, NULL, 10) > 0;
    if (v)
        rocksdb_free(v);
    return bg;
}

bool kvedge_engine_disk_can_flush(kvedge_engine_t *e)
{
    uint64_t avail = 0, total = 0;
    if (!e->dir || !s_statvfs(e->dir, &avail, &total))
        return true;
    atomic_store(&e->memtables_at_ms, 0); /* read afresh */
    return avail >= s_memtables(e) + S_SLACK_BYTES;
}

void kvedge_engine_disk_failed(kvedge_engine_t *e, int rc)
{
    if (rc != KVEDGE_ENOSPC && rc != KVEDGE_EIO)
        return;
    /* RocksDB stops writing after this: the reserve is the room a restart needs. */
    atomic_store(&e->write_failed, true);
    atomic_store(&e->disk_full, rc == KVEDGE_ENOSPC || atomic_load(&e->disk_full));
    kvedge_engine_disk_release(e);
}

int kvedge_engine_disk(kvedge_engine_t *e, kvedge_engine_disk_t *out)
{
    if (!e || !out)
        return KVEDGE_EINVAL;
    memset(out, 0, sizeof *out);
    if (e->dir)
        (void)s_statvfs(e->dir, &out->free_bytes, &out->fs_bytes);
    out->full = atomic_load(&e->disk_full);
    out->write_failed = atomic_load(&e->write_failed);
    out->refused = atomic_load(&e->disk_refused);
    out->compactions = atomic_load(&e->disk_compactions);
    out->reserve_bytes = e->reserve_bytes;
    out->reserve_held = atomic_load(&e->reserve_held);
    out->reserve_releases = atomic_load(&e->reserve_releases);
    out->memtable_bytes = e->db ? s_memtables(e) : 0;
    out->write_buffer_bytes = e->write_buffer_bytes;
    out->wal_bound_bytes = e->wal_bound_bytes;
    if (e->db) {
        static const char *const props[] = {"rocksdb.total-sst-files-size",
                                            "rocksdb.total-blob-file-size"};
        for (size_t p = 0; p < 2; p++)
            for (size_t i = 0; i < S_CF_COUNT; i++) {
                char *v = e->cf[i] ? rocksdb_property_value_cf(e->db, e->cf[i], props[p]) : NULL;
                if (v) {
                    out->files_bytes += strtoull(v, NULL, 10);
                    rocksdb_free(v);
                }
            }
    }
    return KVEDGE_OK;
}

const char *kvedge_engine_dir(const kvedge_engine_t *e)
{
    return e && e->dir ? e->dir : "";
}
