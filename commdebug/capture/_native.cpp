/* commdebug.capture._native: light capture's kernel for the collective ops, in C++.
 *
 * Light capture (commdebug/capture/light.py) registers a kernel for each collective op and
 * records the call there. Written in Python, that kernel cost most of what a light recording
 * costs per collective: torch boxes every argument of the call for Python (the ProcessGroup and
 * ReduceOp objects included), hands over the call's key set as an object, and the kernel's
 * redispatch parses its arguments back against the op's schema. This one is registered from
 * C++ (a boxed kernel: one for every op) and calls Python once per collective, with only what
 * the recorder reads: the tensors, the plain values, the group's name in place of its
 * ProcessGroup (other script objects as None), and a `call` object that runs the op on the
 * keys below ours. The recorder's Python code (light.py's _native_call, then the Recorder's
 * _light_call) stays the one place that decides what is recorded: while a recording is plain,
 * this kernel records a call itself only from what that code worked out on the op's first call
 * on its group (record_fast, below), and declines anything else before recording it.
 *
 * What the kernel decides itself, before any Python runs: a call on this thread while one is
 * being recorded, a call on meta tensors (tracing), a call whose keys below ours are empty, and
 * any call while no handler is set are only redispatched.
 *
 * It also holds light steps' module-call wrapper (ModuleCalls, below): the common case of
 * commdebug/capture/calls.py's CallTracking._call without running Python.
 *
 * Built against the torch it runs with (setup.py builds it where torch is importable at build
 * time); light.py falls back to Python kernels where it is not built, and says so once.
 */
#include <Python.h>

#include <ATen/SequenceNumber.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

// attribute names, interned once (PyInit__native)
PyObject *s_known, *s_paths, *s_stack, *s_ranges, *s_log, *s_forwards, *s_fw_phase, *s_task, *s_calls, *s_pinned, *s_find, *s_bw_found, *s_starts, *s_ends, *s_parents, *s_by_storage, *s_on_waited, *s_tensor_waited, *s_done;
PyObject *handler = nullptr;  // light.py's _native_call(index, args, kwargs, call)
thread_local bool inside = false;  // a collective is being recorded on this thread
std::vector<std::unique_ptr<torch::Library>> libraries;  // by handle; null once unregistered
c10::ClassTypePtr process_group_type;

const c10::DispatchKeySet below_backend_select(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);
const c10::DispatchKeySet below_autograd(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::AutogradOther);
const c10::DispatchKeySet ours(c10::DispatchKey::BackendSelect);

/* Run the op on `keys`, below the autograd keys for an eager kernel registered there (what the
 * autograd fallback it replaces does). */
void redispatch(const c10::OperatorHandle &op, c10::DispatchKeySet keys, bool autograd, torch::jit::Stack *stack) {
    if (autograd) {
        at::AutoDispatchBelowADInplaceOrView guard;
        op.redispatchBoxed(keys, stack);
    } else {
        op.redispatchBoxed(keys, stack);
    }
}

/* `call` as the handler gets it: runs the op once, on the stack the kernel was given, and
 * returns its results for Python (the stack keeps them for the op's caller). */
struct Call {
    PyObject_HEAD
    const c10::OperatorHandle *op;
    c10::DispatchKeySet keys;
    torch::jit::Stack *stack;
    bool autograd;
    bool ran;
};

PyObject *results(const torch::jit::Stack &stack, size_t count) {
    size_t base = stack.size() - count;
    if (count == 1)
        return torch::jit::toPyObject(stack[base]).release().ptr();
    py::tuple out(count);
    for (size_t i = 0; i < count; i++)
        out[i] = torch::jit::toPyObject(stack[base + i]);
    return out.release().ptr();
}

PyObject *call_run(PyObject *self, PyObject *, PyObject *) {
    auto *call = reinterpret_cast<Call *>(self);
    if (call->ran || call->stack == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "commdebug: a collective's call was run twice, or after its kernel returned");
        return nullptr;
    }
    call->ran = true;
    HANDLE_TH_ERRORS
    {
        py::gil_scoped_release released;  // a collective may block: the watchdog and the streamer run meanwhile
        redispatch(*call->op, call->keys, call->autograd, call->stack);
    }
    return results(*call->stack, call->op->schema().returns().size());
    END_HANDLE_TH_ERRORS
}

PyTypeObject CallType = {PyVarObject_HEAD_INIT(nullptr, 0) "commdebug.capture._native.Call"};

/* An argument as the recorder reads it. */
py::object for_python(const c10::IValue &value) {
    if (value.isTensor())
        return py::reinterpret_steal<py::object>(THPVariable_Wrap(value.toTensor()));
    if (value.isCustomClass()) {
        // the group by name: the recorder resolves names (functional ops pass them) without the
        // script object's boxing; other script objects (ReduceOp, options) it never reads
        if (process_group_type && value.toObjectRef().type() == process_group_type) {
            const std::string &name = value.toCustomClass<c10d::ProcessGroup>()->getGroupName();
            if (!name.empty())
                return py::str(name);
            return torch::jit::toPyObject(value);
        }
        return py::none();
    }
    return torch::jit::toPyObject(value);
}

/* A c10d Work the in-flight table holds (commdebug/capture/inflight.py) for a call recorded
 * here: what the Python path gets by unboxing the op's result, without making the Python Work
 * (its script object, then its pybind object). The table keys a Work by its address
 * (work_key), which the Python Work of the same call gives too. */
struct HeldWork {
    PyObject_HEAD
    c10::intrusive_ptr<c10d::Work> work;
};

PyObject *held_is_completed(PyObject *self, PyObject *) {
    HANDLE_TH_ERRORS
    auto &work = reinterpret_cast<HeldWork *>(self)->work;
    bool done;
    {
        py::gil_scoped_release released;
        done = work->isCompleted();
    }
    return PyBool_FromLong(done);
    END_HANDLE_TH_ERRORS
}

void held_dealloc(PyObject *self) {
    auto *held = reinterpret_cast<HeldWork *>(self);
    {
        py::gil_scoped_release released;  // a Work's last reference may wait on its backend
        held->work.reset();
    }
    held->work.~intrusive_ptr();
    Py_TYPE(self)->tp_free(self);
}

PyMethodDef held_methods[] = {
    {"is_completed", held_is_completed, METH_NOARGS, "Work.is_completed() of the Work held."},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject HeldWorkType = {PyVarObject_HEAD_INIT(nullptr, 0) "commdebug.capture._native.HeldWork"};

PyObject *hold(const c10::intrusive_ptr<c10d::Work> &work) {
    auto *held = PyObject_New(HeldWork, &HeldWorkType);
    if (held == nullptr)
        return nullptr;
    new (&held->work) c10::intrusive_ptr<c10d::Work>(work);
    return reinterpret_cast<PyObject *>(held);
}

/* work_key(work): the address of a Python Work's c10d Work (the in-flight table's key); of
 * anything else (a stand-in), its id. */
PyObject *work_key(PyObject *, PyObject *obj) {
    HANDLE_TH_ERRORS
    try {
        c10d::Work &work = py::cast<c10d::Work &>(py::handle(obj));
        return PyLong_FromVoidPtr(&work);
    } catch (const py::cast_error &) {
        return PyLong_FromVoidPtr(obj);
    }
    END_HANDLE_TH_ERRORS
}

/* The c10d Work of a Work held here or of a Python c10d Work; null for anything else (a stand-in). */
c10d::Work *as_work(PyObject *obj) {
    if (Py_TYPE(obj) == &HeldWorkType)
        return reinterpret_cast<HeldWork *>(obj)->work.get();
    try {
        return &py::cast<c10d::Work &>(py::handle(obj));
    } catch (const py::cast_error &) {
        return nullptr;
    }
}

/* work_failed(work): whether a Work held here, or a Python c10d Work, finished with an error.
 * A failed Work reads completed too (a peer closed the connection); the in-flight table must not
 * take it for a call every member finished. Asked of c10d itself: the Python binding's
 * exception() warns on every call that it is deprecated. False for anything else (a stand-in). */
PyObject *work_failed(PyObject *, PyObject *obj) {
    HANDLE_TH_ERRORS
    c10d::Work *work = as_work(obj);
    if (work == nullptr)
        Py_RETURN_FALSE;
    bool failed = false;
    {
        py::gil_scoped_release released;
        try {
            // exception(), not isSuccess(): NCCL's Work throws from isSuccess (deprecated)
            failed = work->isCompleted() && work->exception() != nullptr;
        } catch (const std::exception &) {
            failed = false;  // a backend that cannot say: nothing says it failed
        }
    }
    return PyBool_FromLong(failed);
    END_HANDLE_TH_ERRORS
}

/* When a CPU collective timed by events finished (timing.py's EventTimer): a callback on its
 * Work's future stamps the host clock (time.perf_counter's) when the backend completes the
 * future, on the backend's thread and without the GIL; the recorder reads the stamp later (the
 * program's wait, step boundaries, exit). Nothing waits for it: a call the program waits for in
 * C++ (DDP's gradient buckets, whose waits Python never sees) gets its time all the same, and a
 * call that never finishes never gets one. */
struct Stamp {
    std::atomic<int> state{0};  // PENDING, then DONE or FAILED
    double at = 0;              // written before state becomes DONE
};
constexpr int PENDING = 0, DONE = 1, FAILED = 2;

struct Completion {
    PyObject_HEAD
    std::shared_ptr<Stamp> stamp;
};

PyObject *completion_done_at(PyObject *self, PyObject *) {
    const Stamp &stamp = *reinterpret_cast<Completion *>(self)->stamp;
    if (stamp.state.load(std::memory_order_acquire) != DONE)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(stamp.at);
}

PyObject *completion_failed(PyObject *self, PyObject *) {
    return PyBool_FromLong(reinterpret_cast<Completion *>(self)->stamp->state.load(std::memory_order_acquire) == FAILED);
}

void completion_dealloc(PyObject *self) {
    reinterpret_cast<Completion *>(self)->stamp.~shared_ptr();
    Py_TYPE(self)->tp_free(self);
}

PyMethodDef completion_methods[] = {
    {"done_at", completion_done_at, METH_NOARGS, "done_at() -> float | None: time.perf_counter() when the Work completed; None before, or if it failed."},
    {"failed", completion_failed, METH_NOARGS, "failed() -> bool: the Work completed with an error."},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject CompletionType = {PyVarObject_HEAD_INIT(nullptr, 0) "commdebug.capture._native.Completion"};

/* on_completion(work) -> Completion | None: a stamp of when a Python c10d Work (or one held
 * here) completes; None where its backend has no future to tell (or it is not a Work). */
PyObject *on_completion(PyObject *, PyObject *obj) {
    HANDLE_TH_ERRORS
    c10d::Work *work = as_work(obj);
    if (work == nullptr)
        Py_RETURN_NONE;
    c10::intrusive_ptr<c10::ivalue::Future> future;
    try {
        future = work->getFuture();
    } catch (const std::exception &) {  // c10d's Work has no future unless its backend made one
        Py_RETURN_NONE;
    }
    if (!future)
        Py_RETURN_NONE;
    auto *completion = PyObject_New(Completion, &CompletionType);
    if (completion == nullptr)
        return nullptr;
    new (&completion->stamp) std::shared_ptr<Stamp>(std::make_shared<Stamp>());
    std::shared_ptr<Stamp> stamp = completion->stamp;
    // runs at once, here, if the Work is done already; else on the thread that completes it
    future->addCallback([stamp](c10::ivalue::Future &done) {
        if (done.hasError()) {
            stamp->state.store(FAILED, std::memory_order_release);
            return;
        }
        stamp->at = _PyTime_AsSecondsDouble(_PyTime_GetPerfCounter());  // plain C: no GIL needed
        stamp->state.store(DONE, std::memory_order_release);
    });
    return reinterpret_cast<PyObject *>(completion);
    END_HANDLE_TH_ERRORS
}

/* A tensor's key in the in-flight table (inflight.py's _storage_key): its storage's address,
 * or the Python tensor's id where it has none. New reference. */
PyObject *storage_key_of(const at::Tensor &t, PyObject *python) {
    void *data = nullptr;
    if (t.has_storage())
        data = t.storage().data_ptr().get();
    if (data != nullptr)
        return PyLong_FromVoidPtr(data);
    if (python != nullptr)
        return PyLong_FromVoidPtr(python);
    PyObject *wrapped = THPVariable_Wrap(t);
    PyObject *key = wrapped ? PyLong_FromVoidPtr(wrapped) : nullptr;
    Py_XDECREF(wrapped);  // the tensor keeps its Python object alive while it is waited for
    return key;
}

/* storage_key(tensor): what a wait on it finds in the in-flight table. */
PyObject *storage_key(PyObject *, PyObject *obj) {
    if (!THPVariable_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "storage_key(tensor)");
        return nullptr;
    }
    HANDLE_TH_ERRORS
    return storage_key_of(THPVariable_Unpack(obj), obj);
    END_HANDLE_TH_ERRORS
}

/* waited(flights, tensor): inflight.py's _tell for a wait that returned, every recording's
 * InFlight told that the functional collective behind `tensor` finished. Its common case, a
 * call in the InFlight's table of functional calls (_by_storage) with no one to tell but its
 * group's finished sequence number (InFlight.done), is done here without a Python frame for
 * the lookup; every other case (not in that table, an _on_waited listener: asynchronous
 * timing) goes to InFlight.tensor_waited, which decides as before. */
PyObject *waited(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "waited(flights: list, tensor)");
        return nullptr;
    }
    PyObject *tensor = args[1];
    py::object flights = py::reinterpret_steal<py::object>(PyList_GetSlice(args[0], 0, PyList_GET_SIZE(args[0])));  // another thread may end one
    if (!flights)
        return nullptr;
    py::object key = py::reinterpret_steal<py::object>(THPVariable_Check(tensor) ? storage_key(nullptr, tensor) : nullptr);
    PyErr_Clear();  // no key: tensor_waited reads the call
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(flights.ptr()); i++) {
        PyObject *flight = PyList_GET_ITEM(flights.ptr(), i);
        py::object table = py::reinterpret_steal<py::object>(key ? PyObject_GetAttr(flight, s_by_storage) : nullptr);
        py::object listener = py::reinterpret_steal<py::object>(table ? PyObject_GetAttr(flight, s_on_waited) : nullptr);
        PyObject *entry = listener && PyDict_Check(table.ptr()) && listener.ptr() == Py_None ? PyDict_GetItemWithError(table.ptr(), key.ptr()) : nullptr;
        PyErr_Clear();
        if (entry == nullptr || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 4) {
            PyObject *result = PyObject_CallMethodOneArg(flight, s_tensor_waited, tensor);
            if (result == nullptr)
                return nullptr;
            Py_DECREF(result);
            continue;
        }
        py::object held = py::reinterpret_borrow<py::object>(entry);  // (index, issued at, group, seq, ...)
        if (PyDict_DelItem(table.ptr(), key.ptr()) < 0)
            return nullptr;
        PyObject *done_args[] = {flight, PyTuple_GET_ITEM(entry, 2), PyTuple_GET_ITEM(entry, 3)};
        PyObject *result = PyObject_VectorcallMethod(s_done, done_args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
        if (result == nullptr)
            return nullptr;
        Py_DECREF(result);
    }
    Py_RETURN_NONE;
}

/* The plain recording, in C++ (set_recorder, set_ops): a collective of the innermost light
 * recording while it records everything as it comes (no filter, no timer, no NVTX range:
 * Recorder._plain) is recorded here without the handler: the same event the Python path builds
 * (recorder.py's _collective and _record_collective), from facts the Python side worked out on
 * the op's first call on its group (the GroupInfo, the count key, the bus-bandwidth factor, the
 * size rule), which this path only reads. Where the program is and the source line it reads
 * from the state the Python side keeps, in their common cases (known_where, known_source), and
 * asks the tracker's `where` and source.py's `caller` for the rest; it calls back into Python
 * for the size rule, the trace's counts and event list, the in-flight table and the listeners: each a Python
 * function of its own, shared with the Python path. Anything else, or any fact not known yet,
 * declines before anything is recorded, and the handler records as before. */
struct FastOp {
    PyObject *name;     // the op's name (interned, as the Python path has it)
    PyObject *op;       // its canonical name: all_reduce...
    PyObject *compat;   // the reference's count key
    int inputs;         // argument index, or NONE
    int outputs;        // argument index, NONE, or RETURN (functional ops)
    int group;          // argument index of the group (its name, or a ProcessGroup)
};
constexpr int NONE = -1, RETURN = -2;
// CollectiveEvent's fields, and where start_s is among them (set_recorder checks the count)
constexpr int EVENT_FIELDS = 31, START_S = 24;

struct Fast {
    PyObject *owner = nullptr;  // the state tuple set_recorder got: it holds every object below
    PyObject *recorder, *tracker, *where, *groups, *seqs, *facts, *trace, *add_collective, *add_event;
    PyObject *issued, *tensor_issued, *issued_work, *done, *failed, *caller, *event_type, *dtype_names, *state;
    PyObject *frames;  // source.py's native_view(): what caller() reads, or None
    PyObject *places;  // (GLOBAL, (GLOBAL,), BACKWARD), trace.py's names of the places known_where gives
    double t0 = 0;
    bool record_source = false;
};
/* The innermost light recording's state (owner null: none). A call takes its own reference to
 * the owner for as long as it runs: another thread may end the recording meanwhile. */
Fast current;
std::vector<FastOp> fast_ops;  // by kernel index; name null: the handler records it
std::vector<unsigned long long> recorded_here;  // by kernel index: calls record_fast recorded (for tests)
c10::ClassTypePtr work_type;
std::unordered_map<std::string, PyObject *> group_names;  // a group's name as a Python str, made once

PyObject *s_light_on, *s_plain, *s_step, *s_events_total, *s_unit, *s_size, *s_last_dtensor, *s_issue_listeners,
    *s_listeners, *s_inside, *zero, *one;

void clear_fast() {
    Py_CLEAR(current.owner);
}

/* owner.name is true (an attribute that is missing or fails reads false). */
bool flag(PyObject *owner, PyObject *name) {
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value == nullptr) {
        PyErr_Clear();
        return false;
    }
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    if (truth < 0)
        PyErr_Clear();
    return truth == 1;
}

/* The tensors of an argument, in the order ops.py's tensor_bytes walks them; false for
 * anything it would read differently (symbolic sizes, other values in a list). */
bool flatten(const c10::IValue &value, std::vector<at::Tensor> &out) {
    if (value.isNone())
        return true;
    if (value.isTensor()) {
        const at::Tensor &t = value.toTensor();
        if (!t.defined() || t.unsafeGetTensorImpl()->has_symbolic_sizes_strides())
            return false;
        out.push_back(t);
        return true;
    }
    if (value.isTensorList()) {
        for (const at::Tensor &t : value.toTensorList().vec())
            if (!flatten(c10::IValue(t), out))
                return false;
        return true;
    }
    if (value.isList()) {
        for (const c10::IValue &item : value.toListRef())
            if (!(item.isTensor() || item.isTensorList() || item.isList()) || !flatten(item, out))
                return false;
        return true;
    }
    return false;
}

/* (bytes, shapes, dtype name or None) as ops.py's tensor_bytes gives them; new references. */
struct Sized {
    long long bytes = 0;
    PyObject *shapes = nullptr, *dtype = nullptr;
    ~Sized() {
        Py_XDECREF(shapes);
        Py_XDECREF(dtype);
    }
};

bool sized(const Fast &fast, const std::vector<at::Tensor> &tensors, Sized &out) {
    out.shapes = PyTuple_New(static_cast<Py_ssize_t>(tensors.size()));
    if (out.shapes == nullptr)
        return false;
    for (size_t i = 0; i < tensors.size(); i++) {
        const at::Tensor &t = tensors[i];
        out.bytes += static_cast<long long>(t.numel()) * static_cast<long long>(t.itemsize());
        auto sizes = t.sizes();
        PyObject *shape = PyTuple_New(static_cast<Py_ssize_t>(sizes.size()));
        if (shape == nullptr)
            return false;
        PyTuple_SET_ITEM(out.shapes, i, shape);
        for (size_t d = 0; d < sizes.size(); d++) {
            PyObject *n = PyLong_FromLongLong(sizes[d]);
            if (n == nullptr)
                return false;
            PyTuple_SET_ITEM(shape, d, n);
        }
    }
    if (tensors.empty()) {
        out.dtype = Py_NewRef(Py_None);
        return true;
    }
    out.dtype = PyObject_GetItem(fast.dtype_names, reinterpret_cast<PyObject *>(torch::getTHPDtype(tensors[0].scalar_type())));
    return out.dtype != nullptr;
}

/* The group's name as the Python side keys it (a str argument, or a ProcessGroup's name);
 * borrowed, or null where the group has no name to go by. */
PyObject *group_name(const c10::IValue &value) {
    const std::string *name = nullptr;
    if (value.isString()) {
        name = &value.toStringRef();  // the argument's own string: it outlives this call
    } else if (value.isCustomClass() && process_group_type && value.toObjectRef().type() == process_group_type) {
        name = &value.toCustomClass<c10d::ProcessGroup>()->getGroupName();
    }
    if (name == nullptr || name->empty())
        return nullptr;
    auto found = group_names.find(*name);
    if (found != group_names.end())
        return found->second;
    PyObject *text = PyUnicode_FromStringAndSize(name->data(), static_cast<Py_ssize_t>(name->size()));
    if (text == nullptr) {
        PyErr_Clear();
        return nullptr;
    }
    PyUnicode_InternInPlace(&text);
    group_names.emplace(*name, text);
    return text;
}

double seconds_now() {
    return _PyTime_AsSecondsDouble(_PyTime_GetPerfCounter());  // time.perf_counter's clock
}

/* fn(*args), its result dropped: false with a Python error set where it raised. */
bool call(PyObject *fn, std::initializer_list<PyObject *> args) {
    PyObject *result = PyObject_Vectorcall(fn, const_cast<PyObject **>(args.begin()), args.size(), nullptr);
    Py_XDECREF(result);
    return result != nullptr;
}

/* Call each of the recorder's listeners in `list_name` with the event. */
bool tell(const Fast &fast, PyObject *list_name, PyObject *event) {
    PyObject *listeners = PyObject_GetAttr(fast.recorder, list_name);
    if (listeners == nullptr)
        return false;
    bool ok = true;
    if (PyList_Check(listeners)) {
        for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(listeners); i++)
            ok = call(PyList_GET_ITEM(listeners, i), {event});
    }
    Py_DECREF(listeners);
    return ok;
}

/* source.py's caller(0) as a new (source, from DTensor, compiled) tuple, where every frame on the
 * way is of a kind source.py has classified before and the user's line was named before (every
 * call after an op's first few): the same walk, without a Python frame. Null, with no error
 * set, for the rest, which caller() itself reads (a file or line met for the first time,
 * compiled code, generated code). */
PyObject *known_source(const Fast &fast) {
    if (fast.frames == Py_None)
        return nullptr;
    PyObject *first_other = PyTuple_GET_ITEM(fast.frames, 0), *library = PyTuple_GET_ITEM(fast.frames, 1);
    PyObject *kinds = PyTuple_GET_ITEM(fast.frames, 2), *sites = PyTuple_GET_ITEM(fast.frames, 3);
    PyObject *user = PyTuple_GET_ITEM(fast.frames, 4), *dtensor = PyTuple_GET_ITEM(fast.frames, 5);
    bool from_dtensor = false;
    PyObject *source = nullptr;
    py::object depth = py::reinterpret_steal<py::object>(PyLong_FromLong(0));  // from the innermost Python frame
    while (depth) {
        PyObject *walk_args[] = {depth.ptr(), library};
        py::object found = py::reinterpret_steal<py::object>(PyObject_Vectorcall(first_other, walk_args, 2, nullptr));
        if (!found || (found.ptr() != Py_None && (!PyTuple_Check(found.ptr()) || PyTuple_GET_SIZE(found.ptr()) != 3)))
            break;
        if (found.ptr() == Py_None) {  // the bottom of the stack: no user frame
            source = Py_None;
            break;
        }
        PyObject *code = PyTuple_GET_ITEM(found.ptr(), 0);
        if (!PyCode_Check(code))
            break;
        PyObject *kind = PyDict_GetItemWithError(kinds, reinterpret_cast<PyCodeObject *>(code)->co_filename);
        if (kind == user) {
            py::object id = py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(code));
            py::object site = py::reinterpret_steal<py::object>(id ? PyTuple_Pack(2, id.ptr(), PyTuple_GET_ITEM(found.ptr(), 1)) : nullptr);
            source = site ? PyDict_GetItemWithError(sites, site.ptr()) : nullptr;
            break;
        }
        if (kind != dtensor)  // compiled code, or a file not classified yet
            break;
        from_dtensor = true;
        depth = py::reinterpret_steal<py::object>(PyNumber_Add(PyTuple_GET_ITEM(found.ptr(), 2), one));
    }
    if (source == nullptr) {
        PyErr_Clear();
        return nullptr;
    }
    return PyTuple_Pack(3, source, from_dtensor ? Py_True : Py_False, Py_False);
}

/* A Python int as a long long; one past the range (NodeRanges' open end, 1 << 64) reads as the
 * largest. */
long long as_number(PyObject *value) {
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
    return overflow > 0 ? LLONG_MAX : overflow < 0 ? LLONG_MIN : n;
}

/* calls.py's NodeRanges.find(number) where its log is folded already (every backward collective
 * after the first): the path of the innermost module call that made node `number`, a new
 * reference; Py_None where no call did. Null, with no error set, to ask find() itself. */
PyObject *known_call(PyObject *ranges, long long number) {
    py::object log = py::reinterpret_steal<py::object>(PyObject_GetAttr(ranges, s_log));
    py::object starts = py::reinterpret_steal<py::object>(PyObject_GetAttr(ranges, s_starts));
    py::object ends = py::reinterpret_steal<py::object>(PyObject_GetAttr(ranges, s_ends));
    py::object parents = py::reinterpret_steal<py::object>(PyObject_GetAttr(ranges, s_parents));
    py::object paths = py::reinterpret_steal<py::object>(PyObject_GetAttr(ranges, s_paths));
    if (!log || !starts || !ends || !parents || !paths || !PyList_Check(log.ptr()) || !PyList_Check(starts.ptr()) || !PyList_Check(ends.ptr()) ||
        !PyList_Check(parents.ptr()) || !PyList_Check(paths.ptr()) || PyList_GET_SIZE(log.ptr()) != 0) {
        PyErr_Clear();
        return nullptr;
    }
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(starts.ptr());  // bisect_right(starts, number)
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (number < as_number(PyList_GET_ITEM(starts.ptr(), mid)))
            hi = mid;
        else
            lo = mid + 1;
    }
    Py_ssize_t count = std::min({PyList_GET_SIZE(ends.ptr()), PyList_GET_SIZE(parents.ptr()), PyList_GET_SIZE(paths.ptr())});
    // the calls that hold the number all enclose the latest call started before it
    for (Py_ssize_t i = lo - 1; i >= 0;) {
        if (i >= count)
            return nullptr;
        if (number < as_number(PyList_GET_ITEM(ends.ptr(), i)))
            return Py_NewRef(PyList_GET_ITEM(paths.ptr(), i));
        long long parent = as_number(PyList_GET_ITEM(parents.ptr(), i));
        if (parent >= i)  // parents come before their children: anything else is not find()'s table
            return nullptr;
        i = static_cast<Py_ssize_t>(parent);
    }
    return Py_NewRef(Py_None);
}

/* tracker.where() as a new (fqn, phase, path) tuple in its common cases: forward (or the
 * optimizer, or outside both), and backward in a light step once the graph task is known,
 * where the running autograd node's number finds the module call that made it. Null, with no
 * error set, for the rest (checkpoint recomputation, a new graph task, a node in no module
 * call, a location pinned by backward_of), which where() itself reads. */
PyObject *known_where(const Fast &fast) {
    PyObject *global = PyTuple_GET_ITEM(fast.places, 0), *global_path = PyTuple_GET_ITEM(fast.places, 1);
    PyObject *backward = PyTuple_GET_ITEM(fast.places, 2);
    py::object stack = py::reinterpret_steal<py::object>(PyObject_GetAttr(fast.tracker, s_stack));
    if (!stack || !PyList_Check(stack.ptr())) {
        PyErr_Clear();
        return nullptr;
    }
    Py_ssize_t depth = PyList_GET_SIZE(stack.ptr());
    int task = torch::autograd::get_current_graph_task_id();
    if (task == -1) {
        py::object paths = py::reinterpret_steal<py::object>(PyObject_GetAttr(fast.tracker, s_paths));
        py::object phase = py::reinterpret_steal<py::object>(PyObject_GetAttr(fast.tracker, s_fw_phase));
        if (!paths || !phase || !PyList_Check(paths.ptr()) || phase.ptr() == backward) {
            PyErr_Clear();
            return nullptr;
        }
        Py_ssize_t n = PyList_GET_SIZE(paths.ptr());
        return PyTuple_Pack(3, depth ? PyList_GET_ITEM(stack.ptr(), depth - 1) : global, phase.ptr(), n ? PyList_GET_ITEM(paths.ptr(), n - 1) : global_path);
    }
    if (depth)  // modules running in backward: checkpoint's recomputation
        return nullptr;
    py::object known = py::reinterpret_steal<py::object>(PyObject_GetAttr(fast.tracker, s_task));
    py::object calls = py::reinterpret_steal<py::object>(PyObject_GetAttr(fast.tracker, s_calls));
    py::object pinned = py::reinterpret_steal<py::object>(PyObject_GetAttr(fast.tracker, s_pinned));
    if (!known || !calls || !pinned || !PyLong_Check(known.ptr()) || PyLong_AsLong(known.ptr()) != task || calls.ptr() != Py_True ||
        PyObject_IsTrue(pinned.ptr()) != 0) {
        PyErr_Clear();
        return nullptr;
    }
    c10::intrusive_ptr<torch::autograd::Node> node = torch::autograd::get_current_node();
    if (!node)
        return nullptr;
    uint64_t sequence_nr = node->sequence_nr();
    if (sequence_nr > static_cast<uint64_t>(LLONG_MAX))  // AccumulateGrad's: in no call, where() finds its module
        return nullptr;
    py::object ranges = py::reinterpret_steal<py::object>(PyObject_GetAttr(fast.tracker, s_ranges));
    py::object found = py::reinterpret_steal<py::object>(ranges ? known_call(ranges.ptr(), static_cast<long long>(sequence_nr)) : nullptr);
    if (!found && ranges) {  // the forward's log still to fold: find() does it
        py::object number = py::reinterpret_steal<py::object>(PyLong_FromUnsignedLongLong(sequence_nr));
        found = py::reinterpret_steal<py::object>(number ? PyObject_CallMethodOneArg(ranges.ptr(), s_find, number.ptr()) : nullptr);
    }
    if (!found || !PyTuple_Check(found.ptr()) || PyTuple_GET_SIZE(found.ptr()) == 0 ||
        PyObject_SetAttr(fast.tracker, s_bw_found, found.ptr()) < 0) {  // None: AccumulateGrad's, which where() finds
        PyErr_Clear();
        return nullptr;
    }
    return PyTuple_Pack(3, PyTuple_GET_ITEM(found.ptr(), PyTuple_GET_SIZE(found.ptr()) - 1), backward, found.ptr());
}

/* What the Python path knows at the call: where, the group and its facts, the source line. */
struct Located {
    PyObject *info = nullptr, *facts = nullptr, *where = nullptr, *source = nullptr, *seq = nullptr;
    PyObject *gname = nullptr;  // borrowed (group_names holds it)
    double start_s = 0;
    ~Located() {
        Py_XDECREF(info);
        Py_XDECREF(facts);
        Py_XDECREF(where);
        Py_XDECREF(source);
        Py_XDECREF(seq);
    }
};

/* size_rule(in_bytes, out_bytes, group_size), remembered: the rules (ops.py's MESSAGE_SIZE) are
 * pure functions of their three numbers, and a training step repeats the same few calls, so a
 * repeat answers from here without a Python frame. A new reference, or null with an error. */
struct SizeMemo {
    PyObject *rule = nullptr, *size = nullptr;  // strong references; rule null: empty slot
    long long in = 0, out = 0, group = 0;
};
SizeMemo size_memo[64];

PyObject *message_size(PyObject *rule, PyObject *in_bytes, PyObject *out_bytes, PyObject *group_size) {
    long long in = as_number(in_bytes), out = as_number(out_bytes), group = PyLong_Check(group_size) ? as_number(group_size) : LLONG_MIN;
    size_t slot = (reinterpret_cast<uintptr_t>(rule) / 16 ^ static_cast<size_t>(in) * 31 ^ static_cast<size_t>(out) * 7 ^ static_cast<size_t>(group)) % 64;
    SizeMemo &memo = size_memo[slot];
    if (memo.rule == rule && memo.in == in && memo.out == out && memo.group == group && group != LLONG_MIN)
        return Py_NewRef(memo.size);
    PyObject *rule_args[] = {in_bytes, out_bytes, group_size};
    PyObject *size = PyObject_Vectorcall(rule, rule_args, 3, nullptr);
    if (size != nullptr && group != LLONG_MIN) {
        PyObject *old_rule = memo.rule, *old_size = memo.size;
        memo = SizeMemo{Py_NewRef(rule), Py_NewRef(size), in, out, group};
        Py_XDECREF(old_rule);
        Py_XDECREF(old_size);
    }
    return size;
}

/* Count the collective and keep its event (the Python path's _record_collective): a new
 * reference, or null with a Python error. */
PyObject *record(const Fast &fast, const FastOp &spec, Located &at, const std::vector<at::Tensor> &inputs, const std::vector<at::Tensor> *outputs) {
    Sized in, out;
    if (!sized(fast, inputs, in))
        return nullptr;
    if (outputs == nullptr) {
        out.bytes = in.bytes;
        out.shapes = Py_NewRef(in.shapes);
        out.dtype = Py_NewRef(in.dtype);
    } else if (!sized(fast, *outputs, out)) {
        return nullptr;
    }
    PyObject *dtype = in.dtype != Py_None ? in.dtype : out.dtype;
    PyObject *size_rule = PyTuple_GET_ITEM(at.facts, 2);
    PyObject *group_size = PyObject_GetAttr(at.info, s_size);
    PyObject *in_bytes = PyLong_FromLongLong(in.bytes), *out_bytes = PyLong_FromLongLong(out.bytes);
    PyObject *size = nullptr, *step = nullptr, *index = nullptr, *unit = nullptr, *event = nullptr;
    bool counted = false, kept = false;
    PyObject *fqn = PyTuple_GET_ITEM(at.where, 0), *phase = PyTuple_GET_ITEM(at.where, 1), *path = PyTuple_GET_ITEM(at.where, 2);
    if (group_size && in_bytes && out_bytes)
        size = message_size(size_rule, in_bytes, out_bytes, group_size);
    if (size != nullptr)
        counted = call(fast.add_collective, {path, phase, PyTuple_GET_ITEM(at.facts, 0), size});
    if (counted) {
        step = PyObject_GetAttr(fast.trace, s_step);
        index = PyObject_GetAttr(fast.trace, s_events_total);
        unit = PyObject_GetAttr(fast.tracker, s_unit);
    }
    if (step && index && unit) {
        auto *type = reinterpret_cast<PyTypeObject *>(fast.event_type);
        event = type->tp_alloc(type, EVENT_FIELDS);  // a CollectiveEvent, in its fields' order
    }
    if (event != nullptr) {
        PyObject *items[EVENT_FIELDS] = {
            index, spec.op, spec.compat, spec.name, step, phase, fqn, at.info, at.seq, dtype, in.shapes, out.shapes,
            in_bytes, out_bytes, size, PyTuple_GET_ITEM(at.facts, 1), Py_None, Py_None, Py_None,
            fast.record_source ? at.source : Py_None, Py_None, Py_None, Py_None, Py_None, nullptr, Py_False, Py_None,
            unit, Py_False, Py_None, Py_None};
        PyObject *start = PyFloat_FromDouble(at.start_s);
        if (start == nullptr) {
            Py_CLEAR(event);
        } else {
            for (int i = 0; i < EVENT_FIELDS; i++)
                PyTuple_SET_ITEM(event, i, i == START_S ? start : Py_NewRef(items[i]));
            PyObject_GC_UnTrack(event);  // it can be in no reference cycle: see new_event
            kept = call(fast.add_event, {event});
        }
    }
    if (!kept || !tell(fast, s_issue_listeners, event))
        Py_CLEAR(event);
    Py_XDECREF(unit);
    Py_XDECREF(index);
    Py_XDECREF(step);
    Py_XDECREF(size);
    Py_XDECREF(out_bytes);
    Py_XDECREF(in_bytes);
    Py_XDECREF(group_size);
    return event;
}

/* The collective joins the ones in flight (inflight.py's InFlight.issued, by case): its Work
 * where it returned one, else its one output tensor, else its result. `output` is the
 * argument its spec names as its output, taken before the op ran (None: none or its return). */
bool in_flight(const Fast &fast, PyObject *event, const FastOp &spec, const Located &at, const c10::OperatorHandle &op, const torch::jit::Stack &stack,
               const c10::IValue &output) {
    size_t count = op.schema().returns().size();
    PyObject *index = PyTuple_GET_ITEM(event, 0);
    for (size_t i = count; i-- > 0;) {
        const c10::IValue &value = stack[stack.size() - count + i];
        if (value.isCustomClass() && work_type && value.toObjectRef().type() == work_type) {
            auto work = value.toCustomClass<c10d::Work>();
            if (!work)  // an empty Work: the backend finished the call before returning (NCCL)
                return call(fast.done, {at.gname, at.seq});
            py::object key = py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(work.get()));
            py::object held = py::reinterpret_steal<py::object>(key ? hold(work) : nullptr);
            return held && call(fast.issued_work, {index, at.gname, at.seq, key.ptr(), held.ptr()});
        }
    }
    // a tensor returned (a functional collective's output): tracked by the output's storage,
    // which is what a wait finds
    const c10::IValue &returned = stack.back();
    const c10::IValue &target = spec.outputs >= 0 ? output : returned;
    if (count == 1 && returned.isTensor() && target.isTensor()) {
        py::object key = py::reinterpret_steal<py::object>(storage_key_of(target.toTensor(), nullptr));
        return key && call(fast.tensor_issued, {index, at.gname, at.seq, key.ptr()});
    }
    py::object out = py::reinterpret_steal<py::object>(results(stack, count));
    py::object outputs = spec.outputs >= 0 ? torch::jit::toPyObject(output) : py::reinterpret_borrow<py::object>(spec.outputs == RETURN ? out.ptr() : Py_None);
    return call(fast.issued, {index, at.gname, at.seq, out.ptr(), outputs.ptr()});
}

/* The call raised `error`: recorded (if it was not yet) and marked failed; errors here are
 * dropped, so that the program gets the call's own. Takes `event`. */
void failed(const Fast &fast, const FastOp &spec, Located &at, const std::vector<at::Tensor> &inputs, const std::vector<at::Tensor> &outputs, PyObject *event,
            PyObject *error) {
    if (event == nullptr)
        event = record(fast, spec, at, inputs, &outputs);
    if (event != nullptr) {
        call(fast.failed, {PyTuple_GET_ITEM(event, 0), error ? error : Py_None});
        Py_DECREF(event);
    }
    PyErr_Clear();
}

enum class Fasted { taken, declined };

/* Record and run one call here, or decline (nothing recorded, nothing run). */
Fasted record_fast(const Fast &fast, const FastOp &spec, const c10::OperatorHandle &op, c10::DispatchKeySet below, bool autograd, torch::jit::Stack *stack) {
    // the recording is on: the kernel read _light_on just before, with the GIL held since
    if (!flag(fast.recorder, s_plain) || flag(fast.state, s_inside))
        return Fasted::declined;
    const auto &arguments = op.schema().arguments();
    size_t base = stack->size() - arguments.size();
    Located at;
    at.gname = group_name((*stack)[base + spec.group]);
    if (at.gname == nullptr)
        return Fasted::declined;
    at.info = Py_XNewRef(PyDict_GetItemWithError(fast.groups, at.gname));  // resolved by the Python path before
    PyObject *key = PyTuple_Pack(2, spec.name, at.gname);
    if (at.info == nullptr || key == nullptr) {
        Py_XDECREF(key);
        PyErr_Clear();
        return Fasted::declined;
    }
    at.facts = Py_XNewRef(PyDict_GetItemWithError(fast.facts, key));
    Py_DECREF(key);
    if (at.facts == nullptr || !PyTuple_Check(at.facts) || PyTuple_GET_SIZE(at.facts) != 3) {
        PyErr_Clear();
        return Fasted::declined;
    }
    std::vector<at::Tensor> inputs, outputs;
    if ((spec.inputs >= 0 && !flatten((*stack)[base + spec.inputs], inputs)) ||
        (spec.outputs >= 0 && spec.outputs != spec.inputs && !flatten((*stack)[base + spec.outputs], outputs)))
        return Fasted::declined;
    PyObject *found = known_source(fast);  // (source, from DTensor, compiled code)
    if (found == nullptr)
        found = PyObject_CallOneArg(fast.caller, zero);
    if (found == nullptr || !PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 3) {
        Py_XDECREF(found);
        PyErr_Clear();
        return Fasted::declined;
    }
    bool compiled = PyTuple_GET_ITEM(found, 2) == Py_True;
    bool from_dtensor = PyTuple_GET_ITEM(found, 1) == Py_True;
    at.source = Py_NewRef(PyTuple_GET_ITEM(found, 0));
    Py_DECREF(found);
    if (compiled || (from_dtensor && flag(fast.recorder, s_last_dtensor)))  // said once, or a DTensor op to name: Python's
        return Fasted::declined;
    at.where = known_where(fast);
    if (at.where == nullptr)
        at.where = PyObject_CallNoArgs(fast.where);
    if (at.where == nullptr || !PyTuple_Check(at.where) || PyTuple_GET_SIZE(at.where) != 3) {
        PyErr_Clear();  // the Python path meets the same error, and reports it
        return Fasted::declined;
    }
    // from here on the call is ours: recorded, then run
    at.start_s = seconds_now() - fast.t0;
    PyObject *seq = PyDict_GetItemWithError(fast.seqs, at.gname);
    at.seq = seq != nullptr ? Py_NewRef(seq) : Py_NewRef(zero);
    PyObject *next = PyNumber_Add(at.seq, one);
    if (next == nullptr || PyDict_SetItem(fast.seqs, at.gname, next) < 0) {
        Py_XDECREF(next);
        throw python_error();
    }
    Py_DECREF(next);
    bool before = spec.outputs != RETURN;  // every tensor it reads is an argument: recorded before it runs
    c10::IValue output = spec.outputs >= 0 ? (*stack)[base + spec.outputs] : c10::IValue();  // the op takes its arguments
    PyObject *event = nullptr;
    if (before) {
        event = record(fast, spec, at, inputs, spec.outputs == spec.inputs ? nullptr : &outputs);
        if (event == nullptr)
            throw python_error();
    }
    try {
        py::gil_scoped_release released;  // a collective may block: the watchdog and the streamer run meanwhile
        redispatch(op, below, autograd, stack);
    } catch (py::error_already_set &error) {  // a Python kernel below ours raised (its error is read, not taken)
        failed(fast, spec, at, inputs, outputs, event, error.value().ptr());
        throw;
    } catch (...) {
        std::exception_ptr error = std::current_exception();
        torch::translate_exception_to_python(error);  // the error as the program will see it
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyErr_NormalizeException(&type, &value, &traceback);
        failed(fast, spec, at, inputs, outputs, event, value);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        std::rethrow_exception(error);
    }
    if (!before) {
        size_t count = op.schema().returns().size();
        std::vector<at::Tensor> produced;
        flatten((*stack)[stack->size() - count], produced);  // one return (set_ops takes no other)
        event = record(fast, spec, at, inputs, &produced);
        if (event == nullptr)
            throw python_error();
    }
    bool ok = in_flight(fast, event, spec, at, op, *stack, output) && tell(fast, s_listeners, event);
    Py_DECREF(event);
    if (!ok)
        throw python_error();
    return Fasted::taken;
}

struct Kernel final : c10::OperatorKernel {
    int index;
    bool autograd;  // registered at the autograd keys: run below them
    Kernel(int index, bool autograd) : index(index), autograd(autograd) {}

    void operator()(const c10::OperatorHandle &op, c10::DispatchKeySet keys, torch::jit::Stack *stack) {
        c10::DispatchKeySet below = keys & (autograd ? below_autograd : below_backend_select);
        if (below.empty()) {  // no tensor to take the backend from: let the dispatcher skip us
            c10::impl::ExcludeDispatchKeyGuard skip(ours);
            op.callBoxed(stack);
            return;
        }
        if (inside || handler == nullptr || keys.has(c10::DispatchKey::Meta) || !Py_IsInitialized() || _Py_IsFinalizing()) {
            redispatch(op, below, autograd, stack);
            return;
        }
        py::gil_scoped_acquire gil;
        if (handler == nullptr) {  // removed while this thread waited for the GIL
            py::gil_scoped_release released;
            redispatch(op, below, autograd, stack);
            return;
        }
        inside = true;
        struct Outside {
            ~Outside() { inside = false; }
        } outside;
        if (current.owner != nullptr && !flag(current.recorder, s_light_on)) {
            // the innermost recording records nothing here now (a detail step's dispatch mode
            // records the call below us; outside its step window): what the handler would do
            py::gil_scoped_release released;
            redispatch(op, below, autograd, stack);
            return;
        }
        if (current.owner != nullptr && static_cast<size_t>(index) < fast_ops.size() && fast_ops[index].name != nullptr) {
            // copies: while the op runs (without the GIL) another thread may end the recording,
            // or register the kernels again (set_ops); the op's names live in light.py's table
            Fast fast = current;
            FastOp spec = fast_ops[index];
            py::object owner = py::reinterpret_borrow<py::object>(fast.owner);
            if (record_fast(fast, spec, op, below, autograd, stack) == Fasted::taken) {
                if (static_cast<size_t>(index) < recorded_here.size())
                    recorded_here[index]++;
                return;
            }
        }
        const auto &arguments = op.schema().arguments();
        size_t base = stack->size() - arguments.size();
        size_t count = 0;  // positional arguments: all but the keyword-only ones (rare)
        for (const auto &argument : arguments)
            count += !argument.kwarg_only();
        py::tuple args(count);
        py::dict named;
        for (size_t i = 0, at = 0; i < arguments.size(); i++) {
            py::object value = for_python((*stack)[base + i]);
            if (arguments[i].kwarg_only())
                named[py::str(arguments[i].name())] = value;
            else
                args[at++] = value;
        }
        auto *call = PyObject_New(Call, &CallType);
        if (call == nullptr)
            throw python_error();
        call->op = &op;
        call->keys = below;
        call->stack = stack;
        call->autograd = autograd;
        call->ran = false;
        py::object handle = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject *>(call));
        py::object which = py::int_(index);
        PyObject *handler_args[] = {which.ptr(), args.ptr(), named.ptr(), handle.ptr()};
        PyObject *result = PyObject_Vectorcall(handler, handler_args, 4, nullptr);
        call->stack = nullptr;  // the handler may keep `call`: it must not run it later
        if (result == nullptr)
            throw python_error();
        Py_DECREF(result);
        if (!call->ran) {  // the handler did not run the op: run it now, as it would have
            py::gil_scoped_release released;
            redispatch(op, below, autograd, stack);
        }
    }
};

/* Light steps' `Module.__call__` (commdebug/capture/calls.py wraps it in a two-line Python
 * function that Dynamo can read): the common case of CallTracking._call in C. One tracker in a
 * light step, a module it has seen under the same parent before, a parent running and the
 * node-range log not full: push the module on the tracker's stack, log the autograd number
 * (with gradients on), run the call, log the number again and pop. Every other case goes to
 * `fallback`, the Python wrapper, which decides as before; so the C side never names a module
 * nor works out a path. */
struct ModuleCalls {
    PyObject_HEAD
    PyObject *original;  // Module.__call__ as torch has it
    PyObject *users;     // the patch's list of trackers in light steps (kept current by the patch)
    PyObject *fallback;  // fallback(mod, args, kwargs): the Python wrapper
    Py_ssize_t log_cap;  // calls.py's LOG_CAP: at it the Python side folds the log first
    vectorcallfunc vectorcall;
};


/* original(mod, *args, **kwargs), without a tuple where there are no keyword arguments. */
PyObject *call_original(PyObject *original, PyObject *mod, PyObject *args, PyObject *kwargs) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    if ((kwargs == nullptr || PyDict_GET_SIZE(kwargs) == 0) && n < 8) {
        PyObject *stack[9];
        stack[0] = mod;
        for (Py_ssize_t i = 0; i < n; i++)
            stack[i + 1] = PyTuple_GET_ITEM(args, i);
        return PyObject_Vectorcall(original, stack, n + 1, nullptr);
    }
    PyObject *all = PyTuple_New(n + 1);
    if (all == nullptr)
        return nullptr;
    Py_INCREF(mod);
    PyTuple_SET_ITEM(all, 0, mod);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *arg = PyTuple_GET_ITEM(args, i);
        Py_INCREF(arg);
        PyTuple_SET_ITEM(all, i + 1, arg);
    }
    PyObject *out = PyObject_Call(original, all, kwargs);
    Py_DECREF(all);
    return out;
}

/* Append the autograd number the next node takes, then path, to the tracker's node-range log
 * (flat: see NodeRanges). */
int log_number(PyObject *log, PyObject *path) {
    PyObject *number = PyLong_FromUnsignedLongLong(at::sequence_number::peek());
    if (number == nullptr)
        return -1;
    int failed = PyList_Append(log, number);
    Py_DECREF(number);
    if (failed == 0)
        failed = PyList_Append(log, path);
    return failed;
}

/* owner.name if it is exactly of `type`, else nullptr with no error set. */
PyObject *attribute(PyObject *owner, PyObject *name, PyTypeObject *type) {
    PyObject *value = PyObject_GetAttr(owner, name);
    if (value == nullptr) {
        PyErr_Clear();
        return nullptr;
    }
    if (Py_TYPE(value) != type) {
        Py_DECREF(value);
        return nullptr;
    }
    return value;
}

/* The tracker's log as the call ends: the list the start went to, or the one a fold left. */
void log_end(PyObject *tracker) {
    PyObject *ranges = PyObject_GetAttr(tracker, s_ranges);
    PyObject *log = ranges ? attribute(ranges, s_log, &PyList_Type) : nullptr;
    if (log != nullptr)
        log_number(log, Py_None);
    Py_XDECREF(log);
    Py_XDECREF(ranges);
}

void pop(PyObject *list) {
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (n > 0)
        PyList_SetSlice(list, n - 1, n, nullptr);
}

PyObject *module_call(PyObject *self, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    auto *calls = reinterpret_cast<ModuleCalls *>(self);
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 3 || kwnames != nullptr || !PyTuple_Check(argv[1]) || (argv[2] != Py_None && !PyDict_Check(argv[2]))) {
        PyErr_SetString(PyExc_TypeError, "ModuleCalls(mod, args: tuple, kwargs: dict | None)");
        return nullptr;
    }
    PyObject *mod = argv[0], *args = argv[1], *kwargs = argv[2] == Py_None ? nullptr : argv[2];
    if (PyList_GET_SIZE(calls->users) != 1)
        return PyObject_Vectorcall(calls->fallback, argv, 3, nullptr);
    PyObject *tracker = PyList_GET_ITEM(calls->users, 0);
    Py_INCREF(tracker);  // the list may change during the call
    PyObject *known = nullptr, *paths = nullptr, *stack = nullptr, *ranges = nullptr, *log = nullptr, *key = nullptr;
    PyObject *entry = nullptr, *fqn = nullptr, *path = nullptr, *forwards = nullptr, *more = nullptr;
    PyObject *out = nullptr;
    bool logged = false;
    // the common case, or the Python wrapper for everything else
    known = attribute(tracker, s_known, &PyDict_Type);
    paths = attribute(tracker, s_paths, &PyList_Type);
    stack = attribute(tracker, s_stack, &PyList_Type);
    if (known == nullptr || paths == nullptr || stack == nullptr || PyList_GET_SIZE(paths) == 0)
        goto slow;
    if (c10::GradMode::is_enabled()) {
        ranges = PyObject_GetAttr(tracker, s_ranges);
        log = ranges ? attribute(ranges, s_log, &PyList_Type) : nullptr;
        if (log == nullptr || PyList_GET_SIZE(log) >= calls->log_cap)
            goto slow;
    }
    key = PyLong_FromVoidPtr(mod);
    if (key == nullptr)
        goto fail;
    entry = PyDict_GetItemWithError(known, key);  // borrowed
    if (entry == nullptr) {
        if (PyErr_Occurred())
            goto fail;
        goto slow;
    }
    if (!PyList_Check(entry) || PyList_GET_SIZE(entry) != 4)
        goto slow;
    fqn = PyList_GET_ITEM(entry, 1);
    path = PyList_GET_ITEM(entry, 3);
    if (fqn == Py_None || PyList_GET_ITEM(entry, 2) != PyList_GET_ITEM(paths, PyList_GET_SIZE(paths) - 1) || !PyTuple_Check(path))
        goto slow;
    Py_INCREF(fqn);  // borrowed from the entry, which the call may replace
    Py_INCREF(path);
    forwards = PyObject_GetAttr(tracker, s_forwards);  // module calls seen (the step counter reads it)
    if (forwards == nullptr)
        goto fail_held;
    more = PyNumber_Add(forwards, one);
    if (more == nullptr || PyObject_SetAttr(tracker, s_forwards, more) < 0)
        goto fail_held;
    if (PyList_Append(stack, fqn) < 0)
        goto fail_held;
    if (PyList_Append(paths, path) < 0) {
        pop(stack);
        goto fail_held;
    }
    if (log != nullptr) {
        if (log_number(log, path) < 0) {
            pop(stack);
            pop(paths);
            goto fail_held;
        }
        logged = true;
    }
    out = call_original(calls->original, mod, args, kwargs);
    {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);  // the call's error, if any, survives the bookkeeping
        if (logged)
            log_end(tracker);
        pop(stack);
        pop(paths);
        PyErr_Clear();
        if (type != nullptr)
            PyErr_Restore(type, value, traceback);
    }
    Py_DECREF(fqn);
    Py_DECREF(path);
    goto done;
fail_held:
    Py_DECREF(fqn);
    Py_DECREF(path);
fail:
    out = nullptr;
    goto done;
slow:
    if (PyErr_Occurred())
        PyErr_Clear();
    out = PyObject_Vectorcall(calls->fallback, argv, 3, nullptr);
done:
    Py_XDECREF(more);
    Py_XDECREF(forwards);
    Py_XDECREF(key);
    Py_XDECREF(log);
    Py_XDECREF(ranges);
    Py_XDECREF(stack);
    Py_XDECREF(paths);
    Py_XDECREF(known);
    Py_DECREF(tracker);
    return out;
}

PyObject *module_calls_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *original, *users, *fallback;
    Py_ssize_t log_cap;
    static const char *names[] = {"original", "users", "fallback", "log_cap", nullptr};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!On:ModuleCalls", const_cast<char **>(names), &original, &PyList_Type, &users, &fallback, &log_cap))
        return nullptr;
    auto *calls = reinterpret_cast<ModuleCalls *>(type->tp_alloc(type, 0));
    if (calls == nullptr)
        return nullptr;
    Py_INCREF(original);
    Py_INCREF(users);
    Py_INCREF(fallback);
    calls->original = original;
    calls->users = users;
    calls->fallback = fallback;
    calls->log_cap = log_cap;
    calls->vectorcall = module_call;
    return reinterpret_cast<PyObject *>(calls);
}

void module_calls_dealloc(PyObject *self) {
    auto *calls = reinterpret_cast<ModuleCalls *>(self);
    Py_XDECREF(calls->original);
    Py_XDECREF(calls->users);
    Py_XDECREF(calls->fallback);
    Py_TYPE(self)->tp_free(self);
}

PyTypeObject ModuleCallsType = {PyVarObject_HEAD_INIT(nullptr, 0) "commdebug.capture._native.ModuleCalls"};

class Quiet : public c10::WarningHandler {
    void process(const c10::Warning &) override {}  // a kernel replacing another's warns: expected
};

PyObject *register_kernels(PyObject *, PyObject *args) {
    const char *ns, *key;
    PyObject *entries;
    if (!PyArg_ParseTuple(args, "ssO!:register", &ns, &key, &PyList_Type, &entries))
        return nullptr;
    HANDLE_TH_ERRORS
    Quiet quiet;
    c10::WarningUtils::WarningHandlerGuard guard(&quiet);
    c10::DispatchKey dispatch_key = c10::parseDispatchKey(key);
    bool autograd = dispatch_key != c10::DispatchKey::BackendSelect;
    auto library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, std::make_optional(dispatch_key), __FILE__, __LINE__);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); i++) {
        const char *name;
        int index;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(entries, i), "si", &name, &index))
            return nullptr;
        library->impl(name, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<Kernel>(index, autograd)));
    }
    libraries.push_back(std::move(library));
    return PyLong_FromSsize_t(static_cast<Py_ssize_t>(libraries.size() - 1));
    END_HANDLE_TH_ERRORS
}

PyObject *unregister_kernels(PyObject *, PyObject *arg) {
    Py_ssize_t handle = PyLong_AsSsize_t(arg);
    if (handle == -1 && PyErr_Occurred())
        return nullptr;
    if (handle < 0 || static_cast<size_t>(handle) >= libraries.size()) {
        PyErr_SetString(PyExc_ValueError, "unregister: no such registration");
        return nullptr;
    }
    HANDLE_TH_ERRORS
    libraries[handle].reset();  // the ops' kernels at that key are what they were before
    while (!libraries.empty() && !libraries.back())
        libraries.pop_back();
    Py_RETURN_NONE;
    END_HANDLE_TH_ERRORS
}


PyObject *set_recorder(PyObject *, PyObject *arg) {
    if (arg == Py_None) {
        clear_fast();
        Py_RETURN_NONE;
    }
    Fast next;
    int record_source = 0;
    if (!PyArg_ParseTuple(arg, "OOOO!O!O!OOOOOOOOOOOOdpOO!:set_recorder", &next.recorder, &next.tracker, &next.where, &PyDict_Type,
                          &next.groups, &PyDict_Type, &next.seqs, &PyDict_Type, &next.facts, &next.trace, &next.add_collective,
                          &next.add_event, &next.issued, &next.tensor_issued, &next.issued_work, &next.done, &next.failed, &next.caller,
                          &next.event_type, &next.dtype_names, &next.state, &next.t0, &record_source, &next.frames, &PyTuple_Type,
                          &next.places))
        return nullptr;
    if (!(next.frames == Py_None || (PyTuple_Check(next.frames) && PyTuple_GET_SIZE(next.frames) == 6)) || PyTuple_GET_SIZE(next.places) != 3) {
        PyErr_SetString(PyExc_TypeError, "set_recorder: the frames view takes 6 items, the places 3");
        return nullptr;
    }
    if (!PyType_Check(next.event_type) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject *>(next.event_type), &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "set_recorder: the event type must be a tuple type");
        return nullptr;
    }
    PyObject *fields = PyObject_GetAttrString(next.event_type, "_fields");
    Py_ssize_t count = fields ? PyObject_Length(fields) : -1;
    Py_XDECREF(fields);
    if (count != EVENT_FIELDS) {  // the event was given a field: record() must set it too
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "set_recorder: the event type has %zd fields, record() sets %d", count, EVENT_FIELDS);
        return nullptr;
    }
    next.record_source = record_source != 0;
    next.owner = Py_NewRef(arg);  // a tuple: the objects parsed above stay alive with it
    PyObject *old = current.owner;
    current = next;
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

PyObject *set_ops(PyObject *, PyObject *list) {
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "set_ops(list)");
        return nullptr;
    }
    std::vector<FastOp> ops(static_cast<size_t>(PyList_GET_SIZE(list)), FastOp{nullptr, nullptr, nullptr, NONE, NONE, NONE});
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        PyObject *entry = PyList_GET_ITEM(list, i);
        if (entry == Py_None)
            continue;
        FastOp op;
        if (!PyArg_ParseTuple(entry, "UUUiii:set_ops", &op.name, &op.op, &op.compat, &op.inputs, &op.outputs, &op.group))
            return nullptr;
        if (op.group < 0 || op.inputs < NONE || op.outputs < RETURN) {
            PyErr_SetString(PyExc_ValueError, "set_ops: bad argument index");
            return nullptr;
        }
        Py_INCREF(op.name);
        Py_INCREF(op.op);
        Py_INCREF(op.compat);
        ops[i] = op;
    }
    for (FastOp &op : fast_ops) {  // op names are interned and kept by the Python side too: no call holds these
        Py_XDECREF(op.name);
        Py_XDECREF(op.op);
        Py_XDECREF(op.compat);
    }
    fast_ops = std::move(ops);
    recorded_here.resize(fast_ops.size(), 0);
    Py_RETURN_NONE;
}

PyObject *counts(PyObject *, PyObject *) {
    PyObject *out = PyList_New(static_cast<Py_ssize_t>(recorded_here.size()));
    for (size_t i = 0; out != nullptr && i < recorded_here.size(); i++) {
        PyObject *n = PyLong_FromUnsignedLongLong(recorded_here[i]);
        if (n == nullptr)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), n);
    }
    return out;
}

PyObject *set_handler(PyObject *, PyObject *fn) {
    PyObject *old = handler;
    if (fn == Py_None) {
        handler = nullptr;
    } else {
        Py_INCREF(fn);
        handler = fn;
    }
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

/* tuple.__new__(event_type, fields), untracked by the garbage collector. An event holds only
 * values that never point back at it (strings, numbers, tuples of them, the GroupInfo tuple),
 * so it can be in no reference cycle; tracked, the thousands a long recording keeps (a deque
 * of 20,000 by default) set off full collections, which walk the whole heap, every few hundred
 * steps. */
PyObject *new_event(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyType_Check(args[0]) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject *>(args[0]), &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "new_event(tuple type, fields)");
        return nullptr;
    }
    PyObject *packed = PyTuple_Pack(1, args[1]);
    if (packed == nullptr)
        return nullptr;
    PyObject *event = PyTuple_Type.tp_new(reinterpret_cast<PyTypeObject *>(args[0]), packed, nullptr);
    Py_DECREF(packed);
    if (event != nullptr)
        PyObject_GC_UnTrack(event);
    return event;
}

/* light.py's skip(): let this thread's calls go past the kernels until unskip(token), for a
 * call whose collectives need no recording (a DTensor's wait, which the wrapper around it tells
 * the in-flight table of). The token: whether BackendSelect was excluded already, or None where
 * no kernel is registered. In C, because a DTensor program runs it for every wait. */
PyObject *skip(PyObject *, PyObject *) {
    if (std::none_of(libraries.begin(), libraries.end(), [](const auto &library) { return library != nullptr; }))
        Py_RETURN_NONE;
    bool before = c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::BackendSelect);
    c10::impl::tls_set_dispatch_key_excluded(c10::DispatchKey::BackendSelect, true);
    return PyBool_FromLong(before);
}

/* light.py's unskip(token): the thread's exclusion as skip() found it. */
PyObject *unskip(PyObject *, PyObject *token) {
    if (token != Py_None)
        c10::impl::tls_set_dispatch_key_excluded(c10::DispatchKey::BackendSelect, token == Py_True);
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"waited", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(waited)), METH_FASTCALL,
     "waited(flights, tensor): each InFlight in `flights` told that the functional collective behind `tensor` finished (inflight.py's _tell)."},
    {"new_event", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(new_event)), METH_FASTCALL,
     "new_event(event_type, fields): tuple.__new__(event_type, fields), not tracked by the garbage collector (it can be in no cycle)."},
    {"skip", skip, METH_NOARGS,
     "skip() -> token: this thread's calls go past the kernels until unskip(token); None where none is registered."},
    {"unskip", unskip, METH_O, "unskip(token): the thread's exclusion of the kernels' key as skip() found it."},
    {"register", register_kernels, METH_VARARGS,
     "register(namespace, key, [(name, index), ...]) -> handle\n\n"
     "Register the kernel for each op `name` (\"allreduce_\", \"all_reduce.default\") of `namespace`\n"
     "at dispatch key `key` (\"BackendSelect\", or \"Autograd\": then it runs the op below the\n"
     "autograd keys); it calls the handler with `index`. Replaces what was there until unregister."},
    {"unregister", unregister_kernels, METH_O, "unregister(handle): the kernels of one register() call go."},
    {"set_handler", set_handler, METH_O,
     "set_handler(fn or None): fn(index, args, kwargs, call) records a collective and returns call()'s\n"
     "result; `call()` runs the op once on the keys below the kernel. None: the kernels only redispatch."},
    {"set_recorder", set_recorder, METH_O,
     "set_recorder(state or None): the innermost light recording's plain path, recorded in C++ (see\n"
     "Recorder._native_state); None: every call goes to the handler."},
    {"storage_key", storage_key, METH_O, "storage_key(tensor) -> int: its storage's address, or its id without one (the in-flight table's key)."},
    {"work_failed", work_failed, METH_O, "work_failed(work) -> bool: the Work (held, or a Python c10d Work) finished with an error."},
    {"on_completion", on_completion, METH_O,
     "on_completion(work) -> Completion | None: when the Work completes, stamped by a callback on its future (None: no future)."},
    {"work_key", work_key, METH_O, "work_key(work) -> int: the address of a Python c10d Work's Work (the in-flight table's key)."},
    {"counts", counts, METH_NOARGS,
     "counts() -> [n, ...]: by kernel index, the calls the kernel recorded itself (for tests)."},
    {"set_ops", set_ops, METH_O,
     "set_ops([None | (name, op, count key, inputs, outputs, group), ...]): by kernel index, the ops the\n"
     "C++ path may record (argument indices; -1: none, -2: the op's one return)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "Light capture's kernel for the collective ops.", -1, methods};

}  // namespace

/* A static type made ready with its size, its own slots (set before) and its doc. */
static bool ready(PyTypeObject &type, Py_ssize_t size, const char *doc) {
    type.tp_basicsize = size;
    type.tp_flags |= Py_TPFLAGS_DEFAULT;
    type.tp_doc = doc;
    return PyType_Ready(&type) == 0;
}

PyMODINIT_FUNC PyInit__native(void) {
    CallType.tp_call = call_run;
    HeldWorkType.tp_dealloc = held_dealloc;
    HeldWorkType.tp_methods = held_methods;
    CompletionType.tp_dealloc = completion_dealloc;
    CompletionType.tp_methods = completion_methods;
    ModuleCallsType.tp_flags = Py_TPFLAGS_HAVE_VECTORCALL;
    ModuleCallsType.tp_vectorcall_offset = offsetof(ModuleCalls, vectorcall);
    ModuleCallsType.tp_call = PyVectorcall_Call;
    ModuleCallsType.tp_new = module_calls_new;
    ModuleCallsType.tp_dealloc = module_calls_dealloc;
    if (!ready(CallType, sizeof(Call), "A collective's call, run once by light capture's handler.") ||
        !ready(HeldWorkType, sizeof(HeldWork), "A c10d Work held for the in-flight table (is_completed only).") ||
        !ready(CompletionType, sizeof(Completion), "When a c10d Work completed, stamped by a callback on its future (on_completion).") ||
        !ready(ModuleCallsType, sizeof(ModuleCalls),
               "ModuleCalls(original, users, fallback, log_cap): light steps' Module.__call__, called as (mod, args, kwargs)."))
        return nullptr;
    one = PyLong_FromLong(1);
    zero = PyLong_FromLong(0);
    if (!one || !zero)
        return nullptr;
    struct {
        PyObject **name;
        const char *text;
    } names[] = {
        {&s_known, "_known"},
        {&s_paths, "paths"},
        {&s_stack, "stack"},
        {&s_ranges, "_ranges"},
        {&s_log, "log"},
        {&s_forwards, "forwards"},
        {&s_fw_phase, "fw_phase"},
        {&s_task, "task"},
        {&s_calls, "calls"},
        {&s_pinned, "_pinned"},
        {&s_find, "find"},
        {&s_bw_found, "_bw_found"},
        {&s_starts, "starts"},
        {&s_ends, "ends"},
        {&s_parents, "parents"},
        {&s_by_storage, "_by_storage"},
        {&s_on_waited, "_on_waited"},
        {&s_tensor_waited, "tensor_waited"},
        {&s_done, "done"},
        {&s_light_on, "_light_on"},
        {&s_plain, "_plain"},
        {&s_step, "step"},
        {&s_events_total, "events_total"},
        {&s_unit, "unit"},
        {&s_size, "size"},
        {&s_last_dtensor, "_last_dtensor"},
        {&s_issue_listeners, "issue_listeners"},
        {&s_listeners, "_listeners"},
        {&s_inside, "inside"}};
    for (auto &entry : names)
        if ((*entry.name = PyUnicode_InternFromString(entry.text)) == nullptr)
            return nullptr;
    try {
        process_group_type = c10::getCustomClassType<c10::intrusive_ptr<c10d::ProcessGroup>>();
    } catch (...) {  // a torch without c10d: no group to name
        process_group_type = nullptr;
    }
    try {
        work_type = c10::getCustomClassType<c10::intrusive_ptr<c10d::Work>>();
    } catch (...) {
        work_type = nullptr;
    }
    PyObject *created = PyModule_Create(&module);
    if (created == nullptr)
        return nullptr;
    Py_INCREF(&ModuleCallsType);
    if (PyModule_AddObject(created, "ModuleCalls", reinterpret_cast<PyObject *>(&ModuleCallsType)) < 0) {
        Py_DECREF(&ModuleCallsType);
        Py_DECREF(created);
        return nullptr;
    }
    return created;
}
