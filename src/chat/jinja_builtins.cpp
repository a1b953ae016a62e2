#include "chat/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>

#include "core/error.h"

namespace tandem::chat {
namespace {

const Value* arg(const CallArgs& a, size_t i, const char* name) {
  if (i < a.positional.size()) return &a.positional[i];
  for (const auto& [k, v] : a.keyword)
    if (k == name) return &v;
  return nullptr;
}
Value arg_or(const CallArgs& a, size_t i, const char* name, Value dflt) {
  const Value* v = arg(a, i, name);
  return v ? *v : std::move(dflt);
}
const std::string& need_string(const Value& v, const char* what) {
  if (!v.is_string()) throw Error(std::string(what) + " needs a string, got " + v.type_name());
  return v.as_string();
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const auto drop = [&](char c) {
    return chars.is_string() ? chars.as_string().find(c) != std::string::npos : is_space(c);
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && drop(s[b])) ++b;
  if (right)
    while (e > b && drop(s[e - 1])) --e;
  return s.substr(b, e - b);
}

List split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (!sep.is_string()) {  // whitespace runs, no empty parts
    size_t i = 0;
    while (true) {
      while (i < s.size() && is_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        std::string rest = s.substr(i);
        while (!rest.empty() && is_space(rest.back())) rest.pop_back();
        out.emplace_back(rest);
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_space(s[j])) ++j;
      out.emplace_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& d = sep.as_string();
  if (d.empty()) throw Error("split: empty separator");
  size_t i = 0;
  while (true) {
    const size_t j = s.find(d, i);
    if (j == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) {
      out.emplace_back(s.substr(i));
      return out;
    }
    out.emplace_back(s.substr(i, j - i));
    i = j + d.size();
  }
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` between characters
    List chars = Value(s).iterate();
    int64_t n = 0;
    for (const auto& c : chars) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out += c.as_string();
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t i = 0;
  int64_t n = 0;
  while (true) {
    const size_t j = s.find(from, i);
    if (j == std::string::npos || (count >= 0 && n == count)) break;
    out += s.substr(i, j - i) + to;
    i = j + from.size();
    ++n;
  }
  return out + s.substr(i);
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s)
    if (upper && c >= 'a' && c <= 'z')
      c = char(c - 32);
    else if (!upper && c >= 'A' && c <= 'Z')
      c = char(c + 32);
  return s;
}

std::string title(const std::string& s) {
  std::string out = s;
  bool prev_alpha = false;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c));
    if (alpha) c = prev_alpha ? char(std::tolower(c)) : char(std::toupper(c));
    prev_alpha = alpha;
  }
  return out;
}

// Python's <, for sorting and comparisons: numbers, strings, lists.
bool less(const Value& a, const Value& b) {
  if ((a.is_number() || a.kind() == Value::Kind::Bool) && (b.is_number() || b.kind() == Value::Kind::Bool))
    return a.as_number() < b.as_number();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list()) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (less(x[i], y[i])) return true;
      if (less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  throw Error(std::string("'<' not supported between '") + a.type_name() + "' and '" + b.type_name() + "'");
}

Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t i = 0;
  while (true) {
    const size_t j = path.find('.', i);
    const std::string part = path.substr(i, j == std::string::npos ? std::string::npos : j - i);
    cur = py_index(cur, Value(part));
    if (j == std::string::npos) return cur;
    i = j + 1;
  }
}

CallArgs rest_args(const CallArgs& a, size_t from) {
  CallArgs r;
  for (size_t i = from; i < a.positional.size(); ++i) r.positional.push_back(a.positional[i]);
  r.keyword = a.keyword;
  return r;
}

const std::set<std::string>& filter_names() {
  static const std::set<std::string> names = {
      "trim",     "length", "count", "tojson",     "upper",      "lower",   "title",    "capitalize",
      "default",  "d",      "join",  "replace",    "items",      "first",   "last",     "string",
      "int",      "float",  "list",  "selectattr", "rejectattr", "select",  "reject",   "map",
      "dictsort", "unique", "abs",   "round",      "sort",       "reverse", "sum",      "min",
      "max",      "indent", "safe",  "wordcount",  "center",     "batch",   "striptags"};
  return names;
}
const std::set<std::string>& test_names() {
  static const std::set<std::string> names = {
      "defined", "undefined", "none",     "string",   "number",      "integer", "float", "boolean", "true",
      "false",   "mapping",   "iterable", "sequence", "callable",    "equalto", "eq",    "==",      "ne",
      "!=",      "lt",        "<",        "le",       "<=",          "gt",      ">",     "ge",      ">=",
      "in",      "sameas",    "odd",      "even",     "divisibleby", "lower",   "upper", "escaped"};
  return names;
}

}  // namespace

bool has_filter(const std::string& name) {
  return filter_names().count(name) > 0;
}
bool has_test(const std::string& name) {
  return test_names().count(name) > 0;
}

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return 0;
    case Value::Kind::String:
      return int64_t(v.iterate().size());
    case Value::Kind::List:
      return int64_t(v.as_list().size());
    case Value::Kind::Dict:
      return int64_t(v.as_dict().size());
    default:
      throw Error(std::string("object of type '") + v.type_name() + "' has no len()");
  }
}

Value py_slice(const Value& v, const Value& start, const Value& stop, const Value& step) {
  if (v.is_undefined()) throw Error("cannot slice an undefined value");
  if (!v.is_list() && !v.is_string())
    throw Error(std::string("'") + v.type_name() + "' object is not sliceable");
  const List items = v.is_list() ? v.as_list() : v.iterate();
  const int64_t n = int64_t(items.size());
  const int64_t st = step.is_number() ? step.as_int() : 1;
  if (st == 0) throw Error("slice step cannot be zero");
  const auto norm = [&](const Value& x, int64_t dflt) {
    if (!(x.kind() == Value::Kind::Int)) return dflt;
    int64_t i = x.as_int();
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = norm(start, st > 0 ? 0 : n - 1), e = norm(stop, st > 0 ? n : -1);
  List out;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) out.push_back(items[size_t(i)]);
  if (v.is_list()) return Value(std::move(out));
  std::string s;
  for (const auto& c : out) s += c.as_string();
  return Value(std::move(s));
}

Value py_index(const Value& v, const Value& key) {
  if (v.is_undefined()) throw Error("cannot index an undefined value with " + key.repr());
  if (v.is_mapping()) {
    if (key.is_string()) {
      for (const auto& [k, x] : v.as_dict())
        if (k == key.as_string()) return x;
      return method(v, key.as_string());
    }
    return {};
  }
  if ((v.is_list() || v.is_string()) && key.kind() == Value::Kind::Int) {
    const List items = v.is_list() ? v.as_list() : v.iterate();
    int64_t i = key.as_int();
    if (i < 0) i += int64_t(items.size());
    if (i < 0 || i >= int64_t(items.size())) return {};
    return items[size_t(i)];
  }
  if (key.is_string()) return method(v, key.as_string());
  return {};
}

Value method(const Value& obj, const std::string& name) {
  if (obj.is_string()) {
    const std::string s = obj.as_string();
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return Value::function([s, name](const CallArgs& a) {
        return Value(strip(s, arg_or(a, 0, "chars", Value()), name != "rstrip", name != "lstrip"));
      });
    if (name == "split" || name == "rsplit")
      return Value::function([s, name](const CallArgs& a) {
        const Value maxsplit = arg_or(a, 1, "maxsplit", Value(int64_t(-1)));
        if (name == "rsplit" && maxsplit.as_int() >= 0) throw Error("rsplit with maxsplit is not supported");
        return Value(split(s, arg_or(a, 0, "sep", Value()), maxsplit.as_int()));
      });
    if (name == "upper" || name == "lower")
      return Value::function([s, name](const CallArgs&) { return Value(ascii_case(s, name == "upper")); });
    if (name == "title") return Value::function([s](const CallArgs&) { return Value(title(s)); });
    if (name == "capitalize")
      return Value::function([s](const CallArgs&) {
        std::string r = ascii_case(s, false);
        if (!r.empty()) r[0] = char(std::toupper(static_cast<unsigned char>(r[0])));
        return Value(r);
      });
    if (name == "startswith" || name == "endswith")
      return Value::function([s, name](const CallArgs& a) {
        const Value p = arg_or(a, 0, "prefix", Value());
        List options = p.is_list() ? p.as_list() : List{p};
        for (const auto& o : options) {
          const std::string& x = need_string(o, name.c_str());
          if (x.size() <= s.size() &&
              (name == "startswith" ? s.compare(0, x.size(), x) == 0
                                    : s.compare(s.size() - x.size(), x.size(), x) == 0))
            return Value(true);
        }
        return Value(false);
      });
    if (name == "replace")
      return Value::function([s](const CallArgs& a) {
        return Value(replace_all(s, need_string(arg_or(a, 0, "old", Value()), "replace"),
                                 need_string(arg_or(a, 1, "new", Value()), "replace"),
                                 arg_or(a, 2, "count", Value(int64_t(-1))).as_int()));
      });
    if (name == "find")
      return Value::function([s](const CallArgs& a) {
        const size_t i = s.find(need_string(arg_or(a, 0, "sub", Value()), "find"));
        return Value(i == std::string::npos ? int64_t(-1) : int64_t(Value(s.substr(0, i)).iterate().size()));
      });
    if (name == "count")
      return Value::function([s](const CallArgs& a) {
        const std::string sub = need_string(arg_or(a, 0, "sub", Value()), "count");
        int64_t n = 0;
        for (size_t i = s.find(sub); !sub.empty() && i != std::string::npos; i = s.find(sub, i + sub.size()))
          ++n;
        return Value(n);
      });
    if (name == "join")
      return Value::function([s](const CallArgs& a) {
        std::string out;
        const List items = arg_or(a, 0, "iterable", Value()).iterate();
        for (size_t i = 0; i < items.size(); ++i) out += (i ? s : "") + need_string(items[i], "join");
        return Value(out);
      });
    if (name == "format")  // "{}" and "{0}" fields only
      return Value::function([s](const CallArgs& a) {
        std::string out;
        size_t next = 0;
        for (size_t i = 0; i < s.size(); ++i) {
          if (s.compare(i, 2, "{{") == 0 || s.compare(i, 2, "}}") == 0) {
            out += s[i++];
            continue;
          }
          if (s[i] != '{') {
            out += s[i];
            continue;
          }
          const size_t close = s.find('}', i);
          if (close == std::string::npos) throw Error("format: single '{' in the format string");
          const std::string field = s.substr(i + 1, close - i - 1);
          size_t index = next++;
          if (!field.empty()) {
            if (field.find_first_not_of("0123456789") != std::string::npos)
              throw Error("format: only {} and {N} fields are supported, got {" + field + "}");
            index = size_t(std::stoul(field));
          }
          if (index >= a.positional.size())
            throw Error("format: replacement index " + std::to_string(index) + " out of range");
          out += a.positional[index].str();
          i = close;
        }
        return Value(out);
      });
    if (name == "splitlines")
      return Value::function([s](const CallArgs&) {
        List out;
        size_t i = 0;
        while (i < s.size()) {
          size_t j = s.find('\n', i);
          if (j == std::string::npos) j = s.size();
          std::string line = s.substr(i, j - i);
          if (!line.empty() && line.back() == '\r') line.pop_back();
          out.emplace_back(line);
          i = j + 1;
        }
        return Value(out);
      });
    if (name == "isdigit" || name == "isalpha" || name == "isspace")
      return Value::function([s, name](const CallArgs&) {
        if (s.empty()) return Value(false);
        for (unsigned char c : s) {
          const bool ok = name == "isdigit"   ? std::isdigit(c)
                          : name == "isalpha" ? std::isalpha(c)
                                              : is_space(char(c));
          if (!ok) return Value(false);
        }
        return Value(true);
      });
    return {};
  }
  if (obj.kind() == Value::Kind::Dict) {
    if (name == "items")
      return Value::function([obj](const CallArgs&) {
        List out;
        for (const auto& [k, v] : obj.as_dict()) out.emplace_back(List{Value(k), v});
        return Value(out);
      });
    if (name == "keys") return Value::function([obj](const CallArgs&) { return Value(obj.iterate()); });
    if (name == "values")
      return Value::function([obj](const CallArgs&) {
        List out;
        for (const auto& kv : obj.as_dict()) out.push_back(kv.second);
        return Value(out);
      });
    if (name == "get")
      return Value::function([obj](const CallArgs& a) {
        const Value key = arg_or(a, 0, "key", Value());
        const Value v = key.is_string() ? obj.get(key.as_string()) : Value();
        return v.is_undefined() ? arg_or(a, 1, "default", Value::none()) : v;
      });
  }
  return {};
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& a) {
  using K = Value::Kind;
  const auto other = [&]() -> const Value& {
    const Value* o = arg(a, 0, "other");
    if (!o) throw Error("test '" + name + "' needs an argument");
    return *o;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number() || v.kind() == K::Bool;
  if (name == "integer") return v.kind() == K::Int;
  if (name == "float") return v.kind() == K::Float;
  if (name == "boolean") return v.kind() == K::Bool;
  if (name == "true") return v.kind() == K::Bool && v.as_bool();
  if (name == "false") return v.kind() == K::Bool && !v.as_bool();
  if (name == "mapping") return v.kind() == K::Dict;
  if (name == "iterable" || name == "sequence")
    return v.is_string() || v.is_list() || v.kind() == K::Dict || v.is_undefined();
  if (name == "callable") return v.kind() == K::Function;
  if (name == "equalto" || name == "eq" || name == "==") return equal(v, other());
  if (name == "ne" || name == "!=") return !equal(v, other());
  if (name == "lt" || name == "<") return less(v, other());
  if (name == "gt" || name == ">") return less(other(), v);
  if (name == "le" || name == "<=") return !less(other(), v);
  if (name == "ge" || name == ">=") return !less(v, other());
  if (name == "in") {
    const Value& c = other();
    if (c.is_string()) return v.is_string() && c.as_string().find(v.as_string()) != std::string::npos;
    for (const auto& x : c.iterate())
      if (equal(x, v)) return true;
    return false;
  }
  if (name == "sameas") {
    const Value& o = other();
    if (v.kind() != o.kind()) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.kind() == K::Bool) return v.as_bool() == o.as_bool();
    return equal(v, o) && (v.kind() == K::Int || v.is_string());
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind() != K::Int) throw Error("test '" + name + "' needs an integer, got " + v.type_name());
    if (name == "odd") return v.as_int() % 2 != 0;
    if (name == "even") return v.as_int() % 2 == 0;
    const int64_t d = other().as_int();
    if (d == 0) throw Error("divisibleby 0");
    return v.as_int() % d == 0;
  }
  if (name == "lower" || name == "upper") {
    const std::string& s = need_string(v, name.c_str());
    return ascii_case(s, name == "upper") == s;
  }
  if (name == "escaped") return false;
  throw Error("unsupported test '" + name + "'");
}

Value apply_filter(const std::string& name, const Value& v, const CallArgs& a, const Callbacks& cb) {
  using K = Value::Kind;
  if (name == "trim") {
    return Value(strip(v.str(), arg_or(a, 0, "chars", Value()), true, true));
  }
  if (name == "length" || name == "count") return Value(py_len(v));
  if (name == "tojson") {
    const Value indent = arg_or(a, 0, "indent", Value::none());
    const Value sort_keys = arg_or(a, 3, "sort_keys", Value(false));
    if (const Value* sep = arg(a, 2, "separators"); sep && !sep->is_none())
      throw Error("tojson: separators are not supported");
    return Value(to_json(v, indent.kind() == K::Int ? int(indent.as_int()) : -1, sort_keys.truthy()));
  }
  if (name == "upper" || name == "lower") return Value(ascii_case(v.str(), name == "upper"));
  if (name == "title") return Value(title(v.str()));
  if (name == "capitalize") {
    std::string r = ascii_case(v.str(), false);
    if (!r.empty()) r[0] = char(std::toupper(static_cast<unsigned char>(r[0])));
    return Value(r);
  }
  if (name == "default" || name == "d") {
    const bool boolean = arg_or(a, 1, "boolean", Value(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return arg_or(a, 0, "default_value", Value(""));
    return v;
  }
  if (name == "join") {
    const std::string sep = arg_or(a, 0, "d", Value("")).str();
    const Value attr = arg_or(a, 1, "attribute", Value());
    std::string out;
    const List items = v.iterate();
    for (size_t i = 0; i < items.size(); ++i)
      out += (i ? sep : "") + (attr.is_undefined() ? items[i] : attribute_path(items[i], attr.str())).str();
    return Value(out);
  }
  if (name == "replace") {
    return Value(replace_all(v.str(), arg_or(a, 0, "old", Value()).str(), arg_or(a, 1, "new", Value()).str(),
                             arg_or(a, 2, "count", Value(int64_t(-1))).as_int()));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value(List{});
    if (v.kind() != K::Dict) throw Error(std::string("items: needs a mapping, got ") + v.type_name());
    return method(v, "items").as_function()({});
  }
  if (name == "first" || name == "last") {
    const List items = v.iterate();
    if (items.empty()) return {};
    return name == "first" ? items.front() : items.back();
  }
  if (name == "string") return v.is_string() ? v : Value(v.str());
  if (name == "int") {
    if (v.kind() == K::Int) return v;
    if (v.kind() == K::Float) return Value(int64_t(v.as_number()));
    if (v.kind() == K::Bool) return Value(int64_t(v.as_bool()));
    if (v.is_string()) {
      char* end = nullptr;
      const std::string s = strip(v.as_string(), Value(), true, true);
      const long long i = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && *end == '\0') return Value(int64_t(i));
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == '\0') return Value(int64_t(d));
    }
    return arg_or(a, 0, "default", Value(int64_t(0)));
  }
  if (name == "float") {
    if (v.is_number() || v.kind() == K::Bool) return Value(v.as_number());
    if (v.is_string()) {
      char* end = nullptr;
      const std::string s = strip(v.as_string(), Value(), true, true);
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == '\0') return Value(d);
    }
    return arg_or(a, 0, "default", Value(0.0));
  }
  if (name == "list") return Value(v.iterate());
  if ((name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject" ||
       name == "map") &&
      !v.truthy())
    return Value(List{});  // jinja2 yields nothing for a none or empty input
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep = name == "selectattr" || name == "select";
    const std::string attr = by_attr ? arg_or(a, 0, "attribute", Value()).str() : "";
    const size_t ti = by_attr ? 1 : 0;
    const Value test = arg_or(a, ti, "test", Value());
    const CallArgs targs = rest_args(a, ti + 1);
    List out;
    for (const auto& item : v.iterate()) {
      const Value x = by_attr ? attribute_path(item, attr) : item;
      const bool pass = test.is_undefined() ? x.truthy() : cb.test(test.str(), x, targs);
      if (pass == keep) out.push_back(item);
    }
    return Value(out);
  }
  if (name == "map") {
    List out;
    const Value* attr = arg(a, 99, "attribute");
    if (attr) {
      const Value dflt = arg_or(a, 99, "default", Value());
      for (const auto& item : v.iterate()) {
        Value x = attribute_path(item, attr->str());
        out.push_back(x.is_undefined() ? dflt : x);
      }
      return Value(out);
    }
    const Value f = arg_or(a, 0, "filter", Value());
    if (!f.is_string()) throw Error("map: needs a filter name or attribute=");
    const CallArgs fargs = rest_args(a, 1);
    for (const auto& item : v.iterate()) out.push_back(cb.filter(f.as_string(), item, fargs));
    return Value(out);
  }
  if (name == "dictsort") {
    if (v.kind() != K::Dict) throw Error(std::string("dictsort: needs a mapping, got ") + v.type_name());
    const bool by_value = arg_or(a, 1, "by", Value("key")).str() == "value";
    const bool reverse = arg_or(a, 2, "reverse", Value(false)).truthy();
    const bool case_sensitive = arg_or(a, 0, "case_sensitive", Value(false)).truthy();
    List out;
    for (const auto& [k, x] : v.as_dict()) out.emplace_back(List{Value(k), x});
    const auto key = [&](const Value& pair) {
      Value k = pair.as_list()[by_value ? 1 : 0];
      if (!case_sensitive && k.is_string()) k = Value(ascii_case(k.as_string(), false));
      return k;
    };
    std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
      return reverse ? less(key(y), key(x)) : less(key(x), key(y));
    });
    return Value(out);
  }
  if (name == "unique") {
    List out;
    for (const auto& x : v.iterate())
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
    return Value(out);
  }
  if (name == "abs") {
    if (v.kind() == K::Int) return Value(int64_t(std::llabs(v.as_int())));
    return Value(std::fabs(v.as_number()));
  }
  if (name == "round") {
    const int64_t precision = arg_or(a, 0, "precision", Value(int64_t(0))).as_int();
    const double p = std::pow(10.0, double(precision));
    return Value(std::nearbyint(v.as_number() * p) / p);
  }
  if (name == "sort" || name == "reverse") {
    List items = v.iterate();
    if (name == "reverse") {
      if (v.is_string()) {
        std::string s;
        for (auto it = items.rbegin(); it != items.rend(); ++it) s += it->as_string();
        return Value(s);
      }
      std::reverse(items.begin(), items.end());
      return Value(items);
    }
    const bool reverse = arg_or(a, 0, "reverse", Value(false)).truthy();
    const Value attr = arg_or(a, 2, "attribute", Value());
    const auto key = [&](const Value& x) { return attr.is_undefined() ? x : attribute_path(x, attr.str()); };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return reverse ? less(key(y), key(x)) : less(key(x), key(y));
    });
    return Value(items);
  }
  if (name == "sum") {
    Value total = arg_or(a, 1, "start", Value(int64_t(0)));
    for (const auto& x : v.iterate()) {
      if (total.kind() == K::Int && x.kind() == K::Int)
        total = Value(total.as_int() + x.as_int());
      else
        total = Value(total.as_number() + x.as_number());
    }
    return total;
  }
  if (name == "min" || name == "max") {
    const List items = v.iterate();
    if (items.empty()) return {};
    Value best = items[0];
    for (const auto& x : items)
      if (name == "min" ? less(x, best) : less(best, x)) best = x;
    return best;
  }
  if (name == "indent") {
    const Value w = arg_or(a, 0, "width", Value(int64_t(4)));
    const std::string pad = w.is_string() ? w.as_string() : std::string(size_t(w.as_int()), ' ');
    const bool first = arg_or(a, 1, "first", Value(false)).truthy();
    const bool blank = arg_or(a, 2, "blank", Value(false)).truthy();
    const List lines = split(v.str(), Value("\n"), -1);
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& line = lines[i].as_string();
      if (i) out += '\n';
      if ((i > 0 || first) && (blank || !line.empty())) out += pad;
      out += line;
    }
    return Value(out);
  }
  if (name == "safe") return v;
  if (name == "wordcount") return Value(int64_t(split(v.str(), Value(), -1).size()));
  if (name == "center") {
    const std::string s = v.str();
    const int64_t width = arg_or(a, 0, "width", Value(int64_t(80))).as_int();
    const int64_t n = int64_t(Value(s).iterate().size());
    if (n >= width) return Value(s);
    const int64_t left = (width - n) / 2 + ((width - n) % 2 && width % 2 ? 1 : 0);
    return Value(std::string(size_t(left), ' ') + s + std::string(size_t(width - n - left), ' '));
  }
  if (name == "batch") {
    const int64_t n = arg_or(a, 0, "linecount", Value(int64_t(1))).as_int();
    if (n <= 0) throw Error("batch: linecount must be positive");
    List out, cur;
    for (const auto& x : v.iterate()) {
      cur.push_back(x);
      if (int64_t(cur.size()) == n) {
        out.emplace_back(cur);
        cur.clear();
      }
    }
    if (!cur.empty()) out.emplace_back(cur);
    return Value(out);
  }
  if (name == "striptags") {
    std::string s = v.str(), out;
    bool in_tag = false;
    for (char c : s) {
      if (c == '<')
        in_tag = true;
      else if (c == '>' && in_tag)
        in_tag = false;
      else if (!in_tag)
        out += c;
    }
    return Value(strip(out, Value(), true, true));
  }
  throw Error("unsupported filter '" + name + "'");
}

Dict global_functions() {
  Dict g;
  g.emplace_back("range", Value::function([](const CallArgs& a) {
                   int64_t start = 0, stop = 0, step = 1;
                   for (const auto& x : a.positional)
                     if (x.kind() != Value::Kind::Int) throw Error("range: arguments must be integers");
                   if (a.positional.size() == 1)
                     stop = a.positional[0].as_int();
                   else if (a.positional.size() >= 2) {
                     start = a.positional[0].as_int();
                     stop = a.positional[1].as_int();
                     if (a.positional.size() >= 3) step = a.positional[2].as_int();
                   } else {
                     throw Error("range: expected 1 to 3 arguments");
                   }
                   if (step == 0) throw Error("range: step must not be zero");
                   List out;
                   for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
                     out.emplace_back(i);
                     if (out.size() > 10'000'000) throw Error("range: too many items");
                   }
                   return Value(out);
                 }));
  g.emplace_back("namespace", Value::function([](const CallArgs& a) {
                   Dict d;
                   for (const auto& x : a.positional)
                     if (x.kind() == Value::Kind::Dict)
                       for (const auto& kv : x.as_dict()) d.push_back(kv);
                   for (const auto& kv : a.keyword) d.push_back(kv);
                   return Value::make_namespace(std::move(d));
                 }));
  g.emplace_back("dict", Value::function([](const CallArgs& a) {
                   Dict d;
                   for (const auto& kv : a.keyword) d.push_back(kv);
                   return Value(std::move(d));
                 }));
  g.emplace_back(
      "raise_exception", Value::function([](const CallArgs& a) -> Value {
        throw Error("raise_exception: " + (a.positional.empty() ? std::string() : a.positional[0].str()));
      }));
  g.emplace_back("strftime_now", Value::function([](const CallArgs& a) {
                   const std::string fmt = arg_or(a, 0, "format", Value("%Y-%m-%d")).str();
                   const std::time_t now = std::time(nullptr);
                   std::tm tm{};
                   localtime_r(&now, &tm);
                   char buf[256];
                   const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
                   return Value(std::string(buf, n));
                 }));
  return g;
}

}  // namespace tandem::chat
