// chorus_torch._C: the creator torch.distributed calls for backend "chorus", and facts about
// the build. Only this file sees Python and pybind11.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "process_group.h"

namespace py = pybind11;

namespace chorus_torch {

void run_without_gil(const std::function<void()>& fn) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    py::gil_scoped_release nogil;
    fn();
  } else {
    fn();
  }
}

}  // namespace chorus_torch

PYBIND11_MODULE(_C, m) {
  m.doc() = "chorus collectives as a torch.distributed backend";
  py::module_::import("torch.distributed");  // registers c10d's Store and ProcessGroup types
  m.def(
      "create_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout) {
        return chorus_torch::create_process_group(store, rank, size, timeout);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::call_guard<py::gil_scoped_release>(),
      "The process group for backend 'chorus' (torch.distributed calls this).");
  // revoke and shrink take the group's chorus backend (torch 1.x: the group itself).
  auto chorus_of = [](const c10::intrusive_ptr<chorus_torch::PgBase>& pg) {
    auto* c = dynamic_cast<chorus_torch::ProcessGroupChorus*>(pg.get());
    TORCH_CHECK(c, "chorus_torch: the group's backend is ", pg->getBackendName(), ", not chorus");
    return c;
  };
  m.def(
      "revoke",
      [chorus_of](const c10::intrusive_ptr<chorus_torch::PgBase>& pg) { chorus_of(pg)->revoke(); },
      py::arg("group"), py::call_guard<py::gil_scoped_release>(),
      "chorusCommRevoke: every pending and later operation of the group fails, on every rank.");
  m.def(
      "shrink",
      [chorus_of](const c10::intrusive_ptr<chorus_torch::PgBase>& pg,
                  const std::vector<int>& exclude, bool agree) {
        return c10::intrusive_ptr<chorus_torch::PgBase>(chorus_of(pg)->shrink(exclude, agree));
      },
      py::arg("group"), py::arg("exclude"), py::arg("agree"),
      py::call_guard<py::gil_scoped_release>(),
      "chorusCommShrink: a group of the ranks but `exclude` (with agree: but the failed ones).");
  m.def("_test_slow_finish", &chorus_torch::WorkChorus::test_slow_finish, py::arg("ms"),
        "Test hook: Works finish slowly, so that wait() meets a Work the completer is finishing.");
  m.def("chorus_version", [] {
    int v = 0;
    chorusGetVersion(&v);
    return v;
  });
  m.attr("torch_version_built") = TORCH_VERSION;
  m.attr("cuda") = false;
}
