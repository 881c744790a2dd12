//! Dapr's and Layotto's key prefix strategies (`keyPrefix`: `appid`,
//! `name`, `none` or a literal), shared by the redis stores and locks and
//! by every sequencer's counter keys.

/// What separates the parts of a Dapr key (`{appId}||{key}`): refused in
/// a literal `keyPrefix` and in keys, as Dapr does.
pub const KEY_SEPARATOR: &str = "||";

/// The part Dapr's and Layotto's key prefix strategies put in front of a
/// key (state keys as Dapr's `GetModifiedStateKey`; lock keys add `lock||`
/// in front; sequencer keys, as Layotto's `GetModifiedSeqKey`, add
/// `sequencer|||`), from `keyPrefix` (case-insensitive: Dapr lowercases it), the
/// app id and the store's name:
///
/// * empty or `appid` (the default): `{appId}||`, nothing when the app
///   has no id;
/// * `name`: `{store name}||`;
/// * `none`: nothing;
/// * anything else, lowercased: `{keyPrefix}||`.
pub fn strategy_base(key_prefix: &str, app_id: &str, store: &str) -> String {
    let strategy = key_prefix.to_lowercase();
    match strategy.as_str() {
        "" | "appid" if app_id.is_empty() => String::new(),
        "" | "appid" => format!("{app_id}{KEY_SEPARATOR}"),
        "name" => format!("{store}{KEY_SEPARATOR}"),
        "none" => String::new(),
        literal => format!("{literal}{KEY_SEPARATOR}"),
    }
}
