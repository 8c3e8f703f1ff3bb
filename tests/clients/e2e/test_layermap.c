/* Layer matching (clients/e2e/layermap.h, gpu/rsa.h, the decoder's trace hook): CKA and RSA
 * against double loops and their invariances, the selection rule of Eq. 16 on hand-made
 * scores, the map file's round trip and every kind of refused map, and `kvedge layermap` end
 * to end on the tiny fixture model against itself. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "clients/decoder/decoder.h"
#include "clients/e2e/layermap.h"
#include "gpu/cka.h"
#include "gpu/rsa.h"
#include "access/codec/error.h"
#include "tests/common/shell.h"

static char s_dir[64];

static uint64_t s_rng = 0x9e3779b97f4a7c15ull;

/* A normal deviate (Box-Muller over xorshift). */
static double s_normal(void)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        s_rng ^= s_rng << 13;
        s_rng ^= s_rng >> 7;
        s_rng ^= s_rng << 17;
        u[i] = ((s_rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static float *s_random(uint32_t n, uint32_t d)
{
    float *m = malloc(sizeof(float) * n * d);
    assert_non_null(m);
    for (size_t i = 0; i < (size_t)n * d; i++)
        m[i] = (float)s_normal();
    return m;
}

/* Linear CKA the long way, Eq. 11-13: HSIC of the centred Gram matrices K = X X^T, L = Y Y^T,
 * HSIC(K, L) = tr(K H L H), CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)). */
static double s_naive_cka(const float *x, const float *y, uint32_t n, uint32_t d1, uint32_t d2)
{
    double *k = calloc((size_t)n * n, sizeof(double)), *l = calloc((size_t)n * n, sizeof(double));
    assert_true(k && l);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n; j++) {
            for (uint32_t c = 0; c < d1; c++)
                k[i * n + j] += (double)x[i * d1 + c] * x[j * d1 + c];
            for (uint32_t c = 0; c < d2; c++)
                l[i * n + j] += (double)y[i * d2 + c] * y[j * d2 + c];
        }
    /* Centre both: M - row means - column means + grand mean (H M H). */
    double *m[2] = {k, l};
    for (int t = 0; t < 2; t++) {
        double *a = m[t], g = 0, *rm = calloc(n, sizeof(double));
        for (uint32_t i = 0; i < n; i++) {
            for (uint32_t j = 0; j < n; j++)
                rm[i] += a[i * n + j] / n;
            g += rm[i] / n;
        }
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < n; j++)
                a[i * n + j] += g - rm[i] - rm[j]; /* symmetric: column means are row means */
        free(rm);
    }
    double kl = 0, kk = 0, ll = 0;
    for (size_t i = 0; i < (size_t)n * n; i++) {
        kl += k[i] * l[i];
        kk += k[i] * k[i];
        ll += l[i] * l[i];
    }
    free(k);
    free(l);
    return kk > 0 && ll > 0 ? kl / sqrt(kk * ll) : 0;
}

/* RSA the long way, Eq. 14-15: cosines in double, lower triangles, Pearson. */
static double s_naive_rsa(const float *x, const float *y, uint32_t n, uint32_t d1, uint32_t d2)
{
    const size_t m = (size_t)n * (n - 1) / 2;
    double *a = malloc(m * sizeof(double)), *b = malloc(m * sizeof(double));
    assert_true(a && b);
    size_t k = 0;
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = 0; j < i; j++, k++) {
            double s[2] = {0, 0};
            const float *p[2] = {x, y};
            const uint32_t d[2] = {d1, d2};
            for (int t = 0; t < 2; t++) {
                double dot = 0, ni = 0, nj = 0;
                for (uint32_t c = 0; c < d[t]; c++) {
                    const double u = p[t][i * d[t] + c], v = p[t][j * d[t] + c];
                    dot += u * v;
                    ni += u * u;
                    nj += v * v;
                }
                s[t] = ni > 0 && nj > 0 ? dot / sqrt(ni * nj) : 0;
            }
            a[k] = s[0];
            b[k] = s[1];
        }
    double ma = 0, mb = 0;
    for (k = 0; k < m; k++) {
        ma += a[k] / m;
        mb += b[k] / m;
    }
    double ab = 0, aa = 0, bb = 0;
    for (k = 0; k < m; k++) {
        ab += (a[k] - ma) * (b[k] - mb);
        aa += (a[k] - ma) * (a[k] - ma);
        bb += (b[k] - mb) * (b[k] - mb);
    }
    free(a);
    free(b);
    return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0;
}

static double s_cka(const float *x, const float *y, uint32_t n, uint32_t d1, uint32_t d2)
{
    double v = -1;
    const kvedge_cka_args_t a = {x, y, n, d1, d2, &v};
    assert_int_equal(kvedge_cpu_cka(&a), KVEDGE_OK);
    return v;
}

static double s_rsa(const float *x, const float *y, uint32_t n, uint32_t d1, uint32_t d2)
{
    double v = -2;
    const kvedge_rsa_args_t a = {x, y, n, d1, d2, &v};
    assert_int_equal(kvedge_cpu_rsa(&a), KVEDGE_OK);
    return v;
}

static const uint32_t s_sizes[][3] = {{3, 1, 1}, {5, 3, 7}, {17, 8, 4}, {33, 16, 16}, {64, 7, 31}};

static void test_cka_rsa_vs_naive(void **state)
{
    (void)state;
    for (size_t t = 0; t < sizeof s_sizes / sizeof s_sizes[0]; t++) {
        const uint32_t n = s_sizes[t][0], d1 = s_sizes[t][1], d2 = s_sizes[t][2];
        float *x = s_random(n, d1), *y = s_random(n, d2);
        /* A shared component so the scores are not all near 0. */
        for (uint32_t i = 0; i < n; i++)
            y[i * d2] += 2 * x[i * d1];
        const double c = s_cka(x, y, n, d1, d2), r = s_rsa(x, y, n, d1, d2);
        assert_true(fabs(c - s_naive_cka(x, y, n, d1, d2)) <= KVEDGE_CKA_TOL);
        assert_true(fabs(r - s_naive_rsa(x, y, n, d1, d2)) <= KVEDGE_RSA_TOL);
        assert_true(c >= 0 && c <= 1 + 1e-6);
        assert_true(r >= -1 && r <= 1);
        free(x);
        free(y);
    }
}

/* Q [d][d]: an orthogonal matrix (Gram-Schmidt of a random one, in double). */
static double *s_orthogonal(uint32_t d)
{
    double *q = malloc(sizeof(double) * d * d);
    assert_non_null(q);
    for (uint32_t i = 0; i < d * d; i++)
        q[i] = s_normal();
    for (uint32_t c = 0; c < d; c++) {
        for (uint32_t p = 0; p < c; p++) {
            double dot = 0;
            for (uint32_t r = 0; r < d; r++)
                dot += q[r * d + c] * q[r * d + p];
            for (uint32_t r = 0; r < d; r++)
                q[r * d + c] -= dot * q[r * d + p];
        }
        double nn = 0;
        for (uint32_t r = 0; r < d; r++)
            nn += q[r * d + c] * q[r * d + c];
        for (uint32_t r = 0; r < d; r++)
            q[r * d + c] /= sqrt(nn);
    }
    return q;
}

static void test_invariances(void **state)
{
    (void)state;
    const uint32_t n = 48, d1 = 12, d2 = 20;
    float *x = s_random(n, d1), *y = s_random(n, d2), *yt = malloc(sizeof(float) * n * d2);
    assert_non_null(yt);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t c = 0; c < d1; c++)
            y[i * d2 + c] += x[i * d1 + c];
    double *q = s_orthogonal(d2);
    /* yt = 3.5 * y Q: an orthogonal transform and an isotropic scaling of one side. */
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t c = 0; c < d2; c++) {
            double s = 0;
            for (uint32_t k = 0; k < d2; k++)
                s += (double)y[i * d2 + k] * q[k * d2 + c];
            yt[i * d2 + c] = (float)(3.5 * s);
        }
    const double c0 = s_cka(x, y, n, d1, d2), c1 = s_cka(x, yt, n, d1, d2);
    assert_true(c0 > 0.2 && c0 < 0.99);
    assert_true(fabs(c0 - c1) <= KVEDGE_CKA_TOL);
    /* Cosines, hence RSA, keep through an orthogonal transform and scaling too. */
    assert_true(fabs(s_rsa(x, y, n, d1, d2) - s_rsa(x, yt, n, d1, d2)) <= KVEDGE_RSA_TOL);
    /* A matrix with itself, and with its own transform. */
    assert_true(fabs(s_cka(y, yt, n, d2, d2) - 1) <= KVEDGE_CKA_TOL);
    assert_true(fabs(s_cka(x, x, n, d1, d1) - 1) <= KVEDGE_CKA_TOL);
    assert_true(fabs(s_rsa(x, x, n, d1, d1) - 1) <= KVEDGE_RSA_TOL);
    assert_true(fabs(s_rsa(y, yt, n, d2, d2) - 1) <= KVEDGE_RSA_TOL);
    free(q);
    free(yt);
    free(y);
    free(x);
}

static void test_rsa_degenerate(void **state)
{
    (void)state;
    float x[6] = {1, 2, 3, 4, 5, 6}, z[6] = {0}, y[4] = {1, 0, 0, 1};
    double v = 7;
    kvedge_rsa_args_t a = {x, y, 2, 3, 2, &v};
    /* n == 2: one pair, a constant triangle. */
    assert_int_equal(kvedge_cpu_rsa(&a), KVEDGE_OK);
    assert_true(v == 0);
    a.y = z; /* all zero rows: cosines 0, constant */
    a.d2 = 3;
    assert_int_equal(kvedge_cpu_rsa(&a), KVEDGE_OK);
    assert_true(v == 0);
    a.n = 1;
    assert_int_equal(kvedge_cpu_rsa(&a), KVEDGE_EINVAL);
    a.n = 2;
    a.rsa = NULL;
    assert_int_equal(kvedge_cpu_rsa(&a), KVEDGE_EINVAL);
    a.rsa = &v;
    a.d1 = 0;
    assert_int_equal(kvedge_cpu_rsa(&a), KVEDGE_EINVAL);
    assert_int_equal(kvedge_cpu_rsa(NULL), KVEDGE_EINVAL);
}

static void test_select(void **state)
{
    (void)state;
    const double tie = KVEDGE_LAYERMAP_NEAR_TIE;
    /* The best pair passes: layer 2. */
    const double c1[] = {0.3, 0.6, 0.9, 0.7}, r1[] = {0.3, 0.6, 0.9, 0.7};
    assert_int_equal(kvedge_layermap_select(c1, r1, 4, 0.5, 0.5, tie), 2);
    /* The best by CKA fails RSA: the next passing one. */
    const double c2[] = {0.3, 0.6, 0.95, 0.7}, r2[] = {0.3, 0.6, 0.4, 0.7};
    assert_int_equal(kvedge_layermap_select(c2, r2, 4, 0.5, 0.5, tie), 3);
    /* Near ties: the shallower wins (1 is within tie of 3). */
    const double c3[] = {0.2, 0.80, 0.70, 0.81}, r3[] = {0.2, 0.80, 0.70, 0.80};
    assert_int_equal(kvedge_layermap_select(c3, r3, 4, 0.5, 0.5, tie), 1);
    /* An exact tie: the shallower. */
    const double c4[] = {0.9, 0.9}, r4[] = {0.8, 0.8};
    assert_int_equal(kvedge_layermap_select(c4, r4, 2, 0.5, 0.5, 0.0), 0);
    /* Not within tie: the best. */
    assert_int_equal(kvedge_layermap_select(c3, r3, 4, 0.5, 0.5, 0.001), 3);
    /* Nothing passes: none; NaN passes nothing; thresholds are inclusive. */
    assert_int_equal(kvedge_layermap_select(c1, r1, 4, 0.95, 0.5, tie), KVEDGE_LAYERMAP_NONE);
    const double c5[] = {NAN, 0.5}, r5[] = {0.9, NAN};
    assert_int_equal(kvedge_layermap_select(c5, r5, 2, 0.0, 0.0, tie), KVEDGE_LAYERMAP_NONE);
    const double c6[] = {0.4, 0.5}, r6[] = {0.5, 0.5};
    assert_int_equal(kvedge_layermap_select(c6, r6, 2, 0.5, 0.5, tie), 1);
    assert_int_equal(kvedge_layermap_select(c6, r6, 0, 0.5, 0.5, tie), KVEDGE_LAYERMAP_NONE);
    assert_int_equal(kvedge_layermap_select(NULL, r6, 2, 0.5, 0.5, tie), KVEDGE_LAYERMAP_NONE);
}

/* ---- map files ---- */

static void s_write(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void s_hand_map(kvedge_layermap_t *m, kvedge_layermap_entry_t *e)
{
    memset(m, 0, sizeof *m);
    snprintf(m->cloud_id, sizeof m->cloud_id, "kjv/cloud");
    snprintf(m->edge_id, sizeof m->edge_id, "kjv/edge");
    m->cloud_layers = 6;
    m->cloud_hidden = 192;
    m->edge_layers = 3;
    m->edge_hidden = 128;
    m->samples = 512;
    m->cka_min = 0.5;
    m->rsa_min = 0.25;
    e[0] = (kvedge_layermap_entry_t){0, 0.851517, 0.848707};
    e[1] = (kvedge_layermap_entry_t){KVEDGE_LAYERMAP_NONE, 0.4, -0.2};
    e[2] = (kvedge_layermap_entry_t){5, 1.0, 0.25};
    m->entry = e;
}

static void test_map_round_trip(void **state)
{
    (void)state;
    kvedge_layermap_t m, back;
    kvedge_layermap_entry_t e[3];
    s_hand_map(&m, e);
    char path[128], why[KVEDGE_LAYERMAP_WHY_BYTES];
    snprintf(path, sizeof path, "%s/rt.map", s_dir);
    assert_int_equal(kvedge_layermap_save(path, &m), KVEDGE_OK);
    assert_int_equal(kvedge_layermap_read(path, &back, why, sizeof why), KVEDGE_OK);
    assert_string_equal(back.cloud_id, m.cloud_id);
    assert_string_equal(back.edge_id, m.edge_id);
    assert_int_equal(back.cloud_layers, 6);
    assert_int_equal(back.cloud_hidden, 192);
    assert_int_equal(back.edge_layers, 3);
    assert_int_equal(back.edge_hidden, 128);
    assert_int_equal(back.samples, 512);
    assert_true(back.cka_min == 0.5 && back.rsa_min == 0.25);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(back.entry[i].cloud, e[i].cloud);
        assert_true(fabs(back.entry[i].cka - e[i].cka) < 1e-12);
        assert_true(fabs(back.entry[i].rsa - e[i].rsa) < 1e-12);
    }
    /* Written again, the same bytes. */
    char path2[160];
    snprintf(path2, sizeof path2, "%s/rt2.map", s_dir);
    assert_int_equal(kvedge_layermap_save(path2, &back), KVEDGE_OK);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", path, path2);
    assert_int_equal(system(cmd), 0);
    /* The table and JSON print. */
    FILE *null = fopen("/dev/null", "w");
    assert_int_equal(kvedge_layermap_print(null, &back, false, NULL, NULL), KVEDGE_OK);
    assert_int_equal(kvedge_layermap_print(null, &back, true, NULL, NULL), KVEDGE_OK);
    fclose(null);
    kvedge_layermap_clear(&back);
    assert_null(back.entry);
    kvedge_layermap_clear(NULL);
    /* A map that fails its check is not written. */
    e[0].cloud = 6;
    assert_int_equal(kvedge_layermap_save(path, &m), KVEDGE_ECORRUPT);
    e[0].cloud = 0;
    e[0].cka = 0.4; /* selected below the threshold */
    assert_int_equal(kvedge_layermap_check(&m, why, sizeof why), KVEDGE_ECORRUPT);
    assert_non_null(strstr(why, "thresholds"));
}

#define S_HEAD        "kvedge-layermap 1\ncloud c 6 192\nedge e 3 128\nsamples 512\nthresholds 0.5 0.5\n"
#define S_GOOD_LAYERS "layer 0 0 0.9 0.9\nlayer 1 none 0.1 0.1\nlayer 2 5 0.6 0.7\n"

static void test_map_rejects(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int rc;
        const char *line; /* ":LINE:" the reason names */
        const char *reason;
    } bad[] = {
        {"", KVEDGE_ETRUNCATED, ":1:", "truncated"},
        {"kvedge-layermap 2\n", KVEDGE_EVERSION, ":1:", "version 2"},
        {"kvedge-lamp 1\n", KVEDGE_ECORRUPT, ":1:", "expected"},
        {"kvedge-layermap 1\ncloud c 0 192\n", KVEDGE_ECORRUPT, ":2:", "layer count"},
        {"kvedge-layermap 1\ncloud c 1025 192\n", KVEDGE_ECORRUPT, ":2:", "layer count"},
        {"kvedge-layermap 1\ncloud c 6\n", KVEDGE_ECORRUPT, ":2:", "fields"},
        {"kvedge-layermap 1\ncloud c 6 192\nedge e 3 0\n", KVEDGE_ECORRUPT, ":3:", "hidden"},
        {"kvedge-layermap 1\ncloud c 6 192\nedge e -3 128\n", KVEDGE_ECORRUPT, ":3:", "layer"},
        {"kvedge-layermap 1\ncloud c  6 192\n", KVEDGE_ECORRUPT, ":2:", "one space"},
        {"kvedge-layermap 1\n\ncloud c 6 192\n", KVEDGE_ECORRUPT, ":2:", "empty"},
        {"kvedge-layermap 1\ncloud c 6 192\nedge e 3 128\nsamples 2\n", KVEDGE_ECORRUPT,
         ":4:", "samples"},
        {"kvedge-layermap 1\ncloud c 6 192\nedge e 3 128\nsamples 512\nthresholds nan 0.5\n",
         KVEDGE_ECORRUPT, ":5:", "thresholds"},
        {S_HEAD "layer 0 6 0.9 0.9\n", KVEDGE_ECORRUPT, ":6:", "out of range"},
        {S_HEAD "layer 0 -1 0.9 0.9\n", KVEDGE_ECORRUPT, ":6:", "out of range"},
        {S_HEAD "layer 0 0 nan 0.9\n", KVEDGE_ECORRUPT, ":6:", "finite"},
        {S_HEAD "layer 0 0 0.9 inf\n", KVEDGE_ECORRUPT, ":6:", "finite"},
        {S_HEAD "layer 0 0 1.5 0.9\n", KVEDGE_ECORRUPT, ":6:", "CKA in [0, 1]"},
        {S_HEAD "layer 0 0 0.9 -1.5\n", KVEDGE_ECORRUPT, ":6:", "RSA in [-1, 1]"},
        {S_HEAD "layer 0 0 0.4 0.9\n", KVEDGE_ECORRUPT, ":6:", "below the thresholds"},
        {S_HEAD "layer 0 0 0.9 0.9\nlayer 0 1 0.9 0.9\n", KVEDGE_ECORRUPT, ":7:", "twice"},
        {S_HEAD "layer 0 0 0.9 0.9\nlayer 2 1 0.9 0.9\n", KVEDGE_ECORRUPT, ":7:", "order"},
        {S_HEAD "layer 0 0 0.9 0.9\nlayer 9 1 0.9 0.9\n", KVEDGE_ECORRUPT, ":7:", "range"},
        {S_HEAD "layer 0 0 0.9 0.9\n", KVEDGE_ETRUNCATED, ":7:", "truncated"},
        {S_HEAD "layer 0 0 0.9 0.9\nend\n", KVEDGE_ETRUNCATED, ":7:", "1 of 3"},
        {S_HEAD S_GOOD_LAYERS, KVEDGE_ETRUNCATED, ":9:", "truncated"},
        {S_HEAD S_GOOD_LAYERS "layer 2 5 0.6 0.7\nend\n", KVEDGE_ECORRUPT, ":9:", "duplicate"},
        {S_HEAD S_GOOD_LAYERS "end\nend\n", KVEDGE_ECORRUPT, ":10:", "after 'end'"},
        {S_HEAD S_GOOD_LAYERS "end\r\n", KVEDGE_ECORRUPT, ":9:", "CR"},
        {S_HEAD "layer 0 0 0x1p-1 0.9\n", KVEDGE_ECORRUPT, ":6:", "finite"},
        {S_HEAD "layer 0 zero 0.9 0.9\n", KVEDGE_ECORRUPT, ":6:", "none"},
    };
    char path[128], why[KVEDGE_LAYERMAP_WHY_BYTES];
    snprintf(path, sizeof path, "%s/bad.map", s_dir);
    kvedge_layermap_t m;
    /* The good one first: the cases differ from it in one place. */
    s_write(path, S_HEAD S_GOOD_LAYERS "end\n");
    assert_int_equal(kvedge_layermap_read(path, &m, why, sizeof why), KVEDGE_OK);
    assert_int_equal(m.entry[1].cloud, KVEDGE_LAYERMAP_NONE);
    kvedge_layermap_clear(&m);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        s_write(path, bad[i].text);
        why[0] = '\0';
        int rc = kvedge_layermap_read(path, &m, why, sizeof why);
        if (rc != bad[i].rc || !strstr(why, bad[i].line) || !strstr(why, bad[i].reason) ||
            strncmp(why, path, strlen(path)) != 0)
            fail_msg("case %zu: rc %d (want %d), why '%s' (want '%s' and '%s')", i, rc, bad[i].rc,
                     why, bad[i].line, bad[i].reason);
        assert_null(m.entry);
        assert_int_equal(m.edge_layers, 0);
    }
    /* Missing file. */
    snprintf(path, sizeof path, "%s/none.map", s_dir);
    assert_int_equal(kvedge_layermap_read(path, &m, why, sizeof why), KVEDGE_EIO);
    assert_non_null(strstr(why, "none.map"));
}

/* ---- the decoder's trace hook and the collection ---- */

typedef struct {
    uint32_t calls;
    float *k, *v; /* [layers][heads][n][head_dim] */
    size_t kvf;
    float *last; /* the last layer's hidden states */
    size_t hidden_floats;
} s_trace_t;

static int s_trace(void *arg, uint32_t layer, const float *hidden, uint32_t n, const float *q,
                   const float *k, const float *v)
{
    (void)q;
    s_trace_t *t = arg;
    assert_int_equal(layer, t->calls);
    (void)n;
    memcpy(t->k + layer * t->kvf, k, t->kvf * sizeof(float));
    memcpy(t->v + layer * t->kvf, v, t->kvf * sizeof(float));
    memcpy(t->last, hidden, t->hidden_floats * sizeof(float));
    t->calls++;
    return layer == 99 ? KVEDGE_EIO : KVEDGE_OK;
}

static int s_abort(void *arg, uint32_t layer, const float *hidden, uint32_t n, const float *q,
                   const float *k, const float *v)
{
    (void)q;
    (void)arg;
    (void)hidden;
    (void)n;
    (void)k;
    (void)v;
    return layer == 1 ? KVEDGE_ECANCELED : KVEDGE_OK;
}

static void test_trace_hook(void **state)
{
    (void)state;
    kvedge_decoder_t *md = kvedge_decoder_new();
    assert_int_equal(kvedge_decoder_load(md, KVEDGE_FIXTURES "/opt_tiny.safetensors", 0),
                     KVEDGE_OK);
    const kvedge_decoder_config_t *c = kvedge_decoder_config(md);
    const uint32_t n = 21;
    int32_t tok[21];
    for (uint32_t i = 0; i < n; i++)
        tok[i] = (int32_t)((i * 37 + 5) % c->vocab);
    const size_t kvf = kvedge_decoder_kv_floats(md, n);
    float *k = malloc(c->layers * kvf * sizeof(float)),
          *v = malloc(c->layers * kvf * sizeof(float));
    s_trace_t t = {
        0,   malloc(c->layers * kvf * sizeof(float)),       malloc(c->layers * kvf * sizeof(float)),
        kvf, malloc((size_t)n * c->hidden * sizeof(float)), (size_t)n * c->hidden};
    assert_true(k && v && t.k && t.v && t.last);
    assert_int_equal(kvedge_decoder_prefill(md, tok, n, NULL, k, v), KVEDGE_OK);
    assert_int_equal(kvedge_decoder_prefill_trace(md, tok, n, s_trace, &t), KVEDGE_OK);
    assert_int_equal(t.calls, c->layers);
    /* The same numbers to the bit as a plain prefill. */
    assert_memory_equal(k, t.k, c->layers * kvf * sizeof(float));
    assert_memory_equal(v, t.v, c->layers * kvf * sizeof(float));
    /* collect gives the same last-layer rows, in one window or in several. */
    float *out = malloc((size_t)c->layers * n * c->hidden * sizeof(float));
    assert_non_null(out);
    assert_int_equal(kvedge_layermap_collect(md, tok, n, n, out), KVEDGE_OK);
    assert_memory_equal(out + (size_t)(c->layers - 1) * n * c->hidden, t.last,
                        (size_t)n * c->hidden * sizeof(float));
    /* In windows of 8 the first window's rows are the same positions (causal attention),
     * equal to float rounding (BLAS blocks differ with the row count). */
    assert_int_equal(kvedge_layermap_collect(md, tok, n, 8, out), KVEDGE_OK);
    const float *o = out + (size_t)(c->layers - 1) * n * c->hidden;
    for (size_t i = 0; i < (size_t)8 * c->hidden; i++)
        assert_true(fabsf(o[i] - t.last[i]) <= 1e-4f * (1 + fabsf(t.last[i])));
    /* Errors: no callback, the callback's own code, a window over the positions. */
    assert_int_equal(kvedge_decoder_prefill_trace(md, tok, n, NULL, NULL), KVEDGE_EINVAL);
    assert_int_equal(kvedge_decoder_prefill_trace(md, tok, n, s_abort, NULL), KVEDGE_ECANCELED);
    assert_int_equal(kvedge_layermap_collect(md, tok, n, c->max_positions + 1, out), KVEDGE_EINVAL);
    /* build: too few tokens, bad ids. */
    kvedge_layermap_t m;
    assert_int_equal(
        kvedge_layermap_build(md, "a", md, "b", tok, n, n + 1, 0.5, 0.5, &m, NULL, NULL),
        KVEDGE_ETRUNCATED);
    assert_int_equal(kvedge_layermap_build(md, "a b", md, "b", tok, n, n, 0.5, 0.5, &m, NULL, NULL),
                     KVEDGE_EINVAL);
    double *cka = NULL, *rsa = NULL;
    assert_int_equal(kvedge_layermap_build(md, "a", md, "b", tok, n, n, 0.5, 0.5, &m, &cka, &rsa),
                     KVEDGE_OK);
    for (uint32_t e = 0; e < c->layers; e++) {
        assert_int_equal(m.entry[e].cloud, (int32_t)e);
        assert_true(fabs(cka[e * c->layers + e] - 1) <= KVEDGE_CKA_TOL);
        assert_true(fabs(rsa[e * c->layers + e] - 1) <= KVEDGE_RSA_TOL);
    }
    free(cka);
    free(rsa);
    kvedge_layermap_clear(&m);
    free(out);
    free(t.last);
    free(t.k);
    free(t.v);
    free(k);
    free(v);
    kvedge_decoder_destroy(&md);
}

/* ---- `kvedge layermap` end to end ---- */

/* GPT-2's byte-to-character map: printable bytes map to themselves, the rest to 256 + i. */
static unsigned s_byte_char(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return b;
    unsigned k = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
            k++;
    return 256 + k;
}

/* A byte tokenizer (ids 0..255 = the bytes, no merges) that fits opt_tiny's 256 ids. */
static void s_byte_tokenizer(const char *dir)
{
    char path[160];
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputc('{', f);
    for (unsigned b = 0; b < 256; b++)
        fprintf(f, "%s\"\\u%04x\": %u", b ? ", " : "", s_byte_char(b), b);
    fputs("}\n", f);
    assert_int_equal(fclose(f), 0);
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    s_write(path, "#version: 0.2\n");
}

static void test_cli_self(void **state)
{
    (void)state;
    s_byte_tokenizer(s_dir);
    char calib[128];
    snprintf(calib, sizeof calib, "%s/calib.txt", s_dir);
    FILE *f = fopen(calib, "w");
    assert_non_null(f);
    for (int i = 0; i < 12; i++)
        fprintf(f, "In the beginning God created the heaven and the earth. (%d)\n", i);
    assert_int_equal(fclose(f), 0);
    const char *w = KVEDGE_FIXTURES "/opt_tiny.safetensors";
    /* 400 samples: three windows of the fixture's 160 positions. */
    assert_int_equal(kt_sh("%s layermap --cloud %s --edge %s --tokenizer %s --calib %s --samples "
                           "400 --out %s/self.map --heatmap %s/heat > %s/out.txt 2> %s/err.txt",
                           KVEDGE_BIN, w, w, s_dir, calib, s_dir, s_dir, s_dir, s_dir),
                     0);
    char path[160], why[KVEDGE_LAYERMAP_WHY_BYTES];
    snprintf(path, sizeof path, "%s/self.map", s_dir);
    kvedge_layermap_t m;
    assert_int_equal(kvedge_layermap_read(path, &m, why, sizeof why), KVEDGE_OK);
    assert_string_equal(m.cloud_id, "opt_tiny");
    assert_int_equal(m.cloud_layers, 3);
    assert_int_equal(m.edge_layers, 3);
    assert_int_equal(m.samples, 400);
    for (uint32_t e = 0; e < m.edge_layers; e++) {
        assert_int_equal(m.entry[e].cloud, (int32_t)e);
        assert_true(m.entry[e].cka >= 0.9999);
        assert_true(m.entry[e].rsa >= 0.9999);
    }
    kvedge_layermap_clear(&m);
    /* --show reads it back; a damaged copy is refused with its line. */
    assert_int_equal(
        kt_sh("%s layermap --show %s/self.map > %s/show.txt", KVEDGE_BIN, s_dir, s_dir), 0);
    snprintf(path, sizeof path, "%s/show.txt", s_dir);
    assert_true(kt_file_has(path, "opt_tiny"));
    assert_int_equal(kt_sh("head -n 6 %s/self.map > %s/cut.map; %s layermap --show %s/cut.map "
                           "2> %s/show.err",
                           s_dir, s_dir, KVEDGE_BIN, s_dir, s_dir),
                     4);
    snprintf(path, sizeof path, "%s/show.err", s_dir);
    assert_true(kt_file_has(path, "cut.map:7: truncated"));
    snprintf(path, sizeof path, "%s/out.txt", s_dir);
    assert_true(kt_file_has(path, "CKA"));
    snprintf(path, sizeof path, "%s/heat_cka.png", s_dir);
    struct stat st;
    if (kt_sh("command -v gnuplot > /dev/null") == 0) {
        assert_int_equal(stat(path, &st), 0);
    } else { /* no heatmap, and stderr says why (the map is still written) */
        assert_int_not_equal(stat(path, &st), 0);
        snprintf(path, sizeof path, "%s/err.txt", s_dir);
        assert_true(kt_file_has(path, "gnuplot is not on PATH"));
    }
    /* --json with ids of our own. */
    assert_int_equal(kt_sh("%s layermap --cloud %s --edge %s --tokenizer %s --calib %s --samples "
                           "50 --cloud-id big --edge-id small --json > %s/out.json",
                           KVEDGE_BIN, w, w, s_dir, calib, s_dir),
                     0);
    snprintf(path, sizeof path, "%s/out.json", s_dir);
    assert_true(kt_file_has(path, "\"id\":\"big\""));
    assert_true(kt_file_has(path, "\"map\":[{\"edge\":0,\"cloud\":0"));
    assert_true(kt_file_has(path, "\"rsa\":[["));
}

static void test_cli_errors(void **state)
{
    (void)state;
    s_byte_tokenizer(s_dir);
    char calib[128];
    snprintf(calib, sizeof calib, "%s/short.txt", s_dir);
    s_write(calib, "Too short.\n");
    const char *w = KVEDGE_FIXTURES "/opt_tiny.safetensors";
    char err[160];
    snprintf(err, sizeof err, "%s/err.txt", s_dir);
    assert_int_equal(kt_sh("%s layermap --cloud %s --edge %s --tokenizer %s --calib %s --samples "
                           "64 2> %s",
                           KVEDGE_BIN, w, w, s_dir, calib, err),
                     2);
    assert_true(kt_file_has(err, "gives 11 tokens, too short for 64 samples"));
    /* Usage: a missing flag, a bad threshold, too few samples. */
    assert_int_equal(
        kt_sh("%s layermap --cloud %s --edge %s --calib %s 2> %s", KVEDGE_BIN, w, w, calib, err),
        2);
    assert_true(kt_file_has(err, "required"));
    assert_int_equal(kt_sh("%s layermap --cloud %s --edge %s --tokenizer %s --calib %s --cka-min 2 "
                           "2> %s",
                           KVEDGE_BIN, w, w, s_dir, calib, err),
                     2);
    assert_int_equal(kt_sh("%s layermap --cloud %s --edge %s --tokenizer %s --calib %s --samples 2 "
                           "2> %s",
                           KVEDGE_BIN, w, w, s_dir, calib, err),
                     2);
    /* A missing model. */
    assert_int_equal(kt_sh("%s layermap --cloud %s/nope.safetensors --edge %s --tokenizer %s "
                           "--calib %s --samples 5 2> %s",
                           KVEDGE_BIN, s_dir, w, s_dir, calib, err),
                     1);
    assert_true(kt_file_has(err, "cloud model"));
    /* The kjv tokenizer's ids do not fit the fixture's 256. */
    assert_int_equal(kt_sh("%s layermap --cloud %s --edge %s --tokenizer %s/kjv --calib %s "
                           "--samples 3 2> %s",
                           KVEDGE_BIN, w, w, KVEDGE_MODELS, calib, err),
                     2);
    assert_true(kt_file_has(err, "vocabulary"));
}

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_dir, sizeof s_dir, "/tmp/kvedge-test-layermap-XXXXXX");
    return mkdtemp(s_dir) ? 0 : -1;
}

static int s_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cka_rsa_vs_naive), cmocka_unit_test(test_invariances),
        cmocka_unit_test(test_rsa_degenerate),   cmocka_unit_test(test_select),
        cmocka_unit_test(test_map_round_trip),   cmocka_unit_test(test_map_rejects),
        cmocka_unit_test(test_trace_hook),       cmocka_unit_test(test_cli_self),
        cmocka_unit_test(test_cli_errors),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
