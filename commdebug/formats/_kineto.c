/* commdebug.formats._kineto: one pass over a torch.profiler (Kineto) trace's bytes that keeps
 * only the events commdebug reads, without making Python objects of the others.
 *
 * A GPU trace of a few steps is tens of megabytes of JSON and over a hundred thousand events,
 * most of them CPU ops, CUDA runtime calls and flow arrows that say nothing about
 * communication. Parsing them all (orjson included) is most of what reading a trace costs.
 * scan() walks the document once, checking that it is JSON as it goes, and makes Python objects
 * (those json.loads makes) of the events kineto.py's sorting keeps alone: GPU activities,
 * metadata, CPU events whose name holds one of the given markers. Of each CUDA launch it keeps
 * only its correlation id, time and thread.
 *
 * The result is what kineto.py's full parse gives (kineto.py's _sort, applied to the events
 * kept, is the same code): an event is kept whenever its bytes leave any doubt (a name with
 * escapes, a name that is no string), and anything this pass does not expect (a document that
 * is not strict JSON, a key with escapes, a launch whose fields are not plain numbers, an integer
 * past 64 bits, nesting deeper than MAX_DEPTH) makes it return None: the caller then parses the
 * whole document, which says what is wrong or reads what this pass does not.
 *
 * The JSON itself (the checking skip, the objects) is _kineto_json.h's; it reads a bytes object,
 * whose buffer CPython ends with a NUL byte.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_kineto_json.h"

#define DECLINE (-2) /* not an error: the caller parses the whole document */

/* ---- one event ------------------------------------------------------------------------ */

enum { ABSENT, STRING, INTEGER, NUMBER, OTHER };

typedef struct {
    Ptr at;         /* a string's content (no quotes), a number's text */
    Py_ssize_t len;
    int kind;
    int escaped;
} Field;

typedef struct {
    Field ph, cat, name, tid, ts, correlation;
    int args_object, stream;
    int declined;   /* a key written with escapes: "p\u0068" is "ph", and this pass compares bytes */
} Event;

/* A value at p into f: the position after it, or NULL. */
static Ptr
read_field(Ptr p, Ptr end, int depth, Field *f)
{
    Ptr after;
    f->escaped = 0;
    if (*p == '"') {
        if ((after = skip_string(p, end, &f->escaped)) == NULL)
            return NULL;
        f->at = p + 1;
        f->len = after - p - 2;
        f->kind = STRING;
        return after;
    }
    if (*p == '-' || is_digit(*p)) {
        int integer;
        if ((after = skip_number(p, &integer)) == NULL)
            return NULL;
        f->at = p;
        f->len = after - p;
        f->kind = integer ? INTEGER : NUMBER;
        return after;
    }
    f->kind = OTHER;
    return skip_value(p, end, depth);
}

#define KEY_IS(key, len, literal) ((len) == (Py_ssize_t)sizeof(literal) - 1 && memcmp((key), (literal), sizeof(literal) - 1) == 0)

static Ptr
args_member(Ptr key, Py_ssize_t len, int escaped, Ptr p, Ptr end, int depth, void *into)
{
    Event *e = into;
    if (escaped) {
        e->declined = 1;
        return NULL;
    }
    if (KEY_IS(key, len, "stream"))
        e->stream = 1;
    else if (KEY_IS(key, len, "correlation"))
        return read_field(p, end, depth, &e->correlation);
    return skip_value(p, end, depth);
}

static Ptr
event_member(Ptr key, Py_ssize_t len, int escaped, Ptr p, Ptr end, int depth, void *into)
{
    Event *e = into;
    Field *f = NULL;
    if (escaped) {
        e->declined = 1;
        return NULL;
    }
    switch (len) {
    case 2:
        f = KEY_IS(key, len, "ph") ? &e->ph : KEY_IS(key, len, "ts") ? &e->ts : NULL;
        break;
    case 3:
        f = KEY_IS(key, len, "cat") ? &e->cat : KEY_IS(key, len, "tid") ? &e->tid : NULL;
        break;
    case 4:
        if (KEY_IS(key, len, "name"))
            f = &e->name;
        else if (KEY_IS(key, len, "args")) {  /* the last "args" counts, as in a parsed dict */
            e->stream = 0;
            e->correlation.kind = ABSENT;
            e->args_object = *p == '{';
            return e->args_object ? read_container(p, end, depth, args_member, e) : skip_value(p, end, depth);
        }
        break;
    }
    return f != NULL ? read_field(p, end, depth, f) : skip_value(p, end, depth);
}

/* ---- what is kept ---------------------------------------------------------------------- */

typedef struct {
    PyObject *gpu;       /* the GPU activities, as dicts */
    PyObject *events;    /* the other events kept, as dicts */
    PyObject *launches;  /* correlation id -> (time, thread) */
    PyObject **strings;  /* ASCII strs made, by a hash of their text: a trace repeats its keys, names and
                          * categories thousands of times, and one str serves them all */
    Py_buffer *markers;
    Py_ssize_t n_markers;
    int status;          /* 0; -1 an error is set; DECLINE */
} Scan;

static inline int
field_is(const Field *f, const char *text, Py_ssize_t len)
{
    return f->kind == STRING && !f->escaped && f->len == len && memcmp(f->at, text, (size_t)len) == 0;
}

#define FIELD_IS(f, literal) field_is((f), (literal), (Py_ssize_t)sizeof(literal) - 1)

static int
holds(Ptr at, Py_ssize_t len, const Py_buffer *marker)
{
    Py_ssize_t n = marker->len;
    const unsigned char *m = marker->buf;
    if (n == 0 || n > len)
        return n == 0;
    Ptr last = at + len - n;
    while (at <= last) {
        Ptr hit = memchr(at, m[0], (size_t)(last - at + 1));
        if (hit == NULL)
            return 0;
        if (memcmp(hit, m, (size_t)n) == 0)
            return 1;
        at = hit + 1;
    }
    return 0;
}

/* An integer field as a Python int, or NULL (no error set) where it is none (see integer_of). */
static PyObject *
integer_field(const Field *f)
{
    return f->kind == INTEGER ? integer_of(f->at, f->len) : NULL;
}

/* A time field as a double, as float() of the parsed value gives it: -1 on an error, DECLINE
 * where the full parse must say (no number; float() of a huge integer raises), else 0. */
static int
time_of(const Field *f, double *out)
{
    if (f->kind == ABSENT) {
        *out = 0.0;
        return 0;
    }
    if (f->kind != INTEGER && f->kind != NUMBER)
        return DECLINE;
    if (double_of(f->at, f->len, out) < 0)
        return -1;
    return isfinite(*out) ? 0 : DECLINE;
}

/* A launch's (time, thread) into s->launches: 0, -1 on an error, DECLINE where a field is not
 * what Kineto writes (the full parse reads it). */
static int
add_launch(Scan *s, const Event *e)
{
    PyObject *corr = NULL, *when = NULL, *tid = NULL, *pair = NULL;
    double ts;
    int status = time_of(&e->ts, &ts);
    if (status != 0)
        return status;
    status = -1;
    if ((corr = integer_field(&e->correlation)) == NULL)
        goto done;
    if (e->tid.kind == ABSENT)
        tid = Py_NewRef(Py_None);
    else if (e->tid.kind == STRING && !e->tid.escaped)
        tid = PyUnicode_DecodeUTF8((const char *)e->tid.at, e->tid.len, "surrogatepass");
    else
        tid = integer_field(&e->tid);
    if (tid == NULL || (when = PyFloat_FromDouble(ts)) == NULL || (pair = PyTuple_Pack(2, when, tid)) == NULL)
        goto done;
    status = PyDict_SetItem(s->launches, corr, pair);
done:
    if (status == -1 && !PyErr_Occurred())
        status = DECLINE;
    Py_XDECREF(corr);
    Py_XDECREF(when);
    Py_XDECREF(tid);
    Py_XDECREF(pair);
    return status;
}

static int
keep(Scan *s, PyObject *into, Ptr from, Ptr end)
{
    PyObject *event;
    if (build_value(s->strings, from, end, &event) == NULL)
        return PyErr_Occurred() ? -1 : DECLINE;
    int status = PyList_Append(into, event);
    Py_DECREF(event);
    return status;
}

/* One event of traceEvents, at from: kept, skipped, a launch read, or DECLINE. Mirrors
 * kineto.py's _sort (see there); an event is kept wherever its bytes cannot tell. */
static int
sort_event(Scan *s, const Event *e, Ptr from, Ptr end)
{
    if (e->ph.kind == STRING && e->ph.escaped)
        return DECLINE;
    if (FIELD_IS(&e->ph, "M"))
        return keep(s, s->events, from, end);
    if (!FIELD_IS(&e->ph, "X"))
        return 0;
    if (e->args_object && e->stream)
        return keep(s, s->gpu, from, end);
    if (e->cat.kind == STRING) {
        if (e->cat.escaped)
            return DECLINE;
        if (FIELD_IS(&e->cat, "cuda_runtime") || FIELD_IS(&e->cat, "cuda_driver") || FIELD_IS(&e->cat, "privateuse1_runtime"))
            return e->args_object && e->correlation.kind != ABSENT ? add_launch(s, e) : 0;
    }
    /* a CPU event: kept where its name holds a marker. A name that is no string is kept too
     * (str() of a list could hold one); one that is absent or a number cannot. */
    if (e->name.kind == ABSENT || e->name.kind == INTEGER || e->name.kind == NUMBER)
        return 0;
    if (e->name.kind == OTHER || e->name.escaped)
        return keep(s, s->events, from, end);
    for (Py_ssize_t i = 0; i < s->n_markers; i++)
        if (holds(e->name.at, e->name.len, &s->markers[i]))
            return keep(s, s->events, from, end);
    return 0;
}

/* One element of traceEvents: an event sorted, anything else skipped (the parse skips it too). */
static Ptr
trace_event(Ptr key, Py_ssize_t len, int escaped, Ptr p, Ptr end, int depth, void *into)
{
    Scan *s = into;
    (void)key, (void)len, (void)escaped;
    Event e;
    Ptr from = p;
    if (*p != '{')
        return skip_value(p, end, depth);
    memset(&e, 0, sizeof e);
    if ((p = read_container(p, end, depth, event_member, &e)) == NULL) {
        if (e.declined)
            s->status = DECLINE;
        return NULL;
    }
    if ((s->status = sort_event(s, &e, from, end)) != 0)
        return NULL;
    return p;
}

/* The document's top-level members: traceEvents read, the others made into the header. */
typedef struct {
    Scan *scan;
    PyObject *header;
    int seen;
} Document;

static Ptr
document_member(Ptr key, Py_ssize_t len, int escaped, Ptr p, Ptr end, int depth, void *into)
{
    Document *d = into;
    PyObject *name = NULL, *value = NULL;
    Ptr after;
    if (escaped)
        return NULL;
    if (KEY_IS(key, len, "traceEvents")) {
        if (d->seen || *p != '[')
            return NULL;
        d->seen = 1;
        return read_container(p, end, depth, trace_event, d->scan);
    }
    if ((after = skip_value(p, end, depth)) == NULL)
        return NULL;
    if (build_string(d->scan->strings, key - 1, end, &name) == NULL || build_value(d->scan->strings, p, end, &value) == NULL ||
        PyDict_SetItem(d->header, name, value) < 0) {
        d->scan->status = PyErr_Occurred() ? -1 : DECLINE;
        after = NULL;
    }
    Py_XDECREF(name);
    Py_XDECREF(value);
    return after;
}

PyDoc_STRVAR(scan_doc,
"scan(raw, markers, /)\n--\n\n"
"One pass over a trace document: (header, gpu, others, launches) or None.\n\n"
"header: the top-level members but traceEvents; gpu: the GPU activities; others: the other\n"
"events kept (metadata, CPU events whose name holds one of the markers, bytes objects), each as\n"
"json.loads makes it; launches: {correlation id: (time, thread)} of the CUDA runtime and driver\n"
"calls. None where the document is not strict JSON or holds what this pass does not read (the\n"
"caller parses it whole).");

static PyObject *
scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Scan s;
    Document d;
    PyObject *result = NULL;
    Py_ssize_t got = 0;
    (void)module;
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "scan(raw: bytes, markers: tuple[bytes, ...])");
        return NULL;
    }
    memset(&s, 0, sizeof s);
    memset(&d, 0, sizeof d);
    d.scan = &s;
    s.n_markers = PyTuple_GET_SIZE(args[1]);
    if ((s.markers = PyMem_Calloc((size_t)(s.n_markers ? s.n_markers : 1), sizeof(Py_buffer))) == NULL ||
        (s.strings = PyMem_Calloc(STRINGS, sizeof(PyObject *))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < s.n_markers; got++)
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(args[1], got), &s.markers[got], PyBUF_SIMPLE) < 0)
            goto done;
    if ((s.launches = PyDict_New()) == NULL || (s.gpu = PyList_New(0)) == NULL || (s.events = PyList_New(0)) == NULL ||
        (d.header = PyDict_New()) == NULL)
        goto done;

    Ptr start = (Ptr)PyBytes_AS_STRING(args[0]), end = start + PyBytes_GET_SIZE(args[0]);
    Ptr p = skip_ws(start);
    if (*p == '{') {
        p = read_container(p, end, 0, document_member, &d);
        if (p != NULL && skip_ws(p) != end)
            p = NULL;  /* more after the document: no JSON */
    }
    else
        p = NULL;
    if (s.status == -1)
        goto done;
    if (p == NULL || !d.seen || s.status == DECLINE)
        result = Py_NewRef(Py_None);
    else
        result = PyTuple_Pack(4, d.header, s.gpu, s.events, s.launches);
done:
    Py_XDECREF(d.header);
    Py_XDECREF(s.gpu);
    Py_XDECREF(s.events);
    Py_XDECREF(s.launches);
    if (s.strings != NULL)
        for (int i = 0; i < STRINGS; i++)
            Py_XDECREF(s.strings[i]);
    PyMem_Free(s.strings);
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&s.markers[i]);
    PyMem_Free(s.markers);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL, scan_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "commdebug.formats._kineto",
    "The events of a torch.profiler trace that commdebug reads, found in one pass over its bytes.",
    -1, methods,
};

PyMODINIT_FUNC
PyInit__kineto(void)
{
    init_tables();
    return PyModule_Create(&module_def);
}
