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
 * Linux only (sched_setaffinity); the build is optional and realrun/probe.py says when it is
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

#include "_monotonic.h"

#define TIMEOUT_NS 5000000000LL /* a thread that never gets its CPU ends the probe */
#define WARM_ROUNDS 1000

typedef struct {
    _Alignas(64) _Atomic int64_t token;
    _Alignas(64) _Atomic int stop;  /* set by a thread that failed: the other stops waiting */
    int64_t rounds, bursts;
    double *burst_ns;               /* per burst: mean one-way ns (filled by the first thread) */
} Line;

typedef struct {
    Line *line;
    int cpu, first;
    int error;                      /* errno of sched_setaffinity, or ETIMEDOUT */
} Side;

/* Spin until the token is `want`; 0, or ETIMEDOUT / ECANCELED (the other side failed). */
static int
wait_for(Line *line, int64_t want, int64_t deadline)
{
    unsigned spins = 0;
    while (atomic_load_explicit(&line->token, memory_order_acquire) != want) {
        if (atomic_load_explicit(&line->stop, memory_order_relaxed))
            return ECANCELED;
        if ((++spins & 0xfff) == 0 && now() > deadline)
            return ETIMEDOUT;
    }
    return 0;
}

static void *
side_main(void *arg)
{
    Side *side = arg;
    Line *line = side->line;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(side->cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        side->error = errno;
        atomic_store(&line->stop, 1);
        return NULL;
    }
    int64_t deadline = now() + TIMEOUT_NS;
    int64_t total = WARM_ROUNDS + line->rounds * line->bursts;
    int64_t burst_start = 0;
    for (int64_t i = 0; i < total; i++) {
        int error;
        if (side->first) {
            int64_t timed = i - WARM_ROUNDS;
            if (timed >= 0 && timed % line->rounds == 0)
                burst_start = now();
            atomic_store_explicit(&line->token, 2 * i + 1, memory_order_release);
            error = wait_for(line, 2 * i + 2, deadline);
            if (!error && timed >= 0 && (timed + 1) % line->rounds == 0)
                line->burst_ns[timed / line->rounds] =
                    (double)(now() - burst_start) / (2.0 * (double)line->rounds);
        } else {
            error = wait_for(line, 2 * i + 1, deadline);
            if (!error)
                atomic_store_explicit(&line->token, 2 * i + 2, memory_order_release);
        }
        if (error) {
            if (error == ETIMEDOUT) {
                side->error = error;
                atomic_store(&line->stop, 1);
            }
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
    if (cpu_a == cpu_b || cpu_a < 0 || cpu_b < 0 || cpu_a >= CPU_SETSIZE || cpu_b >= CPU_SETSIZE) {
        PyErr_Format(PyExc_ValueError, "cpus: %d and %d must be two different CPU numbers",
                     cpu_a, cpu_b);
        return NULL;
    }
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
    Side sides[2] = {{line, cpu_a, 1, 0}, {line, cpu_b, 0, 0}};
    pthread_t threads[2];
    int started = 0, create_error = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; started < 2; started++) {
        create_error = pthread_create(&threads[started], NULL, side_main, &sides[started]);
        if (create_error) {
            atomic_store(&line->stop, 1);
            break;
        }
    }
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (create_error) {
        errno = create_error;
        PyErr_SetFromErrno(PyExc_OSError);
    } else if (sides[0].error || sides[1].error) {
        Side *failed = sides[0].error ? &sides[0] : &sides[1];
        if (failed->error == ETIMEDOUT)
            PyErr_Format(PyExc_TimeoutError, "CPU %d: the probe thread got no time in %lld s",
                         failed->cpu, TIMEOUT_NS / 1000000000LL);
        else
            PyErr_Format(PyExc_OSError, "CPU %d: cannot run there (%s)", failed->cpu,
                         strerror(failed->error));
    } else {
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

static PyMethodDef probe_methods[] = {
    {"line_latency", (PyCFunction)(void (*)(void))line_latency, METH_VARARGS | METH_KEYWORDS,
     "line_latency(cpu_a, cpu_b, rounds=4000, bursts=5) -> list of the bursts' mean one-way "
     "ns of a cache line handed between threads pinned to the two CPUs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef probe_module = {
    PyModuleDef_HEAD_INIT, "realrun._cpuprobe",
    "The cache-line latency between two CPUs, measured from C.", -1, probe_methods, NULL, NULL,
    NULL, NULL,
};

PyMODINIT_FUNC
PyInit__cpuprobe(void)
{
    return PyModule_Create(&probe_module);
}
