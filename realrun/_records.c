/* A real worker's per-update records, written from C.
 *
 * In the worker loop every record is a Python call; each of the ones below reads the clock
 * and stores the stamp straight into the shared buffer, so an update costs five calls (four
 * stamps and `done`) instead of four monotonic_ns calls plus the stores that put their values
 * and the sample and progress into the buffers (about 0.45 us: 7% of a 6.5 us update at
 * d = 100). The clock is the one
 * time.monotonic_ns reads on Linux (CLOCK_MONOTONIC), so stamps from C and from Python lie on
 * one time line. realrun/records.py is the same interface in Python, used where this module
 * was not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>

#include "_monotonic.h"

typedef struct {
    PyObject_HEAD
    Py_buffer views[5];  /* times, samples, progress, copy_end, store_end */
    int held;            /* how many of views are held */
    int64_t *times, *samples, *progress, *copy_end, *store_end;
    Py_ssize_t quota, blocks, rank, count;
} Recorder;

/* Hold a writable, contiguous int64 buffer of at least `need` items; name it in errors. */
static int64_t *
hold(Recorder *self, PyObject *obj, const char *name, Py_ssize_t need)
{
    Py_buffer *view = &self->views[self->held];
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: must be a writable contiguous int64 buffer, not %.100s",
                     name, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    self->held++;
    if (view->itemsize != 8 || view->format == NULL ||
        (strcmp(view->format, "q") != 0 && strcmp(view->format, "l") != 0 &&
         strcmp(view->format, "@q") != 0 && strcmp(view->format, "@l") != 0 &&
         strcmp(view->format, "<q") != 0 && strcmp(view->format, "<l") != 0)) {
        PyErr_Format(PyExc_TypeError, "%s: must be an int64 buffer, not format '%s'", name,
                     view->format ? view->format : "B");
        return NULL;
    }
    if (view->len / 8 < need) {
        PyErr_Format(PyExc_ValueError, "%s: %zd items, needs at least %zd", name,
                     view->len / 8, need);
        return NULL;
    }
    return (int64_t *)view->buf;
}

static void
Recorder_dealloc(Recorder *self)
{
    for (int k = 0; k < self->held; k++)
        PyBuffer_Release(&self->views[k]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
Recorder_init(Recorder *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"times", "samples", "progress", "rank", "copy_end", "store_end",
                             "blocks", NULL};
    PyObject *times, *samples, *progress, *copy_end, *store_end;
    Py_ssize_t rank, blocks;
    if (self->held) {
        PyErr_SetString(PyExc_TypeError, "Recorder: already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOnOOn", kwlist, &times, &samples,
                                     &progress, &rank, &copy_end, &store_end, &blocks))
        return -1;
    if (rank < 0 || blocks < 1) {
        PyErr_Format(PyExc_ValueError, "rank %zd, blocks %zd: must be >= 0 and >= 1", rank,
                     blocks);
        return -1;
    }
    Py_buffer probe;
    if (PyObject_GetBuffer(samples, &probe, PyBUF_SIMPLE) < 0)
        return -1;
    self->quota = probe.len / 8;
    PyBuffer_Release(&probe);
    self->rank = rank;
    self->blocks = blocks;
    self->count = 0;
    if (!(self->times = hold(self, times, "times", 4 * self->quota)) ||
        !(self->samples = hold(self, samples, "samples", self->quota)) ||
        !(self->progress = hold(self, progress, "progress", rank + 1)) ||
        !(self->copy_end = hold(self, copy_end, "copy_end", self->quota * blocks)) ||
        !(self->store_end = hold(self, store_end, "store_end", self->quota * blocks)))
        return -1;
    return 0;
}

/* Every call below writes into the row of update `count`; `done` moves to the next. Between
 * `written` and `done` the worker stores what measure mode keeps of the update. */
static int
in_range(Recorder *self)
{
    if (self->count < self->quota)
        return 1;
    PyErr_Format(PyExc_IndexError, "Recorder: all %zd updates recorded", self->quota);
    return 0;
}

/* Stamp slot `slot` (0 read start, 1 read end, 2 gradient end, 3 write end) of the row. */
static PyObject *
stamp(Recorder *self, int slot)
{
    if (!in_range(self))
        return NULL;
    self->times[4 * self->count + slot] = now();
    Py_RETURN_NONE;
}

static PyObject *
Recorder_start(Recorder *self, PyObject *Py_UNUSED(ignored)) { return stamp(self, 0); }

static PyObject *
Recorder_read_end(Recorder *self, PyObject *Py_UNUSED(ignored)) { return stamp(self, 1); }

static PyObject *
Recorder_grad_end(Recorder *self, PyObject *Py_UNUSED(ignored)) { return stamp(self, 2); }

static PyObject *
Recorder_written(Recorder *self, PyObject *Py_UNUSED(ignored)) { return stamp(self, 3); }

static PyObject *
Recorder_done(Recorder *self, PyObject *sample)
{
    if (!in_range(self))
        return NULL;
    long long value = PyLong_AsLongLong(sample);
    if (value == -1 && PyErr_Occurred())
        return NULL;
    self->samples[self->count] = value;
    self->count++;
    self->progress[self->rank] = self->count;  /* last: the row is whole when it counts */
    Py_RETURN_NONE;
}

/* Stamp block `block`'s entry of the row in `base` (copy_end or store_end). */
static PyObject *
stamp_block(Recorder *self, int64_t *base, PyObject *block)
{
    if (!in_range(self))
        return NULL;
    Py_ssize_t b = PyLong_AsSsize_t(block);
    if (b == -1 && PyErr_Occurred())
        return NULL;
    if (b < 0 || b >= self->blocks) {
        PyErr_Format(PyExc_IndexError, "block %zd: not in 0..%zd", b, self->blocks - 1);
        return NULL;
    }
    base[self->count * self->blocks + b] = now();
    Py_RETURN_NONE;
}

static PyObject *
Recorder_copied(Recorder *self, PyObject *block) { return stamp_block(self, self->copy_end, block); }

static PyObject *
Recorder_stored(Recorder *self, PyObject *block) { return stamp_block(self, self->store_end, block); }

static PyObject *
Recorder_get_count(Recorder *self, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(self->count);
}

static PyMethodDef Recorder_methods[] = {
    {"start", (PyCFunction)Recorder_start, METH_NOARGS, "Stamp the read start."},
    {"read_end", (PyCFunction)Recorder_read_end, METH_NOARGS, "Stamp the read end."},
    {"grad_end", (PyCFunction)Recorder_grad_end, METH_NOARGS, "Stamp the gradient end."},
    {"written", (PyCFunction)Recorder_written, METH_NOARGS, "Stamp the write end."},
    {"done", (PyCFunction)Recorder_done, METH_O,
     "Store the update's sample and count it (after whatever else its row holds)."},
    {"copied", (PyCFunction)Recorder_copied, METH_O, "Stamp the end of a block's copy."},
    {"stored", (PyCFunction)Recorder_stored, METH_O, "Stamp the end of a block's store."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Recorder_getset[] = {
    {"count", (getter)Recorder_get_count, NULL, "updates recorded", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "realrun._records.Recorder",
    .tp_doc = "Stamps of one worker's updates, written into its shared record buffers.",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Recorder_init,
    .tp_dealloc = (destructor)Recorder_dealloc,
    .tp_methods = Recorder_methods,
    .tp_getset = Recorder_getset,
};

static struct PyModuleDef records_module = {
    PyModuleDef_HEAD_INIT, "realrun._records",
    "A real worker's per-update records, written from C.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__records(void)
{
    if (PyType_Ready(&RecorderType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&records_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&RecorderType);
    if (PyModule_AddObject(module, "Recorder", (PyObject *)&RecorderType) < 0) {
        Py_DECREF(&RecorderType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
