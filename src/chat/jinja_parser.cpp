#include "chat/jinja_parser.h"

#include <cctype>
#include <cstdlib>

#include "core/error.h"

namespace tandem::chat {
namespace {

enum class Tok { Text, BlockBegin, BlockEnd, VarBegin, VarEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;
  Pos pos;
};

[[noreturn]] void fail(Pos p, const std::string& msg) {
  throw Error("chat template line " + std::to_string(p.line) + " col " + std::to_string(p.col) + ": " + msg);
}

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : s_(src) {}

  std::vector<Token> run() {
    bool line_starting = true;
    int strip_next = 0;  // 0: nothing; 2: all leading whitespace (the previous tag ended with '-')
    while (i_ < s_.size()) {
      size_t open = s_.find('{', i_);
      while (open != std::string::npos && open + 1 < s_.size() && s_[open + 1] != '{' &&
             s_[open + 1] != '%' && s_[open + 1] != '#')
        open = s_.find('{', open + 1);
      if (open == std::string::npos || open + 1 >= s_.size()) open = s_.size();
      const Pos text_pos = here();
      std::string text = s_.substr(i_, open - i_);
      if (strip_next == 2) {
        size_t k = 0;
        while (k < text.size() && is_ws(text[k])) ++k;
        text.erase(0, k);
      }
      strip_next = 0;
      if (open < s_.size()) {
        const char kind = s_[open + 1];
        const char mod = open + 2 < s_.size() ? s_[open + 2] : '\0';
        if (mod == '-') {
          size_t k = text.size();
          while (k > 0 && is_ws(text[k - 1])) --k;
          text.resize(k);
        } else if (mod != '+' && kind != '{') {  // lstrip_blocks: block and comment tags
          const size_t nl = text.rfind('\n');
          const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
          if (l_pos > 0 || line_starting) {
            bool blank = true;
            for (size_t k = l_pos; k < text.size(); ++k) blank = blank && (text[k] == ' ' || text[k] == '\t');
            if (blank) text.resize(l_pos);
          }
        }
      }
      if (!text.empty()) out_.push_back({Tok::Text, text, text_pos});
      advance_to(open);
      if (i_ >= s_.size()) break;
      const char kind = s_[i_ + 1];
      const Pos tag_pos = here();
      advance_to(i_ + 2);
      if (i_ < s_.size() && (s_[i_] == '-' || s_[i_] == '+')) advance_to(i_ + 1);
      bool dash = false;
      if (kind == '#') {
        const size_t end = s_.find("#}", i_);
        if (end == std::string::npos) fail(tag_pos, "comment not closed with #}");
        dash = end > i_ && s_[end - 1] == '-';
        advance_to(end + 2);
      } else {
        out_.push_back({kind == '%' ? Tok::BlockBegin : Tok::VarBegin, "", tag_pos});
        dash = lex_tag(kind == '%' ? '%' : '}', tag_pos);
        out_.push_back({kind == '%' ? Tok::BlockEnd : Tok::VarEnd, "", close_pos_});
      }
      // Whitespace after the tag: '-' strips all of it; trim_blocks removes one newline after a block or
      // comment tag.
      size_t end_of_match = i_;
      if (dash) {
        strip_next = 2;
        while (end_of_match < s_.size() && is_ws(s_[end_of_match])) ++end_of_match;
      } else if (kind != '{') {
        if (end_of_match < s_.size() && s_[end_of_match] == '\n')
          ++end_of_match;
        else if (s_.compare(end_of_match, 2, "\r\n") == 0)
          end_of_match += 2;
      }
      line_starting = end_of_match > 0 && s_[end_of_match - 1] == '\n';
      advance_to(end_of_match);
      strip_next = 0;
    }
    out_.push_back({Tok::Eof, "", here()});
    return std::move(out_);
  }

 private:
  Pos here() const { return pos_; }
  void advance_to(size_t j) {
    for (; i_ < j && i_ < s_.size(); ++i_) {
      if (s_[i_] == '\n') {
        ++pos_.line;
        pos_.col = 1;
      } else {
        ++pos_.col;
      }
    }
  }

  // Lexes the tokens of one tag up to its closing "%}" or "}}"; returns whether it closed with '-'.
  bool lex_tag(char close, Pos tag_pos) {
    int depth = 0;
    while (true) {
      while (i_ < s_.size() && is_ws(s_[i_])) advance_to(i_ + 1);
      if (i_ >= s_.size()) fail(tag_pos, std::string("tag not closed with ") + (close == '%' ? "%}" : "}}"));
      const char c = s_[i_];
      close_pos_ = here();
      if (depth == 0) {
        for (const char m : {'-', '+'}) {
          if (c == m && i_ + 2 < s_.size() + 0 && s_[i_ + 1] == close && s_[i_ + 2] == '}') {
            advance_to(i_ + 3);
            return m == '-';
          }
        }
        if (c == close && i_ + 1 < s_.size() && s_[i_ + 1] == '}') {
          advance_to(i_ + 2);
          return false;
        }
      }
      const Pos p = here();
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i_;
        while (j < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[j])) || s_[j] == '_')) ++j;
        out_.push_back({Tok::Name, s_.substr(i_, j - i_), p});
        advance_to(j);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t j = i_;
        bool is_float = false;
        while (j < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[j])) || s_[j] == '_')) ++j;
        if (j + 1 < s_.size() && s_[j] == '.' && std::isdigit(static_cast<unsigned char>(s_[j + 1]))) {
          is_float = true;
          ++j;
          while (j < s_.size() && std::isdigit(static_cast<unsigned char>(s_[j]))) ++j;
        }
        std::string num;
        for (size_t k = i_; k < j; ++k)
          if (s_[k] != '_') num += s_[k];
        out_.push_back({is_float ? Tok::Float : Tok::Int, num, p});
        advance_to(j);
      } else if (c == '\'' || c == '"') {
        std::string str;
        size_t j = i_ + 1;
        for (;; ++j) {
          if (j >= s_.size()) fail(p, "string literal not closed");
          if (s_[j] == c) break;
          if (s_[j] == '\\' && j + 1 < s_.size()) {
            ++j;
            switch (s_[j]) {
              case 'n':
                str += '\n';
                break;
              case 't':
                str += '\t';
                break;
              case 'r':
                str += '\r';
                break;
              case '\\':
                str += '\\';
                break;
              case '\'':
                str += '\'';
                break;
              case '"':
                str += '"';
                break;
              case '\n':
                break;
              default:
                str += '\\';
                str += s_[j];
            }
          } else {
            str += s_[j];
          }
        }
        out_.push_back({Tok::String, str, p});
        advance_to(j + 1);
      } else {
        static const char* const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                          "/",  "%",  "~",  "<",  ">",  "(",  ")", "[", "]",
                                          "{",  "}",  ",",  ".",  ":",  "|",  "="};
        std::string op;
        for (const char* o : ops)
          if (s_.compare(i_, std::char_traits<char>::length(o), o) == 0) {
            op = o;
            break;
          }
        if (op.empty()) fail(p, std::string("unexpected character '") + c + "'");
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") --depth;
        out_.push_back({Tok::Op, op, p});
        advance_to(i_ + op.size());
      }
    }
  }

  const std::string& s_;
  size_t i_ = 0;
  Pos pos_;
  Pos close_pos_;  // where the closing delimiter of the last tag starts
  std::vector<Token> out_;
};

StmtPtr new_stmt(Stmt::Type type, Pos pos) {
  auto s = std::make_unique<Stmt>();
  s->type = type;
  s->pos = pos;
  return s;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_all() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  const Token& peek(size_t k = 0) const { return t_[std::min(k_ + k, t_.size() - 1)]; }
  Token next() { return t_[k_ < t_.size() - 1 ? k_++ : k_]; }
  bool is_op(const char* op, size_t k = 0) const { return peek(k).type == Tok::Op && peek(k).text == op; }
  bool is_name(const char* n, size_t k = 0) const { return peek(k).type == Tok::Name && peek(k).text == n; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    ++k_;
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    ++k_;
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(peek().pos, std::string("expected '") + op + "', found " + describe(peek()));
  }
  std::string expect_name() {
    if (peek().type != Tok::Name) fail(peek().pos, "expected a name, found " + describe(peek()));
    return next().text;
  }
  void expect_block_end() {
    if (peek().type != Tok::BlockEnd) fail(peek().pos, "expected end of tag %}, found " + describe(peek()));
    ++k_;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::BlockEnd:
        return "'%}'";
      case Tok::VarEnd:
        return "'}}'";
      case Tok::Eof:
        return "end of template";
      case Tok::Text:
        return "text";
      default:
        return "'" + t.text + "'";
    }
  }

  // Statements until one of the end keywords (returned in `end`, its tag's name consumed, not its %}).
  Body parse_body(const std::vector<std::string>& ends, std::string& end) {
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.type == Tok::Eof) {
        if (!ends.empty()) fail(t.pos, "unexpected end of template, expected {% " + ends.back() + " %}");
        return body;
      }
      if (t.type == Tok::Text) {
        auto s = new_stmt(Stmt::Type::Text, t.pos);
        s->text = t.text;
        body.push_back(std::move(s));
        ++k_;
      } else if (t.type == Tok::VarBegin) {
        ++k_;
        auto s = new_stmt(Stmt::Type::Output, t.pos);
        s->expr = parse_expr();
        if (peek().type != Tok::VarEnd) fail(peek().pos, "expected '}}', found " + describe(peek()));
        ++k_;
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        const Pos pos = t.pos;
        ++k_;
        if (peek().type != Tok::Name)
          fail(peek().pos, "expected a statement name, found " + describe(peek()));
        const std::string kw = peek().text;
        for (const auto& e : ends)
          if (kw == e) {
            ++k_;
            end = kw;
            return body;
          }
        body.push_back(parse_statement(pos));
      } else {
        fail(t.pos, "unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement(Pos pos) {
    if (++block_depth_ > kMaxDepth) fail(pos, "blocks nested too deeply");
    StmtPtr s = parse_statement_inner(pos);
    --block_depth_;
    return s;
  }
  StmtPtr parse_statement_inner(Pos pos) {
    const Token kwt = next();
    const std::string& kw = kwt.text;
    if (kw == "if") {
      auto s = new_stmt(Stmt::Type::If, pos);
      s->conds.push_back(parse_expr());
      expect_block_end();
      std::string end;
      s->bodies.push_back(parse_body({"elif", "else", "endif"}, end));
      while (end == "elif") {
        s->conds.push_back(parse_expr());
        expect_block_end();
        s->bodies.push_back(parse_body({"elif", "else", "endif"}, end));
      }
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"}, end);
      }
      expect_block_end();
      return s;
    }
    if (kw == "for") {
      auto s = new_stmt(Stmt::Type::For, pos);
      s->targets.push_back(expect_name());
      while (accept_op(",")) s->targets.push_back(expect_name());
      if (!accept_name("in")) fail(peek().pos, "expected 'in' in for loop, found " + describe(peek()));
      s->expr = parse_cond_free();
      if (accept_name("if")) s->filter = parse_cond_free();
      if (is_name("recursive")) fail(peek().pos, "unsupported: recursive for loops");
      expect_block_end();
      std::string end;
      s->bodies.push_back(parse_body({"else", "endfor"}, end));
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, end);
      }
      expect_block_end();
      return s;
    }
    if (kw == "set") {
      const std::string name = expect_name();
      if (accept_op(".")) {
        auto s = new_stmt(Stmt::Type::Set, pos);
        s->text = name;
        s->attr = expect_name();
        expect_op("=");
        s->expr = parse_expr();
        expect_block_end();
        return s;
      }
      if (peek().type == Tok::BlockEnd) {
        ++k_;
        auto s = new_stmt(Stmt::Type::SetBlock, pos);
        s->text = name;
        std::string end;
        s->bodies.push_back(parse_body({"endset"}, end));
        expect_block_end();
        return s;
      }
      auto s = new_stmt(Stmt::Type::Set, pos);
      s->targets.push_back(name);
      while (accept_op(",")) s->targets.push_back(expect_name());
      expect_op("=");
      s->expr = parse_expr();
      expect_block_end();
      return s;
    }
    if (kw == "macro") {
      auto s = new_stmt(Stmt::Type::Macro, pos);
      s->text = expect_name();
      expect_op("(");
      while (!accept_op(")")) {
        s->targets.push_back(expect_name());
        s->defaults.push_back(accept_op("=") ? parse_expr() : nullptr);
        if (!is_op(")")) expect_op(",");
      }
      expect_block_end();
      std::string end;
      s->bodies.push_back(parse_body({"endmacro"}, end));
      if (peek().type == Tok::Name) ++k_;  // {% endmacro name %}
      expect_block_end();
      return s;
    }
    if (kw == "break" || kw == "continue") {
      auto s = new_stmt(kw == "break" ? Stmt::Type::Break : Stmt::Type::Continue, pos);
      expect_block_end();
      return s;
    }
    if (kw == "generation") {  // transformers' AssistantTracker: renders its body
      auto s = new_stmt(Stmt::Type::Block, pos);
      expect_block_end();
      std::string end;
      s->bodies.push_back(parse_body({"endgeneration"}, end));
      expect_block_end();
      return s;
    }
    fail(kwt.pos, "unsupported statement '" + kw + "'");
  }

  // Expressions, with jinja2's precedence.
  ExprPtr make(Expr::Type type, Pos pos) {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->pos = pos;
    return e;
  }
  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, Pos pos) {
    auto e = make(Expr::Type::Binary, pos);
    e->name = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_expr() {  // with conditional expressions
    const Pos pos = peek().pos;
    ExprPtr e = parse_or();
    while (accept_name("if")) {
      auto c = make(Expr::Type::Cond, pos);
      c->args.push_back(parse_or());
      c->args.insert(c->args.begin() + 1, std::move(e));
      c->args.push_back(accept_name("else") ? parse_expr() : nullptr);
      // args: cond, then, else (may be null: undefined)
      e = std::move(c);
    }
    return e;
  }
  ExprPtr parse_cond_free() { return parse_or(); }
  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Pos p = next().pos;
      e = binary("or", std::move(e), parse_and(), p);
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Pos p = next().pos;
      e = binary("and", std::move(e), parse_not(), p);
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      const Pos p = next().pos;
      auto e = make(Expr::Type::Unary, p);
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      const Pos p = peek().pos;
      std::string op;
      if (peek().type == Tok::Op &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
        op = next().text;
      } else if (is_name("in")) {
        ++k_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        k_ += 2;
        op = "notin";
      } else {
        return e;
      }
      e = binary(op, std::move(e), parse_math1(), p);
    }
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token t = next();
      e = binary(t.text, std::move(e), parse_concat(), t.pos);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token t = next();
      e = binary("~", std::move(e), parse_math2(), t.pos);
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token t = next();
      e = binary(t.text, std::move(e), parse_pow(), t.pos);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token t = next();
      e = binary("**", std::move(e), parse_unary(true), t.pos);
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    // Every nested expression passes here: bound the recursion so a hostile template is an error, not a
    // stack overflow.
    struct Depth {
      int& d;
      explicit Depth(int& depth, Pos p) : d(depth) {
        if (++d > kMaxDepth) {
          --d;
          fail(p, "expression nested too deeply (more than " + std::to_string(kMaxDepth) + " levels)");
        }
      }
      ~Depth() { --d; }
    } depth(depth_, peek().pos);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token t = next();
      e = make(Expr::Type::Unary, t.pos);
      e->name = t.text;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }
  ExprPtr parse_primary() {
    const Token t = next();
    switch (t.type) {
      case Tok::Name: {
        if (t.text == "true" || t.text == "True") return literal(Value(true), t.pos);
        if (t.text == "false" || t.text == "False") return literal(Value(false), t.pos);
        if (t.text == "none" || t.text == "None") return literal(Value::none(), t.pos);
        auto e = make(Expr::Type::Name, t.pos);
        e->name = t.text;
        return e;
      }
      case Tok::String: {
        std::string s = t.text;
        while (peek().type == Tok::String) s += next().text;  // adjacent literals concatenate
        return literal(Value(s), t.pos);
      }
      case Tok::Int:
        return literal(Value(int64_t(std::strtoll(t.text.c_str(), nullptr, 10))), t.pos);
      case Tok::Float:
        return literal(Value(std::strtod(t.text.c_str(), nullptr)), t.pos);
      case Tok::Op:
        if (t.text == "(") {
          if (accept_op(")")) return make(Expr::Type::Tuple, t.pos);
          ExprPtr first = parse_expr();
          if (accept_op(")")) return first;
          auto tup = make(Expr::Type::Tuple, t.pos);
          tup->args.push_back(std::move(first));
          while (accept_op(",")) {
            if (is_op(")")) break;
            tup->args.push_back(parse_expr());
          }
          expect_op(")");
          return tup;
        }
        if (t.text == "[") {
          auto l = make(Expr::Type::List, t.pos);
          while (!accept_op("]")) {
            l->args.push_back(parse_expr());
            if (!is_op("]")) expect_op(",");
          }
          return l;
        }
        if (t.text == "{") {
          auto d = make(Expr::Type::Dict, t.pos);
          while (!accept_op("}")) {
            d->args.push_back(parse_expr());
            expect_op(":");
            d->args.push_back(parse_expr());
            if (!is_op("}")) expect_op(",");
          }
          return d;
        }
        break;
      default:
        break;
    }
    fail(t.pos, "unexpected " + describe(t) + " in expression");
  }
  ExprPtr literal(Value v, Pos pos) {
    auto e = make(Expr::Type::Literal, pos);
    e->value = std::move(v);
    return e;
  }
  void parse_call_args(Expr& e) {  // after '('
    while (!accept_op(")")) {
      if (peek().type == Tok::Name && is_op("=", 1)) {
        std::string key = next().text;
        ++k_;
        e.kwargs.emplace_back(std::move(key), parse_expr());
      } else {
        if (is_op("*") || is_op("**")) fail(peek().pos, "unsupported: *args / **kwargs in calls");
        e.args.push_back(parse_expr());
      }
      if (!is_op(")")) expect_op(",");
    }
  }
  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const Pos p = next().pos;
        auto a = make(Expr::Type::Attr, p);
        if (peek().type == Tok::Int) {  // x.0 is x[0]
          a->type = Expr::Type::Index;
          a->args.push_back(std::move(e));
          a->args.push_back(literal(Value(int64_t(std::strtoll(next().text.c_str(), nullptr, 10))), p));
        } else {
          a->name = expect_name();
          a->args.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (is_op("[")) {
        const Pos p = next().pos;
        ExprPtr parts[3];
        int n_colons = 0;
        if (!is_op(":")) parts[0] = parse_expr();
        while (n_colons < 2 && accept_op(":")) {
          ++n_colons;
          if (!is_op(":") && !is_op("]")) parts[n_colons] = parse_expr();
        }
        expect_op("]");
        auto x = make(n_colons ? Expr::Type::Slice : Expr::Type::Index, p);
        x->args.push_back(std::move(e));
        if (n_colons) {
          for (auto& part : parts) x->args.push_back(std::move(part));
        } else {
          if (!parts[0]) fail(p, "empty subscript");
          x->args.push_back(std::move(parts[0]));
        }
        e = std::move(x);
      } else if (is_op("(")) {
        const Pos p = next().pos;
        auto c = make(Expr::Type::Call, p);
        c->args.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        const Pos p = next().pos;
        auto f = make(Expr::Type::Filter, p);
        f->name = expect_name();
        while (accept_op(".")) f->name += "." + expect_name();
        f->args.push_back(std::move(e));
        if (accept_op("(")) parse_call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        const Pos p = next().pos;
        auto t = make(Expr::Type::Test, p);
        t->negate = accept_name("not");
        t->name = expect_name();
        t->args.push_back(std::move(e));
        if (accept_op("(")) {
          parse_call_args(*t);
        } else {
          const Token& n = peek();
          const bool arg_follows =
              n.type == Tok::String || n.type == Tok::Int || n.type == Tok::Float || is_op("[") ||
              is_op("{") ||
              (n.type == Tok::Name && n.text != "else" && n.text != "or" && n.text != "and" &&
               n.text != "if" && n.text != "is" && n.text != "not" && n.text != "in");
          if (arg_follows) t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        const Pos p = next().pos;
        auto c = make(Expr::Type::Call, p);
        c->args.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  static constexpr int kMaxDepth = 256;
  std::vector<Token> t_;
  size_t k_ = 0;
  int depth_ = 0;
  int block_depth_ = 0;
};

}  // namespace

Body parse_template(const std::string& source) {
  return Parser(Lexer(source).run()).parse_all();
}

}  // namespace tandem::chat
