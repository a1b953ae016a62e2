#include "chat/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace tandem::chat {

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}
Value::Value(bool b) : kind_(Kind::Bool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::Int), i_(i) {}
Value::Value(double d) : kind_(Kind::Float), d_(d) {}
Value::Value(std::string s) : kind_(Kind::String), s_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(List l) : kind_(Kind::List), l_(std::make_shared<const List>(std::move(l))) {}
Value::Value(Dict d) : kind_(Kind::Dict), m_(std::make_shared<Dict>(std::move(d))) {}
Value Value::make_namespace(Dict d) {
  Value v(std::move(d));
  v.kind_ = Kind::Namespace;
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.kind_ = Kind::Function;
  v.f_ = std::make_shared<const Function>(std::move(f));
  return v;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return b_;
    case Kind::Int:
      return i_ != 0;
    case Kind::Float:
      return d_ != 0.0;
    case Kind::String:
      return !s_->empty();
    case Kind::List:
      return !l_->empty();
    case Kind::Dict:
      return !m_->empty();
    case Kind::Namespace:
    case Kind::Function:
      return true;
  }
  return false;
}

Value Value::get(const std::string& key) const {
  if (!is_mapping()) return {};
  for (const auto& [k, v] : *m_)
    if (k == key) return v;
  return {};
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return "list";
    case Kind::Dict:
      return "dict";
    case Kind::Namespace:
      return "Namespace";
    case Kind::Function:
      return "function";
  }
  return "?";
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;
  // Python writes 1e+16 as 1e+16 and 100.0 as 100.0: add ".0" when the text is an integer.
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  if (auto e = s.find('e'); e != std::string::npos) {  // Python: 1e-05, %g gives 1e-05 too; keep
  }
  return s;
}

static std::string py_quote(const std::string& s) {
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = use_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c == char(q))
      out += std::string("\\") + char(q);
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else
      out += char(c);
  }
  return out + q;
}

std::string Value::repr() const {
  if (kind_ == Kind::String) return py_quote(*s_);
  return str();
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return b_ ? "True" : "False";
    case Kind::Int:
      return std::to_string(i_);
    case Kind::Float:
      return float_repr(d_);
    case Kind::String:
      return *s_;
    case Kind::List: {
      std::string out = "[";
      for (size_t i = 0; i < l_->size(); ++i) out += (i ? ", " : "") + (*l_)[i].repr();
      return out + "]";
    }
    case Kind::Dict: {
      std::string out = "{";
      for (size_t i = 0; i < m_->size(); ++i)
        out += (i ? ", " : "") + py_quote((*m_)[i].first) + ": " + (*m_)[i].second.repr();
      return out + "}";
    }
    case Kind::Namespace:
      return "<Namespace>";
    case Kind::Function:
      return "<function>";
  }
  return "";
}

List Value::iterate() const {
  switch (kind_) {
    case Kind::Undefined:
      return {};
    case Kind::List:
      return *l_;
    case Kind::Dict: {
      List keys;
      for (const auto& kv : *m_) keys.emplace_back(kv.first);
      return keys;
    }
    case Kind::String: {
      List chars;
      const std::string& s = *s_;
      for (size_t i = 0; i < s.size();) {
        size_t n = 1;
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (c >= 0xF0)
          n = 4;
        else if (c >= 0xE0)
          n = 3;
        else if (c >= 0xC0)
          n = 2;
        n = std::min(n, s.size() - i);
        chars.emplace_back(s.substr(i, n));
        i += n;
      }
      return chars;
    }
    default:
      throw Error(std::string("'") + type_name() + "' object is not iterable");
  }
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  const bool an = a.is_number() || a.kind() == K::Bool, bn = b.is_number() || b.kind() == K::Bool;
  if (an && bn) {
    if (a.kind() != K::Float && b.kind() != K::Float) return a.as_number() == b.as_number();
    return a.as_number() == b.as_number();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None:
      return true;
    case K::String:
      return a.as_string() == b.as_string();
    case K::List: {
      const List &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equal(x[i], y[i])) return false;
      return true;
    }
    case K::Dict: {
      const Dict &x = a.as_dict(), &y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x)
        if (!equal(v, b.get(k))) return false;
      return true;
    }
    default:
      return &a.as_dict() == &b.as_dict();
  }
}

static void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

static void json_write(const Value& v, int indent, bool sort_keys, int depth, std::string& out) {
  using K = Value::Kind;
  const auto newline = [&](int d) {
    out += '\n';
    out.append(size_t(indent) * size_t(d), ' ');
  };
  switch (v.kind()) {
    case K::Undefined:
    case K::None:
      out += "null";
      return;
    case K::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case K::Int:
      out += std::to_string(v.as_int());
      return;
    case K::Float: {
      const double d = v.as_number();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_repr(d);
      return;
    }
    case K::String:
      json_string(v.as_string(), out);
      return;
    case K::List: {
      const List& l = v.as_list();
      if (l.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(depth + 1);
        json_write(l[i], indent, sort_keys, depth + 1, out);
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case K::Dict:
    case K::Namespace: {
      Dict d = v.as_dict();
      if (d.empty()) {
        out += "{}";
        return;
      }
      if (sort_keys)
        std::stable_sort(d.begin(), d.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      out += '{';
      for (size_t i = 0; i < d.size(); ++i) {
        if (i) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(depth + 1);
        json_string(d[i].first, out);
        out += ": ";
        json_write(d[i].second, indent, sort_keys, depth + 1, out);
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
    case K::Function:
      throw Error("tojson: a function is not JSON serializable");
  }
}

std::string to_json(const Value& v, int indent, bool sort_keys) {
  std::string out;
  json_write(v, indent, sort_keys, 0, out);
  return out;
}

}  // namespace tandem::chat
