//! Stage two: the model checked for user mistakes, each reported on the
//! user's tokens and in the user's terms.

use syn::spanned::Spanned;
use syn::{Ident, LitStr, Type};

use crate::errors::Errors;
use crate::kinds::misspelled_built_in;
use crate::parse::{ComponentArgs, ParsedField, ParsedInput, Shape};

/// A component the derive can expand.
pub(crate) struct Component<'a> {
    /// The struct's name.
    pub ident: &'a Ident,
    /// `kind = "..."`.
    pub kind: LitStr,
    /// `type = "..."`.
    pub type_name: LitStr,
    /// Example metadata, JSON object text.
    pub example: String,
    /// `crate = "..."`, as a path.
    pub crate_override: Option<syn::Path>,
    /// `in_place`: where it was written.
    pub in_place: Option<proc_macro2::Span>,
    /// First paragraph of the doc comment.
    pub description: String,
    /// Every field, with what fills it.
    pub fields: Vec<FieldPlan<'a>>,
}

/// A field and what fills it.
pub(crate) struct FieldPlan<'a> {
    /// The field name.
    pub ident: &'a Ident,
    /// The field type.
    pub ty: &'a Type,
    /// What fills it.
    pub role: FieldRole,
}

/// What fills a field.
pub(crate) enum FieldRole {
    /// The decoded metadata.
    Metadata,
    /// A referenced component; `name` restricts it to that component.
    Inject {
        /// Only the referenced component of this name.
        name: Option<String>,
    },
    /// `Default::default()`.
    Default,
}

impl Component<'_> {
    /// The `#[metadata]` field, if any.
    pub(crate) fn metadata_field(&self) -> Option<&FieldPlan<'_>> {
        self.fields
            .iter()
            .find(|f| matches!(f.role, FieldRole::Metadata))
    }
}

/// Checks `parsed`; every mistake found is reported at once.
pub(crate) fn validate(parsed: ParsedInput<'_>) -> syn::Result<Component<'_>> {
    let ParsedInput {
        ident,
        generics,
        shape,
        args,
        description,
        mut errors,
    } = parsed;
    let fields = match shape {
        Shape::Named(fields) => fields,
        Shape::Tuple(span) => {
            errors.at(
                span,
                format!("#[derive(Component)] needs named fields; `{ident}` is a tuple struct"),
            );
            Vec::new()
        }
        Shape::Unit(span) => {
            errors.at(span, format!("#[derive(Component)] needs a struct with braces; `{ident}` is a unit struct (write `struct {ident} {{}}`)"));
            Vec::new()
        }
        Shape::Enum(span) => {
            errors.at(
                span,
                "#[derive(Component)] works on structs only, not on enums",
            );
            Vec::new()
        }
        Shape::Union(span) => {
            errors.at(
                span,
                "#[derive(Component)] works on structs only, not on unions",
            );
            Vec::new()
        }
    };
    if !generics.params.is_empty() || generics.where_clause.is_some() {
        errors.at(
            generics.params.first().map_or_else(|| generics.span(), Spanned::span),
            format!("#[derive(Component)] does not support generic structs: the registry needs one concrete type for `{ident}`"),
        );
    }
    let in_place = args.as_ref().and_then(|a| a.in_place);
    let args = check_args(ident, args, &mut errors);
    let fields = check_fields(fields, &mut errors);
    errors.finish(())?;
    // `check_args` reports why it gave nothing, so this is never reached.
    let Some((kind, type_name, example, crate_override)) = args else {
        return Err(syn::Error::new(
            ident.span(),
            "invalid `#[component(...)]` attribute",
        ));
    };
    Ok(Component {
        ident,
        kind,
        type_name,
        example,
        crate_override,
        in_place,
        description,
        fields,
    })
}

type CheckedArgs = (LitStr, LitStr, String, Option<syn::Path>);

fn check_args(
    ident: &Ident,
    args: Option<ComponentArgs>,
    errors: &mut Errors,
) -> Option<CheckedArgs> {
    let Some(args) = args else {
        errors.at(
            ident.span(),
            format!("`{ident}` needs a `#[component(kind = \"...\", type = \"...\")]` attribute next to #[derive(Component)]"),
        );
        return None;
    };
    let kind = required(args.kind.clone(), "kind", "kind = \"state\"", &args, errors)
        .and_then(|kind| built_in_spelled_right(kind, errors));
    let type_name = required(
        args.type_name.clone(),
        "type",
        "type = \"memory\"",
        &args,
        errors,
    );
    let example = match args.example {
        Some(lit) => check_example(&lit, errors),
        None => Some("{}".to_string()),
    };
    let krate = match &args.krate {
        Some(lit) => match lit.parse::<syn::Path>() {
            Ok(path) => Some(Some(path)),
            Err(_) => {
                errors.at(
                    lit.span(),
                    format!(
                        "`crate` must be a path, like `crate = \"::rewire\"`; `{}` is not one",
                        lit.value()
                    ),
                );
                None
            }
        },
        None => Some(None),
    };
    Some((kind?, type_name?, example?, krate?))
}

fn required(
    value: Option<LitStr>,
    key: &str,
    example: &str,
    args: &ComponentArgs,
    errors: &mut Errors,
) -> Option<LitStr> {
    let Some(value) = value else {
        if !args.reported.contains(&key) {
            errors.at(
                args.span,
                format!("`#[component(...)]` is missing `{key}`: add `{example}`"),
            );
        }
        return None;
    };
    let text = value.value();
    if text.trim().is_empty() {
        errors.at(value.span(), format!("`{key}` cannot be empty"));
        return None;
    }
    if text.chars().any(|c| c.is_whitespace() || c == '/') {
        errors.at(
            value.span(),
            format!("`{key}` cannot contain spaces or `/`: `{text}`"),
        );
        return None;
    }
    Some(value)
}

/// `kind`, unless it is a built-in kind spelled another way (`state_store`,
/// `secretstores`, `State`): as a custom kind, the struct's kind trait
/// impl would never serve that kind, and a configuration naming its type
/// under the built-in kind would find no such type.
fn built_in_spelled_right(kind: LitStr, errors: &mut Errors) -> Option<LitStr> {
    let text = kind.value();
    let Some(built_in) = misspelled_built_in(&text) else {
        return Some(kind);
    };
    errors.at(
        kind.span(),
        format!("kind `{text}` is not a built-in kind, but looks like the built-in kind `{built_in}`: write `kind = \"{built_in}\"` (as a custom kind, the component would never serve `{built_in}`); a custom kind needs a name of its own"),
    );
    None
}

fn check_example(lit: &LitStr, errors: &mut Errors) -> Option<String> {
    let text = lit.value();
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Object(_)) => Some(text),
        Ok(_) => {
            errors.at(
                lit.span(),
                "`example` must be a JSON object, like `example = r#\"{\"capacity\": 100}\"#`",
            );
            None
        }
        Err(error) => {
            errors.at(lit.span(), format!("`example` is not valid JSON: {error}"));
            None
        }
    }
}

fn check_fields<'a>(fields: Vec<ParsedField<'a>>, errors: &mut Errors) -> Vec<FieldPlan<'a>> {
    let mut metadata_field: Option<&Ident> = None;
    let mut plans = Vec::with_capacity(fields.len());
    for field in fields {
        let ident = field.ident;
        for extra in field.metadata.iter().skip(1) {
            errors.at(
                *extra,
                format!("`#[metadata]` is given twice on field `{ident}`"),
            );
        }
        for extra in field.inject.iter().skip(1) {
            errors.at(
                extra.span,
                format!("`#[inject]` is given twice on field `{ident}`"),
            );
        }
        let role = match (field.metadata.first(), field.inject.first()) {
            (Some(_), Some(inject)) => {
                errors.at(
                    inject.span,
                    format!(
                        "field `{ident}` cannot be both `#[metadata]` and `#[inject]`: pick one"
                    ),
                );
                FieldRole::Default
            }
            (Some(span), None) => {
                if let Some(first) = metadata_field {
                    errors.at(
                        *span,
                        format!("only one field can be `#[metadata]`; `{first}` already is, so `{ident}` cannot be"),
                    );
                } else {
                    metadata_field = Some(ident);
                }
                FieldRole::Metadata
            }
            (None, Some(inject)) => {
                let name = inject.name.as_ref().and_then(|lit| {
                    let name = lit.value();
                    if name.trim().is_empty() {
                        errors.at(
                            lit.span(),
                            "`name` cannot be empty: give the component's name, or drop `name`",
                        );
                        None
                    } else {
                        Some(name)
                    }
                });
                FieldRole::Inject { name }
            }
            (None, None) => FieldRole::Default,
        };
        plans.push(FieldPlan {
            ident,
            ty: field.ty,
            role,
        });
    }
    plans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(source: &str) -> Result<(), Vec<String>> {
        let input: syn::DeriveInput = syn::parse_str(source).map_err(|e| vec![e.to_string()])?;
        let parsed = crate::parse::parse(&input);
        validate(parsed)
            .map(|_| ())
            .map_err(|e| e.into_iter().map(|e| e.to_string()).collect())
    }

    #[test]
    fn accepts_a_full_component() {
        let ok = check(
            "#[component(kind = \"state\", type = \"memory\", example = r#\"{\"a\":1}\"#)] struct S { #[metadata] m: M, #[inject] a: rewire::ConfigStoreHandle, #[inject(name = \"x\")] b: Option<LockHandle>, c: u8 }",
        );
        assert_eq!(ok, Ok(()));
    }

    #[test]
    fn reports_every_mistake() {
        let Err(messages) = check(
            "#[component(kind = \"\", example = \"[1]\")] struct S { #[metadata] m: M, #[metadata] n: N, #[inject] c: String }",
        ) else {
            panic!("accepted")
        };
        // A field of a type that is no handle is the compiler's to report
        // (through `InjectField`), so aliases of handles are accepted.
        assert_eq!(messages.len(), 4, "{messages:?}");
    }

    /// A built-in kind spelled another way is refused, naming the kind.
    #[test]
    fn a_misspelled_built_in_kind_is_refused() {
        let Err(messages) = check("#[component(kind = \"state_store\", type = \"x\")] struct S {}")
        else {
            panic!("accepted")
        };
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(
            messages[0].contains("kind `state_store`")
                && messages[0].contains("write `kind = \"state\"`"),
            "{messages:?}"
        );
        let ok = check("#[component(kind = \"pub_subs\", type = \"x\")] struct S {}");
        assert_eq!(ok, Ok(()));
    }

    #[test]
    fn crate_override_must_be_a_path() {
        let ok = check("#[component(kind = \"k\", type = \"t\", crate = \"crate\")] struct S {}");
        assert_eq!(ok, Ok(()));
        let Err(messages) =
            check("#[component(kind = \"k\", type = \"t\", crate = \"no way\")] struct S {}")
        else {
            panic!("accepted")
        };
        assert!(
            messages[0].contains("`crate` must be a path"),
            "{messages:?}"
        );
    }
}
