#include "chat/jinja_eval.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "chat/jinja_builtins.h"
#include "core/error.h"

namespace tandem::chat {
namespace {

std::string at(Pos p) {
  return "chat template line " + std::to_string(p.line) + " col " + std::to_string(p.col) + ": ";
}

// Errors from builtins carry no position; the innermost expression or statement adds it once.
struct Located : Error {
  explicit Located(const std::string& m) : Error(m) {}
};

struct Frame {
  std::unordered_map<std::string, Value> vars;
  Frame* parent = nullptr;
};

enum class Flow { Normal, Break, Continue };

// Limits of one render. A template is untrusted input (it comes from the GGUF or --chat-template): one that
// loops for hours, doubles a string or list until memory runs out, or overflows an integer must stop with an
// Error instead (tests: Jinja.RunawayTemplatesAreErrorsNotHangs, fuzz/fuzz_chat_template).
// Steps (statements, loop iterations and expressions evaluated): a base, and more for every message, since
// real templates spend thousands of steps on each (Gemma 4's template needed more than 10^7 for 2000
// messages; the test renders 2000 through the real templates).
constexpr int64_t kBaseSteps = 1'000'000;
constexpr int64_t kStepsPerMessage = 50'000;
constexpr size_t kMaxStringBytes = 64u << 20;  // any string the template builds, the output included
constexpr size_t kMaxListItems = 1'000'000;    // any list it builds by concatenation

void check_string_size(size_t bytes) {
  if (bytes > kMaxStringBytes)
    throw Error("the chat template builds a string of more than " + std::to_string(kMaxStringBytes >> 20) +
                " MiB");
}

// Integer arithmetic as Python does it, except that a result outside int64 is an error (Python would grow
// the integer; C++ would be undefined behaviour).
int64_t checked_add(int64_t a, int64_t b, const std::string& op) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw Error("integer overflow in '" + op + "'");
  return r;
}
int64_t checked_sub(int64_t a, int64_t b, const std::string& op) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) throw Error("integer overflow in '" + op + "'");
  return r;
}
int64_t checked_mul(int64_t a, int64_t b, const std::string& op) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw Error("integer overflow in '" + op + "'");
  return r;
}

class Evaluator {
 public:
  Evaluator(Frame& root, int64_t max_steps) : root_(root), max_steps_(max_steps) {
    cb_.filter = [this](const std::string& f, const Value& v, const CallArgs& a) { return filter(f, v, a); };
    cb_.test = [](const std::string& t, const Value& v, const CallArgs& a) { return apply_test(t, v, a); };
  }

  Flow exec(const Body& body, Frame& f, std::string& out) {
    for (const auto& s : body) {
      const Flow flow = exec_one(*s, f, out);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

 private:
  Value filter(const std::string& name, const Value& v, const CallArgs& a) {
    if (!has_filter(name)) throw Error("unsupported filter '" + name + "'");
    return apply_filter(name, v, a, cb_);
  }

  void tick() {
    if (++steps_ > max_steps_)
      throw Error("the chat template runs too long (more than " + std::to_string(max_steps_) + " steps)");
  }

  Flow exec_one(const Stmt& s, Frame& f, std::string& out) {
    try {
      tick();
      const Flow flow = exec_stmt(s, f, out);
      check_string_size(out.size());
      return flow;
    } catch (const Located&) {
      throw;
    } catch (const Error& e) {
      throw Located(at(s.pos) + e.what());
    }
  }

  Flow exec_stmt(const Stmt& s, Frame& f, std::string& out) {
    switch (s.type) {
      case Stmt::Type::Text:
        out += s.text;
        return Flow::Normal;
      case Stmt::Type::Output:
        out += eval(*s.expr, f).str();
        return Flow::Normal;
      case Stmt::Type::If:
        for (size_t i = 0; i < s.conds.size(); ++i)
          if (eval(*s.conds[i], f).truthy()) return exec(s.bodies[i], f, out);
        return exec(s.else_body, f, out);
      case Stmt::Type::For:
        return exec_for(s, f, out);
      case Stmt::Type::Set: {
        Value v = eval(*s.expr, f);
        if (!s.attr.empty()) {
          Value ns = lookup(s.text, f);
          if (ns.kind() != Value::Kind::Namespace)
            throw Error("cannot set attribute '" + s.attr + "' of '" + s.text + "': not a namespace()");
          Dict& d = ns.namespace_dict();
          for (auto& kv : d)
            if (kv.first == s.attr) {
              kv.second = std::move(v);
              return Flow::Normal;
            }
          d.emplace_back(s.attr, std::move(v));
          return Flow::Normal;
        }
        if (s.targets.size() == 1) {
          f.vars[s.targets[0]] = std::move(v);
        } else {
          const List items = v.iterate();
          if (items.size() != s.targets.size())
            throw Error("set: cannot unpack " + std::to_string(items.size()) + " values into " +
                        std::to_string(s.targets.size()) + " names");
          for (size_t i = 0; i < items.size(); ++i) f.vars[s.targets[i]] = items[i];
        }
        return Flow::Normal;
      }
      case Stmt::Type::SetBlock: {
        std::string body;
        Frame inner{{}, &f};
        exec(s.bodies[0], inner, body);
        f.vars[s.text] = Value(body);
        return Flow::Normal;
      }
      case Stmt::Type::Macro: {
        const Stmt* macro = &s;
        f.vars[s.text] = Value::function([this, macro](const CallArgs& a) { return call_macro(*macro, a); });
        return Flow::Normal;
      }
      case Stmt::Type::Break:
        return Flow::Break;
      case Stmt::Type::Continue:
        return Flow::Continue;
      case Stmt::Type::Block:
        return exec(s.bodies[0], f, out);
    }
    return Flow::Normal;
  }

  Value call_macro(const Stmt& m, const CallArgs& a) {
    if (a.positional.size() > m.targets.size())
      throw Error("macro '" + m.text + "' takes " + std::to_string(m.targets.size()) + " arguments, got " +
                  std::to_string(a.positional.size()));
    if (++depth_ > 200) {
      --depth_;
      throw Error("macro '" + m.text + "': recursion too deep");
    }
    Frame frame{{}, &root_};
    for (size_t i = 0; i < m.targets.size(); ++i) {
      Value v;
      if (i < a.positional.size())
        v = a.positional[i];
      else if (m.defaults[i])
        v = eval(*m.defaults[i], frame);
      frame.vars[m.targets[i]] = v;
    }
    for (const auto& [k, v] : a.keyword) {
      bool known = false;
      for (const auto& t : m.targets) known = known || t == k;
      if (!known) {
        --depth_;
        throw Error("macro '" + m.text + "' has no parameter '" + k + "'");
      }
      frame.vars[k] = v;
    }
    std::string out;
    try {
      exec(m.bodies[0], frame, out);
    } catch (...) {
      --depth_;
      throw;
    }
    --depth_;
    return Value(out);
  }

  Flow exec_for(const Stmt& s, Frame& f, std::string& out) {
    const Value seq = eval(*s.expr, f);
    if (!seq.is_undefined() && !seq.is_list() && !seq.is_string() && seq.kind() != Value::Kind::Dict)
      throw Error(std::string("'") + seq.type_name() + "' object is not iterable");
    List items = seq.iterate();
    const auto bind = [&](Frame& fr, const Value& item) {
      if (s.targets.size() == 1) {
        fr.vars[s.targets[0]] = item;
        return;
      }
      const List parts = item.iterate();
      if (parts.size() != s.targets.size())
        throw Error("for: cannot unpack " + std::to_string(parts.size()) + " values into " +
                    std::to_string(s.targets.size()) + " names");
      for (size_t i = 0; i < parts.size(); ++i) fr.vars[s.targets[i]] = parts[i];
    };
    if (s.filter) {
      List kept;
      for (const auto& item : items) {
        Frame probe{{}, &f};
        bind(probe, item);
        if (eval(*s.filter, probe).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(s.else_body, f, out);
    const int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; ++i) {
      tick();  // an empty body still takes a step per iteration
      Frame iter{{}, &f};
      bind(iter, items[size_t(i)]);
      Dict loop;
      loop.emplace_back("index", Value(i + 1));
      loop.emplace_back("index0", Value(i));
      loop.emplace_back("revindex", Value(n - i));
      loop.emplace_back("revindex0", Value(n - i - 1));
      loop.emplace_back("first", Value(i == 0));
      loop.emplace_back("last", Value(i == n - 1));
      loop.emplace_back("length", Value(n));
      loop.emplace_back("depth", Value(int64_t(1)));
      loop.emplace_back("depth0", Value(int64_t(0)));
      loop.emplace_back("previtem", i > 0 ? items[size_t(i - 1)] : Value());
      loop.emplace_back("nextitem", i + 1 < n ? items[size_t(i + 1)] : Value());
      loop.emplace_back("cycle", Value::function([i](const CallArgs& a) {
                          if (a.positional.empty()) throw Error("loop.cycle needs arguments");
                          return a.positional[size_t(i) % a.positional.size()];
                        }));
      iter.vars["loop"] = Value(std::move(loop));
      if (exec(s.bodies[0], iter, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value lookup(const std::string& name, const Frame& f) const {
    for (const Frame* fr = &f; fr; fr = fr->parent) {
      auto it = fr->vars.find(name);
      if (it != fr->vars.end()) return it->second;
    }
    return {};
  }

  Value eval(const Expr& e, Frame& f) {
    try {
      tick();
      return eval_expr(e, f);
    } catch (const Located&) {
      throw;
    } catch (const Error& err) {
      throw Located(at(e.pos) + err.what());
    }
  }

  CallArgs eval_args(const Expr& e, Frame& f, size_t from) {
    CallArgs a;
    for (size_t i = from; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i], f));
    for (const auto& [k, x] : e.kwargs) a.keyword.emplace_back(k, eval(*x, f));
    return a;
  }

  Value eval_expr(const Expr& e, Frame& f) {
    using T = Expr::Type;
    switch (e.type) {
      case T::Literal:
        return e.value;
      case T::Name:
        return lookup(e.name, f);
      case T::List:
      case T::Tuple: {
        List l;
        for (const auto& x : e.args) l.push_back(eval(*x, f));
        return Value(std::move(l));
      }
      case T::Dict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i], f);
          if (!k.is_string())
            throw Error("dict keys must be strings here, got " + std::string(k.type_name()));
          Value v = eval(*e.args[i + 1], f);
          bool replaced = false;
          for (auto& kv : d)
            if (kv.first == k.as_string()) {
              kv.second = v;
              replaced = true;
            }
          if (!replaced) d.emplace_back(k.as_string(), std::move(v));
        }
        return Value(std::move(d));
      }
      case T::Attr: {
        const Value obj = eval(*e.args[0], f);
        if (obj.is_undefined())
          throw Error("'" + describe(*e.args[0]) + "' is undefined (reading ." + e.name + ")");
        if (obj.kind() == Value::Kind::Dict) {
          Value m = method(obj, e.name);
          if (!m.is_undefined()) return m;
          return obj.get(e.name);
        }
        if (obj.kind() == Value::Kind::Namespace) return obj.get(e.name);
        return method(obj, e.name);
      }
      case T::Index: {
        const Value obj = eval(*e.args[0], f);
        if (obj.is_undefined()) throw Error("'" + describe(*e.args[0]) + "' is undefined (subscripted)");
        return py_index(obj, eval(*e.args[1], f));
      }
      case T::Slice: {
        const Value obj = eval(*e.args[0], f);
        Value parts[3];
        for (int i = 0; i < 3; ++i)
          if (e.args[size_t(i) + 1]) parts[i] = eval(*e.args[size_t(i) + 1], f);
        return py_slice(obj, parts[0], parts[1], parts[2]);
      }
      case T::Call: {
        const Value fn = eval(*e.args[0], f);
        if (fn.kind() != Value::Kind::Function)
          throw Error("'" + describe(*e.args[0]) + "' is " +
                      (fn.is_undefined() ? "undefined" : "not callable"));
        return fn.as_function()(eval_args(e, f, 1));
      }
      case T::Filter: {
        const Value input = eval(*e.args[0], f);
        return filter(e.name, input, eval_args(e, f, 1));
      }
      case T::Test: {
        const Value input = eval(*e.args[0], f);
        const bool r = apply_test(e.name, input, eval_args(e, f, 1));
        return Value(r != e.negate);
      }
      case T::Unary: {
        const Value v = eval(*e.args[0], f);
        if (e.name == "not") return Value(!v.truthy());
        if (v.kind() == Value::Kind::Int) {
          int64_t r = v.as_int();
          if (e.name == "-") r = checked_sub(0, v.as_int(), "-");
          return Value(r);
        }
        if (v.kind() == Value::Kind::Float) return Value(e.name == "-" ? -v.as_number() : v.as_number());
        throw Error("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
      }
      case T::Binary:
        return binary(e, f);
      case T::Cond:
        if (eval(*e.args[0], f).truthy()) return eval(*e.args[1], f);
        return e.args[2] ? eval(*e.args[2], f) : Value();
    }
    return {};
  }

  static std::string describe(const Expr& e) {
    switch (e.type) {
      case Expr::Type::Name:
        return e.name;
      case Expr::Type::Attr:
        return describe(*e.args[0]) + "." + e.name;
      case Expr::Type::Index:
        return describe(*e.args[0]) + "[...]";
      default:
        return "value";
    }
  }

  Value binary(const Expr& e, Frame& f) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.args[0], f);
      return a.truthy() ? eval(*e.args[1], f) : a;
    }
    if (op == "or") {
      Value a = eval(*e.args[0], f);
      return a.truthy() ? a : eval(*e.args[1], f);
    }
    const Value a = eval(*e.args[0], f), b = eval(*e.args[1], f);
    using K = Value::Kind;
    if (op == "~") return Value(a.str() + b.str());
    if (op == "==") return Value(equal(a, b));
    if (op == "!=") return Value(!equal(a, b));
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      CallArgs args;
      args.positional.push_back(b);
      return Value(apply_test(op, a, args));
    }
    if (op == "in" || op == "notin") {
      CallArgs args;
      args.positional.push_back(b);
      if (!b.is_string() && !b.is_list() && !b.is_mapping() && !b.is_undefined())
        throw Error(std::string("argument of type '") + b.type_name() + "' is not iterable");
      if (b.is_string() && !a.is_string())
        throw Error(std::string("'in <string>' requires string as left operand, not ") + a.type_name());
      return Value(apply_test("in", a, args) == (op == "in"));
    }
    const bool nums = (a.is_number() || a.kind() == K::Bool) && (b.is_number() || b.kind() == K::Bool);
    const bool ints = nums && a.kind() != K::Float && b.kind() != K::Float;
    const auto ia = [&] { return a.kind() == K::Bool ? int64_t(a.as_bool()) : a.as_int(); };
    const auto ib = [&] { return b.kind() == K::Bool ? int64_t(b.as_bool()) : b.as_int(); };
    int64_t r = 0;
    if (op == "+") {
      if (ints) return Value(checked_add(ia(), ib(), op));
      if (nums) return Value(a.as_number() + b.as_number());
      if (a.is_string() && b.is_string()) {
        check_string_size(a.as_string().size() + b.as_string().size());
        return Value(a.as_string() + b.as_string());
      }
      if (a.is_list() && b.is_list()) {
        if (a.as_list().size() + b.as_list().size() > kMaxListItems)
          throw Error("the chat template builds a list of more than " + std::to_string(kMaxListItems) +
                      " items");
        List l = a.as_list();
        l.insert(l.end(), b.as_list().begin(), b.as_list().end());
        return Value(std::move(l));
      }
    } else if (op == "-" && nums) {
      return ints ? Value(checked_sub(ia(), ib(), op)) : Value(a.as_number() - b.as_number());
    } else if (op == "*") {
      if (ints) return Value(checked_mul(ia(), ib(), op));
      if (nums) return Value(a.as_number() * b.as_number());
      if (a.is_string() && (b.kind() == K::Int)) {
        const std::string& piece = a.as_string();
        const int64_t n = piece.empty() ? 0 : std::max<int64_t>(b.as_int(), 0);
        if (n > 0 && uint64_t(n) > kMaxStringBytes / piece.size()) check_string_size(kMaxStringBytes + 1);
        std::string rep;
        rep.reserve(piece.size() * size_t(n));
        for (int64_t i = 0; i < n; ++i) rep += piece;
        return Value(rep);
      }
    } else if (op == "/" && nums) {
      if (b.as_number() == 0) throw Error("division by zero");
      return Value(a.as_number() / b.as_number());
    } else if ((op == "//" || op == "%") && nums) {
      if (b.as_number() == 0) throw Error(op == "%" ? "modulo by zero" : "division by zero");
      if (ints) {
        if (ia() == std::numeric_limits<int64_t>::min() && ib() == -1)
          throw Error("integer overflow in '" + op + "'");
        int64_t q = ia() / ib();
        r = ia() % ib();
        if (r != 0 && ((r < 0) != (ib() < 0))) {
          --q;
          r += ib();
        }
        return Value(op == "//" ? q : r);
      }
      const double q = std::floor(a.as_number() / b.as_number());
      return Value(op == "//" ? q : a.as_number() - q * b.as_number());
    } else if (op == "**" && nums) {
      if (ints && ib() >= 0) {  // by squaring: 2 ** 10**18 must not loop 10**18 times
        int64_t base = ia(), e = ib();
        r = 1;
        while (e > 0) {
          if (e & 1) r = checked_mul(r, base, op);
          e >>= 1;
          if (e > 0) base = checked_mul(base, base, op);
        }
        return Value(r);
      }
      return Value(std::pow(a.as_number(), b.as_number()));
    }
    if (a.is_undefined() || b.is_undefined())
      throw Error("'" + describe(*e.args[a.is_undefined() ? 0 : 1]) + "' is undefined (operand of " + op +
                  ")");
    throw Error("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() +
                "'");
  }

  Frame& root_;
  Callbacks cb_;
  int depth_ = 0;
  int64_t steps_ = 0;
  int64_t max_steps_;
};

void check_expr(const Expr& e) {
  if (e.type == Expr::Type::Filter && !has_filter(e.name))
    throw Error(at(e.pos) + "unsupported filter '" + e.name + "'");
  if (e.type == Expr::Type::Test && !has_test(e.name))
    throw Error(at(e.pos) + "unsupported test '" + e.name + "'");
  for (const auto& a : e.args)
    if (a) check_expr(*a);
  for (const auto& kv : e.kwargs) check_expr(*kv.second);
}

}  // namespace

void check_supported(const Body& body) {
  for (const auto& s : body) {
    for (const ExprPtr* e : {&s->expr, &s->filter})
      if (*e) check_expr(**e);
    for (const auto& c : s->conds) check_expr(*c);
    for (const auto& d : s->defaults)
      if (d) check_expr(*d);
    for (const auto& b : s->bodies) check_supported(b);
    check_supported(s->else_body);
  }
}

std::string render_template(const Body& body, const Dict& variables) {
  Frame globals;
  for (auto& [k, v] : global_functions()) globals.vars[k] = v;
  for (const auto& [k, v] : variables) globals.vars[k] = v;
  Frame root{{}, &globals};
  int64_t n_messages = 0;
  for (const auto& [k, v] : variables)
    if (k == "messages" && v.is_list()) n_messages = int64_t(v.as_list().size());
  Evaluator ev(root, kBaseSteps + kStepsPerMessage * n_messages);
  std::string out;
  try {
    ev.exec(body, root, out);
  } catch (const Located& e) {
    throw Error(e.what());
  }
  return out;
}

}  // namespace tandem::chat
