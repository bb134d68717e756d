/* How far apart two CPUs are, as a cache line sees it: the one-way latency of handing a line
 * back and forth between two threads pinned to them.
 *
 * A dense model's shared vector is written by every worker, so each line a worker writes was
 * last written or read by another CPU and must come from that CPU's cache. On a virtual
 * machine the host decides where the guest's CPUs sit: two vCPUs in one L3 domain pass a line
 * in a few tens of nanoseconds, two in different domains in hundreds, and the same guest can
 * move between the two within seconds. A real run measures it before and after (the run's
 * summary), so a slow run can say whether its CPUs were far apart.
 *
 * Two threads share one 64-bit token on a line of its own: the first stores 2i+1 and waits for
 * 2i+2, the second waits for 2i+1 and stores 2i+2. Each round trip moves the line twice.
 * Linux only (sched_setaffinity); the build is optional and realrun/host/probe.py says when it is
 * missing.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "../_monotonic.h"

#define TIMEOUT_NS 5000000000LL /* a thread that never gets its CPU ends the probe */
#define WARM_ROUNDS 1000

/* Two threads pinned to two CPUs take turns through a token; each probe's state starts
 * with one of these. */
typedef struct {
    _Alignas(64) _Atomic int64_t token;
    _Alignas(64) _Atomic int stop;  /* set by a thread that failed: the other stops waiting */
} Sync;

typedef struct {
    Sync *sync;                     /* the probe's state, which begins with its Sync */
    int cpu, first;
    int error;                      /* errno of sched_setaffinity, or ETIMEDOUT */
} Side;

/* Spin until the token is at least `want` (the other thread may already have moved it on);
 * 0, or ETIMEDOUT / ECANCELED (the other side failed). */
static int
wait_token(Sync *sync, int64_t want, int64_t deadline)
{
    unsigned spins = 0;
    while (atomic_load_explicit(&sync->token, memory_order_acquire) < want) {
        if (atomic_load_explicit(&sync->stop, memory_order_relaxed))
            return ECANCELED;
        if ((++spins & 0xfff) == 0 && now() > deadline)
            return ETIMEDOUT;
    }
    return 0;
}

static void
set_token(Sync *sync, int64_t value)
{
    atomic_store_explicit(&sync->token, value, memory_order_release);
}

/* Pin the calling thread to its side's CPU; nonzero (and the other side told) if it cannot. */
static int
pin(Side *side)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(side->cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) == 0)
        return 0;
    side->error = errno;
    atomic_store(&side->sync->stop, 1);
    return 1;
}

/* A side's wait failed: a timeout is its own failure (the other side is told); ECANCELED
 * means the other side failed and said so. */
static void
give_up(Side *side, int error)
{
    if (error == ETIMEDOUT) {
        side->error = error;
        atomic_store(&side->sync->stop, 1);
    }
}

/* 0, or -1 with a ValueError naming the two CPUs. */
static int
two_cpus(int cpu_a, int cpu_b)
{
    if (cpu_a != cpu_b && cpu_a >= 0 && cpu_b >= 0 && cpu_a < CPU_SETSIZE && cpu_b < CPU_SETSIZE)
        return 0;
    PyErr_Format(PyExc_ValueError, "cpus: %d and %d must be two different CPU numbers", cpu_a,
                 cpu_b);
    return -1;
}

/* Run `body` on both sides (the first on CPU `cpu_a`) without the GIL and wait for both;
 * 0, or -1 with the Python error of the side that failed. */
static int
run_pair(void *(*body)(void *), Sync *sync, int cpu_a, int cpu_b)
{
    Side sides[2] = {{sync, cpu_a, 1, 0}, {sync, cpu_b, 0, 0}};
    pthread_t threads[2];
    int started = 0, create_error = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; started < 2; started++) {
        create_error = pthread_create(&threads[started], NULL, body, &sides[started]);
        if (create_error) {
            atomic_store(&sync->stop, 1);
            break;
        }
    }
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    Py_END_ALLOW_THREADS
    if (create_error) {
        errno = create_error;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    if (!sides[0].error && !sides[1].error)
        return 0;
    Side *failed = sides[0].error ? &sides[0] : &sides[1];
    if (failed->error == ETIMEDOUT)
        PyErr_Format(PyExc_TimeoutError, "CPU %d: the probe thread got no time in %lld s",
                     failed->cpu, TIMEOUT_NS / 1000000000LL);
    else
        PyErr_Format(PyExc_OSError, "CPU %d: cannot run there (%s)", failed->cpu,
                     strerror(failed->error));
    return -1;
}

typedef struct {
    Sync sync;
    int64_t rounds, bursts;
    double *burst_ns;               /* per burst: mean one-way ns (filled by the first thread) */
} Line;

static void *
side_main(void *arg)
{
    Side *side = arg;
    Line *line = (Line *)side->sync;
    if (pin(side))
        return NULL;
    int64_t deadline = now() + TIMEOUT_NS;
    int64_t total = WARM_ROUNDS + line->rounds * line->bursts;
    int64_t burst_start = 0;
    for (int64_t i = 0; i < total; i++) {
        int error;
        if (side->first) {
            int64_t timed = i - WARM_ROUNDS;
            if (timed >= 0 && timed % line->rounds == 0)
                burst_start = now();
            set_token(&line->sync, 2 * i + 1);
            error = wait_token(&line->sync, 2 * i + 2, deadline);
            if (!error && timed >= 0 && (timed + 1) % line->rounds == 0)
                line->burst_ns[timed / line->rounds] =
                    (double)(now() - burst_start) / (2.0 * (double)line->rounds);
        } else {
            error = wait_token(&line->sync, 2 * i + 1, deadline);
            if (!error)
                set_token(&line->sync, 2 * i + 2);
        }
        if (error) {
            give_up(side, error);
            return NULL;
        }
    }
    return NULL;
}

static PyObject *
line_latency(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *names[] = {"cpu_a", "cpu_b", "rounds", "bursts", NULL};
    int cpu_a, cpu_b;
    Py_ssize_t rounds = 4000, bursts = 5;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ii|nn", names, &cpu_a, &cpu_b, &rounds,
                                     &bursts))
        return NULL;
    if (two_cpus(cpu_a, cpu_b))
        return NULL;
    if (rounds < 1 || bursts < 1) {
        PyErr_Format(PyExc_ValueError, "rounds %zd, bursts %zd: both must be >= 1", rounds,
                     bursts);
        return NULL;
    }
    Line *line = NULL;
    if (posix_memalign((void **)&line, 64, sizeof *line) != 0)
        return PyErr_NoMemory();
    memset(line, 0, sizeof *line);
    line->rounds = rounds;
    line->bursts = bursts;
    line->burst_ns = PyMem_RawCalloc((size_t)bursts, sizeof(double));
    if (line->burst_ns == NULL) {
        free(line);
        return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    if (run_pair(side_main, &line->sync, cpu_a, cpu_b) == 0) {
        result = PyList_New(bursts);
        for (Py_ssize_t i = 0; result != NULL && i < bursts; i++) {
            PyObject *value = PyFloat_FromDouble(line->burst_ns[i]);
            if (value == NULL)
                Py_CLEAR(result);
            else
                PyList_SET_ITEM(result, i, value);
        }
    }
    PyMem_RawFree(line->burst_ns);
    free(line);
    return result;
}

/* What a write costs on lines another CPU read last: the shared-line factor of
 * `timing.write_shared`, measured at a vector's size before a run starts.
 *
 * A real worker writes its update as w[i] -= s[i] over the whole shared vector after copying
 * it. When another worker copied the vector after it, every line is shared with that CPU's
 * cache and each store waits for the copy there to be invalidated. Two threads pinned to the
 * two CPUs take turns on one vector: in an "own" round the first copies it and writes it; in
 * a "shared" round the first copies it, the second copies it, then the first writes it. Only
 * the first's write is timed. Rounds alternate, so a change of pace hits both alike. */
/* 0, or -1 with a ValueError naming the vector probes' arguments. */
static int
vector_args(Py_ssize_t count, Py_ssize_t rounds, Py_ssize_t itemsize)
{
    if (count >= 1 && rounds >= 1 && (itemsize == 4 || itemsize == 8))
        return 0;
    PyErr_Format(PyExc_ValueError, "count %zd, rounds %zd, itemsize %zd: count and rounds must "
                 "be >= 1, itemsize 4 or 8", count, rounds, itemsize);
    return -1;
}

/* Allocate `n` cache-line-aligned buffers of `bytes` each (NULL where one failed, so that
 * all can be freed); nonzero if any failed. */
static int
aligned(char **buffers[], int n, size_t bytes)
{
    int failed = 0;
    for (int i = 0; i < n; i++)
        if (posix_memalign((void **)buffers[i], 64, bytes) != 0) {
            *buffers[i] = NULL;
            failed = 1;
        }
    return failed;
}

typedef struct {
    Sync sync;
    int64_t rounds;
    size_t count, itemsize;
    char *w, *copy_a, *copy_b, *step;
    int64_t *own_ns, *shared_ns;    /* per timed round */
} Vector;

#define WARM_WRITES 20

/* The worker's write: w[i] -= s[i] over the whole vector, one pass. */
static void
sweep(char *w, const char *s, size_t count, size_t itemsize)
{
    if (itemsize == 4) {
        float *wf = (float *)w;
        const float *sf = (const float *)s;
        for (size_t i = 0; i < count; i++)
            wf[i] -= sf[i];
    } else {
        double *wd = (double *)w;
        const double *sd = (const double *)s;
        for (size_t i = 0; i < count; i++)
            wd[i] -= sd[i];
    }
}

static void
write_step(Vector *v)
{
    sweep(v->w, v->step, v->count, v->itemsize);
}

static void *
writer_main(void *arg)
{
    Side *side = arg;
    Vector *v = (Vector *)side->sync;
    if (pin(side))
        return NULL;
    int64_t deadline = now() + TIMEOUT_NS;
    size_t bytes = v->count * v->itemsize;
    int64_t total = 2 * (WARM_WRITES + v->rounds);
    int error = 0;
    /* Round i: token 2i + 1 asks the second thread to copy (shared rounds, i odd); it answers
     * 2i + 2. In own rounds the first sets 2i + 2 itself. */
    for (int64_t i = 0; i < total && !error; i++) {
        int shared = (int)(i & 1);
        if (side->first) {
            memcpy(v->copy_a, v->w, bytes);
            if (shared) {
                set_token(&v->sync, 2 * i + 1);
                error = wait_token(&v->sync, 2 * i + 2, deadline);
                if (error)
                    break;
            }
            int64_t start = now();
            write_step(v);
            int64_t took = now() - start;
            int64_t timed = i / 2 - WARM_WRITES;
            if (timed >= 0)
                (shared ? v->shared_ns : v->own_ns)[timed] = took;
            if (!shared)
                set_token(&v->sync, 2 * i + 2);
        } else if (shared) {
            error = wait_token(&v->sync, 2 * i + 1, deadline);
            if (!error) {
                memcpy(v->copy_b, v->w, bytes);
                set_token(&v->sync, 2 * i + 2);
            }
        } else {
            error = wait_token(&v->sync, 2 * i + 2, deadline);
        }
    }
    give_up(side, error);
    return NULL;
}

static PyObject *
ns_list(const int64_t *values, Py_ssize_t n)
{
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list != NULL && i < n; i++) {
        PyObject *value = PyLong_FromLongLong(values[i]);
        if (value == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, value);
    }
    return list;
}

static PyObject *
shared_write(PyObject *module, PyObject *args, PyObject *kwargs)
{
    (void)module;
    static char *names[] = {"cpu_a", "cpu_b", "count", "itemsize", "rounds", NULL};
    int cpu_a, cpu_b;
    Py_ssize_t count, itemsize = 8, rounds = 200;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iin|nn", names, &cpu_a, &cpu_b, &count,
                                     &itemsize, &rounds) || two_cpus(cpu_a, cpu_b))
        return NULL;
    if (vector_args(count, rounds, itemsize))
        return NULL;
    size_t bytes = (size_t)count * (size_t)itemsize;
    Vector *v = NULL;
    if (posix_memalign((void **)&v, 64, sizeof *v) != 0)
        return PyErr_NoMemory();
    memset(v, 0, sizeof *v);
    v->rounds = rounds;
    v->count = (size_t)count;
    v->itemsize = (size_t)itemsize;
    char **arrays[] = {&v->w, &v->copy_a, &v->copy_b, &v->step};
    int failed = aligned(arrays, 4, bytes);
    v->own_ns = PyMem_RawCalloc((size_t)rounds, sizeof(int64_t));
    v->shared_ns = PyMem_RawCalloc((size_t)rounds, sizeof(int64_t));
    PyObject *result = NULL;
    if (failed || v->own_ns == NULL || v->shared_ns == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* A tiny step keeps the values finite and normal for any number of rounds. */
    for (size_t i = 0; i < v->count; i++) {
        if (itemsize == 4) {
            ((float *)v->w)[i] = 1.0f;
            ((float *)v->step)[i] = 1e-7f;
        } else {
            ((double *)v->w)[i] = 1.0;
            ((double *)v->step)[i] = 1e-12;
        }
    }
    if (run_pair(writer_main, &v->sync, cpu_a, cpu_b) == 0) {
        PyObject *own = ns_list(v->own_ns, rounds), *shared = ns_list(v->shared_ns, rounds);
        if (own != NULL && shared != NULL)
            result = PyTuple_Pack(2, own, shared);
        Py_XDECREF(own);
        Py_XDECREF(shared);
    }
done:
    for (int i = 0; i < 4; i++)
        free(*arrays[i]);
    PyMem_RawFree(v->own_ns);
    PyMem_RawFree(v->shared_ns);
    free(v);
    return result;
}

static PyMethodDef probe_methods[] = {
    {"line_latency", (PyCFunction)(void (*)(void))line_latency, METH_VARARGS | METH_KEYWORDS,
     "line_latency(cpu_a, cpu_b, rounds=4000, bursts=5) -> list of the bursts' mean one-way "
     "ns of a cache line handed between threads pinned to the two CPUs."},
    {"shared_write", (PyCFunction)(void (*)(void))shared_write, METH_VARARGS | METH_KEYWORDS,
     "shared_write(cpu_a, cpu_b, count, itemsize=8, rounds=200) -> (own, shared): per round, "
     "the ns the first CPU's write w[i] -= s[i] of `count` items took after only it copied "
     "the vector (own) and after the second CPU copied it too (shared)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef probe_module = {
    PyModuleDef_HEAD_INIT, "realrun.host._cpuprobe",
    "The cache-line latency between two CPUs, measured from C.", -1, probe_methods, NULL, NULL,
    NULL, NULL,
};

PyMODINIT_FUNC
PyInit__cpuprobe(void)
{
    return PyModule_Create(&probe_module);
}
