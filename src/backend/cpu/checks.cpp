// Argument checks shared by the CPU ops: every failure names the op, the argument and what was expected.
#include <algorithm>

#include "backend/cpu/cpu_ops_impl.h"

namespace tandem::cpu {

namespace {
std::string where(const char* op, const char* name) {
  return std::string(op) + ": " + name;
}
}  // namespace

void check_on_cpu(const char* op, const char* name, const Tensor& t) {
  TANDEM_CPU_CHECK(t.device.kind == DeviceKind::CPU,
                   where(op, name) + " lives on " + t.device.to_string() +
                       ", but this is a CPU op (copy it to the host first)");
  TANDEM_CPU_CHECK(t.data != nullptr || t.nelements() == 0, where(op, name) + " has no data (null pointer)");
  for (int i = 0; i < 4; ++i) TANDEM_CPU_CHECK(t.ne[i] >= 0, where(op, name) + " has a negative dimension");
}

void check_type(const char* op, const char* name, const Tensor& t, DType type) {
  TANDEM_CPU_CHECK(t.type == type,
                   where(op, name) + " must be " + dtype_name(type) + ", got " + dtype_name(t.type));
}

void check_f32(const char* op, const char* name, const Tensor& t) {
  check_on_cpu(op, name, t);
  check_type(op, name, t, DType::F32);
  TANDEM_CPU_CHECK(t.nb[0] == sizeof(float), where(op, name) + " must have contiguous rows (nb[0] == 4)");
}

void check_i32_vector(const char* op, const char* name, const Tensor& t, int64_t n) {
  check_on_cpu(op, name, t);
  check_type(op, name, t, DType::I32);
  TANDEM_CPU_CHECK(t.ne[0] == n && t.nrows() == 1,
                   where(op, name) + " must have shape {" + std::to_string(n) + "}, got " + t.shape_string());
  TANDEM_CPU_CHECK(t.nb[0] == sizeof(int32_t), where(op, name) + " must be contiguous");
}

void check_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                      const Tensor& b) {
  TANDEM_CPU_CHECK(a.ne == b.ne, std::string(op) + ": " + a_name + " " + a.shape_string() + " and " + b_name +
                                     " " + b.shape_string() + " must have the same shape");
}

void check_dims(const char* op, const char* name, const Tensor& t, int64_t ne0, int64_t ne1, int64_t ne2,
                int64_t ne3) {
  const bool ok = t.ne[0] == ne0 && t.ne[1] == ne1 && t.ne[2] == ne2 && t.ne[3] == ne3;
  if (!ok) {
    Tensor want;
    want.ne = {ne0, ne1, ne2, ne3};
    throw Error(where(op, name) + " must have shape " + want.shape_string() + ", got " + t.shape_string());
  }
}

int64_t items_per_task(int64_t n, int n_threads, int64_t min_per_task, int tasks_per_thread) {
  const int64_t target_tasks = int64_t(n_threads) * tasks_per_thread;
  int64_t per = (n + target_tasks - 1) / std::max<int64_t>(target_tasks, 1);
  return std::max<int64_t>({per, min_per_task, 1});
}

}  // namespace tandem::cpu
