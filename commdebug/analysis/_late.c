/* commdebug.analysis._late: the late-rank analysis's passes over a rank's calls, in C.
 *
 * The analysis (late.py, late_digest.py, late_tally.py beside this file) reads every timed call
 * of every rank twice: once in the worker that loaded the rank, to split its calls by group with
 * their gaps and call sites (columns()), and once in the process that merges the ranks, to
 * compare them with the other members' (merge()) and to sum them (add_batch()), and once per
 * group, to take its share of the result (settle(), fold()). Done a
 * column at a time in Python that is some forty passes over ten thousand calls per rank, as
 * long as the rest of `commdebug check`; here it is one pass each.
 *
 * Every result equals the Python code's beside it (late_digest.py's and late_tally.py's
 * fallbacks, used where this module is not built): the same double operations in the same
 * order, so the same bits. Anything this module does not expect (a field that is not a float,
 * an int or None where it reads one) raises TypeError, and the caller takes the Python path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ---- growable byte buffers ------------------------------------------------------------- */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

static int
buf_put(Buf *b, const void *item, Py_ssize_t size)
{
    if (b->len + size > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + size)
            cap *= 2;
        char *data = PyMem_Realloc(b->data, (size_t)cap);
        if (data == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, item, (size_t)size);
    b->len += size;
    return 0;
}

static PyObject *array_type;  /* array.array */

/* An array.array of `code` holding the buffer's bytes. */
static PyObject *
buf_array(const Buf *b, const char *code)
{
    PyObject *bytes = PyBytes_FromStringAndSize(b->data ? b->data : "", b->len);
    if (bytes == NULL)
        return NULL;
    PyObject *out = PyObject_CallFunction(array_type, "sO", code, bytes);
    Py_DECREF(bytes);
    return out;
}

/* ---- columns() ---------------------------------------------------------------------------- */

enum { F_LAT, F_SEQ, F_START, F_STEP, F_GROUP, F_OP, F_MODULE, F_SOURCE, N_FIELDS };

typedef struct {
    PyObject *name, *info;  /* borrowed: the events hold them */
    Buf seqs, lats, gaps, steps, sites, prevs, prev_seqs, prev_groups, prev_lats, ordinals, starts;
} Group;

static void
group_free(Group *g)
{
    PyMem_Free(g->seqs.data);
    PyMem_Free(g->lats.data);
    PyMem_Free(g->gaps.data);
    PyMem_Free(g->steps.data);
    PyMem_Free(g->sites.data);
    PyMem_Free(g->prevs.data);
    PyMem_Free(g->prev_seqs.data);
    PyMem_Free(g->prev_groups.data);
    PyMem_Free(g->prev_lats.data);
    PyMem_Free(g->ordinals.data);
    PyMem_Free(g->starts.data);
}

#define SITE_SLOTS 512  /* a rank has a few dozen call sites; its strings are shared between its events */

typedef struct {
    PyObject *op, *module, *source;  /* borrowed */
    int id;
} SiteSlot;

/* A float field (an int is read as the double Python's arithmetic would make of it); 1: None. */
static int
read_double(PyObject *x, double *out)
{
    if (PyFloat_CheckExact(x)) {
        *out = PyFloat_AS_DOUBLE(x);
        return 0;
    }
    if (x == Py_None)
        return 1;
    PyErr_SetString(PyExc_TypeError, "a float field holds something else");
    return -1;
}

static int
read_int(PyObject *x, long long *out)
{
    if (PyLong_CheckExact(x)) {
        int overflow = 0;
        *out = PyLong_AsLongLongAndOverflow(x, &overflow);
        if (overflow || (*out == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "an int field out of range");
            return -1;
        }
        return 0;
    }
    if (x == Py_None)
        return 1;
    PyErr_SetString(PyExc_TypeError, "an int field holds something else");
    return -1;
}

/* The id of a call site (op, module, source) in `ids` / `table`, first seen first. */
static int
site_id(SiteSlot *slots, PyObject *ids, PyObject *table, PyObject *op, PyObject *module, PyObject *source)
{
    uintptr_t h = ((uintptr_t)op >> 4) * 31u + ((uintptr_t)module >> 4) * 131u + ((uintptr_t)source >> 4);
    SiteSlot *slot = &slots[(h ^ (h >> 9)) % SITE_SLOTS];
    if (slot->op == op && slot->module == module && slot->source == source)
        return slot->id;
    PyObject *key = PyTuple_Pack(3, op, module, source);
    if (key == NULL)
        return -1;
    PyObject *found = PyDict_GetItemWithError(ids, key);
    long id;
    if (found != NULL) {
        id = PyLong_AsLong(found);
    } else if (PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    } else {
        id = (long)PyList_GET_SIZE(table);
        PyObject *number = PyLong_FromLong(id);
        if (number == NULL || PyDict_SetItem(ids, key, number) < 0 || PyList_Append(table, key) < 0) {
            Py_XDECREF(number);
            Py_DECREF(key);
            return -1;
        }
        Py_DECREF(number);
    }
    Py_DECREF(key);
    slot->op = op;
    slot->module = module;
    slot->source = source;
    slot->id = (int)id;
    return (int)id;
}

PyDoc_STRVAR(columns_doc,
"columns(events, fields, starts, steps) -> (groups, table, step_times, timed)\n\n"
"One rank's events (CollectiveEvent tuples, in call order) split by group in one pass.\n"
"`fields`: the events' indices of latency_s, seq, start_s, step, group, op, module, source.\n"
"groups: per group of a timed call with a sequence number, in first-call order, (its\n"
"GroupInfo, seqs q, lats d, gaps d or None, steps q, sites i, prev_sites i, prev_seqs q,\n"
"prev_groups i, prev_lats d, ordinals q, starts d or None: None unless `starts`, run: whether\n"
"the seqs"
"run first to last with no hole); a call's gap is from the end of the call before it\n"
"(an untimed one ends where it starts) to its start, 0 where any two calls overlap and for\n"
"the first call (no call of the rank's own to measure from); sites are ids into table, a\n"
"list of (op, module, source); prev_sites and prev_seqs are the call before's (-1: none, or a\n"
"call without a sequence number); prev_groups the index in groups of the call before's group\n"
"(-1: none, or it is not timed or has no number), prev_lats its latency (-1: none, or not\n"
"timed); ordinals its place among the events (0: the first). step_times: with `steps`, the\n"
"timed calls' (steps q, time at each d) when their steps are in call order, else None.\n"
"timed: how many calls are timed. TypeError where a field is not what it should be.");

static PyObject *
columns(PyObject *module, PyObject *args)
{
    PyObject *events, *fields;
    int want_starts, want_steps;
    if (!PyArg_ParseTuple(args, "O!O!pp", &PyList_Type, &events, &PyTuple_Type, &fields, &want_starts, &want_steps))
        return NULL;
    if (PyTuple_GET_SIZE(fields) != N_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "fields: 8 indices");
        return NULL;
    }
    Py_ssize_t at[N_FIELDS], need = 0;
    for (int f = 0; f < N_FIELDS; f++) {
        at[f] = PyLong_AsSsize_t(PyTuple_GET_ITEM(fields, f));
        if (at[f] < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "fields: indices");
            return NULL;
        }
        if (at[f] >= need)
            need = at[f] + 1;
    }
    PyObject *result = NULL, *ids = PyDict_New(), *table = PyList_New(0), *groups_out = NULL, *steps_out = NULL;
    SiteSlot *slots = PyMem_Calloc(SITE_SLOTS, sizeof(SiteSlot));
    Group *groups = NULL;
    Py_ssize_t n_groups = 0, cap_groups = 0;
    Buf step_list = {0}, step_sums = {0};
    int steps_ordered = want_steps, have_starts = 1, overlap = 0;
    long long timed = 0;
    if (ids == NULL || table == NULL || slots == NULL)
        goto done;

    Py_ssize_t n = PyList_GET_SIZE(events);
    double prev_end = 0.0;  /* the call before's start + latency */
    int prev_site = -1, prev_group = -1;
    double prev_lat = -1.0;
    long long prev_seq = -1, last_step = 0, step_count = 0;
    double step_sum = 0.0;
    PyObject *last_group = NULL;
    Py_ssize_t last_index = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyList_GET_ITEM(events, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < need) {
            PyErr_SetString(PyExc_TypeError, "an event is not a CollectiveEvent");
            goto done;
        }
        double lat = 0.0, start = 0.0;
        long long seq = -1, step = 0;
        int no_lat = read_double(PyTuple_GET_ITEM(e, at[F_LAT]), &lat);
        int no_seq = read_int(PyTuple_GET_ITEM(e, at[F_SEQ]), &seq);
        int no_start = have_starts ? read_double(PyTuple_GET_ITEM(e, at[F_START]), &start) : 1;
        if (no_lat < 0 || no_seq < 0 || no_start < 0)
            goto done;
        if (no_lat)
            lat = 0.0;  /* an untimed call ends where it starts */
        if (no_seq)
            seq = -1;
        PyObject *group = PyTuple_GET_ITEM(e, at[F_GROUP]);
        int site = site_id(slots, ids, table, PyTuple_GET_ITEM(e, at[F_OP]), PyTuple_GET_ITEM(e, at[F_MODULE]),
                           PyTuple_GET_ITEM(e, at[F_SOURCE]));
        if (site < 0)
            goto done;
        double gap = 0.0;
        if (no_start) {
            have_starts = 0;  /* Flight Recorder: no start times, so no gaps */
        } else {
            gap = i == 0 ? 0.0 : start - prev_end;  /* a first call has no call of its own before it */
            if (gap < 0)
                overlap = 1;
            prev_end = start + lat;
        }
        if (!no_lat && (!no_seq || steps_ordered)) {
            int no_step = read_int(PyTuple_GET_ITEM(e, at[F_STEP]), &step);
            if (no_step < 0)
                goto done;
            if (no_step) {
                PyErr_SetString(PyExc_TypeError, "a timed call without a step");
                goto done;
            }
        }
        if (!no_lat) {
            timed++;
            if (steps_ordered) {  /* the rank's time per step, summed as Python's sum() of a slice does */
                if (step_count > 0 && step < last_step) {
                    steps_ordered = 0;
                } else {
                    if (step_count == 0 || step != last_step) {
                        if (step_count > 0 && buf_put(&step_sums, &step_sum, sizeof step_sum) < 0)
                            goto done;
                        if (buf_put(&step_list, &step, sizeof step) < 0)
                            goto done;
                        step_sum = 0.0;
                        last_step = step;
                    }
                    step_sum += lat;
                    step_count++;
                }
            }
        }
        int this_group = -1;
        if (!no_lat && !no_seq) {
            if (!PyTuple_Check(group) || PyTuple_GET_SIZE(group) < 1 || !PyUnicode_Check(PyTuple_GET_ITEM(group, 0))) {
                PyErr_SetString(PyExc_TypeError, "an event's group is not a GroupInfo");
                goto done;
            }
            PyObject *name = PyTuple_GET_ITEM(group, 0);
            Py_ssize_t g = -1;
            if (group == last_group) {
                g = last_index;
            } else {
                for (Py_ssize_t k = 0; k < n_groups && g < 0; k++)
                    if (groups[k].name == name)
                        g = k;
                for (Py_ssize_t k = 0; k < n_groups && g < 0; k++) {
                    int same = PyUnicode_Compare(groups[k].name, name);
                    if (same == -1 && PyErr_Occurred())
                        goto done;
                    if (same == 0)
                        g = k;
                }
                if (g < 0) {
                    if (n_groups == cap_groups) {
                        Py_ssize_t cap = cap_groups ? cap_groups * 2 : 8;
                        Group *more = PyMem_Realloc(groups, (size_t)cap * sizeof(Group));
                        if (more == NULL) {
                            PyErr_NoMemory();
                            goto done;
                        }
                        groups = more;
                        cap_groups = cap;
                    }
                    memset(&groups[n_groups], 0, sizeof(Group));
                    groups[n_groups].name = name;
                    groups[n_groups].info = group;
                    g = n_groups++;
                }
                last_group = group;
                last_index = g;
            }
            Group *to = &groups[g];
            int site_i = site;
            long long ordinal = (long long)i;
            if (buf_put(&to->seqs, &seq, sizeof seq) < 0 || buf_put(&to->lats, &lat, sizeof lat) < 0
                || buf_put(&to->gaps, &gap, sizeof gap) < 0 || buf_put(&to->steps, &step, sizeof step) < 0
                || buf_put(&to->sites, &site_i, sizeof site_i) < 0 || buf_put(&to->prevs, &prev_site, sizeof prev_site) < 0
                || buf_put(&to->prev_seqs, &prev_seq, sizeof prev_seq) < 0
                || buf_put(&to->prev_groups, &prev_group, sizeof prev_group) < 0
                || buf_put(&to->prev_lats, &prev_lat, sizeof prev_lat) < 0
                || buf_put(&to->ordinals, &ordinal, sizeof ordinal) < 0
                || (want_starts && buf_put(&to->starts, &start, sizeof start) < 0))
                goto done;
            this_group = (int)g;
        }
        prev_site = site;
        prev_seq = seq;
        prev_group = this_group;
        prev_lat = no_lat ? -1.0 : lat;
    }
    if (steps_ordered && step_count > 0 && buf_put(&step_sums, &step_sum, sizeof step_sum) < 0)
        goto done;

    groups_out = PyList_New(n_groups);
    if (groups_out == NULL)
        goto done;
    for (Py_ssize_t g = 0; g < n_groups; g++) {
        Group *from = &groups[g];
        if (have_starts && overlap) {  /* overlapping calls (asynchronous timing): no gap, anywhere */
            double *gaps = (double *)from->gaps.data;
            for (Py_ssize_t k = 0; k < from->gaps.len / (Py_ssize_t)sizeof(double); k++)
                if (!(gaps[k] > 0.0))
                    gaps[k] = 0.0;
        }
        /* the usual case: the sequence numbers run first to last, with no hole */
        const long long *seqs = (const long long *)from->seqs.data;
        Py_ssize_t count = from->seqs.len / (Py_ssize_t)sizeof(long long);
        int run = 1;
        for (Py_ssize_t k = 1; k < count && run; k++)
            run = seqs[k] == seqs[0] + k;
        PyObject *item = Py_BuildValue("(ONNNNNNNNNNNO)", from->info, buf_array(&from->seqs, "q"), buf_array(&from->lats, "d"),
                                       have_starts ? buf_array(&from->gaps, "d") : Py_NewRef(Py_None),
                                       buf_array(&from->steps, "q"), buf_array(&from->sites, "i"), buf_array(&from->prevs, "i"),
                                       buf_array(&from->prev_seqs, "q"), buf_array(&from->prev_groups, "i"),
                                       buf_array(&from->prev_lats, "d"), buf_array(&from->ordinals, "q"),
                                       have_starts && want_starts ? buf_array(&from->starts, "d") : Py_NewRef(Py_None),
                                       run ? Py_True : Py_False);
        if (item == NULL)
            goto done;
        PyList_SET_ITEM(groups_out, g, item);
    }
    if (steps_ordered) {
        steps_out = Py_BuildValue("(NN)", buf_array(&step_list, "q"), buf_array(&step_sums, "d"));
        if (steps_out == NULL)
            goto done;
    } else {
        steps_out = Py_NewRef(Py_None);
    }
    result = Py_BuildValue("(OOOL)", groups_out, table, steps_out, timed);

done:
    for (Py_ssize_t g = 0; g < n_groups; g++)
        group_free(&groups[g]);
    PyMem_Free(groups);
    PyMem_Free(slots);
    PyMem_Free(step_list.data);
    PyMem_Free(step_sums.data);
    Py_XDECREF(ids);
    Py_XDECREF(table);
    Py_XDECREF(groups_out);
    Py_XDECREF(steps_out);
    return result;
}

/* ---- the merge ------------------------------------------------------------------------------ */

/* A buffer of `code` items (an array.array of that type code), writable or not; None gives an
 * empty view where `optional`. */
static int
view_of(PyObject *obj, Py_buffer *view, char code, Py_ssize_t itemsize, int writable, int optional)
{
    if (obj == Py_None && optional) {
        view->obj = NULL;
        view->buf = NULL;
        view->len = 0;
        return 0;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (view->itemsize != itemsize || view->format == NULL || view->format[0] != code || view->format[1] != '\0') {
        PyBuffer_Release(view);
        view->obj = NULL;
        PyErr_Format(PyExc_TypeError, "expected an array of type code '%c'", code);
        return -1;
    }
    return 0;
}

static void
release(Py_buffer *views, int count)
{
    for (int k = 0; k < count; k++)
        if (views[k].obj != NULL)
            PyBuffer_Release(&views[k]);
}

#define COUNT(v, type) ((v).len / (Py_ssize_t)sizeof(type))

PyDoc_STRVAR(merge_doc,
"merge(into, lo, rank, part, here, here_groups) -> None\n\n"
"One member's calls on a group, a run of sequence numbers from index `lo` of the group's\n"
"columns, compared with the members' before it. `into`: the group's (least d, most d, rank i,\n"
"site i, prev_site i, prev_seq q, gap d, start d or None, prev_group i, prev_lat d, most_rank\n"
"i, ordinal q); `part`: the member's (lats d, gaps d or None, sites i, prev_sites i, prev_seqs\n"
"q, starts d or None, prev_groups i, prev_lats d, ordinals q); `here`: its site ids as the\n"
"group's (i); `here_groups`:\n"
"its group indices as the tally's group ids (i). Where a latency is more than `most`, `most`\n"
"takes it, and `most_rank` the member; where a latency is less than `least`, the\n"
"member arrived last so far: it takes least, rank, sites, previous call (its group and the\n"
"member's latency there too), the call's place among the member's, and gap and start where\n"
"the member has them (start only where\n"
"`into` keeps it).");

static PyObject *
merge(PyObject *module, PyObject *args)
{
    PyObject *into, *part, *here_obj, *groups_obj;
    Py_ssize_t lo;
    int rank;
    if (!PyArg_ParseTuple(args, "O!niO!OO", &PyTuple_Type, &into, &lo, &rank, &PyTuple_Type, &part, &here_obj, &groups_obj))
        return NULL;
    if (PyTuple_GET_SIZE(into) != 12 || PyTuple_GET_SIZE(part) != 9) {
        PyErr_SetString(PyExc_TypeError, "merge: 12 columns into, 9 of the part");
        return NULL;
    }
    enum { LEAST, MOST, RANK, SITE, PREV_SITE, PREV_SEQ, GAP, START, PREV_GROUP, PREV_LAT, MOST_RANK, ORDINAL,
           LATS, GAPS, SITES, PREVS, PREV_SEQS, STARTS, PREV_GROUPS, PREV_LATS, ORDINALS, HERE, HERE_GROUPS, N };
    Py_buffer v[N];
    static const char codes[N] = {'d', 'd', 'i', 'i', 'i', 'q', 'd', 'd', 'i', 'd', 'i', 'q',
                                  'd', 'd', 'i', 'i', 'q', 'd', 'i', 'd', 'q', 'i', 'i'};
    static const Py_ssize_t sizes[N] = {8, 8, 4, 4, 4, 8, 8, 8, 4, 8, 4, 8, 8, 8, 4, 4, 8, 8, 4, 8, 8, 4, 4};
    int got = 0;
    for (; got < N; got++) {
        PyObject *obj = got < LATS ? PyTuple_GET_ITEM(into, got) : got < HERE ? PyTuple_GET_ITEM(part, got - LATS)
                        : got == HERE ? here_obj : groups_obj;
        int optional = got == START || got == GAPS || got == STARTS;
        if (view_of(obj, &v[got], codes[got], sizes[got], got < LATS, optional) < 0) {
            release(v, got);
            return NULL;
        }
    }
    Py_ssize_t n = COUNT(v[LATS], double), size = COUNT(v[LEAST], double), n_here = COUNT(v[HERE], int);
    Py_ssize_t n_groups = COUNT(v[HERE_GROUPS], int);
    int has_gaps = v[GAPS].obj != NULL, has_start = v[START].obj != NULL && v[STARTS].obj != NULL;
    if (lo < 0 || lo + n > size || COUNT(v[MOST], double) != size || COUNT(v[RANK], int) != size || COUNT(v[SITE], int) != size
        || COUNT(v[PREV_SITE], int) != size || COUNT(v[PREV_SEQ], long long) != size || COUNT(v[GAP], double) != size
        || (v[START].obj != NULL && COUNT(v[START], double) != size) || COUNT(v[PREV_GROUP], int) != size
        || COUNT(v[PREV_LAT], double) != size || COUNT(v[MOST_RANK], int) != size || COUNT(v[ORDINAL], long long) != size
        || COUNT(v[SITES], int) != n || COUNT(v[ORDINALS], long long) != n
        || COUNT(v[PREVS], int) != n || COUNT(v[PREV_SEQS], long long) != n || (has_gaps && COUNT(v[GAPS], double) != n)
        || (v[STARTS].obj != NULL && COUNT(v[STARTS], double) != n) || COUNT(v[PREV_GROUPS], int) != n
        || COUNT(v[PREV_LATS], double) != n) {
        release(v, N);
        PyErr_SetString(PyExc_IndexError, "merge: columns of different lengths");
        return NULL;
    }
    const double *lats = v[LATS].buf, *gaps = v[GAPS].buf, *starts = v[STARTS].buf, *prev_lats = v[PREV_LATS].buf;
    const int *sites = v[SITES].buf, *prevs = v[PREVS].buf, *here = v[HERE].buf, *prev_groups = v[PREV_GROUPS].buf;
    const int *here_groups = v[HERE_GROUPS].buf;
    const long long *prev_seqs = v[PREV_SEQS].buf, *ordinals = v[ORDINALS].buf;
    double *least = (double *)v[LEAST].buf + lo, *most = (double *)v[MOST].buf + lo, *gap = (double *)v[GAP].buf + lo;
    double *start = has_start ? (double *)v[START].buf + lo : NULL, *prev_lat = (double *)v[PREV_LAT].buf + lo;
    int *ranks = (int *)v[RANK].buf + lo, *site = (int *)v[SITE].buf + lo, *prev_site = (int *)v[PREV_SITE].buf + lo;
    int *prev_group = (int *)v[PREV_GROUP].buf + lo, *most_rank = (int *)v[MOST_RANK].buf + lo;
    long long *prev_seq = (long long *)v[PREV_SEQ].buf + lo, *ordinal = (long long *)v[ORDINAL].buf + lo;
    for (Py_ssize_t j = 0; j < n; j++)
        if (sites[j] < 0 || sites[j] >= n_here || prevs[j] >= n_here || prev_groups[j] >= n_groups) {
            release(v, N);
            PyErr_SetString(PyExc_IndexError, "merge: a site or group id out of range");
            return NULL;
        }
    for (Py_ssize_t j = 0; j < n; j++) {
        double lat = lats[j];
        if (lat > most[j]) {
            most[j] = lat;
            most_rank[j] = rank;
        }
        if (lat < least[j]) {
            least[j] = lat;
            ranks[j] = rank;
            site[j] = here[sites[j]];
            prev_site[j] = prevs[j] < 0 ? -1 : here[prevs[j]];
            prev_seq[j] = prev_seqs[j];
            prev_group[j] = prev_groups[j] < 0 ? -1 : here_groups[prev_groups[j]];
            prev_lat[j] = prev_lats[j];
            ordinal[j] = ordinals[j];
            if (has_gaps) {
                gap[j] = gaps[j];
                if (has_start)
                    start[j] = starts[j];
            }
        }
    }
    release(v, N);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(add_batch_doc,
"add_batch(sums, lo, columns) -> None\n\n"
"Per index k, the members' values (`columns`: arrays of d, one per member, of one length)\n"
"added left to right, then added to sums[lo + k] (an array of d).");

static PyObject *
add_batch(PyObject *module, PyObject *args)
{
    PyObject *sums_obj, *cols;
    Py_ssize_t lo;
    if (!PyArg_ParseTuple(args, "OnO!", &sums_obj, &lo, &PyList_Type, &cols))
        return NULL;
    Py_ssize_t m = PyList_GET_SIZE(cols);
    if (m == 0)
        Py_RETURN_NONE;
    Py_buffer sums;
    if (view_of(sums_obj, &sums, 'd', 8, 1, 0) < 0)
        return NULL;
    Py_buffer *views = PyMem_Calloc((size_t)m, sizeof(Py_buffer));
    if (views == NULL) {
        PyBuffer_Release(&sums);
        return PyErr_NoMemory();
    }
    int got = 0;
    PyObject *out = NULL;
    for (; got < m; got++)
        if (view_of(PyList_GET_ITEM(cols, got), &views[got], 'd', 8, 0, 0) < 0)
            goto done;
    Py_ssize_t n = COUNT(views[0], double);
    for (Py_ssize_t k = 1; k < m; k++)
        if (COUNT(views[k], double) != n) {
            PyErr_SetString(PyExc_IndexError, "add_batch: columns of different lengths");
            goto done;
        }
    if (lo < 0 || lo + n > COUNT(sums, double)) {
        PyErr_SetString(PyExc_IndexError, "add_batch: out of range");
        goto done;
    }
    double *to = (double *)sums.buf + lo;
    for (Py_ssize_t j = 0; j < n; j++) {
        double s = ((const double *)views[0].buf)[j];
        for (Py_ssize_t k = 1; k < m; k++)
            s += ((const double *)views[k].buf)[j];
        to[j] += s;
    }
    out = Py_NewRef(Py_None);
done:
    release(views, got);
    PyMem_Free(views);
    PyBuffer_Release(&sums);
    return out;
}

PyDoc_STRVAR(settle_doc,
"settle(columns, runs, base, size, floor, early) -> (steps, ranks, caused, found, analysed, partial)\n\n"
"A group's share of the result. `columns`: its (total d, least d, most d, step i, rank i,\n"
"skip b, prev_site i, ordinal q); `runs`: every member's spans of sequence numbers (first,\n"
"last, first, last...) from `base`; `size`: its members. A call is analysed where every member\n"
"timed it and it is no uneven all_to_all; it made the others wait where total - members x least\n"
"exceeds 1e-12. found: [(index, wait)] of those whose longest single wait (most - least) is\n"
"`floor` or more, or that were among their late rank's first `early` calls (their waits are the\n"
"caller's to place: the root of each is known only once every group is); per other such call\n"
"(its late rank had a call before it: prev_site >= 0), in order, its step (i), late rank (i)\n"
"and that wait (d).\n"
"partial: the calls timed on some members but not all.");

static PyObject *
settle(PyObject *module, PyObject *args)
{
    PyObject *cols, *runs;
    Py_ssize_t base, size;
    double floor;
    long long early;
    if (!PyArg_ParseTuple(args, "O!O!nndL", &PyTuple_Type, &cols, &PyList_Type, &runs, &base, &size, &floor, &early))
        return NULL;
    if (PyTuple_GET_SIZE(cols) != 8) {
        PyErr_SetString(PyExc_TypeError, "settle: 8 columns");
        return NULL;
    }
    enum { TOTAL, LEAST, MOST, STEP, RANK, SKIP, PREV_SITE, ORDINAL, N };
    static const char codes[N] = {'d', 'd', 'd', 'i', 'i', 'b', 'i', 'q'};
    static const Py_ssize_t sizes[N] = {8, 8, 8, 4, 4, 1, 4, 8};
    Py_buffer v[N];
    int got = 0;
    for (; got < N; got++)
        if (view_of(PyTuple_GET_ITEM(cols, got), &v[got], codes[got], sizes[got], 0, 0) < 0) {
            release(v, got);
            return NULL;
        }
    PyObject *result = NULL, *found = NULL;
    Buf steps_out = {0}, ranks_out = {0}, caused_out = {0};
    Py_ssize_t n = COUNT(v[LEAST], double), n_runs = PyList_GET_SIZE(runs);
    long long *count = PyMem_Calloc((size_t)n + 1, sizeof(long long));
    if (count == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (COUNT(v[TOTAL], double) != n || COUNT(v[MOST], double) != n || COUNT(v[STEP], int) != n || COUNT(v[RANK], int) != n
        || COUNT(v[SKIP], char) != n || COUNT(v[PREV_SITE], int) != n || COUNT(v[ORDINAL], long long) != n || n_runs % 2) {
        PyErr_SetString(PyExc_IndexError, "settle: columns of different lengths");
        goto done;
    }
    for (Py_ssize_t k = 0; k < n_runs; k += 2) {  /* how many members' spans cover each call */
        Py_ssize_t first = PyLong_AsSsize_t(PyList_GET_ITEM(runs, k)) - base;
        Py_ssize_t last = PyLong_AsSsize_t(PyList_GET_ITEM(runs, k + 1)) - base;
        if (PyErr_Occurred())
            goto done;
        if (first < 0 || last < first || last >= n) {
            PyErr_SetString(PyExc_IndexError, "settle: a span out of range");
            goto done;
        }
        count[first] += 1;
        count[last + 1] -= 1;
    }
    const double *total = v[TOTAL].buf, *least = v[LEAST].buf, *most = v[MOST].buf;
    const int *step = v[STEP].buf, *rank = v[RANK].buf, *prev_site = v[PREV_SITE].buf;
    const long long *ordinal = v[ORDINAL].buf;
    const signed char *skip = v[SKIP].buf;
    long long covered = 0, analysed = 0, partial = 0;
    found = PyList_New(0);
    if (found == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        covered += count[i];
        if (covered != 0 && covered != size)
            partial++;
        if (size < 2 || covered != size || skip[i] != 0)
            continue;
        analysed++;
        double caused = total[i] - (double)covered * least[i];
        if (!(caused > 1e-12))  /* float noise aside, every member came at once */
            continue;
        if (most[i] - least[i] >= floor || ordinal[i] < early) {
            PyObject *item = Py_BuildValue("(nd)", i, caused);
            if (item == NULL || PyList_Append(found, item) < 0) {
                Py_XDECREF(item);
                goto done;
            }
            Py_DECREF(item);
        } else if (prev_site[i] >= 0) {
            if (buf_put(&steps_out, &step[i], sizeof(int)) < 0 || buf_put(&ranks_out, &rank[i], sizeof(int)) < 0
                || buf_put(&caused_out, &caused, sizeof caused) < 0)
                goto done;
        }
    }
    result = Py_BuildValue("(NNNOLL)", buf_array(&steps_out, "i"), buf_array(&ranks_out, "i"), buf_array(&caused_out, "d"), found,
                           analysed, partial);
done:
    release(v, N);
    PyMem_Free(count);
    PyMem_Free(steps_out.data);
    PyMem_Free(ranks_out.data);
    PyMem_Free(caused_out.data);
    Py_XDECREF(found);
    return result;
}

PyDoc_STRVAR(fold_doc,
"fold(sums, steps, ranks, caused, ints) -> None\n\n"
"sums[(step, rank)] = sums.get((step, rank), 0.0) + wait, for each (step i, rank i, wait d)\n"
"in order; a rank's int taken from the list `ints` where it holds it (shared by the keys).");

static PyObject *
fold(PyObject *module, PyObject *args)
{
    PyObject *sums, *steps_obj, *ranks_obj, *caused_obj, *ints;
    if (!PyArg_ParseTuple(args, "O!OOOO!", &PyDict_Type, &sums, &steps_obj, &ranks_obj, &caused_obj, &PyList_Type, &ints))
        return NULL;
    Py_buffer v[3];
    static const char codes[3] = {'i', 'i', 'd'};
    static const Py_ssize_t sizes[3] = {4, 4, 8};
    PyObject *objs[3] = {steps_obj, ranks_obj, caused_obj};
    int got = 0;
    for (; got < 3; got++)
        if (view_of(objs[got], &v[got], codes[got], sizes[got], 0, 0) < 0) {
            release(v, got);
            return NULL;
        }
    Py_ssize_t n = COUNT(v[2], double), n_ints = PyList_GET_SIZE(ints);
    if (COUNT(v[0], int) != n || COUNT(v[1], int) != n) {
        release(v, 3);
        PyErr_SetString(PyExc_IndexError, "fold: columns of different lengths");
        return NULL;
    }
    const int *steps = v[0].buf, *ranks = v[1].buf;
    const double *caused = v[2].buf;
    PyObject *out = NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *step = PyLong_FromLong(steps[k]), *rank;
        if (ranks[k] >= 0 && ranks[k] < n_ints)
            rank = Py_NewRef(PyList_GET_ITEM(ints, ranks[k]));
        else
            rank = PyLong_FromLong(ranks[k]);
        PyObject *key = (step && rank) ? PyTuple_Pack(2, step, rank) : NULL;
        Py_XDECREF(step);
        Py_XDECREF(rank);
        if (key == NULL)
            goto done;
        PyObject *had = PyDict_GetItemWithError(sums, key);
        double sum = 0.0;
        if (had != NULL) {
            sum = PyFloat_AsDouble(had);
            if (sum == -1.0 && PyErr_Occurred()) {
                Py_DECREF(key);
                goto done;
            }
        } else if (PyErr_Occurred()) {
            Py_DECREF(key);
            goto done;
        }
        PyObject *value = PyFloat_FromDouble(sum + caused[k]);
        int bad = value == NULL || PyDict_SetItem(sums, key, value) < 0;
        Py_XDECREF(value);
        Py_DECREF(key);
        if (bad)
            goto done;
    }
    out = Py_NewRef(Py_None);
done:
    release(v, 3);
    return out;
}

static PyMethodDef methods[] = {
    {"columns", columns, METH_VARARGS, columns_doc},
    {"merge", merge, METH_VARARGS, merge_doc},
    {"add_batch", add_batch, METH_VARARGS, add_batch_doc},
    {"settle", settle, METH_VARARGS, settle_doc},
    {"fold", fold, METH_VARARGS, fold_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef late_module = {
    PyModuleDef_HEAD_INIT, "_late", "The late-rank analysis's passes over a rank's calls, in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__late(void)
{
    if (array_type == NULL) {
        PyObject *array_module = PyImport_ImportModule("array");
        if (array_module == NULL)
            return NULL;
        array_type = PyObject_GetAttrString(array_module, "array");
        Py_DECREF(array_module);
        if (array_type == NULL)
            return NULL;
    }
    return PyModule_Create(&late_module);
}
