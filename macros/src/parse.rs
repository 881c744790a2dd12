//! Stage one: the derive input and its attributes, read into a model.
//!
//! Only syntax is checked here (unknown keys, values that are not string
//! literals); what the model means is checked in [`crate::validate`].

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Attribute, Data, DeriveInput, Fields, Generics, Ident, LitStr, Type};

use crate::errors::{closest, unknown_key, Errors};

/// The keys `#[component(...)]` knows.
pub(crate) const COMPONENT_KEYS: &[&str] = &["kind", "type", "example", "crate", "in_place"];
/// The keys `#[inject(...)]` knows.
pub(crate) const INJECT_KEYS: &[&str] = &["name"];

/// The derive input, as read.
pub(crate) struct ParsedInput<'a> {
    /// The struct's name.
    pub ident: &'a Ident,
    /// Its generics (rejected by validation when not empty).
    pub generics: &'a Generics,
    /// Its shape and, for a struct with named fields, the fields.
    pub shape: Shape<'a>,
    /// The `#[component(...)]` arguments, if the attribute is there.
    pub args: Option<ComponentArgs>,
    /// First paragraph of the doc comment.
    pub description: String,
    /// Syntax mistakes found while reading.
    pub errors: Errors,
}

/// What the derive was put on.
pub(crate) enum Shape<'a> {
    /// A struct with named fields: the only supported shape.
    Named(Vec<ParsedField<'a>>),
    /// A tuple struct, at its fields.
    Tuple(Span),
    /// A unit struct, at its name.
    Unit(Span),
    /// An enum, at `enum`.
    Enum(Span),
    /// A union, at `union`.
    Union(Span),
}

/// `#[component(kind = "...", type = "...", example = "...", crate = "...")]`.
pub(crate) struct ComponentArgs {
    /// The attribute, for "missing key" errors.
    pub span: Span,
    /// `kind = "..."`.
    pub kind: Option<LitStr>,
    /// `type = "..."`.
    pub type_name: Option<LitStr>,
    /// `example = "..."`.
    pub example: Option<LitStr>,
    /// `crate = "..."`.
    pub krate: Option<LitStr>,
    /// `in_place`: the component implements `InPlaceUpdate`.
    pub in_place: Option<Span>,
    /// Keys already reported on (given with a bad value, or suggested for
    /// a misspelt key): not reported missing as well.
    pub reported: Vec<&'static str>,
}

/// One named field and its rewire attributes.
pub(crate) struct ParsedField<'a> {
    /// The field name.
    pub ident: &'a Ident,
    /// The field type.
    pub ty: &'a Type,
    /// Each `#[metadata]` on the field.
    pub metadata: Vec<Span>,
    /// Each `#[inject]` on the field.
    pub inject: Vec<InjectArgs>,
}

/// `#[inject]` or `#[inject(name = "...")]`.
pub(crate) struct InjectArgs {
    /// The attribute.
    pub span: Span,
    /// `name = "..."`: only the referenced component of that name.
    pub name: Option<LitStr>,
}

/// Reads `input`; never fails, mistakes go to `errors`.
pub(crate) fn parse(input: &DeriveInput) -> ParsedInput<'_> {
    let mut errors = Errors::default();
    let mut args = None;
    for attr in &input.attrs {
        if attr.path().is_ident("component") {
            parse_component_attr(attr, &mut args, &mut errors);
        } else if attr.path().is_ident("metadata") || attr.path().is_ident("inject") {
            let name = if attr.path().is_ident("metadata") {
                "metadata"
            } else {
                "inject"
            };
            errors.at(
                attr.path().span(),
                format!("`#[{name}]` goes on a field, not on the struct"),
            );
        }
    }
    let shape = match &input.data {
        Data::Struct(data) => match &data.fields {
            Fields::Named(fields) => Shape::Named(
                fields
                    .named
                    .iter()
                    .filter_map(|field| parse_field(field, &mut errors))
                    .collect(),
            ),
            Fields::Unnamed(fields) => Shape::Tuple(fields.paren_token.span.join()),
            Fields::Unit => Shape::Unit(input.ident.span()),
        },
        Data::Enum(data) => Shape::Enum(data.enum_token.span),
        Data::Union(data) => Shape::Union(data.union_token.span),
    };
    ParsedInput {
        ident: &input.ident,
        generics: &input.generics,
        shape,
        args,
        description: description(&input.attrs),
        errors,
    }
}

fn parse_component_attr(attr: &Attribute, args: &mut Option<ComponentArgs>, errors: &mut Errors) {
    let args = args.get_or_insert_with(|| ComponentArgs {
        span: attr.path().span(),
        kind: None,
        type_name: None,
        example: None,
        krate: None,
        in_place: None,
        reported: Vec::new(),
    });
    let result = attr.parse_nested_meta(|meta| {
        let key = meta
            .path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        if key == "in_place" {
            return in_place_flag(&meta, args, errors);
        }
        let slot = match key.as_str() {
            "kind" => &mut args.kind,
            "type" => &mut args.type_name,
            "example" => &mut args.example,
            "crate" => &mut args.krate,
            _ => {
                let shown = if key.is_empty() {
                    path_text(&meta.path)
                } else {
                    key
                };
                if let Some(close) = closest(&shown, COMPONENT_KEYS) {
                    args.reported.push(close);
                }
                errors.at(
                    meta.path.span(),
                    unknown_key(&shown, "#[component(...)]", COMPONENT_KEYS),
                );
                return skip_value(&meta);
            }
        };
        let value = string_value(&meta, &key, errors)?;
        if value.is_none() {
            if let Some(known) = COMPONENT_KEYS.iter().find(|k| **k == key) {
                args.reported.push(known);
            }
        }
        if let Some(value) = value {
            if slot.is_some() {
                errors.at(
                    meta.path.span(),
                    format!("`{key}` is given twice in `#[component(...)]`"),
                );
            } else {
                *slot = Some(value);
            }
        }
        Ok(())
    });
    if let Err(error) = result {
        errors.push(error);
    }
}

/// `in_place`, a flag: no value, at most once.
fn in_place_flag(
    meta: &syn::meta::ParseNestedMeta<'_>,
    args: &mut ComponentArgs,
    errors: &mut Errors,
) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        errors.at(
            meta.path.span(),
            "`in_place` takes no value: write `#[component(..., in_place)]`",
        );
        return skip_value(meta);
    }
    if args.in_place.is_some() {
        errors.at(
            meta.path.span(),
            "`in_place` is given twice in `#[component(...)]`",
        );
    } else {
        args.in_place = Some(meta.path.span());
    }
    Ok(())
}

fn parse_field<'a>(field: &'a syn::Field, errors: &mut Errors) -> Option<ParsedField<'a>> {
    let ident = field.ident.as_ref()?;
    let mut parsed = ParsedField {
        ident,
        ty: &field.ty,
        metadata: Vec::new(),
        inject: Vec::new(),
    };
    for attr in &field.attrs {
        if attr.path().is_ident("metadata") {
            if let syn::Meta::Path(_) = &attr.meta {
                parsed.metadata.push(attr.path().span());
            } else {
                errors.at(attr.meta.span(), "`#[metadata]` takes no arguments");
            }
        } else if attr.path().is_ident("inject") {
            if let Some(inject) = parse_inject_attr(attr, errors) {
                parsed.inject.push(inject);
            }
        } else if attr.path().is_ident("component") {
            errors.at(
                attr.path().span(),
                "`#[component(...)]` goes on the struct, not on a field (fields take `#[metadata]` or `#[inject]`)",
            );
        }
    }
    Some(parsed)
}

fn parse_inject_attr(attr: &Attribute, errors: &mut Errors) -> Option<InjectArgs> {
    let mut inject = InjectArgs {
        span: attr.path().span(),
        name: None,
    };
    match &attr.meta {
        syn::Meta::Path(_) => {}
        syn::Meta::List(_) => {
            let result = attr.parse_nested_meta(|meta| {
                let key = meta
                    .path
                    .get_ident()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                if key != "name" {
                    let shown = if key.is_empty() {
                        path_text(&meta.path)
                    } else {
                        key
                    };
                    errors.at(
                        meta.path.span(),
                        unknown_key(&shown, "#[inject(...)]", INJECT_KEYS),
                    );
                    return skip_value(&meta);
                }
                if let Some(name) = string_value(&meta, &key, errors)? {
                    if inject.name.is_some() {
                        errors.at(
                            meta.path.span(),
                            "`name` is given twice in `#[inject(...)]`",
                        );
                    } else {
                        inject.name = Some(name);
                    }
                }
                Ok(())
            });
            if let Err(error) = result {
                errors.push(error);
                return None;
            }
        }
        syn::Meta::NameValue(value) => {
            errors.at(
                value.span(),
                "write `#[inject]`, or `#[inject(name = \"...\")]` to take only the component of that name",
            );
            return None;
        }
    }
    Some(inject)
}

/// The string literal after `key =`; any other value is a mistake.
fn string_value(
    meta: &syn::meta::ParseNestedMeta<'_>,
    key: &str,
    errors: &mut Errors,
) -> syn::Result<Option<LitStr>> {
    if !meta.input.peek(syn::Token![=]) {
        errors.at(
            meta.path.span(),
            format!("`{key}` needs a value: `{key} = \"...\"`"),
        );
        return skip_value(meta).map(|()| None);
    }
    let mut expr: syn::Expr = meta.value()?.parse()?;
    // A `$kind:literal` passed through the user's `macro_rules!` arrives
    // in an invisible group.
    while let syn::Expr::Group(group) = expr {
        expr = *group.expr;
    }
    match expr {
        syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(lit),
            ..
        }) => Ok(Some(lit)),
        other => {
            errors.at(
                other.span(),
                format!("`{key}` takes a string literal: `{key} = \"...\"`"),
            );
            Ok(None)
        }
    }
}

/// Consumes whatever follows an unknown key, so reading can go on.
fn skip_value(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        let _: syn::Expr = meta.value()?.parse()?;
    } else if meta.input.peek(syn::token::Paren) {
        let content;
        syn::parenthesized!(content in meta.input);
        let _: proc_macro2::TokenStream = content.parse()?;
    }
    Ok(())
}

fn path_text(path: &syn::Path) -> String {
    let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    segments.join("::")
}

/// The first paragraph of the doc comment, lines joined with spaces.
fn description(attrs: &[Attribute]) -> String {
    let mut lines = Vec::new();
    for attr in attrs {
        let syn::Meta::NameValue(doc) = &attr.meta else {
            continue;
        };
        if !doc.path.is_ident("doc") {
            continue;
        }
        let syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(text),
            ..
        }) = &doc.value
        else {
            continue;
        };
        for line in text.value().split('\n') {
            lines.push(line.trim().to_string());
        }
    }
    let paragraph: Vec<String> = lines
        .into_iter()
        .skip_while(String::is_empty)
        .take_while(|line| !line.is_empty())
        .collect();
    paragraph.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(source: &str) -> ParsedInput<'static> {
        let input: DeriveInput = match syn::parse_str(source) {
            Ok(input) => input,
            Err(error) => panic!("{error}"),
        };
        parse(Box::leak(Box::new(input)))
    }

    #[test]
    fn description_is_the_first_paragraph() {
        let p = parsed("/// In-memory\n/// state store.\n///\n/// More.\n#[component(kind = \"state\", type = \"memory\")] struct S { a: u8 }");
        assert_eq!(p.description, "In-memory state store.");
        assert!(p.errors.finish(()).is_ok());
    }

    #[test]
    fn reads_keys_and_fields() {
        let p = parsed(
            "#[component(kind = \"state\", type = \"memory\", crate = \"::x\")] struct S { #[metadata] m: M, #[inject(name = \"a\")] h: Option<LockHandle>, d: u8 }",
        );
        let args = p.args.as_ref().map(|a| {
            (
                a.kind.as_ref().map(LitStr::value),
                a.krate.as_ref().map(LitStr::value),
            )
        });
        assert_eq!(args, Some((Some("state".into()), Some("::x".into()))));
        let Shape::Named(fields) = &p.shape else {
            panic!("not named")
        };
        assert_eq!(fields.len(), 3);
        assert_eq!(fields[0].metadata.len(), 1);
        assert_eq!(
            fields[1]
                .inject
                .first()
                .and_then(|i| i.name.as_ref())
                .map(LitStr::value),
            Some("a".into())
        );
        assert!(p.errors.finish(()).is_ok());
    }

    #[test]
    fn unknown_keys_are_collected() {
        let p = parsed("#[component(knd = \"state\", type = 3, colour)] struct S {}");
        let Err(error) = p.errors.finish(()) else {
            panic!("no error")
        };
        let messages: Vec<String> = error.into_iter().map(|e| e.to_string()).collect();
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert!(messages[0].contains("did you mean `kind`?"), "{messages:?}");
    }
}
