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
 * _light_call) stays the one place that decides what is recorded.
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
#include <c10/util/Exception.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

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

PyObject *s_known, *s_paths, *s_stack, *s_ranges, *s_log, *s_forwards, *one;

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

PyMethodDef methods[] = {
    {"register", register_kernels, METH_VARARGS,
     "register(namespace, key, [(name, index), ...]) -> handle\n\n"
     "Register the kernel for each op `name` (\"allreduce_\", \"all_reduce.default\") of `namespace`\n"
     "at dispatch key `key` (\"BackendSelect\", or \"Autograd\": then it runs the op below the\n"
     "autograd keys); it calls the handler with `index`. Replaces what was there until unregister."},
    {"unregister", unregister_kernels, METH_O, "unregister(handle): the kernels of one register() call go."},
    {"set_handler", set_handler, METH_O,
     "set_handler(fn or None): fn(index, args, kwargs, call) records a collective and returns call()'s\n"
     "result; `call()` runs the op once on the keys below the kernel. None: the kernels only redispatch."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "Light capture's kernel for the collective ops.", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__native(void) {
    CallType.tp_basicsize = sizeof(Call);
    CallType.tp_flags = Py_TPFLAGS_DEFAULT;
    CallType.tp_call = call_run;
    CallType.tp_doc = "A collective's call, run once by light capture's handler.";
    if (PyType_Ready(&CallType) < 0)
        return nullptr;
    ModuleCallsType.tp_basicsize = sizeof(ModuleCalls);
    ModuleCallsType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
    ModuleCallsType.tp_vectorcall_offset = offsetof(ModuleCalls, vectorcall);
    ModuleCallsType.tp_call = PyVectorcall_Call;
    ModuleCallsType.tp_new = module_calls_new;
    ModuleCallsType.tp_dealloc = module_calls_dealloc;
    ModuleCallsType.tp_doc = "ModuleCalls(original, users, fallback, log_cap): light steps' Module.__call__, called as (mod, args, kwargs).";
    if (PyType_Ready(&ModuleCallsType) < 0)
        return nullptr;
    s_known = PyUnicode_InternFromString("_known");
    s_paths = PyUnicode_InternFromString("paths");
    s_stack = PyUnicode_InternFromString("stack");
    s_ranges = PyUnicode_InternFromString("_ranges");
    s_log = PyUnicode_InternFromString("log");
    s_forwards = PyUnicode_InternFromString("forwards");
    one = PyLong_FromLong(1);
    if (!s_known || !s_paths || !s_stack || !s_ranges || !s_log || !s_forwards || !one)
        return nullptr;
    try {
        process_group_type = c10::getCustomClassType<c10::intrusive_ptr<c10d::ProcessGroup>>();
    } catch (...) {  // a torch without c10d: no group to name
        process_group_type = nullptr;
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
