#include "backend/op_checks.h"

#include <string>

#include "core/error.h"

namespace tandem::op_checks {

namespace {
std::string where(const char* op, const char* name) {
  return std::string(op) + ": " + name;
}
}  // namespace

// These run for every argument of every op: the message is built only when the check fails.
#define TANDEM_OP_CHECK(cond, message)           \
  do {                                           \
    if (!(cond)) throw ::tandem::Error(message); \
  } while (0)

void on_device(const char* op, const char* name, const Tensor& t, DeviceId dev) {
  if (dev.kind == DeviceKind::CPU) {
    TANDEM_OP_CHECK(t.device.kind == DeviceKind::CPU,
                    where(op, name) + " lives on " + t.device.to_string() +
                        ", but this is a CPU op (copy it to the host first)");
  } else {
    TANDEM_OP_CHECK(t.device == dev, where(op, name) + " lives on " + t.device.to_string() +
                                         ", but this op runs on " + dev.to_string() +
                                         " (copy it there first)");
  }
  TANDEM_OP_CHECK(t.data != nullptr || t.nelements() == 0, where(op, name) + " has no data (null pointer)");
  for (int i = 0; i < 4; ++i) TANDEM_OP_CHECK(t.ne[i] >= 0, where(op, name) + " has a negative dimension");
}

void type(const char* op, const char* name, const Tensor& t, DType type) {
  TANDEM_OP_CHECK(t.type == type,
                  where(op, name) + " must be " + dtype_name(type) + ", got " + dtype_name(t.type));
}

void f32(const char* op, const char* name, const Tensor& t, DeviceId dev) {
  on_device(op, name, t, dev);
  type(op, name, t, DType::F32);
  TANDEM_OP_CHECK(t.nb[0] == sizeof(float), where(op, name) + " must have contiguous rows (nb[0] == 4)");
  for (int i = 1; i < 4; ++i)
    TANDEM_OP_CHECK(t.nb[i] % 4 == 0, where(op, name) + " must have 4-byte aligned row strides");
}

void i32_vector(const char* op, const char* name, const Tensor& t, int64_t n, DeviceId dev) {
  on_device(op, name, t, dev);
  type(op, name, t, DType::I32);
  TANDEM_OP_CHECK(t.ne[0] == n && t.nrows() == 1,
                  where(op, name) + " must have shape {" + std::to_string(n) + "}, got " + t.shape_string());
  TANDEM_OP_CHECK(t.nb[0] == sizeof(int32_t), where(op, name) + " must be contiguous");
}

void same_shape(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  TANDEM_OP_CHECK(a.ne == b.ne, std::string(op) + ": " + a_name + " " + a.shape_string() + " and " + b_name +
                                    " " + b.shape_string() + " must have the same shape");
}

void dims(const char* op, const char* name, const Tensor& t, int64_t ne0, int64_t ne1, int64_t ne2,
          int64_t ne3) {
  if (t.ne[0] == ne0 && t.ne[1] == ne1 && t.ne[2] == ne2 && t.ne[3] == ne3) return;
  Tensor want;
  want.ne = {ne0, ne1, ne2, ne3};
  throw Error(where(op, name) + " must have shape " + want.shape_string() + ", got " + t.shape_string());
}

void no_alias(const char* op, const char* names, std::initializer_list<const Tensor*> tensors) {
  for (auto a = tensors.begin(); a != tensors.end(); ++a)
    for (auto b = a + 1; b != tensors.end(); ++b)
      check((*a)->data != (*b)->data, std::string(op) + ": " + names + " must not alias");
}

}  // namespace tandem::op_checks
