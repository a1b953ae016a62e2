// The syntax tree of a parsed Jinja template (jinja_parser.h builds it, jinja_eval.h runs it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/jinja_value.h"

namespace tandem::chat {

struct Pos {
  int line = 1, col = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Type {
    Literal,  // value
    Name,     // name
    List,     // args: items
    Tuple,    // args: items
    Dict,     // args: key, value, key, value, ...
    Attr,     // args[0].name
    Index,    // args[0][args[1]]
    Slice,    // args[0][args[1]:args[2]:args[3]] (null parts are missing)
    Call,     // args[0](args[1..], kwargs)
    Filter,   // args[0] | name(args[1..], kwargs)
    Test,     // args[0] is [not] name(args[1..])
    Unary,    // op args[0]: "-", "+", "not"
    Binary,   // args[0] op args[1]: + - * / // % ** ~ == != < <= > >= in notin and or
    Cond,     // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Type type;
  Pos pos;
  std::string name;     // Name, Attr, Filter, Test; the operator of Unary/Binary
  Value value;          // Literal
  bool negate = false;  // Test: "is not"
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // Call, Filter
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Type {
    Text,      // text
    Output,    // {{ expr }}
    If,        // conds[i] -> bodies[i]; else_body
    For,       // for targets in expr [if filter]: body; else_body
    Set,       // set targets = expr; or set name.attr = expr (attr not empty)
    SetBlock,  // {% set name %}body{% endset %}
    Macro,     // macro name(params = defaults): body
    Break,
    Continue,
    Block,  // a plain body ({% generation %})
  };
  Type type;
  Pos pos;
  std::string text;                  // Text; Set/SetBlock/Macro name
  std::string attr;                  // Set: ns.attr
  std::vector<std::string> targets;  // For and Set (tuple unpacking); Macro parameters
  std::vector<ExprPtr> defaults;     // Macro parameter defaults (null: none)
  ExprPtr expr;                      // Output, For iterable, Set value
  ExprPtr filter;                    // For ... if filter
  std::vector<ExprPtr> conds;        // If
  std::vector<Body> bodies;          // If branches; For/SetBlock/Macro/Block: bodies[0]
  Body else_body;                    // If, For
};

}  // namespace tandem::chat
