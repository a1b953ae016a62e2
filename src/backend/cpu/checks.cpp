// Argument checks shared by the CPU ops: every failure names the op, the argument and what was expected.
#include <algorithm>

#include "backend/cpu/cpu_ops_impl.h"
#include "backend/op_checks.h"

namespace tandem::cpu {

// The rules are the backends' shared ones (backend/op_checks.h); these name the CPU as the device.
void check_on_cpu(const char* op, const char* name, const Tensor& t) {
  op_checks::on_device(op, name, t, DeviceId{DeviceKind::CPU, 0});
}
void check_type(const char* op, const char* name, const Tensor& t, DType type) {
  op_checks::type(op, name, t, type);
}
void check_f32(const char* op, const char* name, const Tensor& t) {
  op_checks::f32(op, name, t, DeviceId{DeviceKind::CPU, 0});
}
void check_i32_vector(const char* op, const char* name, const Tensor& t, int64_t n) {
  op_checks::i32_vector(op, name, t, n, DeviceId{DeviceKind::CPU, 0});
}
void check_same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                      const Tensor& b) {
  op_checks::same_shape(op, a_name, a, b_name, b);
}
void check_dims(const char* op, const char* name, const Tensor& t, int64_t ne0, int64_t ne1, int64_t ne2,
                int64_t ne3) {
  op_checks::dims(op, name, t, ne0, ne1, ne2, ne3);
}

int64_t items_per_task(int64_t n, int n_threads, int64_t min_per_task, int tasks_per_thread) {
  const int64_t target_tasks = int64_t(n_threads) * tasks_per_thread;
  int64_t per = (n + target_tasks - 1) / std::max<int64_t>(target_tasks, 1);
  return std::max<int64_t>({per, min_per_task, 1});
}

}  // namespace tandem::cpu
