// Values of the Jinja-subset interpreter: Python's none, bool, int, float, str, list and dict (string keys,
// in insertion order), plus Jinja's undefined, namespace() objects and callables (macros, builtins, methods).
// Lists and dicts are shared by reference as in Python; templates run in an immutable sandbox (as
// transformers' ImmutableSandboxedEnvironment), so only namespace attributes are ever changed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tandem::chat {

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, unique keys

// Arguments of a call: positional, then keyword.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Function = std::function<Value(const CallArgs&)>;

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };

  Value() = default;  // undefined
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(int64_t(i)) {}
  Value(double d);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(List l);
  Value(Dict d);
  static Value make_namespace(Dict d);
  static Value function(Function f);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_mapping() const { return kind_ == Kind::Dict || kind_ == Kind::Namespace; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_number() const { return kind_ == Kind::Float ? d_ : double(kind_ == Kind::Bool ? b_ : i_); }
  const std::string& as_string() const { return *s_; }
  const List& as_list() const { return *l_; }
  const Dict& as_dict() const { return *m_; }
  Dict& namespace_dict() const { return *m_; }  // namespace attributes are writable
  const Function& as_function() const { return *f_; }

  // Python truthiness (undefined is false).
  bool truthy() const;
  // The dict entry for key, or undefined.
  Value get(const std::string& key) const;
  // The type name Python would give, for messages: "str", "list", "dict", "NoneType", ...
  const char* type_name() const;
  // str(x) as Jinja prints it: None, True, 1.5, ['a', 1], {'k': 'v'}; undefined prints as "".
  std::string str() const;
  // repr(x): strings quoted as Python does.
  std::string repr() const;
  // The elements iteration gives: list items, dict keys, string characters (UTF-8 code points); undefined
  // gives none. Throws for other values.
  List iterate() const;

 private:
  Kind kind_ = Kind::Undefined;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0.0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const List> l_;
  std::shared_ptr<Dict> m_;
  std::shared_ptr<const Function> f_;
};

// ==, as Python compares (1 == 1.0, lists element-wise, dicts by entries).
bool equal(const Value& a, const Value& b);
// Python float repr: shortest text that reads back the same, with ".0" for integral values.
std::string float_repr(double d);
// json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys) with Python's separators; indent < 0
// is None.
std::string to_json(const Value& v, int indent, bool sort_keys);

}  // namespace tandem::chat
