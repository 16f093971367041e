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
 * Built against the torch it runs with (setup.py builds it where torch is importable at build
 * time); light.py falls back to Python kernels where it is not built, and says so once.
 */
#include <Python.h>

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
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
        py::list positional;
        py::dict named;
        for (size_t i = 0; i < arguments.size(); i++) {
            py::object value = for_python((*stack)[base + i]);
            if (arguments[i].kwarg_only())
                named[py::str(arguments[i].name())] = value;
            else
                positional.append(value);
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
        py::object args = py::tuple(positional);
        PyObject *result = PyObject_CallFunction(handler, "iOOO", index, args.ptr(), named.ptr(), handle.ptr());
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
    try {
        process_group_type = c10::getCustomClassType<c10::intrusive_ptr<c10d::ProcessGroup>>();
    } catch (...) {  // a torch without c10d: no group to name
        process_group_type = nullptr;
    }
    return PyModule_Create(&module);
}
