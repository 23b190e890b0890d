// pagedkv._pagedkv: the compiled half of the Python package (python/pagedkv re-exports it).
#include "bindings.hpp"
#include "pagedkv/error.hpp"

NB_MODULE(_pagedkv, m) {
  namespace nb = nanobind;
  m.doc() = "pagedkv C++ bindings (nanobind); import pagedkv instead.";
  // pagedkv.Error: base of the errors the library raises. ContractError: the C++
  // pagedkv::Error, a contract violation (unknown or swapped sequence, commit past the end,
  // ...); its message names the value. Bad arguments on their own are ValueError.
  PyObject* base = PyErr_NewExceptionWithDoc("pagedkv.Error", "Base of pagedkv's errors.",
                                             PyExc_Exception, nullptr);
  m.attr("Error") = nb::steal(base);
  nb::exception<pagedkv::Error>(m, "ContractError", base);
  m.attr("ContractError").attr("__module__") = "pagedkv";
  pagedkv::py::bind_types(m);
  pagedkv::py::bind_manager(m);
  pagedkv::py::bind_ops(m);
  pagedkv::py::bind_kv_pools(m);
  pagedkv::py::bind_testing(m);
}
