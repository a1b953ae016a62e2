// The filters, tests, string/dict methods and global functions of the Jinja subset, with Python's semantics
// for the cases chat templates use.
#pragma once

#include <string>

#include "chat/jinja_value.h"

namespace tandem::chat {

// Calls a filter or a test through the evaluator (map('upper'), select('equalto', x) take their names).
struct Callbacks {
  std::function<Value(const std::string& filter, const Value& input, const CallArgs& args)> filter;
  std::function<bool(const std::string& test, const Value& input, const CallArgs& args)> test;
};

bool has_filter(const std::string& name);
bool has_test(const std::string& name);
// Throw Error (without a position; the evaluator adds it) for bad arguments.
Value apply_filter(const std::string& name, const Value& input, const CallArgs& args, const Callbacks& cb);
bool apply_test(const std::string& name, const Value& input, const CallArgs& args);
// obj.name for a string or dict method ("strip", "split", "items", "get", ...): a function bound to obj, or
// undefined when obj has no such method.
Value method(const Value& obj, const std::string& name);
// range, namespace, raise_exception, strftime_now, dict.
Dict global_functions();

// Python string helpers the evaluator shares.
int64_t py_len(const Value& v);  // code points of a string, items of a list/dict; throws for others
Value py_slice(const Value& v, const Value& start, const Value& stop, const Value& step);
Value py_index(const Value& v, const Value& key);  // v[key] as Jinja's getitem: undefined when missing

}  // namespace tandem::chat
