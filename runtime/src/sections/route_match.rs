//! [`RouteMatch`]: the `match` of a pub/sub routing rule, the subset of
//! CEL (Common Expression Language) that Dapr's routing examples use,
//! evaluated over an event's CloudEvent.
//!
//! Supported: the variable `event` and its fields (`event.type`,
//! `event.source`, `event.data.order.priority`, …); string (`"…"` or
//! `'…'`), number, `true`/`false` and `null` literals; `==`, `!=`, `<`,
//! `<=`, `>`, `>=`; `&&`, `||`, `!`; parentheses; `has(event.field)`; and
//! the string methods `startsWith`, `endsWith` and `contains`. Anything
//! else is refused when the expression is parsed, naming the column.
//!
//! A field the event lacks makes the comparison using it false, as does a
//! comparison between different types: the rule does not hold, and the
//! next rule (else the default route) takes the event. A deliberate
//! difference from Dapr, where CEL raises an error there ("no such key")
//! and `matchRoutingRule` returns it: the event is not routed at all but
//! sent to the dead-letter topic when one is set, else handed back to the
//! broker, which redelivers it to fail the same way, for ever. Here one
//! event that lacks an optional field neither blocks nor loops.

use std::fmt;

use serde_json::{Map, Value};

/// Longest expression accepted, in bytes.
pub const MAX_MATCH_LEN: usize = 4096;
/// Deepest nesting accepted (parentheses, `!` and operators).
const MAX_DEPTH: usize = 32;

/// A parsed routing `match` expression.
#[derive(Clone)]
pub struct RouteMatch {
    source: String,
    expr: Expr,
}

impl PartialEq for RouteMatch {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl fmt::Debug for RouteMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RouteMatch({:?})", self.source)
    }
}

impl RouteMatch {
    /// Parses `source`; the error says what is not supported and where.
    pub fn parse(source: &str) -> Result<Self, String> {
        if source.len() > MAX_MATCH_LEN {
            return Err(format!(
                "expression is {} bytes, more than the {MAX_MATCH_LEN} accepted",
                source.len()
            ));
        }
        let tokens = tokenize(source)?;
        let mut parser = Parser {
            tokens,
            at: 0,
            depth: 0,
        };
        let expr = parser.or()?;
        if let Some((column, token)) = parser.tokens.get(parser.at) {
            return Err(unexpected(*column, token));
        }
        Ok(Self {
            source: source.to_string(),
            expr,
        })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the CloudEvent `event` matches.
    pub fn matches(&self, event: &Map<String, Value>) -> bool {
        eval(&self.expr, event) == Some(Value::Bool(true))
    }

    /// The fields of the event the expression reads, each as its path
    /// (`["data", "order"]` for `event.data.order`; empty for `event`
    /// itself) and whether its value is read (`true`) or only whether it
    /// is there (`false`, `has(…)`). An event holding these fields (and,
    /// of a field read only for its presence, any value) matches as the
    /// whole event does: a caller may build no more of it than that.
    pub fn fields_read(&self) -> Vec<(&[String], bool)> {
        let mut read = Vec::new();
        fields_of(&self.expr, &mut read);
        read
    }
}

/// The fields `expr` reads, appended to `read` (see
/// [`RouteMatch::fields_read`]).
fn fields_of<'e>(expr: &'e Expr, read: &mut Vec<(&'e [String], bool)>) {
    match expr {
        Expr::Literal(_) => {}
        Expr::Field(path) => read.push((path, true)),
        Expr::Has(path) => read.push((path, false)),
        Expr::Not(inner) => fields_of(inner, read),
        Expr::Or(left, right)
        | Expr::And(left, right)
        | Expr::Compare(left, _, right)
        | Expr::Method(left, _, right) => {
            fields_of(left, read);
            fields_of(right, read);
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Literal(Value),
    Op(&'static str),
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Ident(name) => write!(f, "{name}"),
            Token::Literal(value) => write!(f, "{value}"),
            Token::Op(op) => write!(f, "{op}"),
        }
    }
}

const SUPPORTED: &str = "supported: event.FIELD…, string/number/bool/null literals, == != < <= > >=, && || !, parentheses, has(), startsWith/endsWith/contains";

fn unexpected(column: usize, token: &Token) -> String {
    format!("unsupported syntax at column {column}: `{token}` ({SUPPORTED})")
}

const OPERATORS: [&str; 16] = [
    "==", "!=", "<=", ">=", "&&", "||", "<", ">", "!", "(", ")", ".", ",", "-", "+", "*",
];

/// The tokens of `source`, each with its (1-based) column.
fn tokenize(source: &str) -> Result<Vec<(usize, Token)>, String> {
    let chars: Vec<char> = source.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let column = i + 1;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let token = match word.as_str() {
                "true" => Token::Literal(Value::Bool(true)),
                "false" => Token::Literal(Value::Bool(false)),
                "null" => Token::Literal(Value::Null),
                _ => Token::Ident(word),
            };
            tokens.push((column, token));
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            let number = text
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .ok_or_else(|| format!("bad number `{text}` at column {column}"))?;
            tokens.push((column, Token::Literal(Value::Number(number))));
        } else if c == '"' || c == '\'' {
            let (text, next) = string_literal(&chars, i)?;
            tokens.push((column, Token::Literal(Value::String(text))));
            i = next;
        } else {
            let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let op = OPERATORS
                .iter()
                .find(|op| rest.starts_with(**op))
                .ok_or_else(|| {
                    format!("unsupported character `{c}` at column {column} ({SUPPORTED})")
                })?;
            tokens.push((column, Token::Op(op)));
            i += op.len();
        }
    }
    Ok(tokens)
}

/// The string literal opening at `chars[start]`, and the index after it.
fn string_literal(chars: &[char], start: usize) -> Result<(String, usize), String> {
    let quote = chars[start];
    let mut text = String::new();
    let mut i = start + 1;
    while let Some(&c) = chars.get(i) {
        match c {
            '\\' => {
                let escaped = chars.get(i + 1).copied().ok_or_else(|| {
                    format!("unterminated string starting at column {}", start + 1)
                })?;
                text.push(match escaped {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    '\\' | '"' | '\'' => escaped,
                    other => {
                        return Err(format!(
                            "unsupported escape `\\{other}` at column {}",
                            i + 1
                        ))
                    }
                });
                i += 2;
            }
            c if c == quote => return Ok((text, i + 1)),
            c => {
                text.push(c);
                i += 1;
            }
        }
    }
    Err(format!(
        "unterminated string starting at column {}",
        start + 1
    ))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Compare {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Method {
    StartsWith,
    EndsWith,
    Contains,
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Or(Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Compare(Box<Expr>, Compare, Box<Expr>),
    Method(Box<Expr>, Method, Box<Expr>),
    Has(Vec<String>),
    Field(Vec<String>),
    Literal(Value),
}

struct Parser {
    tokens: Vec<(usize, Token)>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at).map(|(_, t)| t)
    }

    fn eat(&mut self, op: &str) -> bool {
        if matches!(self.peek(), Some(Token::Op(o)) if *o == op) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, op: &str) -> Result<(), String> {
        if self.eat(op) {
            return Ok(());
        }
        Err(match self.tokens.get(self.at) {
            Some((column, token)) => {
                format!("expected `{op}` at column {column}, found `{token}` ({SUPPORTED})")
            }
            None => format!("expected `{op}`, the expression ended"),
        })
    }

    fn deeper(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("expression nested more than {MAX_DEPTH} levels"));
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Expr, String> {
        self.deeper()?;
        let mut left = self.and()?;
        while self.eat("||") {
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        self.depth -= 1;
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut left = self.comparison()?;
        while self.eat("&&") {
            left = Expr::And(Box::new(left), Box::new(self.comparison()?));
        }
        Ok(left)
    }

    fn comparison(&mut self) -> Result<Expr, String> {
        let left = self.unary()?;
        let compare = match self.peek() {
            Some(Token::Op("==")) => Compare::Eq,
            Some(Token::Op("!=")) => Compare::Ne,
            Some(Token::Op("<")) => Compare::Lt,
            Some(Token::Op("<=")) => Compare::Le,
            Some(Token::Op(">")) => Compare::Gt,
            Some(Token::Op(">=")) => Compare::Ge,
            _ => return Ok(left),
        };
        self.at += 1;
        let right = self.unary()?;
        Ok(Expr::Compare(Box::new(left), compare, Box::new(right)))
    }

    fn unary(&mut self) -> Result<Expr, String> {
        if self.eat("!") {
            self.deeper()?;
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(Expr::Not(Box::new(inner)));
        }
        if self.eat("-") {
            return match self.tokens.get(self.at).cloned() {
                Some((_, Token::Literal(Value::Number(n)))) => {
                    self.at += 1;
                    let negated = n
                        .as_f64()
                        .and_then(|f| serde_json::Number::from_f64(-f))
                        .map_or(Value::Null, Value::Number);
                    Ok(Expr::Literal(negated))
                }
                Some((column, token)) => Err(unexpected(column, &token)),
                None => Err("the expression ended after `-`".to_string()),
            };
        }
        self.postfix()
    }

    fn postfix(&mut self) -> Result<Expr, String> {
        let mut expr = self.primary()?;
        while self.peek() == Some(&Token::Op(".")) {
            let (column, token) = self
                .tokens
                .get(self.at + 1)
                .cloned()
                .ok_or_else(|| "the expression ended after `.`".to_string())?;
            let Token::Ident(name) = token else {
                return Err(unexpected(column, &token));
            };
            self.at += 2;
            if self.peek() == Some(&Token::Op("(")) {
                let method = match name.as_str() {
                    "startsWith" => Method::StartsWith,
                    "endsWith" => Method::EndsWith,
                    "contains" => Method::Contains,
                    _ => {
                        return Err(format!(
                            "unsupported function `{name}` at column {column} ({SUPPORTED})"
                        ))
                    }
                };
                self.at += 1;
                let argument = self.or()?;
                self.expect(")")?;
                expr = Expr::Method(Box::new(expr), method, Box::new(argument));
            } else if let Expr::Field(path) = &mut expr {
                path.push(name);
            } else {
                return Err(format!(
                    "unsupported field access `.{name}` at column {column} (fields are read from `event`)"
                ));
            }
        }
        Ok(expr)
    }

    fn primary(&mut self) -> Result<Expr, String> {
        let Some((column, token)) = self.tokens.get(self.at).cloned() else {
            return Err("the expression ended where a value was expected".to_string());
        };
        self.at += 1;
        match token {
            Token::Literal(value) => Ok(Expr::Literal(value)),
            Token::Op("(") => {
                let inner = self.or()?;
                self.expect(")")?;
                Ok(inner)
            }
            Token::Ident(name) if name == "event" => Ok(Expr::Field(Vec::new())),
            Token::Ident(name) if name == "has" => {
                self.expect("(")?;
                let argument = self.postfix()?;
                self.expect(")")?;
                match argument {
                    Expr::Field(path) if !path.is_empty() => Ok(Expr::Has(path)),
                    _ => Err(format!(
                        "has() at column {column} takes a field of the event (`has(event.data.x)`)"
                    )),
                }
            }
            Token::Ident(name) => Err(format!(
                "unknown name `{name}` at column {column} (the event is `event`: `event.type`, `event.data.x`)"
            )),
            token => Err(unexpected(column, &token)),
        }
    }
}

fn field<'a>(event: &'a Map<String, Value>, path: &[String]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    let mut value = event.get(first)?;
    for key in rest {
        value = value.as_object()?.get(key)?;
    }
    Some(value)
}

/// The value of `expr`; `None` where CEL would raise an error (a missing
/// field, mismatched types).
fn eval(expr: &Expr, event: &Map<String, Value>) -> Option<Value> {
    let truth = |e: &Expr| eval(e, event).and_then(|v| v.as_bool());
    match expr {
        Expr::Literal(value) => Some(value.clone()),
        Expr::Field(path) if path.is_empty() => Some(Value::Object(event.clone())),
        Expr::Field(path) => field(event, path).cloned(),
        Expr::Has(path) => Some(Value::Bool(field(event, path).is_some())),
        Expr::Not(inner) => truth(inner).map(|b| Value::Bool(!b)),
        Expr::And(left, right) => match (truth(left), truth(right)) {
            (Some(false), _) | (_, Some(false)) => Some(Value::Bool(false)),
            (Some(true), Some(true)) => Some(Value::Bool(true)),
            _ => None,
        },
        Expr::Or(left, right) => match (truth(left), truth(right)) {
            (Some(true), _) | (_, Some(true)) => Some(Value::Bool(true)),
            (Some(false), Some(false)) => Some(Value::Bool(false)),
            _ => None,
        },
        Expr::Compare(left, compare, right) => {
            let (left, right) = (eval(left, event)?, eval(right, event)?);
            compared(&left, *compare, &right).map(Value::Bool)
        }
        Expr::Method(target, method, argument) => {
            let (target, argument) = (eval(target, event)?, eval(argument, event)?);
            let (Value::String(target), Value::String(argument)) = (target, argument) else {
                return None;
            };
            Some(Value::Bool(match method {
                Method::StartsWith => target.starts_with(&argument),
                Method::EndsWith => target.ends_with(&argument),
                Method::Contains => target.contains(&argument),
            }))
        }
    }
}

fn compared(left: &Value, compare: Compare, right: &Value) -> Option<bool> {
    use std::cmp::Ordering;
    let ordering = match (left, right) {
        (Value::Number(a), Value::Number(b)) => a.as_f64()?.partial_cmp(&b.as_f64()?)?,
        (Value::String(a), Value::String(b)) => a.cmp(b),
        (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
        (Value::Null, Value::Null) => Ordering::Equal,
        // Maps and lists: equality only.
        (Value::Object(_), Value::Object(_)) | (Value::Array(_), Value::Array(_)) => {
            return match compare {
                Compare::Eq => Some(left == right),
                Compare::Ne => Some(left != right),
                _ => None,
            }
        }
        _ => return None,
    };
    Some(match compare {
        Compare::Eq => ordering == Ordering::Equal,
        Compare::Ne => ordering != Ordering::Equal,
        Compare::Lt => ordering == Ordering::Less,
        Compare::Le => ordering != Ordering::Greater,
        Compare::Gt => ordering == Ordering::Greater,
        Compare::Ge => ordering != Ordering::Less,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event() -> Map<String, Value> {
        json!({
            "type": "widget", "source": "checkout", "id": "1",
            "data": {"priority": 5, "tier": "express", "country": "FR", "tags": {"a": true}}
        })
        .as_object()
        .cloned()
        .unwrap_or_default()
    }

    fn matches(source: &str) -> bool {
        RouteMatch::parse(source)
            .unwrap_or_else(|e| panic!("{source}: {e}"))
            .matches(&event())
    }

    #[test]
    fn daprs_examples_match_the_event_they_describe() {
        assert!(matches(r#"event.type == "widget""#));
        assert!(!matches(r#"event.type == "gadget""#));
        assert!(matches("event.data.tier == 'express'"));
        assert!(matches("event.data.country != 'US'"));
        assert!(matches(
            r#"event.type == "widget" && event.data.priority > 3"#
        ));
        assert!(matches(
            r#"event.type == "gadget" || (event.source == 'checkout' && !(event.data.priority < 5))"#
        ));
        assert!(matches(
            "event.data.priority >= 5 && event.data.priority <= 5.0"
        ));
        assert!(matches("event.data.tags.a == true"));
        assert!(matches("has(event.data.tier) && !has(event.data.missing)"));
        assert!(matches(
            r#"event.type.startsWith("wid") && event.source.contains("out")"#
        ));
        assert!(matches("event.data.priority > -1"));
    }

    #[test]
    fn the_fields_read_are_named_with_how_they_are_read() {
        let rule = RouteMatch::parse(
            "event.type == 'a' && (has(event.data.tier) || event.data.order.priority > 3) \
             && !event.source.startsWith(event.subject)",
        )
        .expect("parsed");
        let read: Vec<(String, bool)> = rule
            .fields_read()
            .into_iter()
            .map(|(path, value)| (path.join("."), value))
            .collect();
        let expected = [
            ("type", true),
            ("data.tier", false),
            ("data.order.priority", true),
            ("source", true),
            ("subject", true),
        ];
        assert_eq!(
            read,
            expected.map(|(path, value)| (path.to_string(), value))
        );
        let whole = RouteMatch::parse("event == event").expect("parsed");
        assert!(whole
            .fields_read()
            .iter()
            .all(|(path, value)| path.is_empty() && *value));
        assert!(RouteMatch::parse("true")
            .expect("parsed")
            .fields_read()
            .is_empty());
    }

    #[test]
    fn missing_fields_and_mismatched_types_do_not_match() {
        assert!(!matches("event.data.missing == 'x'"));
        assert!(!matches("event.data.missing != 'x'"));
        assert!(!matches("event.data.priority == '5'"));
        assert!(!matches("event.type > 3"));
        assert!(matches(
            "event.data.missing == 'x' || event.type == 'widget'"
        ));
    }

    #[test]
    fn unsupported_syntax_is_refused_naming_the_column() {
        let err = |source: &str| match RouteMatch::parse(source) {
            Ok(_) => panic!("{source} parsed"),
            Err(e) => e,
        };
        assert!(err("event.type in ['a']").contains("unsupported character `[` at column 15"));
        assert!(err("event.type in x").contains("unsupported syntax at column 12: `in`"));
        assert!(err("size(event.type) > 1").contains("unknown name `size`"));
        assert!(err("event.type == ").contains("ended"));
        assert!(err("event.type.matches('a')").contains("unsupported function `matches`"));
        assert!(err("event.type == \"a").contains("unterminated string"));
        assert!(err("event.type = 'a'").contains("unsupported character `=`"));
        assert!(err(&"(".repeat(100)).contains("nested"));
        assert!(err("request.type == 'a'").contains("unknown name `request`"));
    }
}
